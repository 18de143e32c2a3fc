package workload

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/cache"
)

// handMade is a workload of literal token sequences, one a second, hashed in blocks of
// 4 tokens as the engine hashes them.
type handMade [][]uint32

func (w handMade) Name() string                       { return "hand-made" }
func (w handMade) Describe() string                   { return "hand-made" }
func (w handMade) Len() int                           { return len(w) }
func (w handMade) Arrival(i int) (time.Duration, int) { return time.Duration(i) * time.Second, -1 }
func (w handMade) Groups() int                        { return 0 }
func (w handMade) NewSource() Source                  { return handMadeSource{w, NewHasher(4)} }

type handMadeSource struct {
	w handMade
	h *cache.Hasher
}

func (s handMadeSource) Request(i int) *Request {
	return &Request{Index: i, Tokens: s.w[i], Chain: s.h.NewChain(s.w[i], cache.Extra{})}
}

// tokens appends n consecutive token ids from first to t.
func tokens(t []uint32, first, n uint32) []uint32 {
	for k := range n {
		t = append(t, first+k)
	}
	return t
}

func TestReuseCeilingByHand(t *testing.T) {
	w := handMade{
		// 0 s, the warm-up: blocks A = 1..4, B = 5..8, and 2 tokens more. Nothing earlier.
		tokens(tokens(nil, 1, 8), 100, 2),
		// 1 s: A B + 3 tokens of its own: both blocks were seen; the cap (11-1)/4 = 2
		// blocks allows both. 8 of 11.
		tokens(tokens(nil, 1, 8), 200, 3),
		// 2 s: exactly A B, 8 tokens: both seen, but the engine computes the last
		// token, so (8-1)/4 = 1 block. 4 of 8.
		tokens(nil, 1, 8),
		// 3 s: A, then a block of its own (9..12 is not B): 4 of 12.
		tokens(tokens(nil, 1, 4), 9, 8),
		// 4 s: B's tokens first: the same tokens as block B, but not after A, so not
		// the same block. 0 of 9.
		tokens(tokens(nil, 5, 4), 300, 5),
		// 5 s: the previous request's first two blocks (B', 300..303) and 3 more:
		// 8 of 11, a prefix only a measured request had.
		tokens(tokens(tokens(nil, 5, 4), 300, 4), 400, 3),
	}
	c := ReuseCeiling(w, 4, time.Second)
	assert.Equal(t, 5, c.Requests, "the first request is the warm-up")
	assert.Equal(t, int64(11+8+12+9+11), c.Prompt)
	assert.Equal(t, int64(8+4+4+0+8), c.Cacheable)
	assert.InDelta(t, 24.0/51, c.Rate, 1e-12)

	all := ReuseCeiling(w, 4, 0)
	assert.Equal(t, int64(10+11+8+12+9+11), all.Prompt, "measured from the start, the first counts with nothing cached")
	assert.Equal(t, c.Cacheable, all.Cacheable)
}

// TestReusesNameTheLatestSource checks Reuses on the hand-made requests above plus a
// repeat: each request's reusable tokens are the ceiling's, and its source is the latest
// earlier request that had the whole prefix, not the first.
func TestReusesNameTheLatestSource(t *testing.T) {
	w := handMade{
		tokens(tokens(nil, 1, 8), 100, 2),                 // 0: A B
		tokens(tokens(nil, 1, 8), 200, 3),                 // 1: A B, from 0
		tokens(nil, 1, 8),                                 // 2: A (capped), latest with A is 1
		tokens(tokens(nil, 1, 4), 9, 8),                   // 3: A, latest with A is 2
		tokens(tokens(nil, 5, 4), 300, 5),                 // 4: nothing
		tokens(tokens(tokens(nil, 5, 4), 300, 4), 400, 3), // 5: B' and 300..303, from 4
		tokens(tokens(nil, 1, 8), 500, 3),                 // 6: A B: 2 had both, after 1
	}
	got := Reuses(w, 4)
	want := []Reuse{{0, -1}, {8, 0}, {4, 1}, {4, 2}, {0, -1}, {8, 4}, {8, 2}}
	assert.Equal(t, want, got)

	sum := 0
	for _, r := range got[1:] {
		sum += r.Tokens
	}
	assert.Equal(t, ReuseCeiling(w, 4, time.Second).Cacheable, int64(sum), "the per-request reuse adds up to the ceiling")
}

// TestReuseCeilingOfGSP checks the ceiling against the workload's arithmetic: of every
// group's prompts all but the first find the whole system prompt (a whole number of
// blocks here), and no question shares a block with another.
func TestReuseCeilingOfGSP(t *testing.T) {
	c := DefaultGSP()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens = 5, 7, 256, 40
	w, err := NewGSP(c)
	require.NoError(t, err)
	src := w.NewSource()
	prompt := int64(0)
	for i := range w.Len() {
		prompt += int64(len(src.Request(i).Tokens))
	}
	got := ReuseCeiling(w, 16, 0)
	assert.Equal(t, prompt, got.Prompt)
	assert.Equal(t, int64(5*(7-1)*256), got.Cacheable)
}
