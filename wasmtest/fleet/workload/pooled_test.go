package workload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPooledLRUByHand follows a cache of a few 4-token blocks by hand: what it evicts,
// in which order, and what each request finds.
func TestPooledLRUByHand(t *testing.T) {
	A, B := tokens(nil, 1, 4), tokens(nil, 5, 4)
	cat := func(parts ...[]uint32) []uint32 {
		var out []uint32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	w := handMade{
		cat(A, B, tokens(nil, 100, 2)),               // 0: stores A B; A, its root, most recent
		cat(tokens(nil, 20, 4), tokens(nil, 200, 2)), // 1: stores C: C A B
		cat(tokens(nil, 30, 4), tokens(nil, 300, 2)), // 2: stores D, evicts B (a tail goes before its root): D C A
		cat(A, B, tokens(nil, 400, 3)),               // 3: finds A only: 4 of 11; stores B again, evicts C: A B D
		cat(A, B, tokens(nil, 500, 3)),               // 4: finds A B: 8 of 11
	}
	got := PooledLRU(w, 4, 0, 3)
	assert.Equal(t, 5, got.Requests)
	assert.Equal(t, int64(10+6+6+11+11), got.Prompt)
	assert.Equal(t, int64(0+0+0+4+8), got.Cacheable)

	// Two blocks: request 1 evicts A and B, so request 3 finds nothing and 4 both.
	assert.Equal(t, int64(8), PooledLRU(w, 4, 0, 2).Cacheable)
	// No room: nothing is ever found.
	assert.Equal(t, int64(0), PooledLRU(w, 4, 0, 0).Cacheable)
}

// TestPooledLRUWithRoomIsTheReuseCeiling: a cache that holds every block finds what the
// ceiling counts, on the hand-made requests and on GSP, warm-up included.
func TestPooledLRUWithRoomIsTheReuseCeiling(t *testing.T) {
	hand := handMade{
		tokens(tokens(nil, 1, 8), 100, 2),
		tokens(tokens(nil, 1, 8), 200, 3),
		tokens(nil, 1, 8),
		tokens(tokens(nil, 1, 4), 9, 8),
		tokens(tokens(nil, 5, 4), 300, 5),
	}
	assert.Equal(t, ReuseCeiling(hand, 4, 1e9), PooledLRU(hand, 4, 1e9, 1000))

	c := DefaultGSP()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens = 5, 7, 256, 40
	gsp, err := NewGSP(c)
	require.NoError(t, err)
	roomy := PooledLRU(gsp, 16, 0, 1<<20)
	assert.Equal(t, ReuseCeiling(gsp, 16, 0), roomy)
	// Room for one group's system prompt only: groups arrive interleaved (GSP's
	// requests are shuffled), so some of what the ceiling counts is lost.
	tight := PooledLRU(gsp, 16, 0, 256/16+3)
	assert.Less(t, tight.Cacheable, roomy.Cacheable)
	assert.Equal(t, roomy.Prompt, tight.Prompt)
}

// TestCeilingsIsBothInOneWalk: Ceilings gives what ReuseCeiling and PooledLRU give
// apart, with the warm-up left out of both, with room and without.
func TestCeilingsIsBothInOneWalk(t *testing.T) {
	c := DefaultGSP()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens = 5, 7, 256, 40
	gsp, err := NewGSP(c)
	require.NoError(t, err)
	from, _ := gsp.Arrival(3)
	for _, capacity := range []int{0, 256/16 + 3, 1 << 20} {
		reuse, pooled := Ceilings(gsp, 16, from, capacity)
		assert.Equal(t, ReuseCeiling(gsp, 16, from), reuse, "capacity %d", capacity)
		assert.Equal(t, PooledLRU(gsp, 16, from, capacity), pooled, "capacity %d", capacity)
		assert.Less(t, pooled.Requests, gsp.Len(), "the warm-up is not measured")
	}
}
