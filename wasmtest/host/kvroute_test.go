package host_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
	"github.com/kvroute/kvroute/wasmtest/proxy"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// These tests run the real kvroute.wasm in the host, as Envoy would with several worker
// threads; the conformance plugin in testdata covers the ABI in general.

const kvCluster = "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local"

var kvConfig = []byte(`{"control_plane":{"cluster":"` + kvCluster + `","authority":"kvroute-controlplane","poll_ms":100,"report_ms":100}}`)

var kvSystem = strings.Repeat("You are the assistant of a parcel company; follow the policy. ", 300)

func kvChat(system, q string) []byte {
	return []byte(fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, q))
}

// kv32K is the benchmarks' 32 KB chat body (about 8,000 tokens, the sizing example's).
var kv32K = kvChat(kvSystem+strings.Repeat("More context. ", 600), "where is my parcel")

// kvRequest is a chat request with body (in the chunks given) answered by
// 127.0.0.1:9002, kvSystem's prefix owner, with usage.
func kvRequest(body ...[]byte) host.Request {
	return host.Request{
		Headers:         host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}},
		Body:            body,
		UpstreamAddress: "127.0.0.1:9002",
		Upstream: func(host.Message) host.Response {
			return host.Response{Headers: host.Headers{{":status", "200"}},
				Body: [][]byte{[]byte(`{"usage":{"prompt_tokens":8000,"prompt_tokens_details":{"cached_tokens":6000}}}`)}}
		},
	}
}

// kvTable: three replicas with clearly different costs (no near ties), replica 1 holding
// kvSystem's prefix.
func kvTable(t testing.TB) *table.Table { return kvTableOf(t, kvSystem) }

// kvSystemLines is kvSystem in lines, each ending in a newline (an escape in JSON), as
// prompts written in markdown or lists are: a run of plain bytes ends every 62 bytes.
var kvSystemLines = strings.Repeat("You are the assistant of a parcel company; follow the policy.\n", 300)

// kvTableOf is kvTable with replica 1 holding system's prefix.
func kvTableOf(t testing.TB, system string) *table.Table {
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	rs := []table.Replica{
		{Slot: 0, ID: "a", Addr: "127.0.0.1:9001", Queued: 1000, Healthy: true, StateAgeMs: 20},
		{Slot: 1, ID: "b", Addr: "127.0.0.1:9002", Queued: 3000, Healthy: true, StateAgeMs: 20},
		{Slot: 2, ID: "c", Addr: "127.0.0.1:9003", Queued: 9000, Healthy: true, StateAgeMs: 20},
	}
	m, err := table.NewModel("llama", cfg, rs)
	require.NoError(t, err)
	var p prompt.Parser
	req, err := p.Parse(prompt.Chat, kvChat(system, "earlier question"), prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 64})
	require.NoError(t, err)
	c := route.NewChain(cfg, route.Identity{Model: "llama"}, &req, nil)
	for _, k := range prefix.Checkpoints(nil, c.Keys, 4) {
		require.NoError(t, m.Set(k, 1))
	}
	tb := table.New()
	tb.Version = 1
	tb.Models["llama"] = m
	return tb
}

// fakeControlPlane serves one table version and records what the filters send.
type fakeControlPlane struct {
	frame []byte
	mu    sync.Mutex
	polls int
	batch []api.ReportBatch
}

func (f *fakeControlPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case api.TablePath:
		f.polls++
		if r.URL.Query().Get("version") == "1" {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("content-type", api.TableContentType)
		w.Write(f.frame)
	case api.ReportsPath:
		b, _ := io.ReadAll(r.Body)
		rb, rejected, err := api.ParseReportBatch(b)
		if err == nil && len(rejected) > 0 {
			err = rejected[0]
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.batch = append(f.batch, rb)
		w.WriteHeader(http.StatusNoContent)
	case api.AffinityPath:
		// A current control plane that has heard of no other proxy's responses.
		w.Header().Set("content-type", api.AffinityContentType)
		w.Write(api.AppendAffinityHead(nil, 1, 0))
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeControlPlane) reports() []api.Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Report
	for _, b := range f.batch {
		out = append(out, b.Reports...)
	}
	return out
}

func loadKvroute(t testing.TB, cfg host.Config) *host.Host {
	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	return loadModule(t, path, cfg)
}

// loadModule is loadKvroute with the module at path (a baseline's, say).
func loadModule(t testing.TB, path string, cfg host.Config) *host.Host {
	cfg.PluginConfig = kvConfig
	h, err := host.Load(context.Background(), path, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

// loadQuiet loads the filter (cfg as given, its clock and control-plane cluster set
// here) on a virtual clock, against a control plane that answers kvTable's frame and then
// 304 and keeps no report, and advances the clock until the leader has polled and the
// table has arrived.
func loadQuiet(t testing.TB, cfg host.Config) (*host.Host, *clock.Virtual) {
	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	return loadQuietModule(t, path, cfg)
}

// loadQuietModule is loadQuiet with the module at path.
func loadQuietModule(t testing.TB, path string, cfg host.Config) (*host.Host, *clock.Virtual) {
	cp := &quietControlPlane{frame: table.EncodeFull(kvTable(t))}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	cfg.Clock = clk
	cfg.Clusters = map[string]host.Cluster{kvCluster: {Handler: cp}}
	h := loadModule(t, path, cfg)
	clk.Advance(200 * time.Millisecond)
	return h, clk
}

func endpointOf(m host.Message) string { return m.Headers.Get(api.DefaultEndpointHeader) }

// Four worker VMs: one leader polls, the table it publishes in shared data reaches every
// VM, and the reports from every VM reach a real HTTP server.
func TestKvrouteLeaderTableAndReportsAcrossVMs(t *testing.T) {
	cp := &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}
	srv := httptest.NewServer(cp)
	defer srv.Close()
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 4, Clock: clk, Rand: host.SeededRand(7),
		Clusters: map[string]host.Cluster{kvCluster: {URL: srv.URL}}})

	clk.Advance(2 * time.Second) // 20 ticks of every VM
	cp.mu.Lock()
	polls := cp.polls
	cp.mu.Unlock()
	assert.InDelta(t, 20, polls, 2, "one VM polls on each of its ticks, not four")
	lease, _, ok := h.SharedData("kvroute/lease")
	require.True(t, ok)
	owner := binary.LittleEndian.Uint64(lease)
	clk.Advance(time.Second)
	lease, _, _ = h.SharedData("kvroute/lease")
	assert.Equal(t, owner, binary.LittleEndian.Uint64(lease), "the leader keeps its lease")

	for i := 0; i < 4; i++ {
		res, err := h.Do(context.Background(), host.Request{
			VM:              h.VM(i),
			Headers:         host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}},
			Body:            [][]byte{kvChat(kvSystem, fmt.Sprint("question ", i))},
			UpstreamAddress: "127.0.0.1:9002",
			Upstream: func(host.Message) host.Response {
				return host.Response{Headers: host.Headers{{":status", "200"}},
					Body: [][]byte{[]byte(`{"usage":{"prompt_tokens":4800,"prompt_tokens_details":{"cached_tokens":4704}}}`)}}
			},
		})
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003", endpointOf(res.Forwarded), "VM %d routes on the leader's table", i)
	}
	clk.Advance(500 * time.Millisecond)
	rs := cp.reports()
	require.Len(t, rs, 12, "a placement, a start and an outcome from each VM")
	outcomes, starts := 0, 0
	for _, r := range rs {
		assert.Equal(t, "127.0.0.1:9002", r.Replica)
		switch r.Kind {
		case api.KindOutcome:
			outcomes++
			assert.Equal(t, 4704, r.CachedTokens)
		case api.KindStart:
			starts++
		}
	}
	assert.Equal(t, 4, outcomes)
	assert.Equal(t, 4, starts)
	v, ok := h.Metric("kvroute_decisions_total")
	require.True(t, ok)
	assert.Equal(t, int64(4), v.Value)
}

