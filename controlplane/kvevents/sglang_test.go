package kvevents

import (
	"slices"
	"testing"
	"time"

	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

// The engine simulator's SGLang mode (its radix tree, package radix, and SGLang's
// layout: a 3-element batch ending in attn_dp_rank, BlockStored of 6 elements, 7 with
// medium, BlockRemoved of 2, 3 with medium), at each modelled SGLang revision and page
// size, through the production decoder: every event arrives as published, with its
// tokens, page size and parent (None under the root at main, hash(()) before), signed
// hashes reinterpreted as uint64, the DP rank read from attn_dp_rank, medium "GPU" at
// main and absent before, and main's one BlockRemoved per radix node listing all its
// pages.
func TestDecodeSimulatedSGLangBatches(t *testing.T) {
	for _, c := range version.SGLangSetups() {
		v := c.Version
		enc := sim.NewEncoder(sim.SGLang)
		var payloads [][]byte
		var want []sim.Event
		ec := v.Engine(timing.Fast(), c.PageSize, 8*16+c.PageSize) // the null block is one page
		ec.OnEvents = func(at time.Duration, evs []sim.Event) {
			b, err := enc.Encode(sim.Batch{TS: at.Seconds(), Events: evs, DataParallelRank: 2})
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, b)
			want = append(want, evs...)
		}
		eng, err := sched.New(ec)
		if err != nil {
			t.Fatal(err)
		}
		var now time.Duration
		for i := range 3 { // 3 x 64-token prompts into 128 tokens: evictions follow
			p := make([]uint32, 64)
			for j := range p {
				p[j] = uint32(1000*i + j + 1)
			}
			if err := eng.Submit(now, &sched.Request{ID: string(rune('a' + i)), Prompt: p, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			now = eng.RunUntilIdle(now)
		}
		var got []Event
		for i, pl := range payloads {
			b, err := Decode(pl)
			if err != nil {
				t.Fatalf("%s/%d batch %d: %v", v, c.PageSize, i, err)
			}
			if !b.HasDPRank || b.DPRank != 2 {
				t.Fatalf("batch %d: attn_dp_rank %v %d, want 2", i, b.HasDPRank, b.DPRank)
			}
			got = append(got, b.Events...)
		}
		removed := 0
		if len(got) != len(want) {
			t.Fatalf("%s/%d: decoded %d events, want %d", v, c.PageSize, len(got), len(want))
		}
		for i, w := range want {
			g := got[i]
			if int(g.Kind) != int(w.Kind) || !slices.Equal(g.Hashes, w.BlockHashes) || g.HasParent != w.HasParent ||
				g.Parent != w.ParentBlockHash || g.BlockSize != w.BlockSize || !slices.Equal(g.Tokens, w.TokenIDs) ||
				g.HasLoraID || g.LoraName != "" {
				t.Fatalf("%s/%d event %d: got %+v, want %+v", v, c.PageSize, i, g, w)
			}
			if wantMedium := map[bool]string{true: "GPU", false: ""}[v.NewLabels()]; w.Kind != sim.AllBlocksCleared && g.Medium != wantMedium {
				t.Fatalf("%s/%d event %d: medium %q", v, c.PageSize, i, g.Medium)
			}
			if w.Kind == sim.BlockRemoved {
				removed++
				if v.NewLabels() && c.PageSize == 1 && len(g.Hashes) < 2 {
					t.Fatalf("main, page size 1: a BlockRemoved of %d pages; SGLang removes whole nodes", len(g.Hashes))
				}
			}
			if w.Kind == sim.BlockStored && !w.HasParent && !v.NewLabels() {
				t.Fatalf("0.5.0rc0: a page without a parent; the root's children name hash(())")
			}
		}
		if removed == 0 {
			t.Fatalf("%s/%d: no eviction happened: the test does not cover BlockRemoved", v, c.PageSize)
		}
	}
}
