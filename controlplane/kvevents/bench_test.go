package kvevents

import (
	"syscall"
	"testing"
	"time"

	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// stepPayload is one scheduler step as the index's ingest benchmarks send it: 8
// requests each storing 32 16-token blocks after a parent, and one BlockRemoved per
// block (vLLM publishes one per evicted block).
func stepPayload(tb testing.TB, enc sim.Encoding) (payload []byte, stored int) {
	e := sim.NewEncoder(enc)
	var evs []sim.Event
	h := uint64(3) << 40
	for r := range 8 {
		toks := make([]uint32, 32*16)
		for i := range toks {
			toks[i] = uint32(r*131 + i)
		}
		ev := sim.Event{Kind: sim.BlockStored, ParentBlockHash: h - 1, HasParent: true, TokenIDs: toks, BlockSize: 16,
			Medium: sim.MediumGPU, KVCacheSpecKind: sim.SpecFullAttention}
		for i := range 32 {
			ev.BlockHashes = append(ev.BlockHashes, h+uint64(i))
		}
		evs = append(evs, ev)
		for i := range 32 {
			evs = append(evs, sim.Event{Kind: sim.BlockRemoved, BlockHashes: []uint64{h + uint64(i)}, Medium: sim.MediumGPU})
		}
		h += 32
	}
	p, err := e.Encode(sim.Batch{TS: 1, Events: evs})
	if err != nil {
		tb.Fatal(err)
	}
	return p, 8 * 32
}

// cpuTime is the process's CPU time: on a machine shared with other work it is a
// steadier measure than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Decoding one step (256 blocks stored and 256 removed), per stored block.
//
//	go test ./controlplane/kvevents -run '^$' -bench DecodeStep -benchmem
func BenchmarkDecodeStep(b *testing.B) {
	for _, enc := range []sim.Encoding{sim.Map, sim.Array} {
		b.Run(string(enc), func(b *testing.B) {
			p, blocks := stepPayload(b, enc)
			d := NewDecoder()
			var batch Batch
			b.SetBytes(int64(len(p)))
			c0 := cpuTime()
			for b.Loop() {
				if err := d.Decode(p, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N*blocks), "cpu-ns/block")
		})
	}
}
