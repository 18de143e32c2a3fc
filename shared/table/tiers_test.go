package table

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goldenReplicas and goldenModel are the table whose frames the code before format 2
// encoded as goldenFull and goldenDelta (generated from that code, commit baa9ffe).
var goldenReplicas = []Replica{
	{Slot: 0, ID: "a", Addr: "10.0.0.1:8000", Speed: 3, Queued: 500, KVUsage: 0.5, StateAgeMs: 40, Healthy: true},
	{Slot: 1, ID: "b", Addr: "10.0.0.2:8000", Queued: 0, KVUsage: 0.25, StateAgeMs: 41, Healthy: true},
	{Slot: 2, ID: "c", Addr: "10.0.0.3:8000", Queued: 9, StateAgeMs: 42},
}

var goldenCfg = Config{BlockBytes: 64, BlockTokens: 16, Stride: 1, BytesPerToken: 4.125}

const (
	goldenFull  = "4b56525401010000070000000000000000000000000000007b6c50c4a00100007400000001056c6c616d61024010019d20030001610d31302e302e302e313a3830303003f403882728010101620d31302e302e302e323a383030300000c41329010201630d31302e302e302e333a383030300009002a000364000000000000000100c8000000000000000200022c01000000000000010100ce5efcd3"
	goldenDelta = "4b5652540102000008000000000000000700000000000000df6c50c4a00100007200000001056c6c616d61004010019d20030001610d31302e302e302e313a3830303003f403882728010101620d31302e302e302e323a383030300000c41329010201630d31302e302e302e333a383030300009002a0002c80000000000000001002c010000000000000201020164000000000000002c65f87f"
)

// tieredTable is the golden table plus slower tiers: key 200 also on slot 1 in CPU,
// key 400 only in CPU (slot 0) and Disk (slot 2), key 300 on slot 1 in GPU and CPU.
func tieredTable(t testing.TB) *Table {
	tb := New()
	tb.Version, tb.GeneratedMs = 7, 1_790_000_000_123
	m, err := NewModel("llama", goldenCfg, goldenReplicas)
	require.NoError(t, err)
	require.NoError(t, m.SetTiers([]string{"CPU", "DISK"}))
	require.NoError(t, m.Set(100, 0))
	require.NoError(t, m.Set(200, 0, 2, Holder(1, 1)))
	require.NoError(t, m.Set(300, 1, Holder(1, 1)))
	require.NoError(t, m.Set(400, Holder(0, 1), Holder(2, 2)))
	tb.Models["llama"] = m
	return tb
}

func TestFormat1FramesAreByteIdenticalWithTiersPresent(t *testing.T) {
	// What an older filter receives from a control plane that knows tiers is what the
	// control plane before tiers sent for the same GPU holdings, byte for byte.
	assert.Equal(t, goldenFull, hex.EncodeToString(EncodeFull(tieredTable(t))))

	var up Entries
	up.Add(200, 0)
	up.Add(300, 1, 2)
	f := &Frame{Kind: Delta, Version: 8, Base: 7, GeneratedMs: 1_790_000_000_223,
		Models: []ModelChange{{Name: "llama", Config: goldenCfg, Replicas: goldenReplicas, Upserts: up, Removes: []uint64{100}}}}
	assert.Equal(t, goldenDelta, hex.EncodeToString(Encode(f)))
	// The same delta with tier holders and tier names added encodes the same in format 1.
	var up2 Entries
	up2.Add(200, 0, Holder(1, 1))
	up2.Add(300, 1, 2, Holder(0, 2))
	f.Models[0].Upserts, f.Models[0].Tiers = up2, []string{"CPU", "DISK"}
	assert.Equal(t, goldenDelta, hex.EncodeToString(Encode(f)))
}

