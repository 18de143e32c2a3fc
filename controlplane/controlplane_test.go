package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeMetrics serves a vLLM-style /metrics whose queue gauge the test sets.
func fakeMetrics(t *testing.T, queued *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"+
			"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\",engine=\"0\"} 1\n"+
			"# TYPE kvroute:queued_prefill_tokens gauge\nkvroute:queued_prefill_tokens{model_name=\"m\"} %d\n", queued.Load())
	}))
	t.Cleanup(srv.Close)
	return srv
}

// startControlPlane starts a control plane with o (on loopback: o.Listen is set) and
// stops it at the test's end; it returns the control plane and its base URL.
func startControlPlane(t *testing.T, o Options) (*ControlPlane, string) {
	t.Helper()
	o.Listen = "127.0.0.1:0"
	if o.Logger == nil {
		o.Logger = quiet()
	}
	cp, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cp.Wait() })
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return cp, "http://" + cp.Addr()
}

// poller follows the table like a filter does: full first, then deltas.
type poller struct {
	t     *testing.T
	base  string
	token string
	tab   *table.Table
}

func (p *poller) poll() {
	p.t.Helper()
	url := p.base + api.TablePath
	if p.tab.Version != 0 {
		url += fmt.Sprintf("?version=%d", p.tab.Version)
	}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	switch r.StatusCode {
	case http.StatusNotModified, http.StatusServiceUnavailable:
	case http.StatusOK:
		if _, err := p.tab.Apply(b); err != nil {
			p.t.Fatalf("apply: %v", err)
		}
	default:
		p.t.Fatalf("GET %s: %d %s", url, r.StatusCode, b)
	}
}

