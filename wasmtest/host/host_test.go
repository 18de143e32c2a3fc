package host_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

var epoch = time.Unix(1_700_000_000, 0).UTC()

// pluginConfig is the conformance plugin's configuration; tickMs 0 disables ticks.
func pluginConfig(tickMs int, cluster string) []byte {
	return []byte(fmt.Sprintf(`{"tick_ms":%d,"lease_key":"test/lease","lease_ttl_ms":1000,"cluster":%q,"queue":"reports","routing_header":"x-gateway-destination-endpoint"}`,
		tickMs, cluster))
}

func newHost(t *testing.T, cfg host.Config) *host.Host {
	t.Helper()
	if cfg.VMs == 0 {
		cfg.VMs = 2
	}
	if cfg.PluginConfig == nil {
		cfg.PluginConfig = pluginConfig(0, "control")
	}
	h, err := host.Load(context.Background(), pluginPath, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func request(method, path string, extra ...[2]string) host.Headers {
	h := host.Headers{{":method", method}, {":path", path}, {":authority", "model.local"}, {":scheme", "http"}}
	return append(h, extra...)
}

func metric(t *testing.T, h *host.Host, name string) int64 {
	t.Helper()
	m, ok := h.Metric(name)
	if !ok {
		t.Fatalf("metric %s not defined", name)
	}
	return m.Value
}

func shared(t *testing.T, h *host.Host, key string) string {
	t.Helper()
	v, _, ok := h.SharedData(key)
	if !ok {
		t.Fatalf("shared data %q not set", key)
	}
	return string(v)
}

func do(t *testing.T, h *host.Host, req host.Request) *host.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := h.Do(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// control is an in-process control plane for the plugin's HTTP calls.
type control struct {
	mu      sync.Mutex
	polls   []string // vm query of each /poll
	reports []string // lines posted to /reports
	hosts   []string
}

func (c *control) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hosts = append(c.hosts, r.Host)
	switch r.URL.Path {
	case "/poll":
		c.polls = append(c.polls, r.URL.Query().Get("vm"))
		io.WriteString(w, "table-v"+strconv.Itoa(len(c.polls)))
	case "/reports":
		b, _ := io.ReadAll(r.Body)
		c.reports = append(c.reports, strings.Split(string(b), "\n")...)
	case "/async":
		io.WriteString(w, "async-answer")
	default:
		http.NotFound(w, r)
	}
}

func (c *control) snapshot() (polls, reports, hosts []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.polls), slices.Clone(c.reports), slices.Clone(c.hosts)
}

func TestLoadRunsThePluginLifecycleOnEveryVM(t *testing.T) {
	h := newHost(t, host.Config{VMs: 3, PluginName: "kvroute-test", RootID: "root-a", VMConfig: []byte("vm-cfg"),
		Node: host.Node{ID: "node-7"}})
	vms := strings.Split(shared(t, h, "test/vms"), ",")
	if len(vms) != 3 || len(slices.Compact(slices.Sorted(slices.Values(vms)))) != 3 {
		t.Fatalf("test/vms = %q, want 3 distinct VM tokens (one CAS append per proxy_on_configure)", vms)
	}
	want := "plugin_name=kvroute-test root_id=root-a node=node-7 vm_config=vm-cfg"
	if got := shared(t, h, "test/root_props"); got != want {
		t.Fatalf("root properties = %q, want %q", got, want)
	}
	if s := h.Stats(); s.VMs != 3 || s.FailedVMs != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestSharedDataIsOneStoreForAllVMs(t *testing.T) {
	h := newHost(t, host.Config{VMs: 3})
	if err := h.SetSharedData("test/table", []byte("v7"), 0); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, vm := range h.VMs() {
		res := do(t, h, host.Request{VM: vm, Headers: request("GET", "/")})
		if got := res.Forwarded.Headers.Get("x-test-table"); got != "v7" {
			t.Errorf("vm %d read test/table = %q, want v7", vm.Index(), got)
		}
		seen[res.Forwarded.Headers.Get("x-test-vm")] = true
	}
	if len(seen) != 3 {
		t.Fatalf("requests ran on %d distinct VMs, want 3", len(seen))
	}
}

func TestSharedDataCASFollowsCppHost(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	if _, _, ok := h.SharedData("k"); ok {
		t.Fatal("absent key reported present")
	}
	// A key that does not exist is written whatever the CAS (cpp-host SharedData::set).
	if err := h.SetSharedData("k", []byte("a"), 12345); err != nil {
		t.Fatalf("first write with a made-up CAS: %v", err)
	}
	_, cas, _ := h.SharedData("k")
	if cas == 0 {
		t.Fatal("CAS number 0 after a write")
	}
	if err := h.SetSharedData("k", []byte("b"), cas+1); err == nil {
		t.Fatal("write with a stale CAS succeeded")
	}
	if err := h.SetSharedData("k", []byte("b"), cas); err != nil {
		t.Fatalf("write with the current CAS: %v", err)
	}
	if err := h.SetSharedData("k", []byte("c"), cas); err == nil {
		t.Fatal("second write with the same CAS succeeded")
	}
	if err := h.SetSharedData("k", []byte("d"), 0); err != nil {
		t.Fatalf("unconditional write: %v", err)
	}
	if v, _, _ := h.SharedData("k"); string(v) != "d" {
		t.Fatalf("value = %q, want d", v)
	}
}

func TestCASUpdatesFromParallelVMsAreNotLost(t *testing.T) {
	h := newHost(t, host.Config{VMs: 4})
	// cpp-host has no create-if-absent: two VMs that both read "not found" both write with
	// cas 0, unconditionally, and one increment is lost. So the key exists before the race.
	if err := h.SetSharedData("test/counter", []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	const workers, each, per = 4, 5, 1000
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				res, err := h.Do(context.Background(), host.Request{Headers: request("GET", "/", [2]string{"x-count", strconv.Itoa(per)})})
				if err != nil || res.Forwarded.Headers.Get("x-test-error") != "" {
					t.Errorf("%v %v", err, res.Forwarded.Headers)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := shared(t, h, "test/counter"); got != strconv.Itoa(workers*each*per) {
		t.Fatalf("counter = %s after %d CAS increments from 4 VMs in parallel", got, workers*each*per)
	}
	t.Logf("CAS retries under contention: %d", metric(t, h, "test.cas_retries"))
}

func TestOnlyOneVMWinsTheLease(t *testing.T) {
	clk := clock.NewVirtual(epoch)
	ctl := &control{}
	h := newHost(t, host.Config{VMs: 4, Clock: clk, PluginConfig: pluginConfig(100, "control"),
		Clusters: map[string]host.Cluster{"control": {Handler: ctl}}})
	if n := metric(t, h, "test.leaders"); n != 0 {
		t.Fatalf("%d leaders before the first tick", n)
	}
	clk.Advance(100 * time.Millisecond)
	if n := metric(t, h, "test.leaders"); n != 1 {
		t.Fatalf("%d VMs believe they lead after the first tick, want 1", n)
	}
	leader := shared(t, h, "test/leader")
	for range 10 {
		clk.Advance(100 * time.Millisecond)
		if n := metric(t, h, "test.leaders"); n != 1 {
			t.Fatalf("%d leaders, want 1", n)
		}
		if got := shared(t, h, "test/leader"); got != leader {
			t.Fatalf("leader changed from %s to %s while renewing", leader, got)
		}
	}
	polls, _, _ := ctl.snapshot()
	if len(polls) != 11 || slices.ContainsFunc(polls, func(vm string) bool { return vm != leader }) {
		t.Fatalf("polls from %v, want 11 from the leader %s only", polls, leader)
	}
	if got := shared(t, h, "test/table"); got != "table-v11" {
		t.Fatalf("published table %q, want the 11th poll's answer", got)
	}

	// Someone else holds the lease for 500 ms: the leader steps down at its next tick and a
	// VM takes over once the foreign lease has expired.
	foreign := fmt.Sprintf("outsider:%d", clk.Now().Add(500*time.Millisecond).UnixNano())
	if err := h.SetSharedData("test/lease", []byte(foreign), 0); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * time.Millisecond)
	if n := metric(t, h, "test.leaders"); n != 0 {
		t.Fatalf("%d leaders while an outsider holds the lease, want 0", n)
	}
	clk.Advance(500 * time.Millisecond)
	if n := metric(t, h, "test.leaders"); n != 1 {
		t.Fatalf("%d leaders after the outsider's lease expired, want 1", n)
	}
}

func TestTicksFirePerVMOnTheVirtualClock(t *testing.T) {
	clk := clock.NewVirtual(epoch)
	h := newHost(t, host.Config{VMs: 3, Clock: clk, PluginConfig: pluginConfig(100, "control"),
		Clusters: map[string]host.Cluster{"control": {Handler: &control{}}}})
	clk.Advance(99 * time.Millisecond)
	if n := metric(t, h, "test.ticks"); n != 0 {
		t.Fatalf("%d ticks before the first period elapsed", n)
	}
	clk.Advance(time.Millisecond)
	if n := metric(t, h, "test.ticks"); n != 3 {
		t.Fatalf("%d ticks after one period, want one per VM (3)", n)
	}
	clk.Advance(time.Second)
	if n := metric(t, h, "test.ticks"); n != 33 {
		t.Fatalf("%d ticks after 1.1 s, want 33", n)
	}
	for _, vm := range strings.Split(shared(t, h, "test/vms"), ",") {
		if got := shared(t, h, "test/ticks/"+vm); got != "11" {
			t.Errorf("vm %s counted %s ticks, want 11", vm, got)
		}
		// The guest's time.Now is the host clock's.
		if got := shared(t, h, "test/start/"+vm); got != strconv.FormatInt(epoch.UnixNano(), 10) {
			t.Errorf("vm %s started at %s (guest clock), want the virtual epoch %d", vm, got, epoch.UnixNano())
		}
	}
}

func TestVirtualRunsRepeatWithSeededRandomness(t *testing.T) {
	run := func() (string, string) {
		clk := clock.NewVirtual(epoch)
		h := newHost(t, host.Config{VMs: 3, Clock: clk, Rand: host.SeededRand(42),
			PluginConfig: pluginConfig(100, "control"), Clusters: map[string]host.Cluster{"control": {Handler: &control{}}}})
		clk.Advance(300 * time.Millisecond)
		return shared(t, h, "test/vms"), shared(t, h, "test/leader")
	}
	vms1, leader1 := run()
	vms2, leader2 := run()
	if vms1 != vms2 || leader1 != leader2 {
		t.Fatalf("two seeded runs differ: %s/%s vs %s/%s", vms1, leader1, vms2, leader2)
	}
}

func TestDispatchHttpCallReachesARealServer(t *testing.T) {
	ctl := &control{}
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	clk := clock.NewVirtual(epoch)
	h := newHost(t, host.Config{VMs: 2, Clock: clk, PluginConfig: pluginConfig(100, "control"),
		Clusters: map[string]host.Cluster{"control": {URL: srv.URL}}})
	clk.Advance(100 * time.Millisecond) // the leader polls; the response comes back inside Advance
	polls, _, hosts := ctl.snapshot()
	if len(polls) != 1 || polls[0] != shared(t, h, "test/leader") {
		t.Fatalf("server saw polls %v, want one from the leader", polls)
	}
	if hosts[0] != "control" {
		t.Fatalf("server saw Host %q, want the call's :authority", hosts[0])
	}
	if got := shared(t, h, "test/table"); got != "table-v1" {
		t.Fatalf("response callback published %q, want table-v1", got)
	}
	if n := metric(t, h, "test.polls"); n != 1 {
		t.Fatalf("test.polls = %d", n)
	}
	if s := h.Stats(); s.HTTPCalls != 1 {
		t.Fatalf("HTTPCalls = %d", s.HTTPCalls)
	}
}

func TestPausedRequestResumesFromTheHTTPCallResponse(t *testing.T) {
	ctl := &control{}
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	h := newHost(t, host.Config{VMs: 2, Clusters: map[string]host.Cluster{"control": {URL: srv.URL}}})
	res := do(t, h, host.Request{Headers: request("POST", "/v1/completions", [2]string{"x-async", "1"}),
		Body: [][]byte{[]byte(`{"prompt":"x"}`)}})
	if got := res.Forwarded.Headers.Get("x-async-result"); got != "async-answer" {
		t.Fatalf("x-async-result = %q, want the server's answer set before resuming", got)
	}
	if got := res.Forwarded.Headers.Get("x-async-status"); !strings.HasPrefix(got, "200/") {
		t.Fatalf("x-async-status = %q", got)
	}
	if string(res.Forwarded.Body) != `{"prompt":"x"}` {
		t.Fatalf("forwarded body %q", res.Forwarded.Body)
	}
}

func TestHTTPCallFailuresArriveAsEnvoyLocalReplies(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + closed.Addr().String()
	closed.Close()
	cases := []struct {
		name    string
		cluster host.Cluster
		advance time.Duration
		status  string // x-async-status: ":status/number of headers"
		body    string
	}{
		{"connection refused", host.Cluster{URL: deadURL}, 0, "503/3", "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"},
		{"timeout", host.Cluster{Handler: &control{}, Latency: 10 * time.Second}, 5 * time.Second, "504/3", "upstream request timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewVirtual(epoch)
			h := newHost(t, host.Config{VMs: 1, Clock: clk, Clusters: map[string]host.Cluster{"control": tc.cluster}})
			rec := host.NewRecorder()
			s := h.NewStream(host.StreamInfo{}, rec.Hooks())
			defer s.Close()
			if a, err := s.SendRequestHeaders(request("POST", "/", [2]string{"x-async", "1"}), false); err != nil || a != host.ActionPause {
				t.Fatalf("headers: %v %v", a, err)
			}
			if a, err := s.SendRequestBody([]byte("{}"), true); err != nil || a != host.ActionPause {
				t.Fatalf("body: %v %v, want pause while the call is out", a, err)
			}
			if _, sent, _ := rec.Request(); sent {
				t.Fatal("request left the filter before the call answered")
			}
			if tc.advance > 0 {
				clk.Advance(tc.advance - time.Millisecond)
				if _, sent, _ := rec.Request(); sent {
					t.Fatal("request released before the call's timeout")
				}
				clk.Advance(time.Millisecond)
			} else {
				clk.Advance(0)
			}
			m, _, complete := rec.Request()
			if !complete {
				t.Fatal("request still held after the call's outcome was due")
			}
			if got := m.Headers.Get("x-async-status"); got != tc.status {
				t.Errorf("x-async-status = %q, want %q", got, tc.status)
			}
			if got := m.Headers.Get("x-async-result"); got != tc.body {
				t.Errorf("x-async-result = %q, want %q", got, tc.body)
			}
		})
	}
	t.Run("no authority", func(t *testing.T) {
		h := newHost(t, host.Config{VMs: 1, Clusters: map[string]host.Cluster{"control": {Handler: &control{}}}})
		res := do(t, h, host.Request{Headers: request("GET", "/", [2]string{"x-bad-call", "1"})})
		if got := res.Forwarded.Headers.Get("x-test-error"); !strings.Contains(got, "bad argument") {
			t.Fatalf("x-test-error = %q, want bad argument for a call without :authority", got)
		}
		if h.Stats().HTTPCalls != 0 {
			t.Fatal("a refused call was counted")
		}
	})
	t.Run("unknown cluster", func(t *testing.T) {
		h := newHost(t, host.Config{VMs: 1, PluginConfig: pluginConfig(0, "no-such-cluster")})
		res := do(t, h, host.Request{Headers: request("POST", "/", [2]string{"x-async", "1"}), Body: [][]byte{[]byte("{}")}})
		if got := res.Forwarded.Headers.Get("x-test-error"); !strings.Contains(got, "bad argument") {
			t.Fatalf("x-test-error = %q, want the dispatch's bad argument", got)
		}
	})
}

func TestQueueItemsFromAllVMsAreDrainedByTheLeader(t *testing.T) {
	clk := clock.NewVirtual(epoch)
	ctl := &control{}
	h := newHost(t, host.Config{VMs: 3, Clock: clk, PluginConfig: pluginConfig(100, "control"),
		Clusters: map[string]host.Cluster{"control": {Handler: ctl}}})
	// Before a leader registered the queue, reports are dropped (and counted).
	do(t, h, host.Request{Headers: request("POST", "/"), Body: [][]byte{[]byte("{}")}})
	if n := metric(t, h, "test.reports_dropped"); n != 1 {
		t.Fatalf("reports_dropped = %d", n)
	}
	clk.Advance(100 * time.Millisecond)
	leader := shared(t, h, "test/leader")
	for _, vm := range h.VMs() {
		do(t, h, host.Request{VM: vm, Headers: request("POST", "/"), Body: [][]byte{[]byte(`{"n":1}`)}})
	}
	if n := h.QueueLen("reports"); n != 3 {
		t.Fatalf("queue holds %d items, want 3: proxy_on_queue_ready must not run inside the enqueuing callback", n)
	}
	clk.Advance(0) // deliver the queue-ready callbacks, and the leader's POST
	if n := h.QueueLen("reports"); n != 0 {
		t.Fatalf("%d items left in the queue", n)
	}
	if n := metric(t, h, "test.reports_dequeued"); n != 3 {
		t.Fatalf("dequeued %d, want 3", n)
	}
	for _, key := range h.SharedDataKeys() {
		if strings.HasPrefix(key, "test/dequeued_by/") && key != "test/dequeued_by/"+leader {
			t.Fatalf("%s dequeued, but only the registering VM %s should", key, leader)
		}
	}
	_, reports, _ := ctl.snapshot()
	vms := map[string]bool{}
	for _, r := range reports {
		f := strings.Fields(r)
		vms[strings.TrimPrefix(f[1], "vm=")] = true
	}
	if len(reports) != 3 || len(vms) != 3 {
		t.Fatalf("control plane got %q, want one report from each of the 3 VMs", reports)
	}
	if n := metric(t, h, "test.reports_posted"); n != 3 {
		t.Fatalf("reports_posted = %d", n)
	}
}

func TestPausedRequestResumesAfterTheBody(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	rec := host.NewRecorder()
	s := h.NewStream(host.StreamInfo{}, rec.Hooks())
	defer s.Close()
	part1, part2 := `{"prompt":"hello","route":`, `"10.0.0.1:8000,10.0.0.2:8000"}`
	steps := []struct {
		send func() (host.Action, error)
		want host.Action
	}{
		{func() (host.Action, error) {
			return s.SendRequestHeaders(request("POST", "/v1/completions", [2]string{"x-gateway-destination-endpoint", "6.6.6.6:1"}), false)
		}, host.ActionPause},
		{func() (host.Action, error) { return s.SendRequestBody([]byte(part1), false) }, host.ActionPause},
		{func() (host.Action, error) { return s.SendRequestBody([]byte(part2), true) }, host.ActionContinue},
	}
	for i, st := range steps {
		a, err := st.send()
		if err != nil || a != st.want {
			t.Fatalf("step %d: %v %v, want %v", i, a, err, st.want)
		}
		if _, sent, _ := rec.Request(); sent != (i == len(steps)-1) {
			t.Fatalf("step %d: request left the filter = %v", i, sent)
		}
	}
	m, _, complete := rec.Request()
	if !complete {
		t.Fatal("request not complete")
	}
	if got := m.Headers.Get("x-gateway-destination-endpoint"); got != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Fatalf("routing header %q, want the body's choice (the client's was stripped)", got)
	}
	if got, want := m.Headers.Get("x-test-body-size"), strconv.Itoa(len(part1+part2)); got != want {
		t.Fatalf("filter saw %s body bytes at end of stream, want the cumulative %s", got, want)
	}
	if string(m.Body) != part1+part2 {
		t.Fatalf("forwarded body %q", m.Body)
	}
	if e := m.Headers.Get("x-test-error"); e != "" {
		t.Fatal(e)
	}
}

func TestHeadersPropertiesAndEdits(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1, PluginName: "kvroute-test", Node: host.Node{ID: "node-7"}})
	res := do(t, h, host.Request{
		Info: host.StreamInfo{SourceAddress: "10.1.2.3:5555"},
		Headers: request("GET", "/v1/models?q=1", [2]string{"x-remove-me", "a"}, [2]string{"x-remove-me", "b"},
			[2]string{"x-replace-me", "old"}, [2]string{"User-Agent", "ua/1"}, [2]string{"x-set-pairs", "1"},
			[2]string{"x-gateway-destination-endpoint", "6.6.6.6:1"}),
	})
	f := res.Forwarded.Headers
	want := map[string]string{
		"x-replace-me": "replaced", "x-added": "1", "x-test-path": "/v1/models?q=1", "x-test-method": "GET",
		"x-test-source": "10.1.2.3:5555", "x-test-plugin": "kvroute-test", "x-test-node": "node-7",
		"x-test-ua": "ua/1", "x-test-state": "headers-seen", "x-test-requests-seen": "1",
	}
	for k, v := range want {
		if got := f.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for _, k := range []string{"x-remove-me", "x-gateway-destination-endpoint", "x-test-error"} {
		if vs := f.Values(k); len(vs) != 0 {
			t.Errorf("%s = %q, want it removed", k, vs)
		}
	}
	if got := f.Get("x-pairs-set"); got == "" {
		t.Error("proxy_set_header_map_pairs did not take effect")
	}
	if len(res.Actions) != 2 || res.Actions[0] != host.ActionContinue {
		t.Errorf("actions %v: a GET ends at its headers, the filter continues there", res.Actions)
	}
}

