package index

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// setSlot keeps every key's holder list sorted and exact, counts the lists with an array
// of their own (the byte budget prices those), and never writes to oneHolder. The
// changed list names each key whose holders changed since the last build once, and a
// build leaves only keys that are held.
func TestSetSlotLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 3))
	m := &model{}
	want := map[uint64]map[uint16]bool{}
	changed := map[uint64]bool{}
	slots := []uint32{0, 1, 2, 3, 7, 4095, 4096, 5000, 65535}
	for i := range 200_000 {
		// The key 0 too: a keymap keeps it beside its array.
		k, slot, on := uint64(rng.IntN(64)), slots[rng.IntN(len(slots))], rng.IntN(2) == 0
		if want[k] == nil {
			want[k] = map[uint16]bool{}
		}
		if want[k][uint16(slot)] != on {
			changed[k] = true
		}
		m.setSlot(k, slot, on, false)
		if on {
			want[k][uint16(slot)] = true
		} else {
			delete(want[k], uint16(slot))
		}
		if i%97 != 0 {
			continue
		}
		listed := map[uint64]bool{}
		for _, k := range m.keys.dirty {
			if listed[k] {
				t.Fatalf("step %d: key %d listed twice as changed", i, k)
			}
			listed[k] = true
		}
		if !maps.Equal(listed, changed) {
			t.Fatalf("step %d: changed list %v, want %v", i, listed, changed)
		}
		if i%(97*5) == 0 {
			m.keys.built()
			clear(changed)
			held := 0
			for _, w := range want {
				if len(w) > 0 {
					held++
				}
			}
			if m.keys.Len() != held || len(m.keys.dirty) != 0 {
				t.Fatalf("step %d: after a build %d entries, %d listed; %d keys held", i, m.keys.Len(), len(m.keys.dirty), held)
			}
		}
		lists := 0
		for k, w := range want {
			var exp []uint16
			for s := range w {
				exp = append(exp, s)
			}
			slices.Sort(exp)
			got := m.keys.get(k)
			ok := got != nil
			if !slices.Equal(got, exp) || ok != (len(exp) > 0) {
				t.Fatalf("step %d key %d: holders %v (%v), want %v", i, k, got, ok, exp)
			}
			if ok && !sharedList(got) {
				lists++
			}
		}
		if lists != m.lists {
			t.Fatalf("step %d: %d lists of their own, counted %d", i, lists, m.lists)
		}
	}
	for i, v := range oneHolder {
		if int(v) != i {
			t.Fatalf("oneHolder[%d] = %d", i, v)
		}
	}
}

// TestSpeculativeEntriesEndAtTheirTTL: a holding keeps its speculative end in whole
// seconds, rounded up, and the expiry queue's millisecond times decide: an entry placed
// mid-second is listed until its TTL has passed, not a second less or more, and a
// placement that refreshes it keeps it past the first one's TTL.
func TestSpeculativeEntriesEndAtTheirTTL(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: 10 * time.Second})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	once, again := seqHashes(2, 100), seqHashes(2, 200)
	placed := t0.Add(500 * time.Millisecond)
	ix.ApplyReports(reports(placement(addrA, once), placement(addrA, again)), placed, nil)
	refresh := placed.Add(9 * time.Second)
	ix.ApplyReports(reports(placement(addrA, again)), refresh, nil)
	at := func(d time.Duration) time.Time {
		now := placed.Add(d)
		w.apply(t, ix.Flush(now, false), now)
		return now
	}
	at(10*time.Second - time.Millisecond)
	if !all(w.held("m", 0, once)) || !all(w.held("m", 0, again)) {
		t.Fatalf("a millisecond before the TTL: %v %v", w.held("m", 0, once), w.held("m", 0, again))
	}
	at(10*time.Second + time.Millisecond)
	if !none(w.held("m", 0, once)) || !all(w.held("m", 0, again)) {
		t.Fatalf("a millisecond after: %v %v", w.held("m", 0, once), w.held("m", 0, again))
	}
	at(19*time.Second + time.Millisecond)
	if !none(w.held("m", 0, again)) {
		t.Fatalf("after the refresh's TTL: %v", w.held("m", 0, again))
	}
	for _, c := range []struct {
		ms   int64
		want specSec
	}{{-5, 1}, {0, 1}, {1, 1}, {1000, 1}, {1001, 2}, {1_800_000_000_500, 1_800_000_001}, {math.MaxInt64, math.MaxUint32}} {
		if got := specSecOf(c.ms); got != c.want {
			t.Errorf("specSecOf(%d) = %d, want %d", c.ms, got, c.want)
		}
	}
}
