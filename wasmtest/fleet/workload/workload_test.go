package workload

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// commonPrefix is the number of leading equal elements.
func commonPrefix[T comparable](a, b []T) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// checkRequest pins the invariants every workload's requests share: the tokens are the
// engine's own rendering and encoding of the messages, the chain is the engine's
// hashing of the tokens, and the body parses into the same messages.
func checkRequest(t *testing.T, r *Request) {
	t.Helper()
	want := tokenizer.EncodeChat("", r.Messages, true, false)
	require.Equal(t, want, r.Tokens, "tokens are the engine's chat rendering")
	assert.Equal(t, NewHasher(16).NewChain(r.Tokens, cache.Extra{}).Hashes, r.Chain.Hashes, "chain is the engine's")
	var p prompt.Parser
	req, err := p.Parse(prompt.Chat, r.Body, prompt.Limits{MaxBytes: 8 << 20})
	require.NoError(t, err, "body parses")
	assert.Equal(t, r.Model, req.Model)
	assert.Equal(t, string(inferenceExtensionInput(t, prompt.Chat, r.Body)), string(r.PrefixInput), "weighted-scorers hashes what the inference extension would")
	for _, m := range r.Messages {
		assert.True(t, bytes.Contains(req.Text, []byte(m.Content)), "canonical text holds every message")
	}
}

func TestSeedSizesAndSharedPrefix(t *testing.T) {
	c := DefaultSeed()
	c.Duration = 20 * time.Second
	w, err := NewSeed(c)
	require.NoError(t, err)
	src := w.NewSource()
	first := src.Request(0)
	checkRequest(t, first)
	require.Len(t, first.Tokens, 8000, "prompt is exactly 8,000 tokens")
	var same, other *Request
	for i := 1; i < w.Len() && (same == nil || other == nil); i++ {
		_, g := w.Arrival(i)
		switch {
		case g == first.Group && same == nil:
			same = src.Request(i)
		case g != first.Group && other == nil:
			other = src.Request(i)
		}
	}
	require.NotNil(t, same, "a second request of the first customer")
	checkRequest(t, same)
	checkRequest(t, other)
	// Two requests of one customer share exactly the 6,000-token prefix (375 engine
	// blocks); two customers share only BOS and the system header.
	assert.Equal(t, 6000, commonPrefix(first.Tokens, same.Tokens))
	assert.Equal(t, 375, commonPrefix(first.Chain.Hashes, same.Chain.Hashes))
	assert.Equal(t, 1+len(header("system"))/4, commonPrefix(first.Tokens, other.Tokens))
	assert.Equal(t, first.Messages[0].Content, same.Messages[0].Content)
}

func TestSeedRateAndShares(t *testing.T) {
	cases := []struct {
		name string
		hot  float64
	}{{"uniform", 0}, {"hot customer", 0.10}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultSeed()
			c.Hot = tc.hot
			w, err := NewSeed(c)
			require.NoError(t, err)
			// 40 req/s for 600 s: 24,000 expected, Poisson sd ~155.
			assert.InDelta(t, 24000, w.Len(), 600)
			counts := make([]int, c.Customers)
			last := time.Duration(0)
			for i := range w.Len() {
				at, g := w.Arrival(i)
				require.GreaterOrEqual(t, at, last, "arrivals in time order")
				last = at
				counts[g]++
			}
			assert.Less(t, last, c.Duration)
			n := float64(w.Len())
			if tc.hot > 0 {
				assert.InDelta(t, 0.10, float64(counts[0])/n, 0.01, "hot customer's share")
				for _, k := range counts[1:] {
					assert.InDelta(t, 0.9*n/199, float64(k), 6*math.Sqrt(0.9*n/199))
				}
			} else {
				for _, k := range counts {
					assert.InDelta(t, n/200, float64(k), 6*math.Sqrt(n/200), "uniform customers")
				}
			}
		})
	}
}

