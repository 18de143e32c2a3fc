package proxy_test

// The attack suite against the proxy alone: a hostile client of the proxy's
// port, on loopback, with bounded counts and times. Each test logs its figures (requests
// answered, refused, failed; time to cut; goroutines and heap before, at peak and after)
// for docs/testing.md's table of attacks.
//
// Without the fixes, the same attacks gave:
//   - `GET http:@<canary>/debug/state` reached the canary (200, one hit): the upstream
//     URL was "http://" + endpoint + target, so the endpoint became userinfo;
//   - absolute-form targets, `GET *` and `PRI * HTTP/2.0` got 503 "upstream connect
//     error" (the target was glued after the endpoint's port);
//   - GET /admin/restart and /reset_prefix_cache were forwarded (200);
//   - a malformed chunk size closed the connection without a status (unexpected EOF);
//   - 40 of 40 slow-header and stalled 1 MiB-body connections were still open after 3 s,
//     with no timeout configured anywhere.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/proxy"
)

// canary is a listener no request may ever reach: it counts accepted connections.
type canary struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newCanary(t *testing.T) *canary {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &canary{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.accepted.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return c
}

func (c *canary) addr() string { return c.ln.Addr().String() }

// rawResult is what a raw HTTP/1 exchange got back.
type rawResult struct {
	status int // 0: the connection ended without a response
	body   string
	closed bool // the proxy closed the connection after the response
	after  time.Duration
}

// rawExchange writes raw bytes to the proxy and reads one response.
func rawExchange(t *testing.T, addr, raw string) rawResult {
	t.Helper()
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return readResult(c, start)
}

func readResult(c net.Conn, start time.Time) rawResult {
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return rawResult{after: time.Since(start), closed: true}
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	res := rawResult{status: resp.StatusCode, body: string(b), after: time.Since(start)}
	if resp.Close { // the proxy said it closes: check that it does
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = br.ReadByte()
		res.closed = err == io.EOF || err != nil && !isTimeout(err)
	}
	return res
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// resources samples goroutines and heap.
type resources struct {
	mu               sync.Mutex
	goroutines, heap [3]int64 // before, peak, after
	stop, done       chan struct{}
}

func sample() (int64, int64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(runtime.NumGoroutine()), int64(ms.HeapInuse)
}

func watchResources() *resources {
	runtime.GC()
	r := &resources{stop: make(chan struct{}), done: make(chan struct{})}
	g, h := sample()
	r.goroutines = [3]int64{g, g, 0}
	r.heap = [3]int64{h, h, 0}
	go func() {
		defer close(r.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				g, h := sample()
				r.mu.Lock()
				r.goroutines[1] = max(r.goroutines[1], g)
				r.heap[1] = max(r.heap[1], h)
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// settle stops sampling and waits (polling, with a deadline) for the goroutine count to
// come back within slack of where it started. Pooled keep-alive connections (the test
// client's, the proxy's to its upstreams) are dropped first: they are not leaks.
func (r *resources) settle(t *testing.T, slack int64, s *proxy.Server) {
	t.Helper()
	close(r.stop)
	<-r.done
	http.DefaultClient.CloseIdleConnections()
	s.Proxy.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		g, h := sample()
		r.goroutines[2], r.heap[2] = g, h
		if g <= r.goroutines[0]+slack || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.goroutines[2] > r.goroutines[0]+slack {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines %d -> %d after the attack: a leak\n%s", r.goroutines[0], r.goroutines[2], buf[:n])
	}
}

func (r *resources) String() string {
	mb := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }
	return fmt.Sprintf("goroutines %d/%d/%d, heap %s/%s/%s (before/peak/after)",
		r.goroutines[0], r.goroutines[1], r.goroutines[2], mb(r.heap[0]), mb(r.heap[1]), mb(r.heap[2]))
}

// waitNoConnections polls until the proxy has no client connection open.
func waitNoConnections(t *testing.T, s *proxy.Server, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.Stats().OpenConnections > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d client connections still open %s after the attack", s.Stats().OpenConnections, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A request target naming another host never leaves the proxy: the upstream URL is the
// chosen endpoint plus the route. Invalid targets get Envoy's 400, paths that are not the
// OpenAI API or health get the router's 404, and a canary listener sees nothing.
func TestAttackRequestTargets(t *testing.T) {
	can := newCanary(t)
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	res := watchResources()
	C := can.addr()
	get := func(target string, extra ...string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: kvroute\r\n" + strings.Join(extra, "") + "\r\n"
	}
	post := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: kvroute\r\nContent-Length: 2\r\n\r\n{}"
	}
	cases := []struct {
		name, raw string
		want      int
		reachesA  bool
	}{
		{"userinfo trick", get("http:@" + C + "/debug/state"), 400, false},
		{"userinfo trick, origin-form", get("@" + C + "/v1/models"), 400, false},
		{"absolute-form to the canary, API path", get("http://" + C + "/v1/models"), 200, true},
		{"absolute-form with userinfo", get("http://user@" + C + "/health"), 200, true},
		{"absolute-form to the canary, debug path", get("http://" + C + "/debug/state"), 404, false},
		{"absolute-form, other scheme", get("ftp://" + C + "/v1/models"), 400, false},
		{"absolute-form without host", get("http:///v1/models"), 400, false},
		{"scheme-relative path", get("//" + C + "/v1/models"), 404, false},
		{"at sign in the path", get("/v1/models@" + C), 404, false},
		{"canary in the query", get("/v1/models?next=http://" + C + "/"), 200, true},
		{"canary as Host", "GET /v1/models HTTP/1.1\r\nHost: " + C + "\r\n\r\n", 200, true},
		{"canary as routing header", get("/v1/models", proxy.DefaultRoutingHeader+": "+C+"\r\n"), 200, true},
		{"dot segments", get("/v1/../admin/restart"), 404, false},
		{"encoded dot segments", get("/v1/%2e%2e/admin/restart"), 404, false},
		{"encoded route", get("/v1/%6dodels"), 404, false},
		{"asterisk with GET", get("*"), 400, false},
		{"asterisk with OPTIONS", "OPTIONS * HTTP/1.1\r\nHost: kvroute\r\n\r\n", 404, false},
		{"CONNECT to the canary", "CONNECT " + C + " HTTP/1.1\r\nHost: " + C + "\r\n\r\n", 400, false},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, false},
		{"unknown method", "BREW /v1/models HTTP/1.1\r\nHost: kvroute\r\n\r\n", 400, false},
		{"engine admin: restart", post("/admin/restart"), 404, false},
		{"engine admin: state", get("/admin/state"), 404, false},
		{"vLLM: reset_prefix_cache", post("/reset_prefix_cache"), 404, false},
		{"vLLM: sleep", post("/sleep"), 404, false},
		{"vLLM: tokenize (not under /v1)", post("/tokenize"), 404, false},
		{"metrics", get("/metrics"), 404, false},
		{"root", get("/"), 404, false},
	}
	var answered, refused, failed int
	for _, c := range cases {
		before := len(a.requests())
		r := rawExchange(t, s.Addr(), c.raw)
		switch {
		case r.status >= 200 && r.status < 300:
			answered++
		case r.status >= 400 && r.status < 500:
			refused++
		default:
			failed++
		}
		reached := len(a.requests()) > before
		if r.status != c.want || reached != c.reachesA {
			t.Errorf("%s: %d %q (reached the endpoint: %v), want %d (%v)", c.name, r.status, r.body, reached, c.want, c.reachesA)
		}
		if r.status == 400 && !r.closed {
			t.Errorf("%s: 400 without closing the connection", c.name)
		}
	}
	if n := can.accepted.Load(); n != 0 {
		t.Fatalf("the canary accepted %d connections", n)
	}
	st := s.Stats()
	res.settle(t, 5, s)
	t.Logf("request targets: %d requests, %d answered, %d refused (%d bad request, %d no route), %d failed; canary connections %d; %s",
		len(cases), answered, refused, st.BadRequests, st.NoRoute, failed, can.accepted.Load(), res)
}

// Absolute-form is handled as Envoy does: :authority becomes the URL's host (userinfo
// dropped), :path its path; the upstream is still the endpoint the filter chose.
func TestAbsoluteFormSetsAuthorityNotUpstream(t *testing.T) {
	var gotHost, gotURI string
	a := newUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) { gotHost, gotURI = r.Host, r.RequestURI })
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	r := rawExchange(t, s.Addr(), "GET http://user@10.9.9.9:81/v1/models?a=b HTTP/1.1\r\nHost: ignored\r\n\r\n")
	if r.status != 200 || gotHost != "10.9.9.9:81" || gotURI != "/v1/models?a=b" {
		t.Fatalf("%d, upstream saw Host %q target %q", r.status, gotHost, gotURI)
	}
}

// Malformed chunked framing gets Envoy's 400 and the connection closed; nothing is
// forwarded.
func TestAttackMalformedChunks(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	res := watchResources()
	head := "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nTransfer-Encoding: chunked\r\n\r\n"
	bodies := map[string]string{
		"not hex":          "zz\r\nabc\r\n0\r\n\r\n",
		"negative":         "-1\r\na\r\n0\r\n\r\n",
		"data past size":   "1\r\nabc\r\n0\r\n\r\n",
		"size overflow":    "fffffffffffffffffff\r\na\r\n0\r\n\r\n",
		"after good chunk": "2\r\n{}\r\nq\r\n0\r\n\r\n",
	}
	var cut []time.Duration
	for name, b := range bodies {
		r := rawExchange(t, s.Addr(), head+b)
		if r.status != 400 || !r.closed {
			t.Errorf("%s: status %d closed %v, want 400 and the connection closed", name, r.status, r.closed)
		}
		cut = append(cut, r.after)
	}
	if n := len(a.requests()); n != 0 {
		t.Fatalf("upstream got %d malformed requests", n)
	}
	// The proxy still serves.
	if resp, _ := send(t, "POST", s.URL+"/v1/completions", fmt.Sprintf(`{"route":%q}`, a.addr)); resp.StatusCode != 200 {
		t.Fatalf("after the attack: %d", resp.StatusCode)
	}
	st := s.Stats()
	res.settle(t, 5, s)
	t.Logf("malformed chunks: %d requests refused 400 (%d framing errors), slowest answer %s; %s",
		len(bodies), st.FramingErrors, maxDuration(cut), res)
}

func maxDuration(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

// Slow and stalled clients are cut at the stated timeouts, every connection drops, and
// nothing leaks.
func TestAttackSlowClients(t *testing.T) {
	a := newUpstream(t, "a", nil)
	cfg := proxy.Config{Endpoints: []string{a.addr},
		RequestHeadersTimeout: 300 * time.Millisecond, RequestTimeout: 900 * time.Millisecond,
		StreamIdleTimeout: 500 * time.Millisecond, IdleTimeout: 600 * time.Millisecond}
	s := startProxy(t, cfg, host.Config{})
	const perKind = 25
	const slack = 1500 * time.Millisecond // scheduling on a shared 2-core machine
	type kind struct {
		name   string
		start  func(c net.Conn) // writes the attack; trickles until the connection dies
		status int              // 0: closed without a response
		reason string
		limit  time.Duration
	}
	trickle := func(c net.Conn, prefix string) {
		if _, err := io.WriteString(c, prefix); err != nil {
			return
		}
		for {
			time.Sleep(50 * time.Millisecond)
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
	}
	kinds := []kind{
		{"slow headers", func(c net.Conn) { trickle(c, "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nX-Slow: ") },
			408, "request header timeout", cfg.RequestHeadersTimeout},
		{"trickled body", func(c net.Conn) {
			trickle(c, "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Length: 100000\r\n\r\n")
		}, 408, "request timeout", cfg.RequestTimeout},
		{"stalled 1 MiB body", func(c net.Conn) {
			_, _ = io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Length: 1048576\r\n\r\n"+strings.Repeat("x", 512<<10))
		}, 408, "stream timeout", cfg.StreamIdleTimeout},
		{"silent connection", func(c net.Conn) {}, 0, "", cfg.IdleTimeout},
	}
	res := watchResources()
	type outcome struct {
		r   rawResult
		err error
	}
	results := make([][]outcome, len(kinds))
	var wg sync.WaitGroup
	for k, kd := range kinds {
		results[k] = make([]outcome, perKind)
		for i := 0; i < perKind; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				c, err := net.Dial("tcp", s.Addr())
				if err != nil {
					results[k][i].err = err
					return
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(kd.limit + 10*time.Second)) // a hang guard
				go kd.start(c)
				results[k][i].r = readResult(c, start)
			}()
		}
	}
	wg.Wait()
	for k, kd := range kinds {
		var slowest time.Duration
		cutN := 0
		for i, o := range results[k] {
			r := o.r
			if o.err != nil {
				t.Fatalf("%s %d: %v", kd.name, i, o.err)
			}
			slowest = max(slowest, r.after)
			if r.status != kd.status || (kd.status != 0 && r.body != kd.reason) || !r.closed {
				t.Errorf("%s %d: %d %q closed %v after %s, want %d %q and the connection closed", kd.name, i, r.status, r.body, r.closed, r.after, kd.status, kd.reason)
				continue
			}
			if r.after < kd.limit || r.after > kd.limit+slack {
				t.Errorf("%s %d: cut after %s, want at %s (+%s)", kd.name, i, r.after, kd.limit, slack)
				continue
			}
			cutN++
		}
		t.Logf("%s: %d of %d cut (%d %q), timeout %s, slowest cut %s", kd.name, cutN, perKind, kd.status, kd.reason, kd.limit, slowest)
	}
	waitNoConnections(t, s, 5*time.Second)
	st := s.Stats()
	if st.HeaderTimeouts != perKind || st.RequestTimeouts != perKind || st.StreamIdleTimeouts != perKind || st.IdleClosed != perKind {
		t.Errorf("stats %+v", st)
	}
	if n := len(a.requests()); n != 0 {
		t.Errorf("upstream got %d incomplete requests", n)
	}
	res.settle(t, 5, s)
	t.Logf("slow clients: %d connections, %d cut by the timeouts, %d still open; %s", len(kinds)*perKind,
		st.HeaderTimeouts+st.RequestTimeouts+st.StreamIdleTimeouts+st.IdleClosed, st.OpenConnections, res)
	// The proxy still serves.
	if resp, _ := send(t, "POST", s.URL+"/v1/completions", fmt.Sprintf(`{"route":%q}`, a.addr)); resp.StatusCode != 200 {
		t.Fatalf("after the attack: %d", resp.StatusCode)
	}
}

// A keep-alive connection idle past the idle timeout is closed; one in use is not.
func TestIdleTimeoutKeepsBusyConnections(t *testing.T) {
	a := newUpstream(t, "a", nil)
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}, IdleTimeout: 300 * time.Millisecond}, host.Config{})
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 5; i++ { // 5 requests 100 ms apart: 500 ms in all, never 300 ms idle
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: kvroute\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d on the kept-alive connection: %v %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("idle connection closed after %s", d)
	}
}

