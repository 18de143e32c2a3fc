package index

import "testing"

// Keys that differ only in a few bits (here: sequential, or only in their top bits) are
// still spread over the shards: a shard is picked by a seeded mix of the whole key, so
// no key pattern fills one shard, whose array would then double alone.
func TestModelKeysSpreadOverShards(t *testing.T) {
	for _, pattern := range []struct {
		name string
		key  func(i uint64) uint64
	}{
		{"sequential", func(i uint64) uint64 { return i + 1 }},
		{"top bits", func(i uint64) uint64 { return i << 48 }},
		{"one bit each", func(i uint64) uint64 { return 1<<(i%64) | (i/64)<<58 }},
	} {
		var mk modelKeys
		const n = 1 << 14
		seen := map[uint64]bool{}
		for i := range uint64(n) {
			k := pattern.key(i)
			if seen[k] {
				continue
			}
			seen[k] = true
			mk.touch(k)
		}
		most, mean := 0, len(seen)/keyShards
		for i := range mk.shards {
			most = max(most, mk.shards[i].Len())
		}
		if most > 2*mean {
			t.Errorf("%s: %d keys, the fullest shard holds %d (mean %d)", pattern.name, len(seen), most, mean)
		}
	}
}

// The changed list's array is reused while builds keep using most of it (a steady
// stream of changes allocates nothing per build) and given back after a flood.
func TestChangedListIsReusedThenGivenBack(t *testing.T) {
	var mk modelKeys
	for round := range 3 { // steady: 10,000 changes between builds
		for i := range uint64(10_000) {
			mk.touch(uint64(round)<<32 | i + 1)
		}
		before := cap(mk.dirty)
		mk.built()
		if cap(mk.dirty) != before {
			t.Fatalf("round %d: the list's array of %d went (%d after the build)", round, before, cap(mk.dirty))
		}
	}
	for i := range uint64(10) { // the flood is over: 10 changes
		mk.touch(1<<40 | i)
	}
	mk.built()
	if cap(mk.dirty) != 0 || mk.Len() != 0 {
		t.Fatalf("after a quiet interval: the list keeps %d slots, %d entries left", cap(mk.dirty), mk.Len())
	}
}