// A worker VM that has not ticked since the leader published its first table routes on
// it anyway: Envoy starts workers (and reloads config) while traffic flows, and a VM
// failing open until its own next tick would scatter exactly the first requests.
func TestKvrouteFirstRequestOnANewVMUsesTheSharedTable(t *testing.T) {
	cp := &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(5),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}}})

	// One tick: every VM ticks (none has a table), the leader polls, and the answer
	// lands after the other VM's tick is over.
	clk.Advance(100 * time.Millisecond)
	require.Eventually(t, func() bool {
		v, _ := h.Metric("kvroute_table_version")
		return v.Value == 1
	}, 5*time.Second, time.Millisecond, "the leader published v1")

	for i := 0; i < 2; i++ {
		res, err := h.Do(context.Background(), host.Request{
			VM:      h.VM(i),
			Headers: host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}},
			Body:    [][]byte{kvChat(kvSystem, fmt.Sprint("first question ", i))},
		})
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003", endpointOf(res.Forwarded), "VM %d", i)
	}
	unrouted, _ := h.Metric("kvroute_unrouted_total")
	assert.Zero(t, unrouted.Value)
}

// A request whose body is whole before the first table is held, its stream paused, and
// resumed on the tick after the table arrives, routed on it and with its body (and
// trailers) as sent (Envoy keeps a paused stream's headers and buffered body; the filter resumes it with
// proxy_continue_stream on the stream's effective context). A held stream the client
// resets is never resumed.
func TestKvrouteRequestBeforeTheFirstTableIsHeldUntilItComes(t *testing.T) {
	cp := &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(5),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}}})

	send := func(vm int, q string) (*host.Recorder, *host.Stream) {
		rec := host.NewRecorder()
		s := h.VM(vm).NewStream(host.StreamInfo{}, rec.Hooks())
		_, err := s.SendRequestHeaders(host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}}, false)
		require.NoError(t, err)
		a, err := s.SendRequestBody(kvChat(kvSystem, q), true)
		require.NoError(t, err)
		assert.Equal(t, host.ActionPause, a, "held: no table yet")
		return rec, s
	}
	held := make([]*host.Recorder, 2)
	for i := range held {
		var s *host.Stream
		held[i], s = send(i, fmt.Sprint("early question ", i))
		defer s.Close()
	}
	// HTTP/2 with trailers: the body callback never sees end of stream, the trailers
	// callback decides and holds.
	trailed := host.NewRecorder()
	ts := h.VM(0).NewStream(host.StreamInfo{}, trailed.Hooks())
	defer ts.Close()
	_, err := ts.SendRequestHeaders(host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}}, false)
	require.NoError(t, err)
	_, err = ts.SendRequestBody(kvChat(kvSystem, "with trailers"), false)
	require.NoError(t, err)
	a, err := ts.SendRequestTrailers(host.Headers{{"x-checksum", "1"}})
	require.NoError(t, err)
	assert.Equal(t, host.ActionPause, a, "held in the trailers callback")

	_, gone := send(1, "a client that leaves")
	gone.Reset("client went away")
	gone.Close() // Envoy destroys a reset stream's filters at once: proxy_on_log, on_done, on_delete

	clk.Advance(100 * time.Millisecond) // every VM ticks; the leader polls
	require.Eventually(t, func() bool {
		v, _ := h.Metric("kvroute_table_version")
		return v.Value == 1
	}, 5*time.Second, time.Millisecond, "the leader published v1")
	for _, rec := range held {
		_, sent, _ := rec.Request()
		assert.False(t, sent, "still held: the table came after this tick")
	}
	clk.Advance(100 * time.Millisecond)
	for i, rec := range held {
		require.NoError(t, rec.WaitRequest(context.Background()))
		m, _, complete := rec.Request()
		assert.True(t, complete)
		assert.Equal(t, "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003", endpointOf(m), "VM %d routes on the table", i)
		assert.Equal(t, kvChat(kvSystem, fmt.Sprint("early question ", i)), m.Body)
	}
	require.NoError(t, trailed.WaitRequest(context.Background()))
	m, _, complete := trailed.Request()
	assert.True(t, complete)
	assert.Equal(t, "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003", endpointOf(m))
	assert.Equal(t, kvChat(kvSystem, "with trailers"), m.Body)
	assert.Equal(t, "1", m.Trailers.Get("x-checksum"), "the trailers follow the resumed body")
	heldN, _ := h.Metric("kvroute_held_for_table_total")
	unrouted, _ := h.Metric("kvroute_unrouted_total")
	decisions, _ := h.Metric("kvroute_decisions_total")
	assert.Equal(t, int64(4), heldN.Value)
	assert.Zero(t, unrouted.Value)
	assert.Equal(t, int64(3), decisions.Value, "the reset stream was never routed")
	for _, l := range h.Logs() {
		assert.NotContains(t, l.Message, "held for the first table", "nothing left to resume")
	}
}