func TestRequestHeadersAfterTheyAreReleased(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	// Continued at the headers: Envoy nulls the request map, later reads are bad arguments.
	get := do(t, h, host.Request{Headers: request("GET", "/")})
	if got := get.Response.Headers.Get("x-test-request-headers-in-response"); !strings.Contains(got, "bad argument") {
		t.Errorf("GET: request header read in the response phase gave %q, want bad argument", got)
	}
	// Held at the headers and continued from the body: Envoy keeps the map.
	post := do(t, h, host.Request{Headers: request("POST", "/"), Body: [][]byte{[]byte("{}")}})
	if got := post.Response.Headers.Get("x-test-request-headers-in-response"); got != "ok" {
		t.Errorf("POST: request header read in the response phase gave %q, want ok", got)
	}
}

func TestResponseBodyGoesThroughTheFilterPerChunk(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	upstream := func(host.Message) host.Response {
		return host.Response{Headers: host.Headers{{":status", "200"}, {"content-type", "text/event-stream"}},
			Body: [][]byte{[]byte("ab"), []byte("cd"), []byte("ef")}}
	}
	res := do(t, h, host.Request{Headers: request("GET", "/", [2]string{"x-upper-response", "1"}), Upstream: upstream})
	if got := fmt.Sprintf("%q", res.ResponseChunks); got != `["AB" "CD" "EF"]` {
		t.Fatalf("chunks %s, want each chunk rewritten and passed on its own", got)
	}
	if got := res.Response.Headers.Get("x-test-filter"); got == "" {
		t.Fatal("response headers callback did not run")
	}
	res = do(t, h, host.Request{Headers: request("GET", "/", [2]string{"x-buffer-response", "1"}), Upstream: upstream})
	if got := fmt.Sprintf("%q", res.ResponseChunks); got != `["abcdef|buffered=6"]` {
		t.Fatalf("chunks %s, want one buffered body", got)
	}
	if n := metric(t, h, "test.response_chunks"); n != 6 {
		t.Fatalf("response body callbacks with data = %d, want 6", n)
	}
}

