package front

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

var seedHeads = []string{
	"GET /v1/table?version=3&wait_ms=1000 HTTP/1.1\r\nhost: cp.kvroute.svc:8080\r\naccept: application/x\r\nx-kvroute-table-formats: 1,2\r\nx-envoy-expected-rq-timeout-ms: 5000\r\n\r\n",
	"POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Type: application/x-kvroute-reports\r\nContent-Length: 12\r\nAuthorization: Bearer t\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: [::1]:80\r\nConnection: close\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nConnection: Keep-Alive\r\nX-Kind:\tpoll \r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nContent-Length: 0\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nTransfer-Encoding: chunked\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nX-Kind: a\r\n b\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nContent-Length: +1\r\n\r\n",
	"GET /v1/table HTTP/1.0\r\nHost: cp\r\n\r\n",
	"GET /v1/table?%zz HTTP/1.1\r\nHost: cp\r\n\r\n",
	"GET /v1/table HTTP/1.1\r\nHost: cp\r\nX-Kind: a\x00\r\n\r\n",
}

// The lean parser never accepts a head net/http's parser rejects, and reads every head it
// accepts as net/http does: method, target, Host, body length, Connection: close and
// each kept header's value.
func FuzzParseHeadAgreesWithNetHTTP(f *testing.F) {
	for _, s := range seedHeads {
		f.Add([]byte(s))
	}
	kept := []string{"Authorization", "X-Kind", "X-Kvroute-Table-Formats"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var h head
		if parseHead(raw, testRoutes, kept, &h) != lean {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw[:h.size])))
		if err != nil {
			t.Fatalf("lean accepted what net/http rejects (%v): %q", err, raw[:h.size])
		}
		route := testRoutes[h.route]
		hosts := r.Header.Values("Host")
		switch {
		case r.Method != route.Method || r.URL.Path != route.Path || r.RequestURI != string(h.target) || r.URL.RawQuery != string(h.query):
			t.Fatalf("request line read as %s %s (%q), lean %s %s: %q", r.Method, r.URL.Path, r.URL.RawQuery, route.Method, route.Path, raw)
		case r.Host != string(h.host) || len(hosts) > 0:
			t.Fatalf("host %q, lean %q: %q", r.Host, h.host, raw)
		case max(r.ContentLength, 0) != h.contentLength:
			t.Fatalf("content length %d, lean %d: %q", r.ContentLength, h.contentLength, raw)
		case r.Close != h.close:
			t.Fatalf("close %v, lean %v: %q", r.Close, h.close, raw)
		case len(r.TransferEncoding) > 0:
			t.Fatalf("lean accepted a transfer encoding: %q", raw)
		}
		for i, k := range kept {
			vs := r.Header.Values(k)
			if h.kept[i] == nil && len(vs) == 0 {
				continue
			}
			if len(vs) != 1 || vs[0] != string(h.kept[i]) {
				t.Fatalf("%s: net/http %q, lean %q: %q", k, vs, h.kept[i], raw)
			}
		}
		if strings.ContainsAny(r.Header.Get("Connection"), ",") {
			t.Fatalf("lean accepted a Connection list: %q", raw)
		}
	})
}

func TestParseHeadNeedsMoreUntilTheBlankLine(t *testing.T) {
	full := []byte(seedHeads[0])
	var h head
	for n := range len(full) {
		if v := parseHead(full[:n], testRoutes, nil, &h); v != needMore {
			t.Fatalf("%d bytes of %d: %v, want needMore", n, len(full), v)
		}
	}
	if v := parseHead(full, testRoutes, nil, &h); v != lean || h.size != len(full) {
		t.Fatalf("whole head: %v, %d bytes", v, h.size)
	}
}
