package table

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The bucket index over the base keys finds exactly what a binary search of the whole
// array finds, for tables of every size, for absent keys, and for keys crafted to share
// their top bits (one crowded bucket).
func TestEntriesIndexFindsWhatBinarySearchFinds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 15, 16, 17, 64, 1000, 100_000} {
		for _, crowded := range []bool{false, true} {
			keys := make([]uint64, 0, n)
			for range n {
				k := rng.Uint64()
				if crowded && len(keys)%2 == 0 {
					k = 0xABCD<<48 | k>>16 // half the keys in one bucket
				}
				keys = append(keys, k)
			}
			slices.Sort(keys)
			keys = slices.Compact(keys)
			var e entries
			e.keys = keys
			e.sets = make([]uint32, len(keys))
			for i := range e.sets {
				e.sets[i] = uint32(i)
			}
			e.buildIndex()
			if n >= 100 && e.index == nil {
				t.Fatalf("%d keys: no index", n)
			}
			probes := append(slices.Clone(keys), rng.Uint64(), 0, ^uint64(0), 0xABCD<<48)
			for _, k := range keys {
				probes = append(probes, k+1, k-1)
			}
			for _, k := range probes {
				i, want := slices.BinarySearch(keys, k)
				got, ok := e.base(k)
				if ok != want || (ok && got != uint32(i)) {
					t.Fatalf("%d keys (crowded %v): key %#x: base = %d, %v; want %d, %v", n, crowded, k, got, ok, i, want)
				}
			}
		}
	}
}