func TestSeedIsDeterministic(t *testing.T) {
	c := DefaultSeed()
	c.Duration = 5 * time.Second
	a, _ := NewSeed(c)
	b, _ := NewSeed(c)
	require.Equal(t, a.Len(), b.Len())
	for i := range a.Len() {
		at1, g1 := a.Arrival(i)
		at2, g2 := b.Arrival(i)
		require.Equal(t, at1, at2)
		require.Equal(t, g1, g2)
	}
	assert.Equal(t, a.NewSource().Request(3).Body, b.NewSource().Request(3).Body)
	c.Seed = 2
	d, _ := NewSeed(c)
	at1, _ := a.Arrival(0)
	at2, _ := d.Arrival(0)
	assert.NotEqual(t, at1, at2, "another seed, other arrivals")
}

func TestSeedSharedFraction(t *testing.T) {
	c := DefaultSeed()
	c.Duration = 10 * time.Second
	c.PrefixTokens = 800 // 10% shared
	w, err := NewSeed(c)
	require.NoError(t, err)
	src := w.NewSource()
	var first *Request
	for i := range w.Len() {
		r := src.Request(i)
		require.Len(t, r.Tokens, 8000)
		if first == nil {
			first = r
			continue
		}
		if r.Group == first.Group {
			assert.Equal(t, 800, commonPrefix(first.Tokens, r.Tokens))
			return
		}
	}
	t.Skip("no repeated customer in 10 s")
}

func TestGSP(t *testing.T) {
	w, err := NewGSP(DefaultGSP())
	require.NoError(t, err)
	require.Equal(t, 1024, w.Len())
	counts := map[int]int{}
	for i := range w.Len() {
		_, g := w.Arrival(i)
		counts[g]++
	}
	assert.Len(t, counts, 64)
	for _, k := range counts {
		assert.Equal(t, 16, k)
	}
	at, _ := w.Arrival(w.Len() - 1)
	assert.InDelta(t, 1024/8.0, at.Seconds(), 15, "8 req/s")
	src := w.NewSource()
	var byGroup = map[int]*Request{}
	for i := range 200 {
		r := src.Request(i)
		checkRequest(t, r)
		require.Len(t, r.Tokens, 2048+128)
		if o := byGroup[r.Group]; o != nil {
			assert.Equal(t, 2048, commonPrefix(o.Tokens, r.Tokens), "group shares the system prompt")
			return
		}
		byGroup[r.Group] = r
	}
	t.Fatal("no two requests of one group")
}

func TestMultiturnExtendsContext(t *testing.T) {
	c := DefaultMultiturn()
	c.Duration = 2 * time.Minute
	c.Think = 5 * time.Second
	w, err := NewMultiturn(c)
	require.NoError(t, err)
	assert.InDelta(t, c.Rate*c.Duration.Seconds(), w.Len(), 0.35*c.Rate*c.Duration.Seconds())
	src := w.NewSource()
	prev := map[int]*Request{}
	checked := 0
	for i := range w.Len() {
		s, k := w.Turn(i)
		r := src.Request(i)
		if checked < 12 {
			checkRequest(t, r)
		}
		require.Len(t, r.Messages, 2+2*k)
		if p := prev[s]; p != nil {
			// Everything turn k-1 sent is resent, then its answer and a new message.
			assert.Equal(t, p.Messages, r.Messages[:len(p.Messages)])
			n := commonPrefix(p.Tokens, r.Tokens)
			assert.GreaterOrEqual(t, n, len(p.Tokens)-1, "turn k's tokens extend turn k-1's")
			assert.Greater(t, len(r.Tokens), len(p.Tokens)+c.OutputTokens+c.UserTokens-16)
			checked++
		}
		prev[s] = r
	}
	assert.Greater(t, checked, 10)
}

func TestParseMooncake(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 40, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 5]}