// The filter holds the headers until the whole body is in, then lets the request go
// with the endpoint header set; a client-sent endpoint header never survives.
func TestKvroutePausedRequestResumesAfterTheBody(t *testing.T) {
	cp := &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 1, Clock: clk, Rand: host.SeededRand(1),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}}})
	clk.Advance(300 * time.Millisecond)

	rec := host.NewRecorder()
	s := h.VM(0).NewStream(host.StreamInfo{}, rec.Hooks())
	defer s.Close()
	body := kvChat(kvSystem, "where is my parcel")
	a, err := s.SendRequestHeaders(host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"},
		{":authority", "llm"}, {api.DefaultEndpointHeader, "10.6.6.6:1"}}, false)
	require.NoError(t, err)
	assert.Equal(t, host.ActionPause, a)
	half := len(body) / 2
	a, err = s.SendRequestBody(body[:half], false)
	require.NoError(t, err)
	assert.Equal(t, host.ActionPause, a, "still buffering")
	_, sent, _ := rec.Request()
	assert.False(t, sent, "nothing leaves before the body is complete")
	a, err = s.SendRequestBody(body[half:], true)
	require.NoError(t, err)
	assert.Equal(t, host.ActionContinue, a)
	m, sent, complete := rec.Request()
	require.True(t, sent)
	assert.True(t, complete)
	assert.Equal(t, "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003", endpointOf(m))
	assert.Equal(t, body, m.Body)
}

// The same request, the same table: the SDK's proxytest emulator and this host give the
// same routing decision.
func TestKvrouteSameDecisionAsProxytest(t *testing.T) {
	frame := table.EncodeFull(kvTable(t))
	body := kvChat(kvSystem, "cross-check")

	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	wasm, err := os.ReadFile(path)
	require.NoError(t, err)
	vm, err := proxytest.NewWasmVMContext(wasm)
	require.NoError(t, err)
	defer vm.Close()
	emu, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration(kvConfig))
	defer reset()
	require.Equal(t, types.OnPluginStartStatusOK, emu.StartPlugin())
	emu.Tick()
	polled := false
	for _, c := range emu.GetCalloutAttributesFromContext(proxytest.PluginContextID) {
		for _, kv := range c.Headers {
			if kv[0] == ":path" && strings.HasPrefix(kv[1], api.TablePath) {
				emu.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, frame)
				polled = true
			}
		}
	}
	require.True(t, polled, "the leader polls the table on its first tick")
	id := emu.InitializeHttpContext()
	emu.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}}, false)
	emu.CallOnRequestBody(id, body, true)
	var fromProxytest string
	for _, kv := range emu.GetCurrentRequestHeaders(id) {
		if kv[0] == api.DefaultEndpointHeader {
			fromProxytest = kv[1]
		}
	}

	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(3),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: &fakeControlPlane{frame: frame}}}})
	clk.Advance(300 * time.Millisecond)
	res, err := h.Do(context.Background(), host.Request{
		Headers: host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}},
		Body:    [][]byte{body},
	})
	require.NoError(t, err)
	assert.NotEmpty(t, fromProxytest)
	assert.Equal(t, fromProxytest, endpointOf(res.Forwarded))
}

