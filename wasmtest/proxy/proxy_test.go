package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/proxy"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

var pluginPath string

func TestMain(m *testing.M) {
	path, cleanup, err := wasmbuild.BuildTemp("../host/testdata/plugin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginPath = path
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// upstream is a local HTTP server standing for one model replica.
type upstream struct {
	name string
	addr string
	srv  *httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	header  http.Header
	trailer http.Header
	body    string
	length  int64
}

func newUpstream(t testing.TB, name string, handler http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{name: name}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{header: r.Header.Clone(), trailer: r.Trailer.Clone(), body: string(b), length: r.ContentLength})
		u.mu.Unlock()
		w.Header().Set("x-served-by", name)
		if handler != nil {
			handler(w, r)
			return
		}
		io.WriteString(w, "hello from "+name)
	}))
	u.addr = u.srv.Listener.Addr().String()
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func startProxy(t testing.TB, cfg proxy.Config, hcfg host.Config) *proxy.Server {
	t.Helper()
	if hcfg.VMs == 0 {
		hcfg.VMs = 2
	}
	if hcfg.PluginConfig == nil {
		hcfg.PluginConfig = []byte(`{"tick_ms":0,"cluster":"control"}`)
	}
	h, err := host.Load(context.Background(), pluginPath, hcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	cfg.Host = h
	s, err := proxy.Listen("", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func send(t *testing.T, method, url, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestForwardsToTheEndpointTheFilterChose(t *testing.T) {
	a, b, c := newUpstream(t, "a", nil), newUpstream(t, "b", nil), newUpstream(t, "c", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr, b.addr, c.addr}}, host.Config{})
	body := fmt.Sprintf(`{"prompt":"hi","route":"%s,%s"}`, b.addr, a.addr)
	resp, got := send(t, "POST", s.URL+"/v1/completions", body, "Content-Type", "application/json",
		proxy.DefaultRoutingHeader, c.addr) // a client's own choice is stripped by the filter
	if resp.StatusCode != 200 || got != "hello from b" {
		t.Fatalf("%d %q, want b's answer", resp.StatusCode, got)
	}
	if resp.Header.Get("x-test-filter") == "" {
		t.Fatal("response did not pass the filter's response callbacks")
	}
	seen := b.requests()
	if len(seen) != 1 || seen[0].body != body || seen[0].length != int64(len(body)) {
		t.Fatalf("b saw %+v", seen)
	}
	if h := seen[0].header; h.Get("x-added") != "1" || h.Get(proxy.DefaultRoutingHeader) != b.addr+","+a.addr || h.Get("x-request-id") == "" {
		t.Fatalf("forwarded headers %v", h)
	}
	st := s.Stats()
	if st.Forwards[b.addr] != 1 || st.Forwards[a.addr]+st.Forwards[c.addr] != 0 || st.Retries != 0 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}
	if st.Filter.Count != 1 || st.Filter.P50 <= 0 || st.Upstream.Count != 1 {
		t.Fatalf("latency stats %+v / %+v", st.Filter, st.Upstream)
	}
}

func TestSkipsEndpointsThatRefuseOrAreNotMembers(t *testing.T) {
	b := newUpstream(t, "b", nil)
	dead := deadAddr(t)
	s := startProxy(t, proxy.Config{Endpoints: []string{dead, b.addr}}, host.Config{})
	resp, got := send(t, "GET", s.URL+"/v1/completions", "", "x-route", "10.255.255.1:9,"+dead+","+b.addr)
	if resp.StatusCode != 200 || got != "hello from b" {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
	st := s.Stats()
	if st.UnknownEndpoints != 1 || st.Retries != 1 || st.Forwards[b.addr] != 1 || st.Forwards[dead] != 0 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v: want the non-member skipped, one retry after the refused connection", st)
	}
}

// resetting is an endpoint that reads the request and closes the connection without a
// response, as a killed engine's pooled connection or an engine dying mid-prefill does.
func resetting(t *testing.T, name string) *upstream {
	return newUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
	})
}

func TestResetBeforeHeadersMovesToTheNextEndpoint(t *testing.T) {
	a, b := resetting(t, "a"), newUpstream(t, "b", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr, b.addr}}, host.Config{})
	body := `{"prompt":"hi"}`
	resp, got := send(t, "POST", s.URL+"/v1/completions", body, "x-route", a.addr+","+b.addr)
	if resp.StatusCode != 200 || got != "hello from b" {
		t.Fatalf("%d %q, want b's answer", resp.StatusCode, got)
	}
	if ra, rb := a.requests(), b.requests(); len(ra) != 1 || len(rb) != 1 || rb[0].body != body {
		t.Fatalf("a saw %+v, b saw %+v: want the same request at both", ra, rb)
	}
	st := s.Stats()
	if st.Resets != 1 || st.Retries != 1 || st.Forwards[a.addr] != 0 || st.Forwards[b.addr] != 1 || st.UpstreamFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResetRetriesAreBounded(t *testing.T) {
	ups := []*upstream{resetting(t, "a"), resetting(t, "b"), resetting(t, "c"), resetting(t, "d")}
	var addrs []string
	for _, u := range ups {
		addrs = append(addrs, u.addr)
	}
	s := startProxy(t, proxy.Config{Endpoints: addrs}, host.Config{})
	resp, got := send(t, "POST", s.URL+"/v1/completions", `{"prompt":"poison"}`, "x-route", strings.Join(addrs, ","))
	if resp.StatusCode != 503 || !strings.Contains(got, "connection termination") {
		t.Fatalf("%d %q, want Envoy's reset 503", resp.StatusCode, got)
	}
	seen := 0
	for _, u := range ups {
		seen += len(u.requests())
	}
	st := s.Stats()
	if seen != 1+proxy.MaxResetRetries || st.Resets != int64(seen) || st.UpstreamFailures != 1 || len(ups[3].requests()) != 0 {
		t.Fatalf("%d endpoints saw the request, stats %+v: want %d attempts in header order", seen, st, 1+proxy.MaxResetRetries)
	}
}

