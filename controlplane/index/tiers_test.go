package index

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/table"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// tierView is a format-2 filter's table, rebuilt from every flush.
type tierView struct {
	t *table.Table
	v uint64
}

func (w *tierView) apply(t *testing.T, ups []ModelUpdate) {
	t.Helper()
	if ups == nil {
		return
	}
	f := &table.Frame{Format: table.FormatTiers, Kind: table.Delta, Version: w.v + 1, Base: w.v, GeneratedMs: t0.UnixMilli()}
	for _, u := range ups {
		f.Models = append(f.Models, table.ModelChange{Name: u.Name, Removed: u.Removed, Reset: u.Reset, Config: u.Config,
			Replicas: u.Replicas, Tiers: u.Tiers, Upserts: u.Upserts, Removes: u.Removes})
	}
	_, err := w.t.Apply(table.Encode(f))
	require.NoError(t, err)
	w.v++
}

// holders of each key on the model, "" when absent.
func (w *tierView) holders(keys []uint64) [][]uint32 {
	out := make([][]uint32, len(keys))
	for i, k := range keys {
		out[i] = w.t.Models["m"].Lookup(k)
	}
	return out
}

var cpuA = table.Holder(0, 1) // replica a (slot 0) in tier 1, "CPU"

// The engine simulator's CPU tier (vLLM's OffloadingConnector events: hash-only, medium
// CPU) through the simulator's encoder and the control plane's decoder into the index:
// offloaded prefixes are listed in the CPU tier once the GPU evicts them, a block held
// in both counts as GPU, and a load back into the GPU moves the key back to GPU.
func TestCPUTierFromTheEngineSimulator(t *testing.T) {
	ix := fixture(t, Config{})
	w := &tierView{t: table.New()}
	w.apply(t, ix.Flush(t0, true))

	enc := sim.NewEncoder(sim.Map)
	seq := uint64(0)
	eng, err := sched.New(sched.Config{Profile: timing.Fast(), NumGPUBlocks: 16, CPUTierTokens: 4096, CPULoadPerToken: time.Microsecond,
		OnEvents: func(at time.Duration, evs []sim.Event) {
			p, err := enc.Encode(sim.Batch{TS: at.Seconds(), Events: evs})
			require.NoError(t, err)
			b, err := kvevents.Decode(p)
			require.NoError(t, err)
			ix.Events().Batch(kvevents.StreamID{Replica: "a"}, seq, b)
			seq++
		}})
	require.NoError(t, err)
	run := func(prompt []uint32) *sched.Request {
		r := &sched.Request{ID: "r", Prompt: prompt, MaxTokens: 1}
		at, _ := eng.NextStepAt()
		require.NoError(t, eng.Submit(at, r))
		for {
			at, ok := eng.NextStepAt()
			if !ok {
				break
			}
			eng.Advance(at)
		}
		eng.Advance(time.Hour) // the last step's copies complete; flushed by the next step
		w.apply(t, ix.Flush(t0, false))
		return r
	}
	a := tokens(200, 1)
	keysA := expectedKeys("m", "", "", a, 4) // 12 blocks: checkpoints at 4, 8, 12 blocks
	run(a)
	assert.Equal(t, [][]uint32{{0}, {0}, {0}}, w.holders(keysA), "on the GPU")

	run(tokens(200, 50000)) // evicts a's blocks from the 15-block GPU pool but its first two
	assert.Equal(t, [][]uint32{{cpuA}, {cpuA}, {cpuA}}, w.holders(keysA), "only in CPU memory now")
	assert.Equal(t, []string{"CPU"}, w.t.Models["m"].Tiers)

	r := run(a)
	assert.Equal(t, 160, r.LoadedTokens)
	assert.Equal(t, [][]uint32{{0}, {0}, {0}}, w.holders(keysA), "loaded back: GPU again")
}

func cpuStored(hashes []uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, Hashes: hashes, Medium: "CPU"} // vLLM's placeholder payload
}

func cpuRemoved(hashes []uint64, medium string) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: hashes, Medium: medium}
}

// tierChain is an index with a published view and an n-block chain for replica a.
type tierChain struct {
	ix   *Index
	w    *tierView
	a    kvevents.StreamID
	hs   []uint64
	toks []uint32
	keys []uint64 // checkpoints: every 4th block
}

func newTierChain(t *testing.T, n int) tierChain {
	c := tierChain{ix: fixture(t, Config{}), w: &tierView{t: table.New()}, a: kvevents.StreamID{Replica: "a"},
		hs: seqHashes(n, 100), toks: tokens(n*16, 7)}
	c.w.apply(t, c.ix.Flush(t0, true))
	c.keys = expectedKeys("m", "", "", c.toks, 4)
	return c
}

