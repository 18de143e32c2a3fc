package sched

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

func tokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

type batch struct {
	at     time.Duration
	events []kvevents.Event
}

type harness struct {
	*Engine
	batches  []batch
	finished []*Request
}

func newHarness(t testing.TB, p timing.Profile, numBlocks int) *harness {
	h := &harness{}
	e, err := New(Config{
		Profile:      p,
		NumGPUBlocks: numBlocks,
		OnEvents:     func(at time.Duration, evs []kvevents.Event) { h.batches = append(h.batches, batch{at, evs}) },
		OnFinish:     func(r *Request, at time.Duration) { h.finished = append(h.finished, r) },
	})
	require.NoError(t, err)
	h.Engine = e
	return h
}

// run drives the engine in virtual time until it is idle.
func (h *harness) run() time.Duration { return h.RunUntilIdle(0) }

func (h *harness) events(kind kvevents.Kind) []kvevents.Event {
	var out []kvevents.Event
	for _, b := range h.batches {
		for _, ev := range b.events {
			if ev.Kind == kind {
				out = append(out, ev)
			}
		}
	}
	return out
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func TestSeed000TTFTColdAndWarm(t *testing.T) {
	// docs/rule.md's worked example: 8,000-token prompts, the first 6,000 shared. Cold TTFT 570 ms, warm
	// 143 ms, 428 ms saved; computed in virtual time, nothing sleeps.
	h := newHarness(t, timing.Seed000(), 0)
	assert.Equal(t, 34882, h.NumGPUBlocks())
	shared := tokens(0, 6000)
	cold := &Request{ID: "cold", Prompt: append(append([]uint32{}, shared...), tokens(100000, 2000)...), MaxTokens: 1}
	require.NoError(t, h.Submit(0, cold))
	h.run()
	assert.Equal(t, 0, cold.CachedTokens)
	assert.InDelta(t, 570, msf(cold.TTFT()), 0.5)

	start := 10 * time.Second
	warm := &Request{ID: "warm", Prompt: append(append([]uint32{}, shared...), tokens(200000, 2000)...), MaxTokens: 1}
	assert.Equal(t, 6000, h.CachedPrefix(warm.Prompt, cache.Extra{}), "lookup before submit")
	require.NoError(t, h.Submit(start, warm))
	h.run()
	assert.Equal(t, 6000, warm.CachedTokens)
	assert.Equal(t, start, warm.Arrival)
	assert.InDelta(t, 143, msf(warm.TTFT()), 0.5)
	assert.InDelta(t, 428, msf(cold.TTFT()-warm.TTFT()), 0.5)

	st := h.Stats()
	assert.Equal(t, int64(16000), st.PrefixQueries)
	assert.Equal(t, int64(6000), st.PrefixHits)
	assert.Equal(t, int64(16000), st.PromptTokens)
}

func TestDecodeStepsFollowTheProfile(t *testing.T) {
	p := timing.Seed000()
	h := newHarness(t, p, 0)
	var times []time.Duration
	h.cfg.OnToken = func(r *Request, at time.Duration) { times = append(times, at) }
	r := &Request{ID: "r", Prompt: tokens(0, 8000), MaxTokens: 3}
	require.NoError(t, h.Submit(0, r))
	end := h.run()
	require.Len(t, times, 3)
	assert.Equal(t, p.PrefillTime(8000), times[0])
	// Each decode step reads the weights and the context so far (8,000 prompt + 1 fed token, ...).
	assert.Equal(t, p.Step(0, 1, 8001), times[1]-times[0])
	assert.Equal(t, p.Step(0, 1, 8002), times[2]-times[1])
	assert.Equal(t, end, r.FinishedAt)
	assert.Equal(t, "length", r.FinishReason)
	assert.Len(t, r.Output, 3)
}

func TestCachedTokensMatchTheCache(t *testing.T) {
	h := newHarness(t, timing.Fast(), 0)
	cases := []struct {
		name   string
		prompt []uint32
		salt   string
		want   int
	}{
		{"cold", tokens(0, 100), "", 0},
		{"same prompt: all but the last token, block aligned", tokens(0, 100), "", 96},
		{"block-aligned prompt repeats: at most prompt_tokens-1", tokens(0, 96), "", 80},
		{"shared 40 tokens: 2 full blocks", append(tokens(0, 40), tokens(9000, 30)...), "", 32},
		{"salted never shares", tokens(0, 100), "tenant-a", 0},
		{"same salt shares", tokens(0, 100), "tenant-a", 96},
		{"other salt", tokens(0, 100), "tenant-b", 0},
		{"one-token prompt", []uint32{5}, "", 0},
	}
	now := time.Duration(0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &Request{ID: c.name, Prompt: c.prompt, MaxTokens: 2, CacheSalt: c.salt}
			assert.Equal(t, c.want, h.CachedPrefix(c.prompt, cache.Extra{Salt: c.salt}))
			require.NoError(t, h.Submit(now, r))
			now = h.run() + time.Second
			assert.Equal(t, c.want, r.CachedTokens)
			assert.Less(t, r.CachedTokens, len(c.prompt))
			assert.Zero(t, r.CachedTokens%16)
		})
	}
}

