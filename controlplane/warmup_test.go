package controlplane

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/server"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// runningEngine is an engine that cached 8 blocks before the control plane started and
// publishes nothing after: its KV events exist only in its replay buffer.
func runningEngine(t *testing.T) (*publisher.Publisher, []uint64) {
	pub, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", BufferSteps: 100, HWM: 1000},
		publisher.Options{Encoding: sim.Map, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	toks := make([]uint32, 8*16)
	for i := range toks {
		toks[i] = uint32(i * 3)
	}
	if _, err := pub.Publish(sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}}}); err != nil {
		t.Fatal(err)
	}
	return pub, prefix.Checkpoints(nil, prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "m", "", prefix.Salt{}), toks, 16), 4)
}

func warmupState(t *testing.T, base string) server.WarmupState {
	t.Helper()
	r, err := http.Get(base + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var st server.DebugState
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil || st.Warmup == nil {
		t.Fatalf("debug state: %v, warmup %v", err, st.Warmup)
	}
	return *st.Warmup
}

func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A control plane started beside an engine that is already running: its very first
// table lists what the engine cached, although the engine publishes nothing more (the
// replay buffer is read on connecting, and the first table waits for it).
func TestFirstTableListsWhatRunningEnginesCached(t *testing.T) {
	pub, keys := runningEngine(t)
	metrics := fakeMetrics(t, new(atomic.Int64))
	_, base := startControlPlane(t, Options{
		Engines:         []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000", Metrics: metrics.URL + "/metrics", KV: pub.Endpoint(), Replay: pub.ReplayEndpoint()}},
		WarmUp:          time.Minute,
		PublishInterval: 10 * time.Millisecond,
	})
	p := &poller{t: t, base: base, tab: table.New()}
	awaitCond(t, "the first table", func() bool { p.poll(); return p.tab.Version != 0 })
	m := p.tab.Models["m"]
	if m == nil || len(m.Replicas) != 1 || !slices.Equal(m.Lookup(keys[0]), []uint32{m.Replicas[0].Slot}) || !slices.Equal(m.Lookup(keys[1]), []uint32{m.Replicas[0].Slot}) {
		t.Fatalf("the first table does not list the engine's cached blocks: %+v", m)
	}
	if st := warmupState(t, base); st.Streams != 1 || st.StreamsRead != 1 || st.ReplicasScraped != 1 || st.Complete != 1 || st.Held {
		t.Fatalf("warm-up %+v", st)
	}
}

// While a stream has not been read (or a replica not scraped) the first table is held (and /readyz says not ready),
// at most the warm-up limit.
func TestFirstTableWaitsForStreamsAtMostTheWarmUp(t *testing.T) {
	pub, _ := runningEngine(t)
	metrics := fakeMetrics(t, new(atomic.Int64))
	engines := []discovery.Engine{
		{ID: "e1", Model: "m", Addr: "10.0.0.1:8000", Metrics: metrics.URL + "/metrics", KV: pub.Endpoint(), Replay: pub.ReplayEndpoint()},
		{ID: "e2", Model: "m", Addr: "10.0.0.2:8000", Metrics: metrics.URL + "/metrics", KV: "tcp://127.0.0.1:1"}, // refuses
	}
	_, base := startControlPlane(t, Options{Engines: engines, WarmUp: time.Hour, PublishInterval: 10 * time.Millisecond})
	awaitCond(t, "e1's stream read, both replicas scraped", func() bool {
		st := warmupState(t, base)
		return st.StreamsRead == 1 && st.ReplicasScraped == 2
	})
	if st := warmupState(t, base); !st.Held || st.Complete != 0.75 || st.Streams != 2 || st.Replicas != 2 {
		t.Fatalf("warm-up %+v", st)
	}
	for _, path := range []string{api.TablePath, "/readyz"} {
		r, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s while the first table is held: %d", path, r.StatusCode)
		}
	}

	_, base = startControlPlane(t, Options{Engines: engines, WarmUp: 100 * time.Millisecond, PublishInterval: 10 * time.Millisecond})
	p := &poller{t: t, base: base, tab: table.New()}
	awaitCond(t, "the first table once the warm-up passed", func() bool { p.poll(); return p.tab.Version != 0 })
	if st := warmupState(t, base); st.Held || st.HeldMs < 100 || st.StreamsRead != 1 {
		t.Fatalf("warm-up %+v", st)
	}
}