func TestTierHoldingsRefCountsAndClears(t *testing.T) {
	c := newTierChain(t, 8)
	ix, w, a, hs, toks, keys := c.ix, c.w, c.a, c.hs, c.toks, c.keys

	ix.Events().Batch(a, 0, batch(storedEv(hs, nil, toks, 16), cpuStored(hs)))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{{0}, {0}}, w.holders(keys), "GPU and CPU: GPU")
	// The GPU evicts everything: the CPU copy remains.
	ix.Events().Batch(a, 1, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: hs, Medium: "GPU"}))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{{cpuA}, {cpuA}}, w.holders(keys))
	// A repeated store changes nothing (vLLM's manager stores a hash once): one removal
	// of the second half drops the second checkpoint.
	ix.Events().Batch(a, 2, batch(cpuStored(hs[4:])))
	ix.Events().Batch(a, 3, batch(cpuRemoved(hs[4:], "cpu"))) // media are case-blind
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{{cpuA}, nil}, w.holders(keys))
	// A hash never seen on the GPU cannot be keyed: an orphan.
	ix.Events().Batch(a, 4, batch(cpuStored([]uint64{999})))
	st := ix.DebugState(t0)[0]
	assert.Equal(t, uint64(1), st.orphans)
	// AllBlocksCleared drops every medium.
	ix.Events().Batch(a, 5, batch(kvevents.Event{Kind: kvevents.AllBlocksCleared}))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{nil, nil}, w.holders(keys))
	assert.Equal(t, 0, w.t.Models["m"].Len())
}

func TestTierLossesDropTheTiers(t *testing.T) {
	c := newTierChain(t, 4)
	ix, w, a, hs, toks, keys := c.ix, c.w, c.a, c.hs, c.toks, c.keys
	ix.Events().Batch(a, 0, batch(storedEv(hs, nil, toks, 16), cpuStored(hs), cpuRemoved(hs, "GPU")))
	w.apply(t, ix.Flush(t0, false))
	require.Equal(t, [][]uint32{{cpuA}}, w.holders(keys))
	ix.Events().Gap(a, 1, 5, false) // lost events: the tiers are as uncertain as the GPU
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{nil}, w.holders(keys))

	ix.Events().Batch(a, 6, batch(storedEv(hs, nil, toks, 16), cpuStored(hs), cpuRemoved(hs, "GPU")))
	w.apply(t, ix.Flush(t0, false))
	require.Equal(t, [][]uint32{{cpuA}}, w.holders(keys))
	ix.SetReplicas([]Spec{{ID: "b", Model: "m", Addr: "10.0.0.2:8000", Events: true}}, t0) // a leaves
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, 0, w.t.Models["m"].Len())
}

// A model names at most table.MaxTiers media; blocks of a further one are skipped. Tier
// blocks are bounded like GPU blocks (the rank's block limit, the global MaxKeys).
func TestTierBounds(t *testing.T) {
	ix := fixture(t, Config{})
	a := kvevents.StreamID{Replica: "a"}
	hs := seqHashes(4, 100)
	ix.Events().Batch(a, 0, batch(storedEv(hs, nil, tokens(4*16, 7), 16)))
	for i := range table.MaxTiers + 1 {
		ev := cpuStored(hs)
		ev.Medium = string(rune('A'+i)) + "TIER"
		ix.Events().Batch(a, uint64(i+1), batch(ev))
	}
	w := &tierView{t: table.New()}
	w.apply(t, ix.Flush(t0, true))
	assert.Len(t, w.t.Models["m"].Tiers, table.MaxTiers)
	assert.Equal(t, uint64(4), ix.DebugState(t0)[0].skipped)

	// Budget: a global MaxKeys of 1,200 entries.
	ix = fixture(t, Config{Budget: Budget{MaxKeys: 1200}})
	big := seqHashes(600, 1)
	ix.Events().Batch(a, 0, batch(storedEv(big, nil, tokens(600*16, 7), 16))) // 600 blocks, 150 keys
	ix.Events().Batch(a, 1, batch(cpuStored(big)))
	st := ix.BudgetState()
	assert.Positive(t, st.Dropped[inputTierBlocks][reasonGlobal], "tier blocks past the global budget are dropped and counted")
	assert.LessOrEqual(t, st.Keys, 1200)
}

