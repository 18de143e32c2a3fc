package sched

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

func newTierHarness(t testing.TB, gpuBlocks, cpuTokens int, load time.Duration) *harness {
	h := &harness{}
	e, err := New(Config{
		Profile: timing.Fast(), NumGPUBlocks: gpuBlocks, CPUTierTokens: cpuTokens, CPULoadPerToken: load,
		OnEvents: func(at time.Duration, evs []kvevents.Event) { h.batches = append(h.batches, batch{at, evs}) },
		OnFinish: func(r *Request, at time.Duration) { h.finished = append(h.finished, r) },
	})
	require.NoError(t, err)
	h.Engine = e
	return h
}

func media(evs []kvevents.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Kind.String()+"/"+ev.Medium)
	}
	return out
}

// Blocks are offloaded as they are computed: the step after, one hash-only BlockStored
// with medium CPU follows the step's GPU events, as vLLM's connector publishes them.
func TestCPUTierStoresComputedBlocksAsVLLMPublishes(t *testing.T) {
	h := newTierHarness(t, 64, 1024, time.Microsecond)
	r := &Request{ID: "a", Prompt: tokens(0, 100), MaxTokens: 2}
	require.NoError(t, h.Submit(0, r))
	h.run()
	require.GreaterOrEqual(t, len(h.batches), 2)
	first := h.batches[0].events
	assert.Equal(t, []string{"BlockStored/GPU"}, media(first), "the prefill step: GPU only, the copy is not done")
	gpu := first[0]
	assert.Len(t, gpu.BlockHashes, 6)
	assert.Len(t, gpu.TokenIDs, 96)
	second := h.batches[1].events
	require.NotEmpty(t, second)
	last := second[len(second)-1]
	assert.Equal(t, kvevents.BlockStored, last.Kind)
	assert.Equal(t, kvevents.MediumCPU, last.Medium)
	assert.Equal(t, gpu.BlockHashes, last.BlockHashes, "the same hashes as the GPU blocks")
	assert.Empty(t, last.TokenIDs, "token_ids []")
	assert.Zero(t, last.BlockSize, "block_size 0")
	assert.False(t, last.HasParent)
	assert.Equal(t, 6, h.State().CPUBlocks)
}

// A prefix the GPU evicted is loaded back from the CPU tier: its tokens count as cached
// (LoadedTokens says which), the load adds to the admitting step, and the loaded blocks
// are cached on the GPU again (BlockStored GPU, with tokens).
func TestCPUTierHitAfterGPUEviction(t *testing.T) {
	const load = 20 * time.Microsecond
	h := newTierHarness(t, 16, 4096, load) // 15 usable GPU blocks: one 200-token prompt
	a := &Request{ID: "a", Prompt: tokens(0, 200), MaxTokens: 1}
	b := &Request{ID: "b", Prompt: tokens(10000, 200), MaxTokens: 1}
	require.NoError(t, h.Submit(0, a))
	h.run()
	require.NoError(t, h.Submit(h.clock, b)) // evicts a's blocks from the GPU
	h.run()
	require.NotEmpty(t, h.events(kvevents.BlockRemoved), "a's GPU blocks were evicted")
	// The GPU keeps a's first two blocks (it evicts a freed request's tail first).
	assert.Equal(t, 32, h.CachedPrefix(a.Prompt, a.chain.Extra))

	h.batches = nil
	again := &Request{ID: "a2", Prompt: tokens(0, 200), MaxTokens: 1}
	start := h.clock
	require.NoError(t, h.Submit(start, again))
	h.run()
	assert.Equal(t, 192, again.CachedTokens, "2 blocks on the GPU, 10 loaded")
	assert.Equal(t, 160, again.LoadedTokens)
	p := timing.Fast()
	assert.Equal(t, p.PrefillTime(8)+160*load, again.TTFT(), "8 tokens prefilled, 160 loaded")
	assert.Equal(t, int64(160), h.Stats().CPUHits)
	stored := h.events(kvevents.BlockStored)
	require.NotEmpty(t, stored)
	assert.Equal(t, kvevents.MediumGPU, stored[0].Medium, "loaded blocks are GPU-cached again")
	assert.Len(t, stored[0].TokenIDs, 160)
	assert.True(t, stored[0].HasParent, "chained to the GPU hit")
}

// The CPU tier evicts its least recently used blocks to store new ones, publishing one
// BlockRemoved with medium CPU before the new blocks' BlockStored.
func TestCPUTierEvictsLRU(t *testing.T) {
	h := newTierHarness(t, 64, 10*16, 0) // 10 CPU blocks
	for i, start := range []int{0, 10000} {
		r := &Request{ID: string(rune('a' + i)), Prompt: tokens(start, 100), MaxTokens: 1} // 6 blocks each
		require.NoError(t, h.Submit(h.clock, r))
		h.run()
	}
	removed := h.events(kvevents.BlockRemoved)
	var cpu []kvevents.Event
	for _, ev := range removed {
		if ev.Medium == kvevents.MediumCPU {
			cpu = append(cpu, ev)
		}
	}
	require.Len(t, cpu, 1)
	assert.Len(t, cpu[0].BlockHashes, 2, "6 + 6 blocks in 10: the two oldest go")
	assert.Equal(t, 10, h.State().CPUBlocks)
}

func TestCPUTierConfigErrors(t *testing.T) {
	_, err := New(Config{Profile: timing.Fast(), CPUTierTokens: -1})
	assert.Error(t, err)
	_, err = New(Config{Profile: timing.Fast(), CPUTierTokens: 10}) // less than a block
	assert.ErrorContains(t, err, "holds no 16-token block")
	_, err = New(Config{Profile: timing.Fast(), CPUTierTokens: 160, CPULoadPerToken: -time.Second})
	assert.Error(t, err)
}
