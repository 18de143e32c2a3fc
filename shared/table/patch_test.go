package table

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tieredAt is a format-2 table of one model with the given replicas.
func tieredAt(t *testing.T, version uint64, gen int64, rs []Replica) *Table {
	t.Helper()
	tb := New()
	tb.Version, tb.GeneratedMs, tb.Format = version, gen, FormatTiers
	m, err := NewModel("llama", goldenCfg, rs)
	require.NoError(t, err)
	require.NoError(t, m.SetTiers([]string{"CPU"}))
	require.NoError(t, m.Set(100, 0, Holder(1, 1)))
	tb.Models["llama"] = m
	return tb
}

// roundTrip applies to a copy of base the format-2 delta from base to next, with its
// replica list patched, and returns the copy and the frame's bytes.
func roundTrip(t *testing.T, base, next *Table) (*Table, []byte) {
	t.Helper()
	f := Diff(base, next)
	f.Format = FormatTiers
	for i := range f.Models {
		if om := base.Models[f.Models[i].Name]; om != nil {
			f.Models[i].PatchReplicasFormat(om.Replicas, base.GeneratedMs, next.GeneratedMs, FormatTiers)
		}
	}
	b := Encode(f)
	got := New()
	_, err := got.Apply(EncodeFullFormat(base, FormatTiers))
	require.NoError(t, err)
	_, err = got.Apply(b)
	require.NoError(t, err)
	return got, b
}

