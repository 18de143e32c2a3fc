package cache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIndexAgainstMap(t *testing.T) {
	// Random puts and deletes, including colliding and patterned keys, must agree with a
	// Go map at every step (backward-shift deletion keeps probe runs intact).
	x := newIndex(64)
	ref := map[uint64]int32{}
	rng := uint64(1)
	for step := range 20000 {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		key := rng % 97 // few keys: long probe runs and many collisions
		if step%3 == 0 {
			key <<= 58 // patterned high bits
		}
		switch {
		case rng%3 == 0:
			x.del(key)
			delete(ref, key)
		case len(ref) < 64:
			x.put(key, int32(step))
			ref[key] = int32(step)
		}
		require.Equal(t, len(ref), x.len())
		if step%97 == 0 {
			for k, v := range ref {
				got, ok := x.get(k)
				require.True(t, ok, "step %d key %d", step, k)
				require.Equal(t, v, got)
			}
		}
	}
	_, ok := x.get(12345)
	assert.False(t, ok)
	x.clear()
	assert.Zero(t, x.len())
	_, ok = x.get(0)
	assert.False(t, ok, "key 0 is a normal key, absent after clear")
}
