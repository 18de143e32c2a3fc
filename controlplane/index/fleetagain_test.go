package index

import (
	"sync"
	"testing"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/shared/prefix"
)

// followedRoots returns n 16-token root blocks of model "m" whose index keys the fleet
// measure follows.
func followedRoots(n int) [][]uint32 {
	seed := prefix.Seed(prefix.Token, "m", "", prefix.SaltFromCacheSalt(""))
	var out [][]uint32
	for base := uint32(1); len(out) < n; base += 16 {
		if toks := tokens(16, base); followed(prefix.NextTokens(seed, toks)) {
			out = append(out, toks)
		}
	}
	return out
}

// rootsAs is one batch at engine time ts storing each of roots as a chain root under the
// engine's own hash hashes[i] (replicas hash alike contents differently).
func rootsAs(ts float64, hashes []uint64, roots [][]uint32) *kvevents.Batch {
	b := &kvevents.Batch{TS: ts}
	for i, toks := range roots {
		b.Events = append(b.Events, storedEv([]uint64{hashes[i]}, nil, toks, 16))
	}
	return b
}

// from is n engine hashes from first on.
func from(first uint64, n int) []uint64 {
	var hs []uint64
	for i := range n {
		hs = append(hs, first+uint64(i))
	}
	return hs
}

// waitingIn is how many evictions wait in m's fleet map.
func waitingIn(m *model) int {
	m.again.mu.Lock()
	defer m.again.mu.Unlock()
	return m.again.n
}

// A block replica a evicted and replica b prefilled again within the window is back in
// the fleet though not on a, whose own share reads 0: what a router that moves evicted
// prefixes keeps off the replica's share. A store too late, or dated before the
// eviction, brings nothing back.
func TestEvictedBlocksStoredAgainInTheFleet(t *testing.T) {
	ix := fixture(t, Config{})
	a, b := kvevents.StreamID{Replica: "a"}, kvevents.StreamID{Replica: "b"}
	roots := followedRoots(4)
	sink := ix.Events()
	onA := followedHashes(5) // a's engine hashes, followed by a's own share too
	sink.Batch(a, 0, rootsAs(100, onA, roots))
	sink.Batch(a, 1, evictedAt(130, onA[:4]))
	sink.Batch(b, 0, rootsAs(200, from(5000, 2), roots[:2]))                    // back, on b
	sink.Batch(b, 1, rootsAs(120, from(6000, 1), roots[2:3]))                   // dated before the eviction
	sink.Batch(b, 2, rootsAs(440, from(7000, 1), roots[3:]))                    // after the window
	sink.Batch(a, 2, rootsAs(130+againWindow+1, onA[4:], followedRoots(5)[4:])) // a's window has passed
	ka, kb := kvEventsOf(t, ix, "a"), kvEventsOf(t, ix, "b")
	if ka.EvictedStoredAgain != 0 || ka.EvictedStoredAgainFleet != 0.5 {
		t.Fatalf("a: stored again %v on a, %v in the fleet; want 0 and 0.5", ka.EvictedStoredAgain, ka.EvictedStoredAgainFleet)
	}
	if kb.EvictedStoredAgainFleet != -1 {
		t.Fatalf("b evicted nothing: %v, want -1", kb.EvictedStoredAgainFleet)
	}
	if got := gaugeByReplica(t, ix, "kvroute_controlplane_kv_evicted_blocks_stored_again_fleet_ratio"); len(got) != 1 || got["a"] != 0.5 {
		t.Fatalf("series %v, want only a = 0.5", got)
	}
}

// A replica that leaves, or whose cache is cleared, takes its evictions waiting with it,
// and however many blocks a model's replicas evict, at most maxFleetAgain wait.
func TestEvictedBlocksInTheFleetBounded(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	waiting := func() int { return waitingIn(ix.replicas["a"].m) }
	roots := followedRoots(maxFleetAgain + 10)
	ix.Events().Batch(a, 0, rootsAs(1, from(1<<20, len(roots)), roots))
	ix.Events().Batch(a, 1, evictedAt(2, from(1<<20, len(roots))))
	if n := waiting(); n != maxFleetAgain {
		t.Fatalf("%d evictions waiting, want %d", n, maxFleetAgain)
	}
	ix.Events().Batch(a, 2, &kvevents.Batch{TS: 3, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	if n := waiting(); n != 0 {
		t.Fatalf("%d evictions waiting after a's clear, want 0", n)
	}
	ix.Events().Batch(a, 3, rootsAs(4, from(1<<21, 5), roots[:5]))
	ix.Events().Batch(a, 4, evictedAt(5, from(1<<21, 5)))
	m := ix.replicas["a"].m
	ix.SetReplicas([]Spec{{ID: "b", Model: "m", Addr: "10.0.0.2:8000", Events: true}}, t0)
	if n := waitingIn(m); n != 0 {
		t.Fatalf("%d evictions waiting after a left, want 0", n)
	}
}

// An engine that stores and evicts the same block again and again leaves one eviction
// of it waiting, however often it repeats: a store walks at most one a replica.
func TestEvictedBlocksInTheFleetOneWaitingAReplica(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	roots := followedRoots(1)
	for i := range 100 {
		ts := float64(1 + i)
		ix.Events().Batch(a, uint64(2*i), rootsAs(ts, from(7, 1), roots))
		ix.Events().Batch(a, uint64(2*i+1), evictedAt(ts, from(7, 1)))
	}
	if n := waitingIn(ix.replicas["a"].m); n != 1 {
		t.Fatalf("%d evictions of one block waiting, want 1", n)
	}
}

// Two replicas' streams evict and store the same blocks at once (run under -race).
func TestEvictedBlocksInTheFleetFromParallelStreams(t *testing.T) {
	ix := fixture(t, Config{})
	roots := followedRoots(64)
	var wg sync.WaitGroup
	for k, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := kvevents.StreamID{Replica: id}
			hs := from(uint64(k+1)<<32, len(roots))
			for i := range 50 {
				ts := float64(100 + 20*i)
				ix.Events().Batch(s, uint64(2*i), rootsAs(ts, hs, roots))
				ix.Events().Batch(s, uint64(2*i+1), evictedAt(ts+10, hs))
			}
		}()
	}
	wg.Wait()
	for _, id := range []string{"a", "b"} {
		if got := kvEventsOf(t, ix, id).EvictedStoredAgainFleet; !(got > 0 && got <= 1) {
			t.Fatalf("%s: share in the fleet %v, want in (0, 1]", id, got)
		}
	}
}