func TestBlockStoredEvents(t *testing.T) {
	h := newHarness(t, timing.Fast(), 0)
	a := &Request{ID: "a", Prompt: tokens(0, 40), MaxTokens: 30, CacheSalt: "s", LoRA: "alice", LoraID: 1}
	require.NoError(t, h.Submit(0, a))
	h.run()

	stored := h.events(kvevents.BlockStored)
	require.NotEmpty(t, stored)
	first := stored[0]
	// The prefill step stores both full prompt blocks in one event; the partial block waits.
	assert.Equal(t, a.chain.Hashes[:2], first.BlockHashes)
	assert.False(t, first.HasParent, "parent is nil for the request's first block")
	assert.Equal(t, a.Prompt[:32], first.TokenIDs, "token_ids of exactly those blocks")
	assert.Equal(t, 16, first.BlockSize)
	assert.Equal(t, "alice", first.LoraName)
	assert.Equal(t, 1, first.LoraID)
	assert.Equal(t, "GPU", first.Medium)
	assert.Equal(t, [][]string{{"alice", "s"}, {"alice"}}, first.ExtraKeys, "salt in the first block's extra keys")
	assert.Equal(t, "full_attention", first.KVCacheSpecKind)

	// Decode fills block 2 (tokens 32..47: 8 prompt + 8 generated) and block 3.
	require.Len(t, stored, 3)
	assert.True(t, stored[1].HasParent)
	assert.Equal(t, a.chain.Hashes[1], stored[1].ParentBlockHash)
	assert.Equal(t, append(append([]uint32{}, a.Prompt[32:40]...), a.Output[:8]...), stored[1].TokenIDs)
	assert.Equal(t, [][]string{{"alice"}}, stored[1].ExtraKeys)
	assert.Equal(t, a.Output[8:24], stored[2].TokenIDs)

	// A second request sharing the prefix stores only its new blocks, chained to the hit.
	h.batches = nil
	b := &Request{ID: "b", Prompt: append(tokens(0, 32), tokens(500, 20)...), MaxTokens: 1, CacheSalt: "s", LoRA: "alice", LoraID: 1}
	require.NoError(t, h.Submit(time.Second, b))
	h.run()
	stored = h.events(kvevents.BlockStored)
	require.Len(t, stored, 1)
	assert.Equal(t, 32, b.CachedTokens)
	assert.Equal(t, b.chain.Hashes[2:3], stored[0].BlockHashes)
	assert.Equal(t, a.chain.Hashes[1], stored[0].ParentBlockHash)
	require.Len(t, h.batches, 1, "one batch per step that produced events")
}

func TestEvictionPublishesOneBlockRemovedPerBlock(t *testing.T) {
	h := newHarness(t, timing.Fast(), 9) // 8 usable blocks
	a := &Request{ID: "a", Prompt: tokens(0, 64), MaxTokens: 1}
	require.NoError(t, h.Submit(0, a))
	h.run()
	assert.Empty(t, h.events(kvevents.BlockRemoved))
	b := &Request{ID: "b", Prompt: tokens(1000, 96), MaxTokens: 1}
	require.NoError(t, h.Submit(time.Second, b))
	h.run()
	removed := h.events(kvevents.BlockRemoved)
	// b needs 6 blocks: 4 free-and-empty first, then a's last two, tail first.
	require.Len(t, removed, 2)
	assert.Equal(t, []uint64{a.chain.Hashes[3]}, removed[0].BlockHashes)
	assert.Equal(t, []uint64{a.chain.Hashes[2]}, removed[1].BlockHashes)
	// Removals and stores of one step share one batch, removals first (allocation precedes caching).
	last := h.batches[len(h.batches)-1].events
	assert.Equal(t, kvevents.BlockRemoved, last[0].Kind)
	assert.Equal(t, kvevents.BlockStored, last[len(last)-1].Kind)
}

