package index

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// setSlot keeps every key's holder list sorted and exact, counts the lists with an array
// of their own (the byte budget prices those), and never writes to oneHolder.
func TestSetSlotLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 3))
	m := &model{keys: map[uint64][]uint16{}, dirty: map[uint64]struct{}{}}
	want := map[uint64]map[uint16]bool{}
	slots := []uint32{0, 1, 2, 3, 7, 4095, 4096, 5000, 65535}
	for i := range 200_000 {
		k, slot, on := uint64(1+rng.IntN(64)), slots[rng.IntN(len(slots))], rng.IntN(2) == 0
		m.setSlot(k, slot, on)
		if want[k] == nil {
			want[k] = map[uint16]bool{}
		}
		if on {
			want[k][uint16(slot)] = true
		} else {
			delete(want[k], uint16(slot))
		}
		if i%97 != 0 {
			continue
		}
		lists := 0
		for k, w := range want {
			var exp []uint16
			for s := range w {
				exp = append(exp, s)
			}
			slices.Sort(exp)
			got, ok := m.keys[k]
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