// until polls the table until cond holds (generous deadline, no timing assertion).
func (p *poller) until(what string, cond func(m *table.Model) bool) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.poll()
		if m := p.tab.Models["m"]; m != nil && cond(m) {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func replica(m *table.Model, id string) (table.Replica, bool) {
	for _, r := range m.Replicas {
		if r.ID == id {
			return r, true
		}
	}
	return table.Replica{}, false
}

func TestEndToEnd(t *testing.T) {
	var queued atomic.Int64
	queued.Store(777)
	metrics := fakeMetrics(t, &queued)
	pub, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 100, HWM: 1000},
		publisher.Options{Encoding: sim.Map, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	cp, err := New(Options{
		Listen: "127.0.0.1:0",
		Engines: []discovery.Engine{
			{ID: "e1", Model: "m", Addr: "10.0.0.1:8000", Metrics: metrics.URL + "/metrics", KV: pub.Endpoint(), Replay: pub.ReplayEndpoint(), Speed: 1000},
			{ID: "e2", Model: "m", Addr: "10.0.0.2:8000", Metrics: metrics.URL + "/missing"},
		},
		Index:           index.Config{UnhealthyAfter: 2},
		Token:           "tok",
		PublishInterval: 10 * time.Millisecond,
		ScrapeInterval:  20 * time.Millisecond,
		Logger:          quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	base := "http://" + cp.Addr()
	p := &poller{t: t, base: base, token: "tok", tab: table.New()}

	// Queue, KV usage and health from the scrapes; e2's metrics 404 -> unhealthy, listed.
	p.until("scraped state", func(m *table.Model) bool {
		r1, ok1 := replica(m, "e1")
		r2, ok2 := replica(m, "e2")
		return ok1 && ok2 && r1.Queued == 777 && r1.KVUsage == 0.25 && r1.Healthy && r1.Speed == 1000 && !r2.Healthy
	})
	if c := p.tab.Models["m"].Config; c.BlockBytes != 64 || c.BlockTokens != 16 || c.Stride != 4 || c.BytesPerToken != 4 {
		t.Fatalf("config %+v", c)
	}
	queued.Store(50)
	p.until("queue term refreshed", func(m *table.Model) bool { r, _ := replica(m, "e1"); return r.Queued == 50 })

	// KV events: stored blocks become token keys on e1's slot.
	for !pub.Subscribed() {
		time.Sleep(5 * time.Millisecond)
	}
	toks := make([]uint32, 8*16)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	if _, err := pub.Publish(sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{11, 12, 13, 14, 15, 16, 17, 18}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}}}); err != nil {
		t.Fatal(err)
	}
	keys := prefix.Checkpoints(nil, prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "m", "", prefix.Salt{}), toks, 16), 4)
	r1, _ := replica(p.tab.Models["m"], "e1")
	p.until("token keys", func(m *table.Model) bool {
		return slices.Equal(m.Lookup(keys[0]), []uint32{r1.Slot}) && slices.Equal(m.Lookup(keys[1]), []uint32{r1.Slot})
	})
	// A filter's match on the token-id prompt finds 8 blocks on e1.
	matched, longest := p.tab.Models["m"].Match(prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "m", "", prefix.Salt{}), toks, 16), nil)
	if longest != 8 || matched[p.tab.Models["m"].ReplicaIndex(r1.Slot)] != 8 {
		t.Fatalf("match %v longest %d", matched, longest)
	}

	// Reports: a placement on e2 is listed.
	body := fmt.Sprintf(`{"proxy":"t","reports":[{"kind":"placement","model":"m","replica":"10.0.0.2:8000","domain":1,"block_size":64,"stride":4,"blocks":4,"keys":[%d],"predicted_cached_tokens":0,"at_ms":1}]}`, uint64(42))
	req, _ := http.NewRequest(http.MethodPost, base+api.ReportsPath, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("reports: %d", resp.StatusCode)
	}
	r2, _ := replica(p.tab.Models["m"], "e2")
	p.until("placement", func(m *table.Model) bool { return slices.Equal(m.Lookup(42), []uint32{r2.Slot}) })

	// Cleared: e1's keys vanish.
	if _, err := pub.Publish(sim.Batch{Events: []sim.Event{{Kind: sim.AllBlocksCleared}}}); err != nil {
		t.Fatal(err)
	}
	p.until("clear", func(m *table.Model) bool { return m.Lookup(keys[0]) == nil })

	// Debug state.
	req, _ = http.NewRequest(http.MethodGet, base+"/debug/state", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Version  uint64
		Replicas []index.ReplicaState
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if len(st.Replicas) != 2 || st.Version == 0 {
		t.Fatalf("debug %+v", st)
	}
	e1 := st.Replicas[0]
	if e1.ID != "e1" || !e1.KVEvents.Connected || e1.KVEvents.StoredBlocks != 8 || e1.KVEvents.Clears != 1 || e1.CapacityTokens != 16000 || e1.QueueTokens != 50 {
		t.Fatalf("e1 %+v", e1)
	}

	// Prometheus.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvroute_controlplane_kv_event_stored_blocks_total{model="m",replica="e1"} 8`, `kvroute_controlplane_replica_healthy{model="m",replica="e2"} 0`, "kvroute_controlplane_table_versions_total",
		`kvroute_controlplane_http_handoffs_total{reason="elsewhere"}`} { // /debug/state went to net/http
		if !strings.Contains(string(b), want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}

	// Shutdown with a long poll in flight: it answers at once and Wait returns cleanly.
	polled := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s%s?version=%d&wait_ms=30000", base, api.TablePath, cp.Publisher.Version()), nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			polled <- 0
			return
		}
		resp.Body.Close()
		polled <- resp.StatusCode
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := cp.Wait(); err != nil {
		t.Fatal(err)
	}
	if code := <-polled; code != http.StatusNotModified && code != http.StatusOK {
		t.Fatalf("long poll during shutdown: %d", code)
	}
}

// Engines connect to the control plane's socket (llm-d's topology); topics name them.
func TestCentralBind(t *testing.T) {
	var queued atomic.Int64
	metrics := fakeMetrics(t, &queued)
	cp, err := New(Options{
		Listen:          "127.0.0.1:0",
		KVBind:          "tcp://127.0.0.1:0",
		Engines:         []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000", Metrics: metrics.URL + "/metrics", Topic: "kv@e1@m"}},
		PublishInterval: 10 * time.Millisecond,
		Logger:          quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + cp.KVAddrs()[0].String(), Topic: "kv@e1@m", BufferSteps: 10, HWM: 100},
		publisher.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for !pub.Subscribed() {
		time.Sleep(5 * time.Millisecond)
	}
	toks := make([]uint32, 4*16)
	if _, err := pub.Publish(sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}}}); err != nil {
		t.Fatal(err)
	}
	key := prefix.Checkpoints(nil, prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "m", "", prefix.Salt{}), toks, 16), 4)[0]
	p := &poller{t: t, base: "http://" + cp.Addr(), tab: table.New()}
	p.until("token key via the central socket", func(m *table.Model) bool { return len(m.Lookup(key)) == 1 })
	cancel()
	cp.Wait()
}