// A block-aligned prompt seen twice: the hit is capped one token short
// (kv_cache_manager.py @ace980e6, max_cache_hit_length = num_tokens - 1), so the last
// block is recomputed into a new physical block with the same hash, stored (and
// published) again, and each copy's eviction publishes its own BlockRemoved
// (block_pool.py @c59cb794). Before: b's recompute published nothing and h1 was
// removed once.
func TestBlockAlignedRepeatStoresAndRemovesTwice(t *testing.T) {
	h := newHarness(t, timing.Fast(), 9) // 8 usable blocks
	a := &Request{ID: "a", Prompt: tokens(0, 32), MaxTokens: 1}
	require.NoError(t, h.Submit(0, a))
	h.run()
	b := &Request{ID: "b", Prompt: tokens(0, 32), MaxTokens: 1}
	require.NoError(t, h.Submit(time.Second, b))
	h.run()
	assert.Equal(t, 16, b.CachedTokens, "hit capped at 31 tokens: one whole block")
	h0, h1 := a.chain.Hashes[0], a.chain.Hashes[1]
	stored := h.events(kvevents.BlockStored)
	require.Len(t, stored, 2)
	assert.Equal(t, []uint64{h0, h1}, stored[0].BlockHashes)
	assert.Equal(t, []uint64{h1}, stored[1].BlockHashes, "the recomputed last block is stored again")
	assert.True(t, stored[1].HasParent)
	assert.Equal(t, h0, stored[1].ParentBlockHash)
	assert.Equal(t, tokens(16, 16), stored[1].TokenIDs)
	assert.Equal(t, 2, h.pool.Copies(h1))

	c := &Request{ID: "c", Prompt: tokens(1000, 112), MaxTokens: 1} // 7 of the 8 blocks
	require.NoError(t, h.Submit(2*time.Second, c))
	h.run()
	var removed []uint64
	for _, ev := range h.events(kvevents.BlockRemoved) {
		removed = append(removed, ev.BlockHashes...)
	}
	assert.Equal(t, []uint64{h1, h1}, removed, "h1 removed once per copy; h0, hit by b, is evicted last")
	assert.False(t, h.pool.Cached(h1))
	assert.True(t, h.pool.Cached(h0))
}

func TestContinuousBatchingLimits(t *testing.T) {
	p := timing.Fast()
	p.MaxNumSeqs = 4
	p.MaxNumBatchedTokens = 64
	h := newHarness(t, p, 0)
	var reqs []*Request
	for i := range 10 {
		r := &Request{ID: fmt.Sprint(i), Prompt: tokens(i*1000, 100), MaxTokens: 5}
		reqs = append(reqs, r)
		require.NoError(t, h.Submit(0, r))
	}
	st := h.State()
	assert.Equal(t, 10, st.Waiting)
	assert.Equal(t, 1000, st.QueuedPrefillTokens, "all prompt tokens are queued and uncached")
	maxRunning := 0
	h.cfg.OnToken = func(*Request, time.Duration) { maxRunning = max(maxRunning, h.State().Running) }
	for {
		at, ok := h.NextStepAt()
		if !ok {
			break
		}
		h.Advance(at)
		st := h.State()
		assert.LessOrEqual(t, st.Running, 4)
		assert.GreaterOrEqual(t, st.QueuedPrefillTokens, 0)
	}
	assert.Equal(t, 4, maxRunning)
	for _, r := range reqs {
		assert.Equal(t, "length", r.FinishReason)
		assert.Len(t, r.Output, 5)
	}
	assert.Zero(t, h.State().QueuedPrefillTokens)
	assert.Zero(t, h.State().KVUsage)
	// FCFS: first tokens come in arrival order.
	for i := 1; i < len(reqs); i++ {
		assert.LessOrEqual(t, reqs[i-1].FirstTokenAt, reqs[i].FirstTokenAt)
	}
}