func TestTrailersBothWays(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	res := do(t, h, host.Request{
		Headers:  request("POST", "/"),
		Body:     [][]byte{[]byte(`{"route":"10.0.0.9:80"}`)},
		Trailers: host.Headers{{"x-client-trailer", "1"}},
		Upstream: func(host.Message) host.Response {
			return host.Response{Headers: host.Headers{{":status", "200"}}, Body: [][]byte{[]byte("ok")},
				Trailers: host.Headers{{"x-upstream-trailer", "1"}}}
		},
	})
	f := res.Forwarded
	if f.Headers.Get("x-test-trailers") != "1" || f.Headers.Get("x-gateway-destination-endpoint") != "10.0.0.9:80" {
		t.Errorf("the filter decides at the trailers (the body never saw end of stream): %v", f.Headers)
	}
	if f.Trailers.Get("x-client-trailer") != "1" || f.Trailers.Get("x-trailer-seen") != "1" {
		t.Errorf("forwarded trailers %v", f.Trailers)
	}
	if res.Response.Trailers.Get("x-upstream-trailer") != "1" || res.Response.Trailers.Get("x-test-trailer") != "1" {
		t.Errorf("response trailers %v", res.Response.Trailers)
	}
}

func TestLocalReplyGoesThroughTheResponseCallbacks(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	res := do(t, h, host.Request{Headers: request("GET", "/", [2]string{"x-local-reply", "1"}),
		Upstream: func(host.Message) host.Response { t.Error("upstream called for a local reply"); return host.Response{} }})
	if res.LocalReply != 418 || res.Response.Headers.Get(":status") != "418" || string(res.Response.Body) != "teapot" {
		t.Fatalf("local reply %d %v %q", res.LocalReply, res.Response.Headers, res.Response.Body)
	}
	if res.Response.Headers.Get("x-test-local") != "1" || res.Response.Headers.Get("x-test-filter") == "" {
		t.Fatalf("headers %v: want the reply's own header and the response callback's", res.Response.Headers)
	}
}

