package index

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/controlplane/kvevents"
)

// followedHashes returns n block hashes that residency follows.
func followedHashes(n int) []uint64 {
	var out []uint64
	for h := uint64(1); len(out) < n; h++ {
		if followed(h) {
			out = append(out, h)
		}
	}
	return out
}

// rootsAt is one batch at engine time ts storing each hash as a 16-token chain root (the
// same tokens for the same hash, so storing one again is a second copy).
func rootsAt(ts float64, hashes []uint64) *kvevents.Batch {
	b := &kvevents.Batch{TS: ts}
	for _, h := range hashes {
		b.Events = append(b.Events, storedEv([]uint64{h}, nil, tokens(16, uint32(h)*16), 16))
	}
	return b
}

// evictedAt is one batch at engine time ts evicting each hash.
func evictedAt(ts float64, hashes []uint64) *kvevents.Batch {
	b := removed(0, 0)
	b.TS = ts
	for _, h := range hashes {
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{h}, Medium: "GPU"})
	}
	return b
}

// kvEventsOf is replica id's KV-event state as /debug/state shows it.
func kvEventsOf(t *testing.T, ix *Index, id string) KVEvents {
	t.Helper()
	for _, st := range ix.DebugState(t0) {
		if st.ID == id {
			return st.KVEvents
		}
	}
	t.Fatalf("no replica %q", id)
	return KVEvents{}
}

// A GPU block's residency runs from its BlockStored to the BlockRemoved of its last copy,
// on the engine's clock (the batches' timestamps).
func TestEvictedBlockResidencyOnTheEnginesClock(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := followedHashes(4)
	sink := ix.Events()
	sink.Batch(a, 0, rootsAt(100, hs))
	sink.Batch(a, 1, rootsAt(110, hs[3:])) // a second copy of the last block
	if got := kvEventsOf(t, ix, "a").EvictedResidencyS; got != -1 {
		t.Fatalf("before any eviction: %v, want -1", got)
	}
	sink.Batch(a, 2, evictedAt(130, hs))
	if got := kvEventsOf(t, ix, "a").EvictedResidencyS; got != 30 {
		t.Fatalf("three blocks stored at 100 and evicted at 130: residency %v s, want 30", got)
	}
	sink.Batch(a, 3, evictedAt(190, hs[3:])) // the last copy goes
	if got := kvEventsOf(t, ix, "a").EvictedResidencyS; got != 45 {
		t.Fatalf("and one at 190 after its first copy at 100: mean %v s, want 45 (30, 30, 30, 90)", got)
	}
	if got := kvEventsOf(t, ix, "b").EvictedResidencyS; got != -1 {
		t.Fatalf("a replica without evictions: %v, want -1", got)
	}
}

// Without timestamps, after a clear, or with the engine's clock going back, nothing is
// measured: a residency is never made up.
func TestEvictedBlockResidencyNeedsBothEnds(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := followedHashes(3)
	sink := ix.Events()
	sink.Batch(a, 0, rootsAt(0, hs[:1])) // no timestamp
	sink.Batch(a, 1, rootsAt(100, hs[1:]))
	sink.Batch(a, 2, &kvevents.Batch{TS: 101, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	sink.Batch(a, 3, rootsAt(200, hs[2:]))
	sink.Batch(a, 4, evictedAt(150, hs)) // before the last store
	if got := kvEventsOf(t, ix, "a").EvictedResidencyS; got != -1 {
		t.Fatalf("residency %v, want -1: no block had a measured stay", got)
	}
	// Timestamps no engine sends: infinite or not a number, at either end.
	inf := followedHashes(6)[3:]
	sink.Batch(a, 5, rootsAt(math.Inf(1), inf[:1]))
	sink.Batch(a, 6, rootsAt(math.NaN(), inf[1:2]))
	sink.Batch(a, 7, rootsAt(300, inf[2:]))
	sink.Batch(a, 8, evictedAt(math.Inf(1), inf))
	if got := kvEventsOf(t, ix, "a").EvictedResidencyS; got != -1 {
		t.Fatalf("residency %v after infinite and NaN timestamps, want -1", got)
	}
	if _, err := json.Marshal(ix.DebugState(t0)); err != nil {
		t.Fatalf("/debug/state no longer encodes: %v", err)
	}
}

// However many blocks an engine stores and evicts, a stream follows at most
// maxResidencyBlocks of each: stored (residency) and evicted (stored again).
func TestEvictedBlockMeasuresFollowBoundedBlocks(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := followedHashes(maxResidencyBlocks + 100)
	followed := func() (stored, evicted int) {
		r := ix.replicas["a"]
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.ranks[0].stay.since), len(r.ranks[0].again.gone)
	}
	ix.Events().Batch(a, 0, rootsAt(1, hs))
	if n, _ := followed(); n != maxResidencyBlocks {
		t.Fatalf("following %d stored blocks, want %d", n, maxResidencyBlocks)
	}
	ix.Events().Batch(a, 1, evictedAt(2, hs))
	if _, n := followed(); n != maxResidencyBlocks {
		t.Fatalf("following %d evicted blocks, want %d", n, maxResidencyBlocks)
	}
}

// /metrics has the residency and the share stored again of each replica that measured
// them, and no series for the others.
func TestEvictedBlockMeasuresExported(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, rootsAt(1, followedHashes(1)))
	hs := followedHashes(5)
	ix.Events().Batch(a, 0, rootsAt(10, hs[:4]))
	ix.Events().Batch(a, 1, evictedAt(22.5, hs[:4]))
	ix.Events().Batch(a, 2, rootsAt(30, hs[:1]))
	ix.Events().Batch(a, 3, rootsAt(22.5+againWindow+1, hs[4:])) // the window has passed
	if got := gaugeByReplica(t, ix, "kvroute_controlplane_kv_evicted_block_residency_seconds"); len(got) != 1 || got["a"] != 12.5 {
		t.Fatalf("residency series %v, want only a = 12.5", got)
	}
	if got := gaugeByReplica(t, ix, "kvroute_controlplane_kv_evicted_blocks_stored_again_ratio"); len(got) != 1 || got["a"] != 0.25 {
		t.Fatalf("stored-again series %v, want only a = 0.25 (one of four back)", got)
	}
}

// gaugeByReplica gathers the index's metrics and returns the gauge name's value for each
// replica that has a series.
func gaugeByReplica(t *testing.T, ix *Index, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(ix.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return got
}
