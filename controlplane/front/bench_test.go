package front

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPoll is one table-sized answer (700 bytes, the headers a table answer
// carries) to a poll carrying an Envoy-forwarded request's headers, over loopback, keep
// alive: through the lean loop and through net/http alone, in one run. The client's work
// is in both.
//
//	go test ./controlplane/front -run '^$' -bench Poll -benchmem
func BenchmarkPoll(b *testing.B) {
	body := make([]byte, 700)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.Header.Get("X-Kvroute-Table-Formats")
		hd := w.Header()
		hd["Content-Type"] = []string{"application/x-kvroute-table"}
		hd["Content-Length"] = []string{strconv.Itoa(len(body))}
		hd["Cache-Control"] = []string{"no-store"}
		hd["X-Kvroute-Version"] = []string{"12345"}
		hd["X-Kvroute-Frame"] = []string{"delta"}
		hd["Etag"] = []string{`"12345"`}
		w.WriteHeader(http.StatusOK)
		w.Write(body)
	})
	req := []byte("GET /v1/table?version=12344&wait_ms=1000 HTTP/1.1\r\nhost: cp.kvroute.svc.cluster.local\r\n" +
		"accept: application/x-kvroute-table\r\nx-kvroute-table-formats: 1,2\r\nx-envoy-expected-rq-timeout-ms: 5000\r\n" +
		"x-request-id: 6a1f3c2e-8d4b-4f0a-9c1e-2b7d5e9f0a11\r\nx-forwarded-proto: http\r\n\r\n")
	for _, mode := range []string{"lean", "net/http"} {
		b.Run("server="+mode, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			if mode == "lean" {
				f := &Front{Handler: h, Fallback: srv, Routes: testRoutes, Headers: []string{"X-Kvroute-Table-Formats"}}
				go f.Serve(ln)
				defer f.Shutdown(b.Context())
			} else {
				go srv.Serve(ln)
				defer srv.Close()
			}
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReaderSize(c, 16<<10)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := r.Discard(int(resp.ContentLength)); err != nil || resp.StatusCode != 200 {
					b.Fatal(resp.StatusCode, err)
				}
			}
		})
	}
}
