package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/proxy"
)

// BenchmarkProxyRequest is one chat-sized request through the whole path: client ->
// proxy -> filter (paused at the headers, decided at the end of the body) -> upstream ->
// filter (response callbacks) -> client. It reports the filter's share (time inside the
// guest callbacks) apart from the upstream's and the proxy's own.
func BenchmarkProxyRequest(b *testing.B) {
	up := newUpstream(b, "a", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":300}}`)
	})
	s := startProxy(b, proxy.Config{Endpoints: []string{up.addr}}, host.Config{VMs: 2})
	body := fmt.Sprintf(`{"model":"m","route":%q,"prompt":%q}`, up.addr, strings.Repeat("lorem ipsum ", 100))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		resp, err := client.Post(s.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	elapsed := time.Since(start)
	st := s.Stats()
	n := float64(st.Requests)
	filter := st.Filter.Mean()
	upstream := st.Upstream.Mean()
	b.ReportMetric(float64(filter.Microseconds()), "filter-µs/op")
	b.ReportMetric(float64(st.Filter.P99.Microseconds()), "filter-p99-µs")
	b.ReportMetric(float64(upstream.Microseconds()), "upstream-µs/op")
	b.ReportMetric(float64((st.Total.Mean() - filter - upstream).Microseconds()), "proxy-µs/op")
	b.ReportMetric(float64(elapsed.Microseconds())/n, "client-µs/op")
}
