package index

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/kvroute/kvroute/controlplane/kvevents"
)

// An evicted block counts as stored again when the engine stores it within the window
// of its eviction, and as not when the window passes without it; either outcome is
// counted once the window has passed (at the first event after, on the engine's clock),
// so that the blocks that come back early do not make the share read 1 at first.
func TestEvictedBlocksStoredAgainWithinTheWindow(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := followedHashes(5)
	sink := ix.Events()
	sink.Batch(a, 0, rootsAt(100, hs[:4]))
	sink.Batch(a, 1, evictedAt(130, hs[:4]))
	sink.Batch(a, 2, rootsAt(200, hs[:2])) // 70 s after their eviction
	if got := kvEventsOf(t, ix, "a").EvictedStoredAgain; got != -1 {
		t.Fatalf("before any window has passed: %v, want -1", got)
	}
	sink.Batch(a, 3, rootsAt(130+againWindow+1, hs[4:])) // the window has passed for all four
	if got := kvEventsOf(t, ix, "a").EvictedStoredAgain; got != 0.5 {
		t.Fatalf("two back, two not within the window: share %v, want 0.5", got)
	}
	sink.Batch(a, 4, rootsAt(700, hs[2:4])) // too late: already counted, not counted again
	sink.Batch(a, 5, evictedAt(800, hs[4:]))
	sink.Batch(a, 6, rootsAt(800+againWindow+1, hs[4:])) // back, but after the window
	sink.Batch(a, 7, evictedAt(1200, hs[:1]))
	if got := kvEventsOf(t, ix, "a").EvictedStoredAgain; got != 0.4 {
		t.Fatalf("two of five back within the window: share %v, want 0.4", got)
	}
	if got := kvEventsOf(t, ix, "b").EvictedStoredAgain; got != -1 {
		t.Fatalf("a replica without evictions: %v, want -1", got)
	}
}

// A clear forgets the evicted blocks (the engine may hash anew after a restart), batches
// without a usable timestamp date nothing, and a store dated before the eviction (the
// engine's clock went back) does not bring a block back: no outcome is made up.
func TestEvictedBlocksStoredAgainNeedTheEnginesClock(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := followedHashes(4)
	sink := ix.Events()
	sink.Batch(a, 0, rootsAt(100, hs))
	sink.Batch(a, 1, evictedAt(110, hs[:1]))
	sink.Batch(a, 2, &kvevents.Batch{TS: 111, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	sink.Batch(a, 3, rootsAt(120, hs[:1]))
	sink.Batch(a, 4, rootsAt(121, hs[1:]))
	for i, ts := range []float64{0, math.NaN(), math.Inf(1)} {
		sink.Batch(a, uint64(5+2*i), evictedAt(ts, hs[1+i:2+i]))
		sink.Batch(a, uint64(6+2*i), rootsAt(130, hs[1+i:2+i]))
	}
	sink.Batch(a, 11, evictedAt(140, hs[3:]))
	sink.Batch(a, 12, rootsAt(130, hs[3:])) // the engine's clock went back
	if got := kvEventsOf(t, ix, "a").EvictedStoredAgain; got != -1 {
		t.Fatalf("share %v, want -1: no window has passed", got)
	}
	sink.Batch(a, 13, rootsAt(140+againWindow+1, followedHashes(5)[4:]))
	if got := kvEventsOf(t, ix, "a").EvictedStoredAgain; got != 0 {
		t.Fatalf("share %v, want 0: one eviction dated (at 140), and not back within its window", got)
	}
}

// Whatever a publisher sends (blocks stored, stored again and evicted in any order,
// clears, sequence gaps, timestamps missing, NaN, infinite or jumping back), both block
// measures stay a number /debug/state can encode, within their range or -1.
func FuzzEvictedBlockMeasures(f *testing.F) {
	f.Add([]byte{0, 0, 0, 5, 0, 10, 3, 0, 0, 5, 0, 40, 0, 0, 0, 5, 0, 80})
	f.Add([]byte{0, 1, 0, 5, 1, 0, 3, 1, 0, 1, 0, 0, 2, 1, 0, 2, 0, 0, 4, 0, 0, 6, 0, 0})
	f.Add([]byte{0, 2, 1, 6, 0, 1, 3, 2, 5, 7, 255, 255, 0, 2, 1, 4, 0, 2, 3, 2, 1, 5, 0, 3})
	pool := followedHashes(8)
	f.Fuzz(func(t *testing.T, ops []byte) {
		ix := fixture(t, Config{})
		seq := map[string]uint64{}
		prev := map[string]uint64{}
		for ; len(ops) >= 6; ops = ops[6:] {
			id := "a"
			if ops[2]&1 != 0 {
				id = "b"
			}
			h := uint64(ops[1]%16) + 1 // most small hashes are not followed
			if ops[1]%16 < 8 {
				h = pool[ops[1]%8]
			}
			var ts float64
			switch v := float64(uint16(ops[4])<<8 | uint16(ops[5])); ops[3] % 8 {
			case 1:
				ts = math.NaN()
			case 2:
				ts = math.Inf(1)
			case 3:
				ts = math.Inf(-1)
			case 4:
				ts = -v
			default:
				if ops[3]%8 != 0 {
					ts = v / 2
				}
			}
			b := &kvevents.Batch{TS: ts}
			switch ops[0] % 5 {
			case 0, 1:
				b.Events = append(b.Events, storedEv([]uint64{h}, nil, tokens(16, uint32(h)*16), 16))
			case 2:
				p := prev[id]
				b.Events = append(b.Events, storedEv([]uint64{h}, &p, tokens(16, uint32(h)*32), 16))
			case 3:
				b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{h}, Medium: "GPU"})
			case 4:
				b.Events = append(b.Events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
			}
			prev[id] = h
			if ops[2]&4 != 0 {
				seq[id]++ // a gap
			}
			ix.Events().Batch(kvevents.StreamID{Replica: id}, seq[id], b)
			seq[id]++
		}
		for _, st := range ix.DebugState(t0) {
			if r := st.KVEvents.EvictedResidencyS; r != -1 && !(r >= 0 && !math.IsInf(r, 0)) {
				t.Fatalf("%s: residency %v", st.ID, r)
			}
			if s := st.KVEvents.EvictedStoredAgain; s != -1 && !(s >= 0 && s <= 1) {
				t.Fatalf("%s: share stored again %v", st.ID, s)
			}
			if s := st.KVEvents.EvictedStoredAgainFleet; s != -1 && !(s >= 0 && s <= 1) {
				t.Fatalf("%s: share stored again in the fleet %v", st.ID, s)
			}
		}
		if _, err := json.Marshal(ix.DebugState(t0)); err != nil {
			t.Fatalf("/debug/state no longer encodes: %v", err)
		}
	})
}
