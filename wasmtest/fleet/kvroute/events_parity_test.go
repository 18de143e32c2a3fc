package kvroute

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// batchLog is a cpkv.Handler that keeps a copy of every batch it is given.
type batchLog struct{ batches [][]cpkv.Event }

func (l *batchLog) Batch(_ cpkv.StreamID, _ uint64, b *cpkv.Batch) {
	evs := make([]cpkv.Event, len(b.Events))
	for i, e := range b.Events {
		e.Hashes, e.Tokens, e.FirstExtra = slices.Clone(e.Hashes), slices.Clone(e.Tokens), slices.Clone(e.FirstExtra)
		evs[i] = e
	}
	l.batches = append(l.batches, evs)
}

func (*batchLog) Restart(cpkv.StreamID)                   {}
func (*batchLog) Gap(cpkv.StreamID, uint64, uint64, bool) {}
func (*batchLog) DecodeError(cpkv.StreamID, error)        {}
func (*batchLog) Connected(cpkv.StreamID, bool)           {}

// parityControlPlane is a control plane of one listed replica, with token-domain keys
// on (else the copy drops BlockStored), whose index is l.
func parityControlPlane(l *batchLog) *controlPlane {
	return &controlPlane{cfg: Config{TokenKeys: true}, events: l, ids: []string{"engine-0"}, seq: make([]uint64, 1), listed: []bool{true}}
}

// paritySteps are simulator event batches with every field the copy carries set, in
// the way an engine sets them: a request's first blocks (LoRA, salt in the first
// block's extra keys), its next blocks chained to them by parent (extra keys without
// the salt), a block in CPU memory and a second KV cache group, the CPU tier's copies
// (hashes only: no tokens, block size 0, no parent), evictions and a clear.
func paritySteps() [][]kvevents.Event {
	return [][]kvevents.Event{
		{{Kind: kvevents.BlockStored, BlockHashes: []uint64{0xfedcba9876543210, 11}, TokenIDs: []uint32{1, 2, 3, 70000},
			BlockSize: 2, LoraID: 3, LoraName: "alice", ExtraKeys: [][]string{{"alice", "tenant-salt"}, {"alice"}},
			Medium: kvevents.MediumGPU, KVCacheSpecKind: kvevents.SpecFullAttention}},
		{
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{12}, ParentBlockHash: 11, HasParent: true, TokenIDs: []uint32{4294967295, 6},
				BlockSize: 2, LoraID: 3, LoraName: "alice", ExtraKeys: [][]string{{"alice"}}, Medium: kvevents.MediumGPU,
				KVCacheSpecKind: kvevents.SpecFullAttention},
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{21}, TokenIDs: []uint32{7, 8}, BlockSize: 2,
				ExtraKeys: [][]string{{"salt-only"}}, Medium: kvevents.MediumGPU, KVCacheSpecKind: kvevents.SpecFullAttention},
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{31}, ParentBlockHash: 1 << 63, HasParent: true, TokenIDs: []uint32{9, 10},
				BlockSize: 2, Medium: kvevents.MediumCPU, GroupIdx: 1, KVCacheSpecKind: "sliding_window", SlidingWindow: 64},
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{11, 12}, Medium: kvevents.MediumCPU},
		},
		{
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{12}, Medium: kvevents.MediumGPU},
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{31}, Medium: kvevents.MediumCPU, GroupIdx: 1},
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{11, 12}, Medium: kvevents.MediumCPU},
		},
		{{Kind: kvevents.AllBlocksCleared}},
	}
}

// eventField is one production event field the index reads (controlplane/index
// events.go and sglang.go) or that names the event.
type eventField struct {
	name string
	// carried says whether an encoding's layout has the field (array layouts only ever
	// grew, map has them all).
	carried func(kvevents.Encoding) bool
	get     func(*cpkv.Event) any
}

func always(kvevents.Encoding) bool      { return true }
func hasMedium(e kvevents.Encoding) bool { return e != kvevents.ArrayV09 }
func hasNewest(e kvevents.Encoding) bool { return e == kvevents.Map || e == kvevents.Array }

// emptyIsNil makes an empty slice compare equal to a nil one.
func emptyIsNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

var eventFields = []eventField{
	{"Kind", always, func(e *cpkv.Event) any { return e.Kind }},
	{"Tag", always, func(e *cpkv.Event) any { return e.Tag }},
	{"Hashes", always, func(e *cpkv.Event) any { return emptyIsNil(e.Hashes) }},
	{"Parent", always, func(e *cpkv.Event) any { return e.Parent }},
	{"HasParent", always, func(e *cpkv.Event) any { return e.HasParent }},
	{"Tokens", always, func(e *cpkv.Event) any { return emptyIsNil(e.Tokens) }},
	{"BlockSize", always, func(e *cpkv.Event) any { return e.BlockSize }},
	{"LoraID", always, func(e *cpkv.Event) any { return e.LoraID }},
	{"HasLoraID", always, func(e *cpkv.Event) any { return e.HasLoraID }},
	{"Medium", hasMedium, func(e *cpkv.Event) any { return e.Medium }},
	{"LoraName", hasNewest, func(e *cpkv.Event) any { return e.LoraName }},
	{"FirstExtra", hasNewest, func(e *cpkv.Event) any { return emptyIsNil(e.FirstExtra) }},
	{"CacheSalt", hasNewest, func(e *cpkv.Event) any { return e.CacheSalt() }},
	{"GroupIdx", hasNewest, func(e *cpkv.Event) any { return e.GroupIdx }},
	{"SpecKind", hasNewest, func(e *cpkv.Event) any { return e.SpecKind }},
}

// The control plane's in-process copy of simulator events (controlPlane.Events) gives
// the index the same production events as the engine's bytes would, decoded by the
// subscriber's decoder, in every vLLM layout the simulator writes: every field a
// layout carries is equal, every other one is zero in the decoded event. SGLang's
// layout is not compared: it publishes one event per page under SGLang's own page
// hashes, and the fleet scrapes its engines as vLLM (controlplane/index sglang_test.go
// covers SGLang's events).
func TestEventsParity(t *testing.T) {
	steps := paritySteps()
	log := &batchLog{}
	c := parityControlPlane(log)
	for _, evs := range steps {
		c.Events(0, 0, evs)
	}
	copied := log.batches
	require.Len(t, copied, len(steps), "one index batch per simulator batch")
	zero := &cpkv.Event{}
	// Every compared field is set in some event, so a copy that dropped one would differ.
	setIn := map[string]bool{}
	for _, enc := range kvevents.Encodings {
		t.Run(string(enc), func(t *testing.T) {
			e := kvevents.NewEncoder(enc)
			d := cpkv.NewDecoder()
			var b cpkv.Batch
			for s, evs := range steps {
				p, err := e.Encode(kvevents.Batch{TS: 1, Events: evs})
				require.NoError(t, err)
				require.NoError(t, d.Decode(p, &b))
				require.Len(t, b.Events, len(copied[s]), "step %d", s)
				for i := range b.Events {
					cp, dec := &copied[s][i], &b.Events[i]
					for _, f := range eventFields {
						setIn[f.name] = setIn[f.name] || !assert.ObjectsAreEqual(f.get(dec), f.get(zero))
						want := f.get(cp)
						if !f.carried(enc) {
							want = f.get(zero)
						}
						assert.Equal(t, want, f.get(dec), "step %d event %d (%s): %s", s, i, dec.Tag, f.name)
					}
				}
			}
		})
	}
	for _, f := range eventFields {
		assert.True(t, setIn[f.name], "no decoded event has %s set", f.name)
	}
}
