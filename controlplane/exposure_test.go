package controlplane

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/api"
	dto "github.com/prometheus/client_model/go"
)

// Listening where other hosts reach the API needs a token or an explicit opt-out.
func TestListenNeedsToken(t *testing.T) {
	eng := []discovery.Engine{{ID: "e1", Model: "m", Addr: "127.0.0.1:1"}}
	for _, tc := range []struct {
		listen, token string
		insecure      bool
		ok            bool
	}{
		{"127.0.0.1:0", "", false, true},
		{"[::1]:0", "", false, true},
		{"localhost:0", "", false, true},
		{"0.0.0.0:8080", "", false, false},
		{":8080", "", false, false},
		{"10.0.0.5:8080", "", false, false},
		{"0.0.0.0:8080", "tok", false, true},
		{"0.0.0.0:8080", "", true, true},
	} {
		_, err := New(Options{Listen: tc.listen, Token: tc.token, InsecureNoToken: tc.insecure, Engines: eng, Logger: quiet()})
		if (err == nil) != tc.ok {
			t.Errorf("listen %q token %q insecure %v: err = %v", tc.listen, tc.token, tc.insecure, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "--insecure-no-token") || strings.Contains(err.Error(), "\n")) {
			t.Errorf("listen %q: the error must be one line naming the flag: %q", tc.listen, err)
		}
	}
}