// BenchmarkKvrouteThroughProxy: a 32 KB chat request through proxy -> kvroute.wasm ->
// upstream and back, with the filter's share reported apart from the proxy's and the
// upstream's.
func BenchmarkKvrouteThroughProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":8000,"prompt_tokens_details":{"cached_tokens":5984}}}`)
	}))
	defer up.Close()
	upAddr := strings.TrimPrefix(up.URL, "http://")
	tb := kvTable(b)
	tb.Models["llama"].Replicas[1].Addr = upAddr
	cp := &fakeControlPlane{frame: table.EncodeFull(tb)}
	cfg := host.Config{VMs: 2, Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}},
		CountCalls: []string{mallocgc, gcCycle}, CPUTime: *cpuTime}
	if *guestProfile {
		cfg.TimeCalls = profiledFuncs()
	}
	if *guestAllocs {
		cfg.CallSites = []string{mallocgc}
	}
	h := loadKvroute(b, cfg)
	// Wall clock: wait for the leader's first poll and every VM's next tick after it.
	for v, _ := h.Metric("kvroute_table_version"); v.Value < 1; v, _ = h.Metric("kvroute_table_version") {
		time.Sleep(5 * time.Millisecond)
	}
	ticks := []uint64{h.VM(0).Ticks(), h.VM(1).Ticks()}
	for h.VM(0).Ticks() == ticks[0] || h.VM(1).Ticks() == ticks[1] {
		time.Sleep(5 * time.Millisecond)
	}
	s, err := proxy.Listen("", proxy.Config{Host: h, Endpoints: []string{"127.0.0.1:9001", upAddr, "127.0.0.1:9003"}})
	require.NoError(b, err)
	defer s.Close()
	body := string(kvChat(kvSystem+strings.Repeat("More context. ", 600), "where is my parcel"))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	mallocs, cycles, hostCalls := h.Calls(mallocgc), h.Calls(gcCycle), h.HostCalls()
	h.ResetCallSites()
	ticksBefore := []int{len(h.VM(0).TickDurations()), len(h.VM(1).TickDurations())}
	h.ResetCallTimes()
	start := time.Now()
	for b.Loop() {
		resp, err := client.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
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
	if st.Forwards[upAddr] != st.Requests {
		b.Fatalf("forwards %v of %d requests: want all on the prefix owner %s", st.Forwards, st.Requests, upAddr)
	}
	filter, upstream := st.Filter.Mean(), st.Upstream.Mean()
	b.ReportMetric(float64(filter.Microseconds()), "filter-µs/op")
	b.ReportMetric(float64(st.Filter.P50.Microseconds()), "filter-p50-µs")
	b.ReportMetric(float64(st.Filter.P99.Microseconds()), "filter-p99-µs")
	b.ReportMetric(float64(upstream.Microseconds()), "upstream-µs/op")
	b.ReportMetric(float64((st.Total.Mean() - filter - upstream).Microseconds()), "proxy-µs/op")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(st.Requests), "client-µs/op")
	// Every allocation the guest made (requests, ticks, GC), per request.
	b.ReportMetric(float64(h.Calls(mallocgc)-mallocs)/float64(st.Requests), "guest-allocs/op")
	b.ReportMetric(float64(h.Calls(gcCycle)-cycles)*1000/float64(st.Requests), "gc-per-1k-req")
	calls := 0.0
	for name, n := range h.HostCalls() {
		calls += float64(n - hostCalls[name])
	}
	b.ReportMetric(calls/float64(st.Requests), "host-calls/op")
	var tickTimes []time.Duration
	for i, n := range ticksBefore {
		tickTimes = append(tickTimes, h.VM(i).TickDurations()[n:]...)
	}
	if len(tickTimes) > 0 {
		slices.Sort(tickTimes)
		b.ReportMetric(float64(tickTimes[len(tickTimes)/2].Microseconds()), "tick-p50-µs")
		b.ReportMetric(float64(tickTimes[len(tickTimes)*99/100].Microseconds()), "tick-p99-µs")
	}
	if *guestProfile {
		logGuestProfile(h, st.Requests)
	}
	if *guestAllocs {
		logCallSites(h, mallocgc, hostCalls, st.Requests)
	}
}

// cpuTime: BenchmarkKvrouteThroughProxy's filter times and BenchmarkKvrouteLeaderTick's
// tick times in the guest thread's CPU time (host.Config.CPUTime) rather than wall time.
var cpuTime = flag.Bool("cputime", false, "BenchmarkKvroute*: time callbacks in thread CPU time, not wall time")

// guestAllocs: go test ./wasmtest/host -run '^$' -bench KvrouteThroughProxy -benchtime 2000x -args -guestallocs
// logs where the guest allocates (runtime.mallocgc's callers) and which host functions it
// calls, per request (requests, ticks and GC alike).
var guestAllocs = flag.Bool("guestallocs", false, "BenchmarkKvroute*: log the guest's allocation sites and host calls per request")

func logCallSites(h *host.Host, fn string, hostCallsBefore map[string]int64, requests int64) {
	type row struct {
		name string
		n    int64
	}
	rows := func(m map[string]int64, before map[string]int64) []row {
		var out []row
		for k, n := range m {
			if n -= before[k]; n > 0 {
				out = append(out, row{k, n})
			}
		}
		slices.SortFunc(out, func(a, b row) int { return int(b.n - a.n) })
		return out
	}
	fmt.Printf("%s call sites over %d requests:\n", fn, requests)
	for _, r := range rows(h.CallSites(fn), nil) {
		fmt.Printf("  %8.3f /req  %s\n", float64(r.n)/float64(requests), r.name)
	}
	fmt.Printf("host calls over %d requests:\n", requests)
	for _, r := range rows(h.HostCalls(), hostCallsBefore) {
		fmt.Printf("  %8.3f /req  %s\n", float64(r.n)/float64(requests), r.name)
	}
}

const (
	mallocgc = "runtime.mallocgc"
	gcStart  = "runtime.gcStart" // a garbage collection starts: its caller allocated past the trigger
)

// guestProfile: go test ./wasmtest/host -run '^$' -bench KvrouteThroughProxy -benchtime 2000x -args -guestprofile
// logs the calls and inclusive time per request of guestProfileFuncs in the guest.
var guestProfile = flag.Bool("guestprofile", false, "BenchmarkKvroute*: log where the guest's time goes (host.Config.TimeCalls)")