// A format-2 delta carries only the replicas whose state changed, and of those only what
// changed; the filter's table is the control plane's, value for value, state ages included.
// Before, every delta carried every replica's whole state (27 bytes each here).
func TestFormat2DeltaCarriesOnlyChangedReplicas(t *testing.T) {
	const gen0 = 1_790_000_000_000
	var rs []Replica
	for i := range 12 {
		rs = append(rs, Replica{Slot: uint32(i), ID: fmt.Sprintf("vllm-%d", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Speed: 14025, Queued: uint64(1000 * i), KVUsage: 0.25, StateAgeMs: uint32(10 + i), Healthy: true})
	}
	base := tieredAt(t, 7, gen0, rs)
	next := slices.Clone(rs)
	for i := range next {
		next[i].StateAgeMs += 50 // not scraped since: its age follows the clock
	}
	next[1].Queued = 4096                                                                    // queue
	next[2].KVUsage = 0.5                                                                    // KV usage
	next[3].StateAgeMs = 3                                                                   // scraped again
	next[4].Healthy = false                                                                  // health
	next[5].Addr = "10.0.1.6:8000"                                                           // identity
	next[6].KVUsage = 0.25000001                                                             // below the wire's resolution: no change
	next = slices.Delete(next, 7, 8)                                                         // slot 7 leaves
	next = append(next, Replica{Slot: 20, ID: "new", Addr: "10.0.0.99:8000", Healthy: true}) // slot 20 joins
	want := tieredAt(t, 8, gen0+50, next)
	want.Models["llama"].Replicas[6].KVUsage = 0.25 // what the wire carries

	got, b := roundTrip(t, base, want)
	assert.Equal(t, contents(want), contents(got))
	f, err := Decode(b)
	require.NoError(t, err)
	mc := f.Models[0]
	require.True(t, mc.Patched)
	var listed []uint32
	for _, r := range mc.Replicas {
		listed = append(listed, r.Slot)
	}
	assert.Equal(t, []uint32{1, 2, 3, 4, 5, 20}, listed)
	assert.Equal(t, []uint8{patchHealthy | patchQueued, patchHealthy | patchKV, patchHealthy | patchAge, 0,
		patchHealthy | patchIdentity, patchHealthy | patchAll&^patchLoad}, mc.ReplicaFields, "format 2 carries no load")
	assert.Equal(t, []uint32{7}, mc.Dropped)

	// Nothing changed but the clock: no replica at all.
	same := slices.Clone(want.Models["llama"].Replicas)
	for i := range same {
		same[i].StateAgeMs += 100
	}
	later := tieredAt(t, 9, gen0+150, same)
	got2, b2 := roundTrip(t, want, later)
	assert.Equal(t, contents(later), contents(got2))
	f2, err := Decode(b2)
	require.NoError(t, err)
	assert.Empty(t, f2.Models[0].Replicas)
	assert.Empty(t, f2.Models[0].Dropped)
	whole := Diff(want, later)
	whole.Format = FormatTiers
	t.Logf("delta of 12 unchanged replicas: %d bytes patched, %d whole", len(b2), len(Encode(whole)))
	assert.Less(t, len(b2), len(Encode(whole))-12*20)
}

// Random replica lists: whatever changes, a patched delta rebuilds the next list exactly.
func TestFormat2ReplicaPatchesRebuildTheList(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	gen := int64(1_790_000_000_000)
	rnd := func(slot uint32) Replica {
		return Replica{Slot: slot, ID: fmt.Sprint("r", rng.IntN(3)), Addr: fmt.Sprint("a", rng.IntN(3)), Speed: uint32(rng.IntN(2)),
			Queued: uint64(rng.IntN(3)), KVUsage: float64(rng.IntN(3)) / 4, StateAgeMs: uint32(rng.IntN(300)), Healthy: rng.IntN(2) == 0}
	}
	var rs []Replica
	for s := range uint32(8) {
		rs = append(rs, rnd(s))
	}
	cur := tieredAt(t, 1, gen, rs)
	for v := uint64(2); v < 300; v++ {
		step := int64(rng.IntN(120)) - 10 // a wall clock may step back
		var next []Replica
		for s := range uint32(10) {
			old := cur.Models["llama"].ReplicaIndex(s)
			switch {
			case old >= 0 && rng.IntN(10) == 0: // leaves
			case old >= 0 && rng.IntN(2) == 0: // unchanged but for its age
				r := cur.Models["llama"].Replicas[old]
				r.StateAgeMs = ageAfter(r.StateAgeMs, cur.GeneratedMs, cur.GeneratedMs+step)
				next = append(next, r)
			case old >= 0 || rng.IntN(4) == 0:
				next = append(next, rnd(s))
			}
		}
		if len(next) == 0 {
			next = append(next, rnd(0))
		}
		want := New()
		want.Version, want.GeneratedMs, want.Format = v, cur.GeneratedMs+step, FormatTiers
		m, err := NewModel("llama", goldenCfg, next)
		require.NoError(t, err)
		require.NoError(t, m.SetTiers([]string{"CPU"}))
		want.Models["llama"] = m
		got, _ := roundTrip(t, cur, want)
		require.Equal(t, contents(want), contents(got), "version %d", v)
		cur = want
	}
}

func TestAgeAfterClamps(t *testing.T) {
	assert.Equal(t, uint32(150), ageAfter(100, 1000, 1050))
	assert.Equal(t, uint32(0), ageAfter(100, 1000, 800), "a clock stepped back")
	assert.Equal(t, uint32(math.MaxUint32), ageAfter(math.MaxUint32-1, 0, 10))
}

// Patched sections are checked like the rest: only in format-2 deltas, sorted, every
// new replica whole, only slots the base has dropped, nothing both listed and dropped.
func TestReplicaPatchStructuralChecks(t *testing.T) {
	base := tieredAt(t, 7, 1000, goldenReplicas) // slots 0, 1, 2
	frame := func(mut func(mc *ModelChange)) []byte {
		mc := ModelChange{Name: "llama", Config: goldenCfg, Tiers: []string{"CPU"}, Patched: true}
		mut(&mc)
		return Encode(&Frame{Format: FormatTiers, Kind: Delta, Version: 8, Base: 7, GeneratedMs: 1050, Models: []ModelChange{mc}})
	}
	apply := func(b []byte) error {
		tb := New()
		_, err := tb.Apply(EncodeFullFormat(base, FormatTiers))
		require.NoError(t, err)
		_, err = tb.Apply(b)
		return err
	}
	require.NoError(t, apply(frame(func(mc *ModelChange) {
		mc.Replicas, mc.ReplicaFields, mc.Dropped = []Replica{{Slot: 1, Queued: 9}}, []uint8{patchQueued}, []uint32{2}
	})))
	bad := map[string]func(mc *ModelChange){
		"new replica without all values": func(mc *ModelChange) {
			mc.Replicas, mc.ReplicaFields = []Replica{{Slot: 5}}, []uint8{patchQueued | patchKV | patchAge}
		},
		"dropped slot the base lacks": func(mc *ModelChange) { mc.Dropped = []uint32{4} },
		"dropped slot the base lacks, between": func(mc *ModelChange) {
			mc.Replicas, mc.ReplicaFields, mc.Dropped = []Replica{{Slot: 3, ID: "x", Addr: "y"}, {Slot: 5, ID: "z", Addr: "w"}}, []uint8{patchAll, patchAll}, []uint32{4}
		},
		"listed and dropped": func(mc *ModelChange) {
			mc.Replicas, mc.ReplicaFields, mc.Dropped = []Replica{{Slot: 1}}, []uint8{patchQueued}, []uint32{1}
		},
	}
	for name, mut := range bad {
		assert.ErrorIs(t, apply(frame(mut)), ErrCorrupt, name)
	}
	// Byte-level: slots not increasing, unknown field bits, a patch in format 1, a
	// patched reset section.
	good := frame(func(mc *ModelChange) {
		mc.Replicas, mc.ReplicaFields = []Replica{{Slot: 1, Queued: 9}, {Slot: 2}}, []uint8{patchQueued, 0}
	})
	f, err := Decode(good)
	require.NoError(t, err)
	require.True(t, f.Models[0].Patched)
	forge := func(edit func(b []byte) []byte) []byte { return resum(edit(slices.Clone(good))) }
	for name, edit := range map[string]func(b []byte) []byte{
		"slots not increasing": func(b []byte) []byte {
			return replaceOnce(t, b, []byte{1, patchQueued, 9, 2, 0}, []byte{2, patchQueued, 9, 1, 0})
		},
		"unknown fields": func(b []byte) []byte {
			return replaceOnce(t, b, []byte{1, patchQueued, 9}, []byte{1, 0x40 | patchQueued, 9})
		},
		"format 1":          func(b []byte) []byte { b[4] = FormatVersion; return b },
		"reset and patched": func(b []byte) []byte { return replaceOnce(t, b, []byte("llama\x04"), []byte("llama\x06")) },
		"full frame":        func(b []byte) []byte { b[5] = byte(Full); b[16] = 0; return b },
	} {
		_, err := Decode(forge(edit))
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
	assert.Panics(t, func() {
		Encode(&Frame{Format: FormatVersion, Kind: Delta, Models: []ModelChange{{Name: "m", Patched: true}}})
	}, "format 1 has no patches")
}

func replaceOnce(t *testing.T, b, old, new []byte) []byte {
	t.Helper()
	i := slices.Index(b, old[0])
	for ; i >= 0 && i+len(old) <= len(b); i++ {
		if slices.Equal(b[i:i+len(old)], old) {
			return slices.Concat(b[:i], new, b[i+len(old):])
		}
	}
	t.Fatalf("%x not in the frame", old)
	return nil
}

// A delta applies to its base whatever its bytes, or is refused: never a panic, and the
// replica list it makes is a valid one. (Its entries may still name a slot the delta
// dropped, as with whole lists: the control plane removes a leaving replica's keys in
// the same version.)
func FuzzApplyPatchedDelta(f *testing.F) {
	full := EncodeFullFormat(tieredTable(f), FormatTiers)
	mc := ModelChange{Name: "llama", Config: goldenCfg, Tiers: []string{"CPU", "DISK"}, Patched: true,
		Replicas:      []Replica{{Slot: 1, Queued: 9}, {Slot: 5, ID: "n", Addr: "a:1", Healthy: true}},
		ReplicaFields: []uint8{patchQueued | patchAge, patchAll | patchHealthy}, Dropped: []uint32{2}}
	mc.Upserts.Add(500, 1, Holder(5, 2))
	f.Add(Encode(&Frame{Format: FormatTiers, Kind: Delta, Version: 8, Base: 7, GeneratedMs: 1_790_000_000_200, Models: []ModelChange{mc}}))
	mc.Replicas[0].Running, mc.ReplicaFields[0] = 12, patchQueued|patchLoad
	f.Add(Encode(&Frame{Format: FormatLoad, Kind: Delta, Version: 8, Base: 7, GeneratedMs: 1_790_000_000_200, Models: []ModelChange{mc}}))
	full3 := EncodeFullFormat(loadedTable(f), FormatLoad)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < headerSize+trailerSize {
			return
		}
		in := slices.Clone(b)
		copy(in, magic)
		base := full
		if in[4] == FormatLoad { // a format-3 delta onto a format-3 table
			base = full3
		} else {
			in[4] = FormatTiers
		}
		in[5] = byte(Delta)
		in[6], in[7] = 0, 0
		binary.LittleEndian.PutUint64(in[16:], 7)
		in = resum(in)
		tb := New()
		_, err := tb.Apply(base)
		require.NoError(t, err)
		if _, err := tb.Apply(in); err != nil {
			return
		}
		m := tb.Models["llama"]
		if m == nil {
			return
		}
		_, err = NewModel("llama", m.Config, m.Replicas)
		require.NoError(t, err)
		for i, r := range m.Replicas {
			require.Equal(t, i, m.ReplicaIndex(r.Slot))
		}
	})
}