// Reported (text-domain) keys have no events: the GPU's evictions age them out
// (TestEvictionByBlockRemoved). On a replica that offloads, they move to its CPU tier
// instead, and the CPU tier's removals age them out of it.
func TestReportedKeysTheGPUEvictsMoveToTheCPUTier(t *testing.T) {
	ix := fixture(t, Config{})
	w := &tierView{t: table.New()}
	w.apply(t, ix.Flush(t0, true))
	a := kvevents.StreamID{Replica: "a"}
	chain := seqHashes(6, 100)
	o := outcome("10.0.0.1:8000", chain, 200, 0, 0)
	o.PromptBytes = 4000
	ix.ApplyReports(reports(o), t0, nil)
	removed := func(medium string, n int, base uint64) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: seqHashes(n, base), Medium: medium}
	}
	// The replica shows a CPU tier (a store the index cannot key, an orphan, is enough),
	// then the GPU evicts 144 tokens: the two least recent keys (64 tokens each) go to CPU.
	ix.Events().Batch(a, 0, batch(cpuStored([]uint64{1}), removed("GPU", 9, 5000)))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{{0}, {0}, {0}, {0}, {cpuA}, {cpuA}}, w.holders(chain))
	// The CPU tier evicts 64 tokens: the least recently offloaded key leaves it.
	ix.Events().Batch(a, 1, batch(removed("CPU", 4, 9000)))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, [][]uint32{{0}, {0}, {0}, {0}, {cpuA}, nil}, w.holders(chain))
	// A clear empties both.
	ix.Events().Batch(a, 2, batch(kvevents.Event{Kind: kvevents.AllBlocksCleared}))
	w.apply(t, ix.Flush(t0, false))
	assert.Equal(t, 0, w.t.Models["m"].Len())
}

// The engine's GPU capacity bounds the reported keys it can hold (TestEvictionByCapacity).
// On a replica that offloads, the keys past it are in its CPU tier: they move there and
// stay listed until the CPU tier's removals age them out.
func TestReportedKeysPastTheGPUCapacityMoveToTheCPUTier(t *testing.T) {
	ix := fixture(t, Config{})
	w := &tierView{t: table.New()}
	w.apply(t, ix.Flush(t0, true))
	a := kvevents.StreamID{Replica: "a"}
	ix.ApplyScrape("a", scrape.Sample{CapacityTokens: 640}, nil, t0) // room for 10 keys
	ix.Events().Batch(a, 0, batch(cpuStored([]uint64{1})))           // the replica shows a CPU tier
	old, newer := seqHashes(8, 100), seqHashes(7, 200)
	o := outcome("10.0.0.1:8000", old, 200, 0, 0)
	o.PromptBytes = 4000 // 4 bytes a token: 64 tokens a key
	n := o
	n.Keys = newer
	ix.ApplyReports(reports(o), t0, nil)
	ix.ApplyReports(reports(n), t0.Add(time.Second), nil)
	w.apply(t, ix.Flush(t0.Add(time.Second), false))
	// 15 keys, room for 10 on the GPU: the older chain's tail is in CPU memory.
	g := []uint32{0}
	c := []uint32{cpuA}
	assert.Equal(t, [][]uint32{g, g, g, c, c, c, c, c}, w.holders(old))
	assert.Equal(t, [][]uint32{g, g, g, g, g, g, g}, w.holders(newer))
	// The CPU tier removes 128 tokens: the two keys the GPU gave up first leave it.
	ix.Events().Batch(a, 1, batch(cpuRemoved(seqHashes(8, 9000), "CPU")))
	w.apply(t, ix.Flush(t0.Add(time.Second), false))
	assert.Equal(t, [][]uint32{g, g, g, c, c, c, nil, nil}, w.holders(old))
}

// TestKeysInUseMoveToTheCPUTierAsBefore: on a replica that offloads, the GPU's eviction
// volume moves reported keys to the CPU tier whether a request is using them or not
// (ageText); the outcome brings them back (TestKeysInUseDoNotAgeOut is the replica
// without a tier).
func TestKeysInUseMoveToTheCPUTierAsBefore(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: 10 * time.Second, ConfirmedTTL: time.Hour})
	w := &tierView{t: table.New()}
	w.apply(t, ix.Flush(t0, true))
	stream := kvevents.StreamID{Replica: "a"}
	chain := seqHashes(2, 100)
	o := done(addrA, chain)
	ix.ApplyReports(reports(o, placement(addrA, chain)), t0, nil)
	t1 := t0.Add(20 * time.Second) // the placement's speculative entries are gone
	w.apply(t, ix.Flush(t1, false))
	ix.Events().Batch(stream, 0, batch(cpuStored([]uint64{1}), kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: seqHashes(8, 5000), Medium: "GPU"}))
	w.apply(t, ix.Flush(t1, false))
	assert.Equal(t, [][]uint32{{cpuA}, {cpuA}}, w.holders(chain))
	ix.ApplyReports(reports(o), t1, nil)
	w.apply(t, ix.Flush(t1, false))
	assert.Equal(t, [][]uint32{{0}, {0}}, w.holders(chain))
}