// guestProfileOnly replaces guestProfileFuncs: timing a function costs its every call two
// clock reads, so a profile that times runtime.memmove (hundreds of calls a request) or
// runtime.mallocgc inflates every caller; -guestprofile.only times just the names given.
var guestProfileOnly = flag.String("guestprofile.only", "", "with -guestprofile: time only these guest functions (comma-separated, Go spelling, \"*\" suffix for prefixes)")

func profiledFuncs() []string {
	if *guestProfileOnly != "" {
		return strings.Split(*guestProfileOnly, ",")
	}
	return guestProfileFuncs
}

// guestProfileFuncs: the proxy-wasm callbacks, the request path's steps, the leader's and
// the runtime's allocator and collector.
var guestProfileFuncs = []string{
	"proxy_on_request_headers", "proxy_on_request_body", "proxy_on_response_headers",
	"proxy_on_response_body", "proxy_on_done", "proxy_on_log", "proxy_on_delete",
	"proxy_on_context_create", "proxy_on_tick", "proxy_on_memory_allocate",
	"proxy_on_http_call_response", "proxy_on_queue_ready",
	"github.com/kvroute/kvroute/shared/prompt.(*Parser).Parse",
	"github.com/kvroute/kvroute/shared/route.NewChain",
	"github.com/kvroute/kvroute/shared/route.(*Router).Decide",
	"github.com/kvroute/kvroute/shared/route.(*Router).Route",
	"github.com/kvroute/kvroute/shared/route.(*Local).Add",
	"github.com/kvroute/kvroute/shared/route.Placement",
	"github.com/kvroute/kvroute/shared/prompt.FindUsage",
	"main.(*plugin).enqueue", "main.(*placed).*", "main.(*leader).*", "main.(*view).sync",
	"main.(*httpContext).finish",
	"runtime.mallocgc", "runtime.gcStart", "runtime.gcBgMarkWorker", "runtime.gcMarkTermination",
	"runtime.gcDrain*", "runtime.memmove", "runtime.bgsweep",
}

func logGuestProfile(h *host.Host, requests int64) {
	// Printed, not logged: the testing package cuts a benchmark's log at 10 lines.
	fmt.Printf("guest profile over %d requests (inclusive time; callbacks include their callees):\n", requests)
	for _, c := range h.CallTimes() {
		if c.Calls == 0 {
			continue
		}
		fmt.Printf("  %9.2f µs/req %9.2f calls/req %9.2f µs/call %9.1f µs max  %s\n", float64(c.Total.Microseconds())/float64(requests),
			float64(c.Calls)/float64(requests), float64(c.Total.Nanoseconds())/1e3/float64(c.Calls), float64(c.Max.Nanoseconds())/1e3, c.Name)
	}
}

