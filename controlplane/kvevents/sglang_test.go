package kvevents

import (
	"testing"
	"time"

	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// The engine simulator's SGLang layout (SGLang kv_events.py @612d5790 and
// radix_cache.py @95769b28: 3-element batch ending in attn_dp_rank, one 6-element
// BlockStored per page chained by parent_block_hash, 2-element BlockRemoved, hashes
// CPython's hash() of the page's token tuple, the first page's parent hash(())) through
// the production decoder: every page arrives as its own event with its tokens, page
// size and parent, signed hashes reinterpreted as uint64, the DP rank read from
// attn_dp_rank, medium absent (GPU).
func TestDecodeSimulatedSGLangBatches(t *testing.T) {
	enc := sim.NewEncoder(sim.SGLang)
	if err := enc.SetSGLangPageSize(16); err != nil {
		t.Fatal(err)
	}
	var payloads [][]byte
	var want []sim.Event
	eng, err := sched.New(sched.Config{Profile: timing.Fast(), NumGPUBlocks: 9,
		OnEvents: func(at time.Duration, evs []sim.Event) {
			b, err := enc.Encode(sim.Batch{TS: at.Seconds(), Events: evs, DataParallelRank: 2})
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, b)
			want = append(want, evs...)
		}})
	if err != nil {
		t.Fatal(err)
	}
	var now time.Duration
	for i := range 3 { // 3 x 64-token prompts into 8 usable blocks: evictions follow
		p := make([]uint32, 64)
		for j := range p {
			p[j] = uint32(1000*i + j + 1)
		}
		if err := eng.Submit(now, &sched.Request{ID: string(rune('a' + i)), Prompt: p, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		for {
			at, ok := eng.NextStepAt()
			if !ok {
				break
			}
			eng.Advance(at)
			now = at
		}
	}
	var got []Event
	for i, pl := range payloads {
		b, err := Decode(pl)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if !b.HasDPRank || b.DPRank != 2 {
			t.Fatalf("batch %d: attn_dp_rank %v %d, want 2", i, b.HasDPRank, b.DPRank)
		}
		got = append(got, b.Events...)
	}
	// Expand the simulator's events to SGLang's one-per-page form (page = block here).
	var pages []Event
	removed := 0
	pageHash := map[uint64]uint64{} // simulator block hash -> SGLang page hash
	for _, ev := range want {
		switch ev.Kind {
		case sim.BlockStored:
			parent := uint64(sim.PyEmptyTupleHash)
			if ev.HasParent {
				parent = pageHash[ev.ParentBlockHash]
			}
			for j, h := range ev.BlockHashes {
				toks := ev.TokenIDs[j*ev.BlockSize : (j+1)*ev.BlockSize]
				ph := uint64(sim.PyTupleHash(toks))
				pageHash[h] = ph
				pages = append(pages, Event{Kind: BlockStored, Hashes: []uint64{ph}, Parent: parent, HasParent: true,
					Tokens: toks, BlockSize: ev.BlockSize})
				parent = ph
			}
		case sim.BlockRemoved:
			for _, h := range ev.BlockHashes {
				pages = append(pages, Event{Kind: BlockRemoved, Hashes: []uint64{pageHash[h]}})
				removed++
			}
		}
	}
	if removed == 0 {
		t.Fatal("no eviction happened: the test does not cover BlockRemoved")
	}
	if len(got) != len(pages) {
		t.Fatalf("decoded %d events, want %d", len(got), len(pages))
	}
	for i := range pages {
		g, w := got[i], pages[i]
		if g.Kind != w.Kind || len(g.Hashes) != 1 || g.Hashes[0] != w.Hashes[0] || g.HasParent != w.HasParent ||
			g.Parent != w.Parent || g.BlockSize != w.BlockSize || len(g.Tokens) != len(w.Tokens) || g.Medium != "" ||
			g.HasLoraID || g.LoraName != "" {
			t.Fatalf("event %d: got %+v, want %+v", i, g, w)
		}
		for k := range w.Tokens {
			if g.Tokens[k] != w.Tokens[k] {
				t.Fatalf("event %d token %d: %d != %d", i, k, g.Tokens[k], w.Tokens[k])
			}
		}
	}
}
