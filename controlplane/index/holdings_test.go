package index

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
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
		m.setSlot(k, slot, on)
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