// BenchmarkKvrouteLeaderTick: the leader VM's tick when 256 requests' reports (768: a
// placement, a start and an outcome each; what 2,600 requests/s queue in 100 ms, in one
// VM) are waiting, on the virtual clock so nothing else runs: proxy_on_tick drains and
// posts them, and its worker thread is stalled for that long. tick-p50-µs and tick-p99-µs are over the b.N ticks.
func BenchmarkKvrouteLeaderTick(b *testing.B) {
	// A control plane that keeps nothing: one that keeps every batch grows this process's
	// heap by the reports, and its garbage collector's work lands in the host calls that
	// copy them, inside the ticks being timed.
	cfg := host.Config{VMs: 1, CPUTime: *cpuTime}
	if *guestProfile {
		cfg.TimeCalls = profiledFuncs()
	}
	h, clk := loadQuiet(b, cfg)
	req := kvRequest(kv32K)
	vm := h.VM(0)
	before := len(vm.TickDurations())
	for b.Loop() {
		b.StopTimer()
		for range 256 {
			if _, err := h.Do(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		clk.Advance(100 * time.Millisecond)
	}
	ticks := vm.TickDurations()[before:]
	slices.Sort(ticks)
	b.ReportMetric(float64(ticks[len(ticks)/2].Microseconds()), "tick-p50-µs")
	b.ReportMetric(float64(ticks[len(ticks)*9/10].Microseconds()), "tick-p90-µs")
	b.ReportMetric(float64(ticks[len(ticks)*99/100].Microseconds()), "tick-p99-µs")
	if *guestProfile {
		logGuestProfile(h, int64(256*b.N))
	}
	if v, _ := h.Metric("kvroute_reports_sent_total"); v.Value < int64(768*b.N) {
		b.Fatalf("%d reports reached the control plane, want %d", v.Value, 768*b.N)
	}
}

// baselineWasm: BenchmarkKvrouteRequestPath runs this module beside the one under test,
// request for request in the same process, so a loaded machine slows both alike. Build it
// from an older commit (git worktree add /tmp/kvroute-old <commit>; make -C /tmp/kvroute-old
// wasm) and pass -args -baseline /tmp/kvroute-old/bin/kvroute.wasm.
var baselineWasm = flag.String("baseline", "", "BenchmarkKvrouteRequestPath: a second module to run side by side (e.g. the previous commit's)")

// floorModule: BenchmarkKvrouteRequestPath runs testdata/floor beside the module under
// test ("floor-"): an SDK filter that holds the body and sets the endpoint header, and
// nothing else, so the guest time the SDK and the host cost by themselves is measured.
var floorModule = flag.Bool("floor", false, "BenchmarkKvrouteRequestPath: run testdata/floor (the SDK's callbacks alone) beside the module")

// benchVMs: BenchmarkKvrouteRequestPath's worker VMs (Envoy's --concurrency). Each VM
// applies every sibling's placements (filter/placed.go), so a request's cost grows with it.
var benchVMs = flag.Int("vms", 2, "BenchmarkKvrouteRequestPath: worker VMs")

// benchLines: BenchmarkKvrouteRequestPath's system prompt in lines (kvSystemLines), and
// each request's question a new one, as a shared system prompt's traffic has it.
var benchLines = flag.Bool("lines", false, "BenchmarkKvrouteRequestPath: the system prompt in lines, a new question each request")

// benchColdTable: BenchmarkKvrouteRequestPath's table lists none of the prompt's keys, as
// after a control plane's restart or while it cannot keep up: every placement records
// the whole chain in route.Local, and every sibling VM's copy of it too.
var benchColdTable = flag.Bool("coldtable", false, "BenchmarkKvrouteRequestPath: the table lists none of the prompt's blocks")

// benchAPI: BenchmarkKvrouteRequestPath's request in the chat, the Responses or the
// Messages API's form (the same conversation: the same chain, the same owner).
var benchAPI = flag.String("api", "chat", "BenchmarkKvrouteRequestPath: chat, responses or messages")

// vsAPI: BenchmarkKvrouteRequestPath's second side, the same module taking the same
// conversation in this API.
var vsAPI = flag.String("vs-api", "", "BenchmarkKvrouteRequestPath: also run the same module on this API, side by side")

// kvRequestIn is kvRequest's body of kvChat(system, q) in the API named (chat, responses
// or messages), on its path and answered with its usage.
func kvRequestIn(b *testing.B, api, system, q string) host.Request {
	body, path, usage := kvChat(system, q), "/v1/chat/completions", ""
	switch api {
	case "chat":
		return kvRequest(body[:len(body)/2], body[len(body)/2:])
	case "responses":
		body = []byte(fmt.Sprintf(`{"model":"llama","instructions":%q,"input":[{"role":"user","content":[{"type":"input_text","text":%q}]}]}`, system, q))
		path, usage = "/v1/responses", `{"usage":{"input_tokens":8000,"input_tokens_details":{"cached_tokens":6000}}}`
	case "messages":
		body = []byte(fmt.Sprintf(`{"model":"llama","max_tokens":64,"system":[{"type":"text","text":%q}],"messages":[{"role":"user","content":%q}]}`, system, q))
		path, usage = "/v1/messages", `{"usage":{"input_tokens":8000,"output_tokens":1}}`
	default:
		b.Fatalf("API %q: want chat, responses or messages", api)
	}
	req := kvRequest(body[:len(body)/2], body[len(body)/2:])
	req.Headers[1] = [2]string{":path", path}
	req.Upstream = func(host.Message) host.Response {
		return host.Response{Headers: host.Headers{{":status", "200"}}, Body: [][]byte{[]byte(usage)}}
	}
	return req
}

// BenchmarkKvrouteRequestPath (-guestallocs: where each module allocates; -guestprofile:
// where the module under test spends its time): the 32 KB chat request (body in two 16 KB chunks, as the
// proxy delivers it) through a two-VM host and back, on the virtual clock (10 ms every 32
// requests: 3,200 requests/s, each VM ticking every 320 requests), without sockets: filter-p50-µs and
// filter-p99-µs are the guest's CPU time per request (every callback; host.Config.CPUTime,
// so a loaded machine's descheduling is not counted), guest-allocs/op and
// gc-per-1k-req its allocations and garbage collections, host-calls/op its calls into the
// host, tick-p99-µs the VMs' ticks. With -baseline, the same for that module ("base-"),
// the two alternating request by request.
//
//	go test ./wasmtest/host -run '^$' -bench KvrouteRequestPath -benchtime 4000x -args -baseline OLD.wasm
//
// -api responses or -api messages sends the same conversation through that API; with
// -vs-api chat, a second host of the same module ("chat-") takes the chat form of it,
// request by request beside the first, for the ratio of the two APIs' costs.
func BenchmarkKvrouteRequestPath(b *testing.B) {
	path, err := wasmbuild.Filter()
	require.NoError(b, err)
	type side struct {
		name    string
		h       *host.Host
		clk     *clock.Virtual
		times   []time.Duration
		mallocs int64
		cycles  int64
		calls   map[string]int64
		ticks   []int
		api     string
	}
	load := func(name, path string) *side {
		system := kvSystem
		if *benchLines {
			system = kvSystemLines
		}
		listed := system
		if *benchColdTable {
			listed = "another system prompt" // the model and its replicas, none of the keys
		}
		cp := &quietControlPlane{frame: table.EncodeFull(kvTableOf(b, listed))}
		clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
		cfg := host.Config{VMs: *benchVMs, Clock: clk, Rand: host.SeededRand(3),
			PluginConfig: kvConfig, Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}},
			CountCalls: []string{mallocgc, gcCycle}, CPUTime: true}
		if *guestAllocs {
			cfg.CallSites = []string{mallocgc, gcStart}
		}
		if *guestProfile && name == "" {
			cfg.TimeCalls = profiledFuncs()
		}
		cfg.TimeHostCalls = *hostProfile
		h, err := host.Load(context.Background(), path, cfg)
		require.NoError(b, err)
		b.Cleanup(func() { h.Close(context.Background()) })
		clk.Advance(200 * time.Millisecond) // the leader polls; the table reaches both VMs
		return &side{name: name, h: h, clk: clk, api: *benchAPI}
	}
	sides := []*side{load("", path)}
	if *vsAPI != "" {
		vs := load(*vsAPI+"-", path)
		vs.api = *vsAPI
		sides = append(sides, vs)
	}
	if *baselineWasm != "" {
		sides = append(sides, load("base-", *baselineWasm))
	}
	if *floorModule {
		floor, cleanup, err := wasmbuild.BuildTemp("testdata/floor")
		require.NoError(b, err)
		b.Cleanup(cleanup)
		sides = append(sides, load("floor-", floor))
	}
	reqs := map[string][]host.Request{}
	for _, s := range sides {
		if *benchLines {
			for i := range 64 {
				reqs[s.api] = append(reqs[s.api], kvRequestIn(b, s.api, kvSystemLines+strings.Repeat("More context. ", 600), fmt.Sprint("where is my parcel ", i)))
			}
		} else {
			reqs[s.api] = []host.Request{kvRequestIn(b, s.api, kvSystem+strings.Repeat("More context. ", 600), "where is my parcel")}
		}
	}
	const tickEvery = 32
	run := func(s *side, i int) time.Duration {
		req := reqs[s.api][i%len(reqs[s.api])]
		res, err := s.h.Do(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if got := endpointOf(res.Forwarded); !strings.HasPrefix(got, "127.0.0.1:9002") && !*benchColdTable {
			b.Fatalf("%srouted to %q, want the prefix owner 127.0.0.1:9002 first", s.name, got)
		}
		if i%tickEvery == tickEvery-1 {
			s.clk.Advance(10 * time.Millisecond)
		}
		return res.FilterTime
	}
	// Warm up past route.Local's settle time (placements are kept a second) and the
	// ledger's (starts are kept 2 s: 6,400 requests at this clock), so the VMs' buffers
	// have reached their steady size. With 5,000 the ledger's lists still grew in the
	// first 1,500 timed requests, and a growth (a large allocation, the guest's memory
	// grown) was the slowest request of 20,000, up to 8 ms.
	for i := range 8000 {
		for _, s := range sides {
			run(s, i)
		}
	}
	for _, s := range sides {
		s.mallocs, s.cycles, s.calls = s.h.Calls(mallocgc), s.h.Calls(gcCycle), s.h.HostCalls()
		s.h.ResetCallSites()
		s.h.ResetCallTimes()
		for _, vm := range s.h.VMs() {
			s.ticks = append(s.ticks, len(vm.TickDurations()))
		}
	}
	i := 0
	for b.Loop() {
		for j := range sides {
			s := sides[(i+j)%len(sides)] // alternate which goes first
			s.times = append(s.times, run(s, i))
		}
		i++
	}
	for _, s := range sides {
		slices.Sort(s.times)
		n := float64(len(s.times))
		b.ReportMetric(float64(s.times[len(s.times)/2].Microseconds()), s.name+"filter-p50-µs")
		b.ReportMetric(float64(s.times[len(s.times)*99/100].Microseconds()), s.name+"filter-p99-µs")
		// The slowest requests are those inside which the guest's collector marks.
		b.ReportMetric(float64(s.times[len(s.times)*999/1000].Microseconds()), s.name+"filter-p999-µs")
		b.ReportMetric(float64(s.times[len(s.times)-1].Microseconds()), s.name+"filter-max-µs")
		b.ReportMetric(float64(s.h.Calls(mallocgc)-s.mallocs)/n, s.name+"guest-allocs/op")
		b.ReportMetric(float64(s.h.Calls(gcCycle)-s.cycles)*1000/n, s.name+"gc-per-1k-req")
		calls := 0.0
		for name, c := range s.h.HostCalls() {
			calls += float64(c - s.calls[name])
		}
		b.ReportMetric(calls/n, s.name+"host-calls/op")
		var ticks []time.Duration
		for k, vm := range s.h.VMs() {
			ticks = append(ticks, vm.TickDurations()[s.ticks[k]:]...)
		}
		if len(ticks) > 0 {
			slices.Sort(ticks)
			b.ReportMetric(float64(ticks[len(ticks)*99/100].Microseconds()), s.name+"tick-p99-µs")
		}
		if *guestAllocs {
			fmt.Printf("%s:\n", cmp.Or(strings.TrimSuffix(s.name, "-"), "module under test"))
			logCallSites(s.h, mallocgc, s.calls, int64(len(s.times)))
			fmt.Println("garbage collections started by:")
			for site, n := range s.h.CallSites(gcStart) {
				fmt.Printf("  %8d  %s\n", n, site)
			}
		}
		if *guestProfile && s.name == "" {
			logGuestProfile(s.h, int64(len(s.times)))
		}
		if *hostProfile {
			logHostProfile(s.name, s.h, int64(len(s.times)))
		}
	}
}

// hostProfile: BenchmarkKvrouteRequestPath -args -hostcalls logs the time per request in
// each host function (host.Config.TimeHostCalls): the part of filter-p50-µs that is this
// host's Go implementation of proxy-wasm and WASI, not the guest's code.
var hostProfile = flag.Bool("hostcalls", false, "BenchmarkKvrouteRequestPath: log the time in each host function")

func logHostProfile(name string, h *host.Host, requests int64) {
	fmt.Printf("%shost functions over %d requests (wall time, calls back into the guest included):\n", name, requests)
	var total time.Duration
	for _, c := range h.HostCallTimes() {
		total += c.Total
		fmt.Printf("  %9.2f µs/req %9.2f calls/req %9.2f µs/call %9.1f µs max  %s\n", float64(c.Total.Nanoseconds())/1e3/float64(requests),
			float64(c.Calls)/float64(requests), float64(c.Total.Nanoseconds())/1e3/float64(c.Calls), float64(c.Max.Nanoseconds())/1e3, c.Name)
	}
	fmt.Printf("  %9.2f µs/req in all\n", float64(total.Nanoseconds())/1e3/float64(requests))
}

// The request path allocates nothing in the guest in steady state: every value a host
// call returns lands in a buffer the VM reuses (filter/hostmem.go), and no host call's
// results go through the heap. Before, a request made 33 allocations (11 buffers from
// proxy_on_memory_allocate, the 32 KB body among them, and 22 for the SDK's host-call
// out-parameters), and the guest collected garbage every 250 requests. The ticks'
// allocations (the report batches) are counted apart.
func TestKvrouteRequestPathAllocatesNothing(t *testing.T) {
	h, clk := loadQuiet(t, host.Config{VMs: 2, Rand: host.SeededRand(3), CountCalls: []string{mallocgc}})
	next := bodies32K(11)
	var reqMallocs, reqs int64
	one := func(i int, measure bool) {
		body := next()
		req := kvRequest(body[:len(body)/2], body[len(body)/2:])
		req.Headers = append(req.Headers, [2]string{"content-length", strconv.Itoa(len(body))})
		before := h.Calls(mallocgc)
		res, err := h.Do(context.Background(), req)
		require.NoError(t, err)
		require.NotEmpty(t, endpointOf(res.Forwarded))
		if measure {
			reqMallocs += h.Calls(mallocgc) - before
			reqs++
		}
		if i%32 == 31 {
			clk.Advance(16 * time.Millisecond) // 2,000 requests a second: a tick every 200
		}
	}
	// Past route.Local's settle time (a second) and the ledger's window of recorded
	// starts (max_state_age, 2 s: a started request is kept until then), so their
	// storage is at its steady size: 2,500 requests, 1.25 s, measured 0.012 after it.
	for i := range 5000 {
		one(i, false)
	}
	for i := range 1000 {
		one(i, true)
	}
	perReq := float64(reqMallocs) / float64(reqs)
	t.Logf("guest allocations per request: %.3f", perReq)
	// Not quite zero: route.Local's storage still grows now and then (4 in 1,000).
	assert.LessOrEqual(t, perReq, 0.01, "allocations in the guest per request (runtime.mallocgc calls during the callbacks)")
}

// The leader posts every report the VMs queued on each tick (up to 16 items, 4,096
// reports), each item as it is dequeued. A leader that took at most max_report_batch
// (512) reports a tick would keep up with 1,706 requests a second (a placement, a start
// and an outcome each): at 3,200 a second its queue would grow by almost two items a
// tick, for good. Its own reports it posts from its buffer: none goes through the shared queue,
// whose enqueue and dequeue each copy every item (the other VMs' still go through the
// queue, TestKvrouteLeaderTableAndReportsAcrossVMs).
func TestKvrouteLeaderKeepsUpWith3200RequestsASecond(t *testing.T) {
	h, clk := loadQuiet(t, host.Config{VMs: 1, Rand: host.SeededRand(5)})
	// Short prompts: the reports' count is what matters here, not their size.
	req := kvRequest(kvChat(kvSystem[:1024], "where is my parcel"))
	const ticks, perTick = 24, 320
	for range ticks {
		for range perTick {
			_, err := h.Do(context.Background(), req)
			require.NoError(t, err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		v, _ := h.Metric("kvroute_reports_sent_total")
		return v.Value == 3*ticks*perTick
	}, 5*time.Second, time.Millisecond, "every placement, start and outcome reached the control plane")
	assert.Zero(t, h.HostCalls()["env.proxy_enqueue_shared_queue"], "items the leader enqueued")
}

// The ticks' reads of shared data and of call responses go through the VM's buffers, and
// the calls' headers are made once: before, the lease, the table head (every VM, every
// tick), each report post's and poll's status and headers allocated (0.23 guest
// allocations a request at 3,200 requests/s, 0.10 after; what is left is the SDK's
// DispatchHttpCall and the posts' callbacks).
func TestKvrouteTicksReadSharedDataAndCallStatusIntoBuffers(t *testing.T) {
	h, clk := loadQuiet(t, host.Config{VMs: 2, Rand: host.SeededRand(5), CallSites: []string{mallocgc}})
	req := kvRequest(kvChat(kvSystem[:1024], "where is my parcel"))
	for i := range 20 {
		if i == 5 {
			h.ResetCallSites() // the buffers have grown to their size
		}
		for range 64 {
			_, err := h.Do(context.Background(), req)
			require.NoError(t, err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		clk.Advance(100 * time.Millisecond) // the other VM's last flush, then the leader's post
		v, _ := h.Metric("kvroute_reports_sent_total")
		return v.Value == 3*20*64
	}, 5*time.Second, time.Millisecond)
	for site := range h.CallSites(mallocgc) {
		for _, fn := range []string{"callStatus", "tryLease", "readHead", "encode < main.__keys_", "callHeaders"} {
			assert.NotContains(t, site, fn, "an allocation on the ticks")
		}
	}
}

// In steady state the ticks do not make the guest collect garbage either: a VM's report
// buffer is reused once the leader has drained it, and the leader reads each queue item
// into one reused buffer. A module with a new report buffer each tick and a copy of every
// item collects in these 20 ticks (5,120 requests), each collection's marking charged to
// a tick.
func TestKvrouteTicksCollectNoGarbage(t *testing.T) {
	h, clk := loadQuiet(t, host.Config{VMs: 1, Rand: host.SeededRand(5), CountCalls: []string{gcCycle}})
	req := kvRequest(kv32K)
	run := func(ticks int) {
		for range ticks {
			for range 256 {
				_, err := h.Do(context.Background(), req)
				require.NoError(t, err)
			}
			clk.Advance(100 * time.Millisecond)
		}
	}
	// Three seconds: the buffers reach their size, and so does route.Local's storage (its
	// placements of the last second and more; until then its growth starts collections).
	run(30)
	before := h.Calls(gcCycle)
	run(20)
	assert.LessOrEqual(t, h.Calls(gcCycle)-before, int64(1), "garbage collections in 20 ticks of 256 requests")
}