// A listener given in Options is served (and its address is what the exposure check
// reads: a wildcard one needs a token like --listen's), and it is closed at shutdown.
func TestServesTheListenerItIsGiven(t *testing.T) {
	eng := []discovery.Engine{{ID: "e1", Model: "m", Addr: "127.0.0.1:1"}}
	wide, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	if _, err := New(Options{Listener: wide, Engines: eng, Logger: quiet()}); err == nil {
		t.Error("a wildcard listener was accepted without a token")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := New(Options{Listen: "127.0.0.1:9", Listener: ln, Engines: eng, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if cp.Addr() != ln.Addr().String() {
		t.Errorf("serving on %s, given %s", cp.Addr(), ln.Addr())
	}
	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %s", resp.Status)
	}
	cancel()
	cp.Wait()
	if _, err := ln.Accept(); err == nil || !errors.Is(err, net.ErrClosed) {
		t.Errorf("the listener is open after shutdown: %v", err)
	}
}

// rawRequest opens a connection, sends a POST's head and the first bytes of its body,
// and leaves the rest unsent.
func rawRequest(t *testing.T, base, path, head, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: cp\r\nContent-Type: application/json\r\n"+head+"\r\n"+first); err != nil {
		t.Fatal(err)
	}
	return c
}

// stalls are report bodies that stall after their first byte: the control plane's
// net/http reads chunked ones, its lean loop those of a declared length.
var stalls = []struct{ head, first string }{
	{"Transfer-Encoding: chunked\r\n", "1\r\n{\r\n"},
	{"Transfer-Encoding: chunked\r\n", "1\r\n{\r\n"},
	{"Content-Length: 8388608\r\n", "{"},
}

// metricOf reads one series from /metrics; -1 when absent.
func metricOf(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return metricValue(string(b), series)
}

// Report bodies are admitted as they are read, not by the size they declare: two
// chunked bodies and one declaring 8 MiB (the default --max-body-bytes), each stalled
// after a byte, hold three bytes of the 16 MiB in flight, and every filter's reports
// meanwhile are accepted. (Reserving the declared size, the first two held all 16 MiB
// and every other report got 429 for as long as they waited.)
func TestStalledReportBodiesBlockNoOne(t *testing.T) {
	_, base := startControlPlane(t, Options{Engines: []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000"}}})
	for _, s := range stalls {
		rawRequest(t, base, api.ReportsPath, s.head, s.first)
	}
	const inFlight = "kvroute_controlplane_report_bytes_in_flight"
	for deadline := time.Now().Add(20 * time.Second); metricOf(t, base, inFlight) < float64(len(stalls)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled bodies were never read: %s %v", inFlight, metricOf(t, base, inFlight))
		}
	}
	batch := `{"proxy":"p1","reports":[{"kind":"placement","model":"m","replica":"10.0.0.1:8000","domain":1,"block_size":64,"stride":4,"blocks":4,"keys":[1],"predicted_cached_tokens":0,"at_ms":1}]}`
	codes := map[int]int{}
	for range 20 {
		resp, err := http.Post(base+api.ReportsPath, "application/json", strings.NewReader(batch))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusOK] != 20 {
		t.Errorf("reports while three bodies stall: %v, want 20 x 200 (%s %v)", codes, inFlight, metricOf(t, base, inFlight))
	}
}

// A stalled body is cut at BodyTimeout on either listener, and its connection closed:
// a report batch's (net/http's chunked, the lean loop's declared length) with a 400,
// and one sent to an endpoint that reads none once net/http has answered. Before,
// net/http waited on a stalled chunked body for as long as its client did, and the
// lean loop 30 s.
func TestStalledBodiesAreCut(t *testing.T) {
	_, base := startControlPlane(t, Options{Engines: []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000"}}, BodyTimeout: 200 * time.Millisecond})
	for _, tc := range []struct {
		path, head, first string
		want              int
	}{
		{api.ReportsPath, stalls[0].head, stalls[0].first, http.StatusBadRequest},
		{api.ReportsPath, stalls[2].head, stalls[2].first, http.StatusBadRequest},
		{"/healthz", stalls[0].head, stalls[0].first, http.StatusOK},
	} {
		c := rawRequest(t, base, tc.path, tc.head, tc.first)
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a generous bound: the test is that it ends
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Errorf("%s %q: no answer: %v", tc.path, tc.head, err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %q: %s, want %d", tc.path, tc.head, resp.Status, tc.want)
		}
		if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("%s %q: the connection is still open after the answer: %v", tc.path, tc.head, err)
		}
	}
}

// Past MaxConnections every connection is refused at once (a 503 unread, then closed)
// and counted, and holds nothing: neither memory nor a goroutine grows with them, while
// the connections within the cap stay served. Before, connections past the lean loop's
// went to net/http without a bound, about 13 KB and a goroutine each.
func TestConnectionsPastTheCapAreRefused(t *testing.T) {
	const capacity, flood = 10, 400
	cp, base := startControlPlane(t, Options{Engines: []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000"}}, MaxConnections: capacity})
	refused := func() float64 { // not from /metrics: its connection would be refused
		var m dto.Metric
		cp.refused.Write(&m)
		return m.GetCounter().GetValue()
	}
	addr := strings.TrimPrefix(base, "http://")
	poll := "GET " + api.TablePath + " HTTP/1.1\r\nHost: cp\r\n\r\n"
	// Within the cap: kept-alive connections that polled once (lean, then net/http's).
	var held []*bufio.ReadWriter
	for range capacity {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(30 * time.Second))
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		rw.WriteString(poll)
		rw.Flush()
		resp, err := http.ReadResponse(rw.Reader, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		held = append(held, rw)
	}
	before, goroutines := liveMemory(), runtime.NumGoroutine()

	over := make([]net.Conn, flood)
	for i := range over {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		over[i] = c
	}
	for deadline := time.Now().Add(5 * time.Second); refused() < flood && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
	}
	grew, moreGoroutines := int64(liveMemory())-int64(before), runtime.NumGoroutine()-goroutines
	t.Logf("%d connections past a cap of %d: %v refused; live memory %+d bytes, goroutines %+d", flood, capacity, refused(), grew, moreGoroutines)
	if refused() != flood {
		t.Errorf("kvroute_controlplane_http_connections_refused_total = %v, want %d", refused(), flood)
	}
	// This process is both ends: the client side of each connection is a few hundred
	// bytes; net/http's side was 13 KB and a goroutine.
	if grew > flood*2<<10 || moreGoroutines > 10 {
		t.Errorf("the refused connections hold %d bytes and %d goroutines", grew, moreGoroutines)
	}
	for i, c := range over {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var head [12]byte
		n, err := io.ReadFull(c, head[:])
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || err == nil && string(head[:n]) != "HTTP/1.1 503" {
			t.Fatalf("connection %d past the cap: %q, %v: want a 503 or the connection closed", i, head[:n], err)
		}
	}
	for _, rw := range held {
		rw.WriteString(poll)
		rw.Flush()
		resp, err := http.ReadResponse(rw.Reader, nil)
		if err != nil {
			t.Fatalf("a connection within the cap: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
	}
}

// liveMemory is the heap and the goroutine stacks in use after a collection.
func liveMemory() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}
