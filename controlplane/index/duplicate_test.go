package index

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// simBatches runs requests one after another through the engine simulator's core and
// returns the msgpack EventBatch payloads it publishes (vLLM >= 0.24 map layout), in
// sequence order.
func simBatches(t *testing.T, numBlocks int, prompts ...[]uint32) (payloads [][]byte, batchesPerRequest []int) {
	t.Helper()
	enc := sim.NewEncoder(sim.Map)
	eng, err := sched.New(sched.Config{Profile: timing.Fast(), NumGPUBlocks: numBlocks,
		OnEvents: func(at time.Duration, evs []sim.Event) {
			b, err := enc.Encode(sim.Batch{TS: at.Seconds(), Events: evs})
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, b)
		}})
	if err != nil {
		t.Fatal(err)
	}
	var now time.Duration
	for i, p := range prompts {
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
		now += time.Second
		batchesPerRequest = append(batchesPerRequest, len(payloads))
	}
	return payloads, batchesPerRequest
}

// A 64-token prompt seen twice by vLLM: the second hit is capped one token short, so
// block 3 (a checkpoint at stride 4) is recomputed into a second physical copy and
// stored again; evicting the first copy publishes BlockRemoved while the second is
// still cached (vllm/v1/core/block_pool.py @c59cb794). The bytes are the simulator's,
// decoded by the production decoder. Before reference counting, the index dropped
// the block's key at the first BlockRemoved ("after the first copy's eviction": held
// [true true ... false]) although the engine still had it cached.
func TestDuplicateBlockStaysIndexedUntilEveryCopyIsRemoved(t *testing.T) {
	prompt := tokens(64, 500)
	payloads, marks := simBatches(t, 9, prompt, prompt, tokens(64, 9000), tokens(16, 20000))
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	keys := expectedKeys("m", "", "", prompt, 4)
	if len(keys) != 1 {
		t.Fatalf("%d checkpoint keys", len(keys))
	}
	dec := kvevents.NewDecoder()
	stored, removed := 0, 0
	applied := 0
	applyUntil := func(n int) {
		for ; applied < n; applied++ {
			var b kvevents.Batch
			if err := dec.Decode(payloads[applied], &b); err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.Events {
				switch ev.Kind {
				case kvevents.BlockStored:
					stored += len(ev.Hashes)
				case kvevents.BlockRemoved:
					removed += len(ev.Hashes)
				}
			}
			ix.Events().Batch(kvevents.StreamID{Replica: "a"}, uint64(applied), &b)
		}
		w.apply(t, ix.Flush(t0, false), t0)
	}
	applyUntil(marks[1])
	if stored != 5 || removed != 0 {
		t.Fatalf("after the repeat: %d blocks stored, %d removed; want 4 + the recomputed copy, 0", stored, removed)
	}
	if !all(w.held("m", 0, keys)) {
		t.Fatal("the prompt's checkpoint is not indexed")
	}
	applyUntil(marks[2]) // evicts 3 empty blocks and the first copy of block 3
	if removed != 1 {
		t.Fatalf("%d BlockRemoved, want 1 (the first copy)", removed)
	}
	if !all(w.held("m", 0, keys)) {
		t.Fatal("after the first copy's eviction the block was dropped, but its second copy is still cached")
	}
	applyUntil(marks[3]) // evicts the second copy
	if removed != 2 {
		t.Fatalf("%d BlockRemoved, want 2", removed)
	}
	if !none(w.held("m", 0, keys)) {
		t.Fatal("every copy is gone but the key is still indexed")
	}
}