func TestBodyOverTheBufferLimitIs413(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	res := do(t, h, host.Request{Info: host.StreamInfo{BufferLimit: 16}, Headers: request("POST", "/"),
		Body:     [][]byte{[]byte("0123456789"), []byte("0123456789"), []byte("tail")},
		Upstream: func(host.Message) host.Response { t.Error("upstream called"); return host.Response{} }})
	if res.LocalReply != 413 || string(res.Response.Body) != "Payload Too Large" {
		t.Fatalf("got %d %q, want 413", res.LocalReply, res.Response.Body)
	}
}

func TestTrapFailsOpen(t *testing.T) {
	h := newHost(t, host.Config{VMs: 2})
	held := host.NewRecorder()
	s := h.VM(0).NewStream(host.StreamInfo{}, held.Hooks())
	defer s.Close()
	if a, _ := s.SendRequestHeaders(request("POST", "/"), false); a != host.ActionPause {
		t.Fatal("POST headers not held")
	}
	res := do(t, h, host.Request{VM: h.VM(0), Headers: request("GET", "/", [2]string{"x-panic", "1"}, [2]string{"x-remove-me", "1"})})
	if !res.FailedOpen || res.Forwarded.Headers.Get("x-remove-me") != "1" || res.Forwarded.Headers.Get("x-added") != "" {
		t.Fatalf("trapping request: failed open %v, forwarded %v; want it passed on untouched", res.FailedOpen, res.Forwarded.Headers)
	}
	if err := h.VM(0).Failed(); err == nil || !strings.Contains(err.Error(), "panic: test plugin: panic requested") {
		t.Fatalf("VM error %v, want the guest's panic", err)
	}
	// The stream the VM was holding goes on without the filter.
	if _, sent, _ := held.Request(); !sent {
		t.Fatal("stream held by the failed VM was not released")
	}
	if a, err := s.SendRequestBody([]byte("x"), true); a != host.ActionContinue || err != nil {
		t.Fatalf("body after failure: %v %v", a, err)
	}
	if again := do(t, h, host.Request{VM: h.VM(0), Headers: request("GET", "/")}); !again.FailedOpen {
		t.Fatal("a later request on the failed VM ran the filter")
	}
	if other := do(t, h, host.Request{VM: h.VM(1), Headers: request("GET", "/")}); other.FailedOpen || other.Forwarded.Headers.Get("x-added") != "1" {
		t.Fatal("the healthy VM did not filter")
	}
	st := h.Stats()
	if st.VMFailures != 1 || st.FailedVMs != 1 || st.FailOpenStreams != 3 {
		t.Fatalf("stats %+v, want 1 failure and 3 fail-open streams", st)
	}
}

