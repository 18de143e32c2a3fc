package index

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// Event ingest: msgpack decode plus index update, per block. Each batch stores one
// request's 32 new blocks (continuing a chain of 96 stored earlier, as a multi-turn
// request does) and evicts 32 old blocks, so the index stays at steady state.
//
// perEvent=1 is the decode phase: vLLM publishes a BlockStored for each block a running
// request completes (one every 16 tokens it generates), so a long generation's blocks
// arrive one event at a time, and an event's fixed cost is paid per block.
//
//	go test ./controlplane/index -run '^$' -bench 'Ingest$' -cpu 1
func BenchmarkIngest(b *testing.B) {
	for _, perEvent := range []int{32, 1} {
		for _, enc := range []sim.Encoding{sim.Map, sim.Array} {
			b.Run(fmt.Sprintf("%s/perEvent=%d", enc, perEvent), func(b *testing.B) { benchIngest(b, enc, perEvent) })
		}
	}
}

func benchIngest(b *testing.B, enc sim.Encoding, perEvent int) {
	ix := New(Config{})
	ix.SetReplicas([]Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000", Events: true}}, time.Unix(0, 0))
	const perReq, chains = 32, 512
	e := sim.NewEncoder(enc)
	payloads := make([][]byte, chains)
	// vLLM's block hashes are 64-bit digests (docs/kv-events.md): msgpack's uint64, the
	// form kvevents' removedFast reads. Small ones took the general walk instead.
	var h uint64 = 1 << 40
	for c := range payloads {
		base := make([]uint32, 96*16)
		for i := range base {
			base[i] = uint32(c*7919 + i)
		}
		root := sim.Event{Kind: sim.BlockStored, TokenIDs: base, BlockSize: 16, Medium: "GPU"}
		for i := 0; i < 96; i++ {
			root.BlockHashes = append(root.BlockHashes, h)
			h++
		}
		p, err := e.Encode(sim.Batch{Events: []sim.Event{root}})
		if err != nil {
			b.Fatal(err)
		}
		var pre kvevents.Batch
		if err := kvevents.NewDecoder().Decode(p, &pre); err != nil {
			b.Fatal(err)
		}
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, &pre)
		parent := h - 1
		toks := make([]uint32, perReq*16)
		for i := range toks {
			toks[i] = uint32(c*31 + i)
		}
		var evs []sim.Event
		for i := 0; i < perReq; i += perEvent {
			ev := sim.Event{Kind: sim.BlockStored, ParentBlockHash: parent, HasParent: true, TokenIDs: toks[i*16 : (i+perEvent)*16], BlockSize: 16, Medium: "GPU"}
			for j := range perEvent {
				ev.BlockHashes = append(ev.BlockHashes, h+uint64(i+j))
			}
			parent = ev.BlockHashes[perEvent-1]
			evs = append(evs, ev)
		}
		// vLLM: one BlockRemoved per evicted block; these name the blocks this very
		// batch stores, which keeps the index at its size.
		for i := 0; i < perReq; i++ {
			evs = append(evs, sim.Event{Kind: sim.BlockRemoved, BlockHashes: []uint64{h + uint64(i)}, Medium: "GPU"})
		}
		h += perReq
		if payloads[c], err = e.Encode(sim.Batch{TS: 1, Events: evs}); err != nil {
			b.Fatal(err)
		}
	}
	d := kvevents.NewDecoder()
	var batch kvevents.Batch
	sink := ix.Events()
	id := kvevents.StreamID{Replica: "a"}
	blocks := 0
	i := 0
	start := time.Now()
	for b.Loop() {
		if err := d.Decode(payloads[i%chains], &batch); err != nil {
			b.Fatal(err)
		}
		sink.Batch(id, uint64(i), &batch)
		blocks += perReq
		i++
		if i%chains == 0 {
			ix.Flush(time.Unix(int64(i), 0), false)
		}
	}
	b.ReportMetric(float64(blocks)/time.Since(start).Seconds(), "blocks/s")
	if st := ix.DebugState(time.Unix(0, 0))[0]; st.KVEvents.StoredBlocks == 0 {
		b.Fatal(fmt.Sprint("nothing stored", st))
	}
}