func TestFallbackIsLeastOutstandingRequests(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	a := newUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-hold") != "" {
			close(arrived)
			<-release
		}
		io.WriteString(w, "hello from a")
	})
	b := newUpstream(t, "b", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr, b.addr}}, host.Config{})
	held := make(chan string)
	go func() {
		_, got := send(t, "GET", s.URL+"/v1/completions", "", "x-route", a.addr, "x-hold", "1")
		held <- got
	}()
	<-arrived // a now has one request in flight
	for i := range 3 {
		if _, got := send(t, "GET", s.URL+"/v1/completions", ""); got != "hello from b" {
			t.Fatalf("request %d without a routing header went to %q, want b (a is busy)", i, got)
		}
	}
	close(release)
	if got := <-held; got != "hello from a" {
		t.Fatalf("held request got %q", got)
	}
	// Every listed endpoint refuses: the fallback takes over.
	dead := deadAddr(t)
	s.SetEndpoints([]string{a.addr, b.addr, dead})
	if resp, _ := send(t, "GET", s.URL+"/v1/completions", "", "x-route", dead); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	st := s.Stats()
	if st.Fallbacks != 4 || st.Retries != 1 {
		t.Fatalf("stats %+v, want 4 fallbacks and 1 retry", st)
	}
}

func TestNoEndpointAccepts503(t *testing.T) {
	dead := deadAddr(t)
	s := startProxy(t, proxy.Config{Endpoints: []string{dead}}, host.Config{})
	resp, body := send(t, "GET", s.URL+"/v1/completions", "", "x-route", dead)
	if resp.StatusCode != 503 || !strings.Contains(body, "upstream connect error") || resp.Header.Get("x-test-filter") == "" {
		t.Fatalf("%d %q %v: want Envoy's 503, through the filter", resp.StatusCode, body, resp.Header)
	}
	if st := s.Stats(); st.UpstreamFailures != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSSEChunksPassAsTheyCome(t *testing.T) {
	next := make(chan struct{})
	sse := newUpstream(t, "sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-next // chunk 2 only exists once the client has seen chunk 1
		io.WriteString(w, "data: two\n\n")
	})
	s := startProxy(t, proxy.Config{Endpoints: []string{sse.addr}}, host.Config{})
	req, _ := http.NewRequest("GET", s.URL+"/v1/completions", nil)
	req.Header.Set("x-route", sse.addr)
	req.Header.Set("x-upper-response", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	readEvent := func() (string, error) {
		line, err := r.ReadString('\n')
		if err != nil {
			return line, err
		}
		_, err = r.ReadString('\n')
		return line, err
	}
	first := make(chan string, 1)
	go func() { line, _ := readEvent(); first <- line }()
	select {
	case line := <-first:
		if line != "DATA: ONE\n" {
			t.Fatalf("first event %q, want it rewritten by the filter", line)
		}
	case <-time.After(20 * time.Second): // a hang guard, not a latency assertion
		close(next)
		t.Fatal("chunk 1 did not reach the client while the upstream held chunk 2: the proxy buffers")
	}
	close(next)
	if line, err := readEvent(); line != "DATA: TWO\n" || err != nil {
		t.Fatalf("second event %q %v", line, err)
	}
	if rest, err := io.ReadAll(r); len(rest) != 0 || err != nil {
		t.Fatalf("after the stream: %q %v", rest, err)
	}
}

func TestBodyLimit(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}, BodyLimit: 1024}, host.Config{})
	resp, body := send(t, "POST", s.URL+"/v1/completions", strings.Repeat("x", 4096))
	if resp.StatusCode != 413 || body != "Payload Too Large" {
		t.Fatalf("%d %q, want 413", resp.StatusCode, body)
	}
	if n := len(a.requests()); n != 0 {
		t.Fatalf("upstream got %d requests", n)
	}
	payload := fmt.Sprintf(`{"route":%q,"pad":%q}`, a.addr, strings.Repeat("y", 900))
	if resp, _ := send(t, "POST", s.URL+"/v1/completions", payload); resp.StatusCode != 200 {
		t.Fatalf("body under the limit: %d", resp.StatusCode)
	}
	if seen := a.requests(); len(seen) != 1 || seen[0].body != payload {
		t.Fatalf("body under the limit did not arrive whole: %d requests, %+v", len(seen), seen)
	}
	if st := s.Stats(); st.LocalReplies != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFilterLocalReplyAndAsyncRelease(t *testing.T) {
	a := newUpstream(t, "a", nil)
	ctl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from-control") }))
	defer ctl.Close()
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}},
		host.Config{Clusters: map[string]host.Cluster{"control": {URL: ctl.URL}}})
	resp, body := send(t, "GET", s.URL+"/v1/completions", "", "x-local-reply", "1")
	if resp.StatusCode != 418 || body != "teapot" || resp.Header.Get("x-test-local") != "1" {
		t.Fatalf("local reply %d %q", resp.StatusCode, body)
	}
	resp, _ = send(t, "POST", s.URL+"/v1/completions", fmt.Sprintf(`{"route":%q}`, a.addr), "x-async", "1")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if seen := a.requests(); len(seen) != 1 || seen[0].header.Get("x-async-result") != "from-control" {
		t.Fatalf("upstream saw %+v, want the header set by the HTTP-call callback", seen)
	}
}