func TestMetricsAreSharedByNameAcrossVMs(t *testing.T) {
	h := newHost(t, host.Config{VMs: 2})
	sizes := []int{3, 5, 7, 11}
	for _, n := range sizes {
		do(t, h, host.Request{Headers: request("POST", "/"), Body: [][]byte{[]byte(strings.Repeat("x", n))}})
	}
	if n := metric(t, h, "test.requests"); n != 4 {
		t.Fatalf("test.requests = %d", n)
	}
	if n := metric(t, h, "test.inflight"); n != 0 {
		t.Fatalf("test.inflight = %d after every stream closed", n)
	}
	hist, _ := h.Metric("test.request_body_bytes")
	if hist.Type != host.Histogram || hist.Count != 4 || hist.Sum != 26 {
		t.Fatalf("histogram %+v", hist)
	}
}

func TestDisallowHeadersStopIterationHidesTheBody(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1, DisallowHeadersStopIteration: true})
	rec := host.NewRecorder()
	s := h.NewStream(host.StreamInfo{}, rec.Hooks())
	defer s.Close()
	s.SendRequestHeaders(request("POST", "/"), false)
	if a, _ := s.SendRequestBody([]byte(`{"route":"10.0.0.1:1"}`), true); a != host.ActionPause {
		t.Fatal("body passed a StopAll stream")
	}
	if _, sent, _ := rec.Request(); sent {
		t.Fatal("request left the filter")
	}
	if hist, _ := h.Metric("test.request_body_bytes"); hist.Count != 0 {
		t.Fatal("the body callback ran under StopAllIteration")
	}
}

