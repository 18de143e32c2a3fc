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