func TestFormat1DeltaRemovesKeysLeftOnlyInSlowerTiers(t *testing.T) {
	var up Entries
	up.Add(200, 0)
	up.Add(250, Holder(1, 1)) // moved out of GPU: a format-1 reader must drop it
	f := &Frame{Kind: Delta, Version: 8, Base: 7, Models: []ModelChange{{Name: "llama", Config: goldenCfg,
		Replicas: goldenReplicas, Tiers: []string{"CPU"}, Upserts: up, Removes: []uint64{100, 300}}}}
	g, err := Decode(Encode(f))
	require.NoError(t, err)
	assert.Equal(t, uint8(FormatVersion), g.Format)
	assert.Equal(t, []uint64{200}, g.Models[0].Upserts.Keys)
	assert.Equal(t, []uint64{100, 250, 300}, g.Models[0].Removes)
	assert.Empty(t, g.Models[0].Tiers)
}

func TestFormat2RoundTrip(t *testing.T) {
	tb := tieredTable(t)
	b := EncodeFullFormat(tb, FormatTiers)
	assert.Equal(t, byte(FormatTiers), b[4])
	got := New()
	f, err := got.Apply(b)
	require.NoError(t, err)
	assert.Equal(t, uint8(FormatTiers), f.Format)
	assert.Equal(t, uint8(FormatTiers), got.Format)
	assert.Equal(t, contents(tb), contents(got))
	m := got.Models["llama"]
	assert.Equal(t, []string{"CPU", "DISK"}, m.Tiers)
	assert.Equal(t, []uint32{Holder(0, 1), Holder(2, 2)}, m.Lookup(400))

	// A format-2 delta on top; Diff carries the tiers.
	next := tieredTable(t)
	next.Version = 8
	nm := next.Models["llama"]
	require.NoError(t, nm.Set(400, 0))            // loaded back into GPU
	require.NoError(t, nm.Set(500, Holder(1, 2))) // new on disk
	require.NoError(t, nm.Set(100))
	d := Diff(tb, next)
	d.Format = FormatTiers
	_, err = got.Apply(Encode(d))
	require.NoError(t, err)
	assert.Equal(t, contents(next), contents(got))

	// A format-1 table refuses a format-2 delta and the other way round: the caller
	// fetches a full frame.
	old := New()
	_, err = old.Apply(EncodeFull(tb))
	require.NoError(t, err)
	_, err = old.Apply(Encode(d))
	assert.ErrorIs(t, err, ErrBaseMismatch)
	d.Format = FormatVersion
	_, err = tieredFull(t).Apply(Encode(d))
	assert.ErrorIs(t, err, ErrBaseMismatch)
}

func tieredFull(t *testing.T) *Table {
	tb := New()
	_, err := tb.Apply(EncodeFullFormat(tieredTable(t), FormatTiers))
	require.NoError(t, err)
	return tb
}

func TestSetKeepsAReplicasFastestTier(t *testing.T) {
	m, err := NewModel("llama", goldenCfg, goldenReplicas)
	require.NoError(t, err)
	require.NoError(t, m.SetTiers([]string{"CPU", "DISK"}))
	require.NoError(t, m.Set(1, Holder(1, 2), Holder(1, 1), 1, Holder(0, 2)))
	assert.Equal(t, []uint32{1, Holder(0, 2)}, m.Lookup(1))
	assert.Error(t, m.Set(2, Holder(1, 3)), "tier 3 of 2")
	assert.Error(t, m.Set(2, Holder(7, 1)), "slot without replica")
	assert.Error(t, m.SetTiers([]string{"CPU", "CPU"}))
	assert.Error(t, m.SetTiers([]string{""}))
	assert.Error(t, m.SetTiers(make([]string, MaxTiers+1)))
}