func TestLoadFailures(t *testing.T) {
	// (module (import "env" "proxy_does_not_exist" (func)))
	missingImport := []byte{0, 'a', 's', 'm', 1, 0, 0, 0,
		1, 4, 1, 0x60, 0, 0,
		2, 28, 1, 3, 'e', 'n', 'v', 20, 'p', 'r', 'o', 'x', 'y', '_', 'd', 'o', 'e', 's', '_', 'n', 'o', 't', '_', 'e', 'x', 'i', 's', 't', 0, 0}
	// (module): no imports, no ABI version export.
	empty := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	cases := []struct {
		name string
		wasm func(t *testing.T) []byte
		cfg  host.Config
		want string
	}{
		{"missing import", func(*testing.T) []byte { return missingImport }, host.Config{}, "env.proxy_does_not_exist"},
		{"no ABI version", func(*testing.T) []byte { return empty }, host.Config{}, "ABI version"},
		{"configure fails", readPlugin, host.Config{PluginConfig: []byte("{not json")}, "proxy_on_configure returned false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.VMs = 1
			h, err := host.New(context.Background(), tc.wasm(t), tc.cfg)
			if err == nil {
				h.Close(context.Background())
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func readPlugin(t *testing.T) []byte {
	t.Helper()
	b, err := readFile(pluginPath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A filter that buffered the first chunk never sees a second chunk that takes the buffer
// past the limit: Envoy adds the chunk to its buffer first and answers 413 there, even if
// the filter would have continued on it (here, on end of stream). The host used to call
// the filter with 20 bytes and pass them upstream.
func TestChunkPastTheBufferLimitIs413BeforeTheFilterSeesIt(t *testing.T) {
	h := newHost(t, host.Config{VMs: 1})
	res := do(t, h, host.Request{Info: host.StreamInfo{BufferLimit: 16}, Headers: request("POST", "/"),
		Body:     [][]byte{[]byte("0123456789"), []byte("0123456789")},
		Upstream: func(host.Message) host.Response { t.Error("upstream called"); return host.Response{} }})
	if res.LocalReply != 413 {
		t.Fatalf("got local reply %d, want 413", res.LocalReply)
	}
}