{"timestamp": 90, "input_length": 600, "output_length": 0, "hash_ids": [7, 8]}
`
	recs, err := ParseMooncake(strings.NewReader(trace))
	require.NoError(t, err)
	require.Len(t, recs, 3)
	w, err := NewMooncake(MooncakeConfig{Speedup: 2}, recs)
	require.NoError(t, err)
	src := w.NewSource()
	a, b, c := src.Request(0), src.Request(1), src.Request(2)
	for _, r := range []*Request{a, b, c} {
		checkRequest(t, r)
	}
	assert.Len(t, a.Tokens, 1100)
	assert.Len(t, b.Tokens, 1500)
	assert.Len(t, c.Tokens, 600)
	assert.Equal(t, 20*time.Millisecond, b.At, "speedup divides timestamps")
	assert.Equal(t, 1, c.OutputTokens, "at least one output token")
	// Two chained hash ids in common: BOS, the 11 tokens of the user header, 2 x 512.
	assert.Equal(t, 12+2*512, commonPrefix(a.Tokens, b.Tokens))
	assert.Equal(t, 12, commonPrefix(a.Tokens, c.Tokens))

	bad := []string{
		`{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1]}`,
		`{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0]}` + "\n" + `{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0]}`,
		`{"timestamp": 0, "input_length": "x"}`,
		``,
	}
	for _, s := range bad {
		_, err := ParseMooncake(strings.NewReader(s))
		assert.Error(t, err, s)
	}
}

// The first 200 requests of a public synthetic trace in Mooncake's format, kept in
// the repository's testdata: requests whose hash_ids begin alike share that many
// 512-token blocks of prompt.
func TestMooncakeSyntheticTrace(t *testing.T) {
	w, err := LoadMooncake(MooncakeConfig{Path: "../../../testdata/mooncake/synthetic_trace_head200.jsonl"})
	require.NoError(t, err)
	assert.Equal(t, 200, w.Len())
	src := w.NewSource()
	r := src.Request(0)
	assert.Len(t, r.Tokens, w.recs[0].InputLength)
	pairs := 0
	for i := 0; i < w.Len() && pairs < 5; i++ {
		for j := 0; j < i; j++ {
			a, b := w.recs[j], w.recs[i]
			common := 0
			for common < min(len(a.HashIDs), len(b.HashIDs)) && a.HashIDs[common] == b.HashIDs[common] {
				common++
			}
			if common == 0 {
				continue
			}
			pairs++
			ta, tb := src.Request(j).Tokens, src.Request(i).Tokens
			shared := 0
			for shared < min(len(ta), len(tb)) && ta[shared] == tb[shared] {
				shared++
			}
			assert.GreaterOrEqual(t, shared, min(common*MooncakeBlockTokens, len(ta), len(tb))-MooncakeBlockTokens,
				"requests %d and %d share %d hash ids", j, i, common)
			break
		}
	}
	assert.Positive(t, pairs, "the excerpt has requests that share a prefix")
}

func TestMooncakeSpeedupCompressesTime(t *testing.T) {
	recs := []MooncakeRecord{
		{Timestamp: 0, InputLength: 600, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 1000, InputLength: 600, OutputLength: 1, HashIDs: []uint64{1, 3}},
		{Timestamp: 4000, InputLength: 600, OutputLength: 1, HashIDs: []uint64{4, 5}},
	}
	w, err := NewMooncake(MooncakeConfig{Speedup: 2}, recs)
	require.NoError(t, err)
	assert.InDelta(t, 3/2.0, w.Rate(), 1e-12, "3 requests over 2 s at speedup 2")
	fast, err := w.WithSpeedup(8)
	require.NoError(t, err)
	assert.InDelta(t, 3/0.5, fast.Rate(), 1e-12)
	at, _ := fast.Arrival(1)
	assert.Equal(t, 125*time.Millisecond, at)
	at, _ = w.Arrival(1)
	assert.Equal(t, 500*time.Millisecond, at, "the original keeps its speedup")
	for _, bad := range []float64{0, -1, math.Inf(1), math.NaN()} {
		_, err := w.WithSpeedup(bad)
		assert.Error(t, err, "speedup %g", bad)
	}
	once, err := NewMooncake(MooncakeConfig{}, recs[:1])
	require.NoError(t, err)
	assert.Zero(t, once.Rate(), "no span, no rate")
}