func TestMatchTiers(t *testing.T) {
	m, err := NewModel("llama", Config{BlockTokens: 16, Stride: 2}, goldenReplicas)
	require.NoError(t, err)
	require.NoError(t, m.SetTiers([]string{"CPU", "DISK"}))
	// Chain of 8 blocks, checkpoints at positions 1, 3, 5, 7 (keys 11, 13, 15, 17).
	keys := []uint64{10, 11, 12, 13, 14, 15, 16, 17}
	// Replica 0: GPU to 4 blocks, CPU to 8. Replica 1: CPU to 4, then a gap, CPU at 8
	// (not loadable: vLLM stops at the gap). Replica 2: disk to 2, CPU to 4 blocks.
	require.NoError(t, m.Set(11, 0, Holder(1, 1), Holder(2, 2)))
	require.NoError(t, m.Set(13, 0, Holder(1, 1), Holder(2, 1)))
	require.NoError(t, m.Set(15, Holder(0, 1)))
	require.NoError(t, m.Set(17, Holder(0, 1), Holder(1, 1)))
	matched, loadable, cost := m.MatchTiers(keys, []float64{0.1, 0.5}, nil, nil, nil)
	assert.Equal(t, []int{4, 0, 0}, matched)
	assert.Equal(t, []int{4, 4, 4}, loadable)
	assert.InDeltaSlice(t, []float64{0.4, 0.4, 2*0.5 + 2*0.1}, cost, 1e-9)
	gm, _ := m.Match(keys, nil)
	assert.Equal(t, gm, matched, "MatchTiers' GPU part is Match")
	// A tier without a ratio counts as uncached.
	_, _, cost = m.MatchTiers(keys, []float64{0.1}, matched, loadable, cost)
	assert.InDelta(t, 2*1.0+2*0.1, cost[2], 1e-9)
}

func TestFormat2StructuralChecks(t *testing.T) {
	tb := tieredTable(t)
	good := EncodeFullFormat(tb, FormatTiers)
	_, err := Decode(good)
	require.NoError(t, err)

	// A format-1 frame may not carry a holder above MaxSlot.
	f := &Frame{Format: FormatVersion, Kind: Full, Version: 1, Models: []ModelChange{{Name: "m", Reset: true, Config: goldenCfg, Replicas: goldenReplicas}}}
	f.Models[0].Upserts.Add(1, Holder(0, 1))
	b := encodeRaw(f) // bypasses Encode's format-1 projection
	_, err = Decode(b)
	assert.ErrorIs(t, err, ErrCorrupt)

	// Format 2: a holder naming a tier the model does not have.
	f.Format = FormatTiers
	f.Models[0].Tiers = []string{"CPU"}
	f.Models[0].Upserts = Entries{}
	f.Models[0].Upserts.Add(1, Holder(0, 2))
	_, err = Decode(encodeRaw(f))
	assert.ErrorIs(t, err, ErrCorrupt)
	// Too many tiers, or a tier named twice.
	f.Models[0].Upserts = Entries{}
	f.Models[0].Tiers = make([]string, MaxTiers+1)
	for i := range f.Models[0].Tiers {
		f.Models[0].Tiers[i] = string(rune('A' + i))
	}
	_, err = Decode(encodeRaw(f))
	assert.ErrorIs(t, err, ErrCorrupt)
	f.Models[0].Tiers = []string{"CPU", "CPU"}
	_, err = Decode(encodeRaw(f))
	assert.ErrorIs(t, err, ErrCorrupt)
	// A holder whose slot has no replica is refused when applied.
	f.Models[0].Tiers = []string{"CPU"}
	f.Models[0].Upserts.Add(1, Holder(9, 1))
	_, err = New().Apply(encodeRaw(f))
	assert.ErrorIs(t, err, ErrCorrupt)
	// An unknown format.
	bad := append([]byte(nil), good...)
	bad[4] = 3
	_, err = Decode(bad)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.False(t, errors.Is(err, ErrBaseMismatch))
}

// encodeRaw writes f in f.Format without format 1's projection (to forge frames).
func encodeRaw(f *Frame) []byte {
	w := newWriter(f.Format, f.Kind, f.Version, f.Base, f.GeneratedMs)
	w.uv(uint64(len(f.Models)))
	for i := range f.Models {
		mc := &f.Models[i]
		w.modelHead(mc.Name, flagReset, mc.Config, mc.Replicas, mc.Tiers)
		w.uv(uint64(mc.Upserts.Len()))
		for j := 0; j < mc.Upserts.Len(); j++ {
			w.entry(mc.Upserts.At(j))
		}
		w.uv(0)
	}
	return w.finish()
}