func TestChunkedPrefill(t *testing.T) {
	p := timing.Seed000()
	h := newHarness(t, p, 0)
	r := &Request{ID: "long", Prompt: tokens(0, 20000), MaxTokens: 1}
	require.NoError(t, h.Submit(0, r))
	h.Advance(0)
	assert.Equal(t, 20000, h.State().QueuedPrefillTokens)
	at, _ := h.NextStepAt()
	h.Advance(at)
	assert.Equal(t, 20000-8192, h.State().QueuedPrefillTokens, "one 8,192-token chunk per step")
	h.run()
	assert.Equal(t, int64(3), h.Stats().Steps)
	assert.Equal(t, p.PrefillTime(8192)*2+p.PrefillTime(20000-16384), r.TTFT())
	assert.Len(t, h.events(kvevents.BlockStored), 3, "one BlockStored per chunk")
}

func TestPreemptionWhenBlocksRunOut(t *testing.T) {
	p := timing.Fast()
	h := newHarness(t, p, 17) // 16 usable blocks = 256 tokens
	var reqs []*Request
	for i := range 3 {
		r := &Request{ID: fmt.Sprint(i), Prompt: tokens(i*1000, 60), MaxTokens: 100}
		reqs = append(reqs, r)
		require.NoError(t, h.Submit(0, r))
	}
	h.run()
	assert.Positive(t, h.Stats().Preemptions)
	total := 0
	for _, r := range reqs {
		assert.Equal(t, "length", r.FinishReason)
		assert.Len(t, r.Output, 100)
		total += r.Preemptions
	}
	assert.Equal(t, int(h.Stats().Preemptions), total)
	// vLLM's prefix-cache counters count each request's first lookup, not a resumed
	// one's (which would count its output so far as prompt).
	assert.Equal(t, int64(3*60), h.Stats().PrefixQueries)
	assert.Zero(t, h.State().QueuedPrefillTokens)
	assert.Zero(t, h.State().Waiting+h.State().Running)
	// The latest admitted request is the victim; the first never is.
	assert.Zero(t, reqs[0].Preemptions)
}

func TestSubmitRejectsImpossibleRequests(t *testing.T) {
	h := newHarness(t, timing.Fast(), 9)
	cases := []*Request{
		{ID: "empty"},
		{ID: "no tokens", Prompt: tokens(0, 5), MaxTokens: 0},
		{ID: "too long", Prompt: tokens(0, 32768), MaxTokens: 1},
		{ID: "bigger than the pool", Prompt: tokens(0, 200), MaxTokens: 1},
	}
	for _, r := range cases {
		assert.Error(t, h.Submit(0, r), r.ID)
	}
	ok := &Request{ID: "ok", Prompt: tokens(0, 5), MaxTokens: 1}
	require.NoError(t, h.Submit(0, ok))
	assert.Error(t, h.Submit(0, ok), "submitted twice")
}

func TestAbortAndRestart(t *testing.T) {
	h := newHarness(t, timing.Fast(), 0)
	a := &Request{ID: "a", Prompt: tokens(0, 64), MaxTokens: 100}
	b := &Request{ID: "b", Prompt: tokens(1000, 64), MaxTokens: 100}
	require.NoError(t, h.Submit(0, a))
	require.NoError(t, h.Submit(0, b))
	at, _ := h.NextStepAt()
	h.Advance(at) // both admitted
	h.Abort(at, b)
	assert.Equal(t, "abort", b.FinishReason)
	assert.Equal(t, 1, h.State().Running)
	at, _ = h.NextStepAt()
	h.Advance(at)
	assert.Positive(t, h.State().CachedBlocks)

	h.batches = nil
	h.Restart(time.Second)
	assert.Equal(t, "abort", a.FinishReason)
	assert.Zero(t, h.State().CachedBlocks)
	assert.Zero(t, h.State().Running)
	assert.Equal(t, Stats{}, h.Stats())
	assert.Empty(t, h.batches, "a new process sends no AllBlocksCleared (only reset_prefix_cache does)")
	_, busy := h.NextStepAt()
	assert.False(t, busy)

	c := &Request{ID: "c", Prompt: tokens(0, 64), MaxTokens: 1}
	require.NoError(t, h.Submit(2*time.Second, c))
	h.run()
	assert.Zero(t, c.CachedTokens, "the cache is empty after a restart")
	assert.True(t, h.ResetPrefixCache(10*time.Second))
	assert.Zero(t, h.CachedPrefix(c.Prompt, cache.Extra{}))
}