// Clients that leave mid-body or mid-stream: no goroutine or connection is left behind,
// the engine sees every abandoned stream end, and the next requests are served.
func TestAttackDisconnects(t *testing.T) {
	var inflight, served atomic.Int64
	a := newUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-stream") == "" {
			io.WriteString(w, "ok")
			return
		}
		inflight.Add(1)
		defer inflight.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // an engine streaming until its client goes away
	})
	s := startProxy(t, proxy.Config{Endpoints: []string{a.addr}}, host.Config{})
	const n = 40
	res := watchResources()
	body := fmt.Sprintf(`{"route":%q,"pad":%q}`, a.addr, strings.Repeat("y", 64<<10))
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(2)
		go func() { // mid-body: half the body, then gone
			defer wg.Done()
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Error(err)
				return
			}
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
			time.Sleep(20 * time.Millisecond)
			c.Close()
		}()
		go func() { // mid-stream: the first event, then gone
			defer wg.Done()
			c, err := net.Dial("tcp", s.Addr())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvroute\r\nX-Stream: 1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Error(err)
				return
			}
			line, _ := bufio.NewReader(resp.Body).ReadString('\n')
			if line == "data: first\n" {
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if v := inflight.Load(); v != 0 {
		t.Fatalf("%d upstream streams still open after their clients left", v)
	}
	waitNoConnections(t, s, 5*time.Second)
	// The engine's queue recovered: ordinary requests are served.
	for i := 0; i < 5; i++ {
		if resp, _ := send(t, "POST", s.URL+"/v1/completions", fmt.Sprintf(`{"route":%q}`, a.addr)); resp.StatusCode != 200 {
			t.Fatalf("after the attack: %d", resp.StatusCode)
		}
	}
	s.Close()
	res.settle(t, 8, s)
	st := s.Stats()
	t.Logf("disconnects: %d mid-body and %d mid-stream clients gone (%d streams had started), %d resets, upstream streams left open %d; %s",
		n, n, served.Load(), st.Resets, inflight.Load(), res)
}
