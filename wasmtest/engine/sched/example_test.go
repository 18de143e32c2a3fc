package sched_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// A fleet simulator drives engines in virtual time: submit at arrival times, jump to
// NextStepAt, read results from the requests and KV events from the hook.
func Example() {
	stored := 0
	eng, err := sched.New(sched.Config{
		Profile: timing.Seed000(),
		OnEvents: func(at time.Duration, evs []kvevents.Event) {
			for _, ev := range evs {
				if ev.Kind == kvevents.BlockStored {
					stored += len(ev.BlockHashes)
				}
			}
		},
	})
	if err != nil {
		panic(err)
	}
	prompt := func(suffix uint32) []uint32 { // 6,000 shared tokens + 2,000 own
		p := make([]uint32, 8000)
		for i := range p {
			p[i] = uint32(i % 1000)
			if i >= 6000 {
				p[i] = suffix*10000 + uint32(i)
			}
		}
		return p
	}
	// Precompute the block hashes once per prompt; the chain can be submitted to many engines.
	chain := eng.Hasher().NewChain(prompt(1), cache.Extra{})
	cold := &sched.Request{ID: "cold", Prompt: prompt(1), Chain: chain, MaxTokens: 300}
	warm := &sched.Request{ID: "warm", Prompt: prompt(2), MaxTokens: 300}

	if err := eng.Submit(0, cold); err != nil {
		panic(err)
	}
	for at, ok := eng.NextStepAt(); ok; at, ok = eng.NextStepAt() {
		if at >= time.Second && warm.Arrival == 0 && !warm.Done() {
			fmt.Println("would hit:", eng.CachedPrefix(warm.Prompt, cache.Extra{}))
			if err := eng.Submit(time.Second, warm); err != nil {
				panic(err)
			}
			st := eng.State()
			fmt.Println("waiting:", st.Waiting, "running:", st.Running, "queued prefill tokens:", st.QueuedPrefillTokens)
		}
		eng.Advance(at)
	}
	fmt.Printf("cold: cached %d, TTFT %.1f ms\n", cold.CachedTokens, cold.TTFT().Seconds()*1e3)
	// Warm: 2,000 uncached tokens (142.6 ms) in a step shared with the cold request's
	// decode, after waiting for the decode step in flight when it arrived.
	fmt.Printf("warm: cached %d, TTFT %.1f ms\n", warm.CachedTokens, warm.TTFT().Seconds()*1e3)
	fmt.Println("blocks stored:", stored, "finished:", cold.FinishReason, warm.FinishReason)
	// Output:
	// would hit: 6000
	// waiting: 1 running: 1 queued prefill tokens: 2000
	// cold: cached 0, TTFT 570.4 ms
	// warm: cached 6000, TTFT 160.5 ms
	// blocks stored: 661 finished: length length
}