func TestLateAdvanceCatchesUpDeterministically(t *testing.T) {
	// A driver that wakes late gets the same timeline as one that wakes on time.
	run := func(late bool) []time.Duration {
		h := newHarness(t, timing.Fast(), 0)
		var times []time.Duration
		h.cfg.OnToken = func(r *Request, at time.Duration) { times = append(times, at) }
		for i := range 5 {
			require.NoError(t, h.Submit(time.Duration(i)*time.Millisecond, &Request{ID: fmt.Sprint(i), Prompt: tokens(i*100, 300), MaxTokens: 4}))
			if late {
				continue
			}
			for at, ok := h.NextStepAt(); ok && at <= time.Duration(i)*time.Millisecond; at, ok = h.NextStepAt() {
				h.Advance(at)
			}
		}
		if late {
			h.Advance(time.Hour)
		}
		h.run()
		return times
	}
	onTime := run(false)
	assert.Len(t, onTime, 20)
	assert.Equal(t, onTime, run(false), "deterministic")
	// Arrival times, not the driver's wake-ups, decide what each step admits.
	assert.Equal(t, onTime, run(true), "a late driver replays the same timeline")
}

// checkInvariants recomputes the engine's aggregates from scratch.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	queued, held := 0, map[int32]bool{}
	for i := range e.waiting.len() {
		r := e.waiting.at(i)
		require.Equal(t, stateWaiting, r.state)
		require.Empty(t, r.blocks, "waiting requests hold no blocks")
		queued += r.pending
	}
	for _, r := range e.running {
		require.Equal(t, stateRunning, r.state)
		queued += max(r.prefillTarget-r.numComputed, 0)
		for _, id := range r.blocks {
			held[id] = true
		}
		require.GreaterOrEqual(t, len(r.blocks)*e.bs, r.numComputed)
	}
	require.LessOrEqual(t, len(e.running), e.prof.MaxNumSeqs)
	require.Equal(t, queued, e.queuedPrefill)
	require.Len(t, held, e.pool.NumBlocks()-1-e.pool.NumFree(), "the blocks in use are exactly those running requests hold")
}

func TestRandomWorkloadKeepsInvariants(t *testing.T) {
	for seed := range 8 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			p := timing.Fast()
			p.MaxNumSeqs = 6
			p.MaxNumBatchedTokens = 96
			h := newHarness(t, p, 40) // tight pool: preemptions happen
			rng := uint64(seed*7919 + 1)
			next := func(n int) int {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				return int(rng % uint64(n))
			}
			var reqs []*Request
			now := time.Duration(0)
			for i := range 60 {
				now += time.Duration(next(3)) * time.Millisecond
				prefix := tokens(next(4)*1000, 16*next(4))
				prompt := append(prefix, tokens(100000+i*100, 1+next(60))...)
				r := &Request{ID: fmt.Sprint(i), Prompt: prompt, MaxTokens: 1 + next(80), CacheSalt: []string{"", "", "s"}[next(3)]}
				require.NoError(t, h.Submit(now, r))
				reqs = append(reqs, r)
				if next(10) == 0 {
					h.Abort(now, reqs[next(len(reqs))])
				}
				for at, ok := h.NextStepAt(); ok && at <= now; at, ok = h.NextStepAt() {
					h.Advance(at)
					checkInvariants(t, h.Engine)
				}
			}
			for at, ok := h.NextStepAt(); ok; at, ok = h.NextStepAt() {
				h.Advance(at)
				checkInvariants(t, h.Engine)
			}
			for _, r := range reqs {
				require.True(t, r.Done(), r.ID)
				if r.FinishReason == "length" {
					assert.Len(t, r.Output, r.MaxTokens)
					assert.GreaterOrEqual(t, r.FirstTokenAt, r.Arrival)
					assert.GreaterOrEqual(t, r.FinishedAt, r.FirstTokenAt)
				}
			}
			st := h.State()
			assert.Zero(t, st.QueuedPrefillTokens)
			assert.Equal(t, h.NumGPUBlocks()-1, st.FreeBlocks, "every block is back in the free queue")
			assert.Len(t, h.finished, len(reqs), "OnFinish once per request")
			// The event stream is consistent: a hash is removed only after it was stored,
			// and what the stream says is cached is exactly what the pool caches.
			live := map[uint64]bool{}
			for _, b := range h.batches {
				for _, ev := range b.events {
					for _, hv := range ev.BlockHashes {
						switch ev.Kind {
						case kvevents.BlockStored:
							assert.False(t, live[hv], "stored twice without removal")
							live[hv] = true
						case kvevents.BlockRemoved:
							assert.True(t, live[hv], "removed but never stored")
							delete(live, hv)
						}
					}
				}
			}
			assert.Equal(t, st.CachedBlocks, len(live))
			for hv := range live {
				assert.True(t, h.pool.Cached(hv))
			}
		})
	}
}