func TestTrapFailsOpenThroughTheProxy(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{VMs: 1})
	for i, hdr := range []string{"x-panic", "x-anything"} {
		resp, body := send(t, "GET", s.URL+"/v1/completions", "", hdr, "1")
		if resp.StatusCode != 200 || body != "hello from a" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	seen := a.requests()
	if seen[0].header.Get("x-added") != "" || seen[1].header.Get("x-added") != "" {
		t.Fatal("filter ran after its VM failed")
	}
	if st := s.Stats(); st.FailOpen != 2 || st.Fallbacks != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResponseTrailersPassThrough(t *testing.T) {
	a := newUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Upstream-Trailer")
		io.WriteString(w, "body")
		w.(http.Flusher).Flush()
		w.Header().Set("X-Upstream-Trailer", "7")
	})
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	resp, body := send(t, "GET", s.URL+"/v1/completions", "", "x-route", a.addr)
	if body != "body" || resp.Trailer.Get("x-upstream-trailer") != "7" || resp.Trailer.Get("x-test-trailer") != "1" {
		t.Fatalf("%q trailers %v", body, resp.Trailer)
	}
}

func TestFilterRewritesTheBody(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	body := fmt.Sprintf(`{"route":%q}`, a.addr)
	if resp, _ := send(t, "POST", s.URL+"/v1/completions", body, "x-rewrite-body", "1"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	seen := a.requests()
	if len(seen) != 1 || seen[0].body != "rewritten:"+body || seen[0].length != int64(len("rewritten:"+body)) {
		t.Fatalf("upstream saw %+v, want the replaced body with its own length", seen)
	}
}

func TestRequestTrailersReachTheFilterAndTheUpstream(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	body := fmt.Sprintf(`{"route":%q}`, a.addr)
	req, _ := http.NewRequest("POST", s.URL+"/v1/completions", nil)
	req.Trailer = http.Header{"X-Client-Trailer": nil}
	req.ContentLength = -1 // chunked, the only way HTTP/1.1 carries trailers
	req.Body = io.NopCloser(&trailerSetter{r: strings.NewReader(body), trailer: req.Trailer})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	seen := a.requests()
	if len(seen) != 1 || seen[0].body != body {
		t.Fatalf("upstream saw %+v", seen)
	}
	if got := seen[0].trailer; got.Get("X-Client-Trailer") != "v" || got.Get("X-Trailer-Seen") != "1" {
		t.Fatalf("upstream trailers %v, want the client's and the one the filter added", got)
	}
	if got := seen[0].header.Get("x-test-trailers"); got != "1" {
		t.Fatalf("filter saw %q trailers, want 1", got)
	}
}

// trailerSetter fills in the request trailer once the body is read, as a streaming client does.
type trailerSetter struct {
	r       io.Reader
	trailer http.Header
}

func (ts *trailerSetter) Read(p []byte) (int, error) {
	n, err := ts.r.Read(p)
	if err == io.EOF {
		ts.trailer.Set("X-Client-Trailer", "v")
	}
	return n, err
}

func TestRoundRobinIgnoresTheFilterChoice(t *testing.T) {
	a, b, c := newUpstream(t, "a", nil), newUpstream(t, "b", nil), newUpstream(t, "c", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr, b.addr, c.addr}}, host.Config{})
	s.SetRoundRobin(true)
	body := fmt.Sprintf(`{"prompt":"hi","route":"%s"}`, a.addr)
	for i := 0; i < 6; i++ {
		if resp, _ := send(t, "POST", s.URL+"/v1/completions", body); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	st := s.Stats()
	if st.Forwards[a.addr] != 2 || st.Forwards[b.addr] != 2 || st.Forwards[c.addr] != 2 {
		t.Fatalf("forwards %v: want 2 each, whatever the filter chose", st.Forwards)
	}
	s.SetRoundRobin(false)
	send(t, "POST", s.URL+"/v1/completions", body)
	if got := s.Stats().Forwards[a.addr]; got != 3 {
		t.Fatalf("back to override_host: a has %d forwards, want 3", got)
	}
}
