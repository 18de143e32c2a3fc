package index

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/internal/keymap"
)

// homes is what the view's table remembers as keys' homes: key -> slot.
func (w *view) homes(model string) map[uint64]uint32 {
	out := map[uint64]uint32{}
	if m := w.t.Models[model]; m != nil {
		m.EachHome(func(k uint64, s uint32) bool { out[k] = s; return true })
	}
	return out
}

// placedOnA is an index whose speculative entries live a second, a view that holds its
// first full table, and three keys a proxy placed on replica a at t0, not yet flushed.
func placedOnA(t *testing.T) (*Index, *view, []uint64) {
	ix := fixture(t, Config{SpecTTL: time.Second})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	keys := seqHashes(3, 100)
	ix.ApplyReports(reports(placement("10.0.0.1:8000", keys)), t0, nil)
	return ix, w, keys
}

// A placed key the table stops listing becomes a home on the replica that held it
// last, and stops being one when the table lists it again; the filters see it through
// table format 4.
func TestHomesAreKeysListedNowhere(t *testing.T) {
	ix, w, keys := placedOnA(t)
	w.apply(t, ix.Flush(t0, false), t0)
	if !all(w.held("m", 0, keys)) || len(w.homes("m")) != 0 {
		t.Fatalf("placed on a: held %v, homes %v", w.held("m", 0, keys), w.homes("m"))
	}

	t1 := t0.Add(1100 * time.Millisecond) // the speculative entries expire
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.homes("m"); len(got) != 3 || got[100] != 0 || got[102] != 0 || w.t.Models["m"].Lookup(100) != nil {
		t.Fatalf("after expiry: homes %v, entry %v", got, w.t.Models["m"].Lookup(100))
	}

	// Placed on b: listed there, no home; let go by b: b's home.
	ix.ApplyReports(reports(placement("10.0.0.2:8000", keys[:1])), t1, nil)
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.homes("m"); len(got) != 2 || !all(w.held("m", 1, keys[:1])) {
		t.Fatalf("placed again on b: homes %v", got)
	}
	t2 := t1.Add(1100 * time.Millisecond)
	w.apply(t, ix.Flush(t2, false), t2)
	if got := w.homes("m"); len(got) != 3 || got[100] != 1 || got[101] != 0 {
		t.Fatalf("let go by b: homes %v", got)
	}
	if st := ix.DebugState(t2); st[0].Homes != 2 || st[1].Homes != 1 {
		t.Fatalf("debug state: a %d homes, b %d", st[0].Homes, st[1].Homes)
	}

	// A replica that leaves takes its homes with it (its slot will be reused).
	ix.SetReplicas([]Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000", Events: true}}, t2)
	w.apply(t, ix.Flush(t2, false), t2)
	if got := w.homes("m"); len(got) != 2 || got[101] != 0 {
		t.Fatalf("after b left: homes %v", got)
	}
	if st := ix.DebugState(t2); len(st) != 1 || st[0].Homes != 2 {
		t.Fatalf("debug state after b left: %+v", st)
	}
}

// Keys only the engines' events listed (no proxy placed them: token-domain blocks) are
// no homes: the filters route by the keys they place.
func TestHomesOnlyForPlacedKeys(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	toks := tokens(64, 1)
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(storedEv(seqHashes(4, 1), nil, toks, 16)))
	w.apply(t, ix.Flush(t0, false), t0)
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 2, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: seqHashes(4, 1)}))
	w.apply(t, ix.Flush(t0, false), t0)
	if m := w.t.Models["m"]; m.Len() != 0 || m.HomesLen() != 0 {
		t.Fatalf("entries %d, homes %v", m.Len(), w.homes("m"))
	}
}

// The oldest homes go first, and homes are bounded: a flood of placements that expire
// leaves MaxHomes of them, in the memory the bound says.
func TestHomesAreBounded(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: time.Second, MaxHomes: 3})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	ix.ApplyReports(reports(placement("10.0.0.1:8000", seqHashes(3, 100))), t0, nil)
	t1 := t0.Add(1100 * time.Millisecond)
	w.apply(t, ix.Flush(t1, false), t1)
	ix.ApplyReports(reports(placement("10.0.0.2:8000", seqHashes(2, 200))), t1, nil)
	t2 := t1.Add(1100 * time.Millisecond)
	w.apply(t, ix.Flush(t2, false), t2)
	got := w.homes("m")
	if len(got) != 3 || got[200] != 1 || got[201] != 1 {
		t.Fatalf("homes %v: want the newest three", got)
	}
	if st := ix.DebugState(t2); st[0].Homes != 1 || st[1].Homes != 2 {
		t.Fatalf("debug state: a %d homes, b %d", st[0].Homes, st[1].Homes)
	}

	big := fixture(t, Config{SpecTTL: time.Second})
	bw := newView()
	bw.apply(t, big.Flush(t0, true), t0)
	floodPlacements(big, "10.0.0.2:8000", t0)
	bw.apply(t, big.Flush(t1, false), t1)
	h := &big.models["m"].homes
	bytes := h.at.Bytes(0) + int64(cap(h.ring))*8
	if h.len() != DefaultMaxHomes || bw.t.Models["m"].HomesLen() != DefaultMaxHomes || bytes > 5<<20+DefaultMaxHomes*8 {
		t.Fatalf("200,000 keys let go: %d homes (table %d) in %d bytes", h.len(), bw.t.Models["m"].HomesLen(), bytes)
	}
	if slot := keymap.SlotBytes[homeAt](); slot != 16 {
		t.Fatalf("a home's slot takes %d bytes", slot)
	}
}

// A model with a slower tier has no homes: the tier's listings return its prefixes and
// the filters credit none there (shared/route/homes.go), so the table does not carry
// them. The homes made before the tier showed up are dropped with it.
func TestNoHomesForAModelWithASlowerTier(t *testing.T) {
	ix, w, _ := placedOnA(t)
	t1 := t0.Add(1100 * time.Millisecond)
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.homes("m"); len(got) != 3 {
		t.Fatalf("before the tier: homes %v", got)
	}

	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(cpuStored(seqHashes(1, 9000))))
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.homes("m"); len(got) != 0 {
		t.Fatalf("after the CPU tier showed up: homes %v", got)
	}

	more := seqHashes(3, 200)
	ix.ApplyReports(reports(placement("10.0.0.2:8000", more)), t1, nil)
	t2 := t1.Add(1100 * time.Millisecond)
	w.apply(t, ix.Flush(t2, false), t2)
	if got, st := w.homes("m"), ix.DebugState(t2); len(got) != 0 || st[0].Homes+st[1].Homes != 0 {
		t.Fatalf("keys let go with a tier: homes %v, debug %d+%d", got, st[0].Homes, st[1].Homes)
	}
}