func BenchmarkSimulatedRequest(b *testing.B) {
	// One seed-000 request (8,000 prompt tokens, 6,000 shared with the previous ones, 300
	// output tokens) through a loaded engine: hashing, lookup, allocation, 300 decode
	// steps shared with ~20 others, release. Reported per request.
	p := timing.Seed000()
	e, err := New(Config{Profile: p})
	require.NoError(b, err)
	prefixes := make([][]uint32, 200)
	for i := range prefixes {
		prefixes[i] = tokens(i*10000, 6000)
	}
	reqs := make([]*Request, b.N)
	for i := range reqs {
		prompt := make([]uint32, 8000)
		copy(prompt, prefixes[i%len(prefixes)])
		copy(prompt[6000:], tokens(5_000_000+i*2000, 2000))
		reqs[i] = &Request{Prompt: prompt, MaxTokens: 300}
	}
	b.ReportAllocs()
	b.ResetTimer()
	now := time.Duration(0)
	gap := 50 * time.Millisecond // 20 req/s on one replica keeps ~20 in flight
	for i, r := range reqs {
		if err := e.Submit(now, r); err != nil {
			b.Fatal(i, err)
		}
		next := now + gap
		for at, ok := e.NextStepAt(); ok && at <= next; at, ok = e.NextStepAt() {
			e.Advance(at)
		}
		now = next
	}
	for at, ok := e.NextStepAt(); ok; at, ok = e.NextStepAt() {
		e.Advance(at)
	}
}

func BenchmarkFleet24kRequests50Replicas(b *testing.B) {
	// The fleet simulator's load for one policy: 50 seed-000 replicas,
	// 24,000 requests at 40 req/s (10 simulated minutes), 8,000-token prompts whose
	// first 6,000 tokens are one of 200 prefixes, 300 output tokens, round robin. Prompt
	// chains are hashed once, as a fleet simulator would. Reported per request.
	const replicas, n = 50, 24000
	prefixes := make([][]uint32, 200)
	for i := range prefixes {
		prefixes[i] = tokens(i*10000, 6000)
	}
	prompts := make([][]uint32, n)
	for i := range prompts {
		p := make([]uint32, 8000)
		copy(p, prefixes[tokenizer.OutputToken(42, i)%uint32(len(prefixes))]) // uniform, pseudo-random
		copy(p[6000:], tokens(5_000_000+i*2000, 2000))
		prompts[i] = p
	}
	h, _ := cache.NewHasher(cache.AlgoSimXXH64, "0", 16)
	chains := make([]*cache.Chain, n)
	for i, p := range prompts {
		chains[i] = h.NewChain(p, cache.Extra{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		engines := make([]*Engine, replicas)
		for i := range engines {
			engines[i], _ = New(Config{Profile: timing.Seed000()})
		}
		hits := 0
		for i := range n {
			now := time.Duration(i) * 25 * time.Millisecond
			for _, e := range engines {
				for at, ok := e.NextStepAt(); ok && at <= now; at, ok = e.NextStepAt() {
					e.Advance(at)
				}
			}
			r := &Request{Prompt: prompts[i], Chain: chains[i], MaxTokens: 300}
			if err := engines[i%replicas].Submit(now, r); err != nil {
				b.Fatal(err)
			}
		}
		for _, e := range engines {
			for at, ok := e.NextStepAt(); ok; at, ok = e.NextStepAt() {
				e.Advance(at)
			}
			hits += int(e.Stats().PrefixHits)
		}
		b.ReportMetric(float64(hits)/float64(n*8000), "hit-rate")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/request")
}
