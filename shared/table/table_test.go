package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func replicas(n int) []Replica {
	rs := make([]Replica, n)
	for i := range rs {
		rs[i] = Replica{
			Slot: uint32(i), ID: fmt.Sprintf("vllm-%d", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Speed: 14025, Queued: uint64(i * 1000), KVUsage: 0.25 + float64(i)/1000, StateAgeMs: uint32(40 + i),
			Healthy: i%5 != 4,
		}
	}
	return rs
}

var cfg = ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 1, BytesPerToken: 4.125}

func sampleTable(t testing.TB) *Table {
	tb := New()
	tb.Version, tb.GeneratedMs = 7, 1_790_000_000_123
	m, err := NewModel("llama", cfg, replicas(3))
	require.NoError(t, err)
	require.NoError(t, m.Set(100, 0))
	require.NoError(t, m.Set(200, 0, 2))
	require.NoError(t, m.Set(300, 2, 1)) // unsorted input is sorted
	tb.Models["llama"] = m
	q, err := NewModel("qwen", ModelConfig{BlockBytes: 128, BlockTokens: 32, Stride: 4, BytesPerToken: 3.5}, replicas(1))
	require.NoError(t, err)
	tb.Models["qwen"] = q
	return tb
}

// contents flattens a table for comparison.
func contents(t *Table) map[string]any {
	out := map[string]any{"version": t.Version, "generated": t.GeneratedMs}
	for name, m := range t.Models {
		var es []string
		m.Each(func(k uint64, s []uint32) bool {
			es = append(es, fmt.Sprintf("%#x:%v", k, s))
			return true
		})
		var hs []string
		m.EachHome(func(k uint64, s uint32) bool {
			hs = append(hs, fmt.Sprintf("%#x:%d", k, s))
			return true
		})
		out[name] = map[string]any{"config": m.Config, "replicas": m.Replicas, "entries": es, "homes": hs}
	}
	return out
}

func TestFullRoundTrip(t *testing.T) {
	tb := sampleTable(t)
	b := EncodeFull(tb)
	got := New()
	f, err := got.Apply(b)
	require.NoError(t, err)
	assert.Equal(t, Full, f.Kind)
	assert.Equal(t, contents(tb), contents(got))
	assert.Equal(t, []uint32{1, 2}, got.Models["llama"].Lookup(300))
	assert.Nil(t, got.Models["llama"].Lookup(400))
	assert.Equal(t, b, EncodeFull(got), "re-encoding a decoded table gives the same bytes")
}

func TestQuantisedFields(t *testing.T) {
	tb := New()
	m, err := NewModel("m", ModelConfig{BytesPerToken: 3.14159}, []Replica{{Slot: 0, KVUsage: 0.123456, Healthy: true}})
	require.NoError(t, err)
	tb.Models["m"] = m
	got := New()
	_, err = got.Apply(EncodeFull(tb))
	require.NoError(t, err)
	assert.Equal(t, 3.142, got.Models["m"].Config.BytesPerToken)
	assert.Equal(t, 0.1235, got.Models["m"].Replicas[0].KVUsage)
}

func TestDeltaRoundTrip(t *testing.T) {
	old := sampleTable(t)
	next := sampleTable(t)
	next.Version = 9
	next.GeneratedMs += 100
	lm := next.Models["llama"]
	lm.Replicas[1].Queued = 55555         // queue terms change every version
	require.NoError(t, lm.Set(100))       // removed
	require.NoError(t, lm.Set(200, 1))    // changed set
	require.NoError(t, lm.Set(250, 0, 1)) // added
	delete(next.Models, "qwen")           // model gone
	m, err := NewModel("mistral", cfg, replicas(2))
	require.NoError(t, err)
	require.NoError(t, m.Set(42, 1))
	next.Models["mistral"] = m // model new

	d := Diff(old, next)
	assert.Equal(t, uint64(7), d.Base)
	b := Encode(d)
	assert.Less(t, len(b), len(EncodeFull(next))+64)

	holder := New()
	_, err = holder.Apply(EncodeFull(old))
	require.NoError(t, err)
	_, err = holder.Apply(b)
	require.NoError(t, err)
	assert.Equal(t, contents(next), contents(holder))
}

func TestDeltaMustApplyToItsBase(t *testing.T) {
	old := sampleTable(t)
	next := sampleTable(t)
	next.Version = 8
	require.NoError(t, next.Models["llama"].Set(999, 0))
	delta := Encode(Diff(old, next))

	holder := New()
	_, err := holder.Apply(delta)
	assert.ErrorIs(t, err, ErrBaseMismatch, "empty table at version 0")

	_, err = holder.Apply(EncodeFull(old))
	require.NoError(t, err)
	_, err = holder.Apply(delta)
	require.NoError(t, err)
	_, err = holder.Apply(delta)
	assert.ErrorIs(t, err, ErrBaseMismatch, "already applied")
	assert.Equal(t, uint64(8), holder.Version)
}

func TestMatchFindsLongestCheckpointPerReplica(t *testing.T) {
	chain := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	c := cfg
	c.Stride = 4
	m, err := NewModel("m", c, replicas(4))
	require.NoError(t, err)
	// Checkpoints of stride 4 are positions 3, 7, 11 (keys 4, 8, 12).
	require.NoError(t, m.Set(4, 0, 1, 2))
	require.NoError(t, m.Set(8, 0, 1))
	require.NoError(t, m.Set(12, 0))
	require.NoError(t, m.Set(5, 3)) // not a checkpoint position: never consulted
	matched, longest := m.Match(chain, nil)
	assert.Equal(t, []int{12, 8, 4, 0}, matched)
	assert.Equal(t, 12, longest)

	// A shorter request matches only as far as its own chain goes.
	matched, longest = m.Match(chain[:9], matched)
	assert.Equal(t, []int{8, 8, 4, 0}, matched)
	assert.Equal(t, 8, longest)

	// A different chain matches nothing.
	matched, longest = m.Match([]uint64{91, 92, 93, 94}, matched)
	assert.Equal(t, []int{0, 0, 0, 0}, matched)
	assert.Zero(t, longest)
}

func TestMoreThan64Replicas(t *testing.T) {
	tb := New()
	m, err := NewModel("big", cfg, replicas(300))
	require.NoError(t, err)
	all := make([]uint32, 300)
	for i := range all {
		all[i] = uint32(i)
	}
	require.NoError(t, m.Set(1, all...))
	require.NoError(t, m.Set(2, 64, 65, 299))
	tb.Models["big"] = m
	got := New()
	_, err = got.Apply(EncodeFull(tb))
	require.NoError(t, err)
	gm := got.Models["big"]
	assert.Len(t, gm.Replicas, 300)
	assert.Equal(t, all, gm.Lookup(1))
	matched, _ := gm.Match([]uint64{1, 2}, nil)
	assert.Equal(t, 2, matched[299])
	assert.Equal(t, 2, matched[64])
	assert.Equal(t, 1, matched[63])
}

func TestSetRejectsUnknownSlot(t *testing.T) {
	m, err := NewModel("m", cfg, replicas(2))
	require.NoError(t, err)
	assert.Error(t, m.Set(1, 5))
	_, err = NewModel("m", cfg, []Replica{{Slot: 1}, {Slot: 1}})
	assert.Error(t, err, "duplicate slot")
	_, err = NewModel("m", cfg, []Replica{{Slot: MaxSlot + 1}})
	assert.Error(t, err)
}

// The overlay and its merges must behave exactly like a plain map under any sequence of
// upserts and removals.
func TestEntriesMatchReferenceMapUnderRandomChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, err := NewModel("m", cfg, replicas(8))
	require.NoError(t, err)
	ref := map[uint64][]uint32{}
	for step := 0; step < 60000; step++ {
		k := rng.Uint64N(20000)
		if rng.IntN(3) == 0 {
			require.NoError(t, m.Set(k))
			delete(ref, k)
			continue
		}
		s := []uint32{uint32(rng.IntN(8))}
		if rng.IntN(2) == 0 {
			s = append(s, uint32(rng.IntN(8)))
		}
		require.NoError(t, m.Set(k, s...))
		slices.Sort(s)
		ref[k] = slices.Compact(s)
		if step%9973 == 0 {
			assert.Equal(t, len(ref), m.Len(), "step %d", step)
		}
	}
	assert.Equal(t, len(ref), m.Len())
	for k, s := range ref {
		require.Equal(t, s, m.Lookup(k), "key %d", k)
	}
	n := 0
	prev := uint64(0)
	m.Each(func(k uint64, s []uint32) bool {
		require.Equal(t, ref[k], s)
		if n > 0 {
			require.Greater(t, k, prev)
		}
		prev = k
		n++
		return true
	})
	assert.Equal(t, len(ref), n)
}

func TestCorruptFramesAreErrorsNotPanics(t *testing.T) {
	good := EncodeFull(sampleTable(t))
	for cut := 0; cut < len(good); cut++ {
		_, err := New().Apply(good[:cut])
		require.ErrorIs(t, err, ErrCorrupt, "truncated to %d bytes", cut)
	}
	for i := 0; i < len(good); i++ {
		b := slices.Clone(good)
		b[i] ^= 0x40
		_, err := New().Apply(b)
		require.Error(t, err, "bit flip at byte %d", i)
	}
}

// resum fixes the checksum of a hand-modified frame so the structural checks are reached.
func resum(b []byte) []byte {
	body := b[:len(b)-4]
	binary.LittleEndian.PutUint32(body[32:], uint32(len(body)-headerSize))
	return binary.LittleEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli))
}

func TestStructuralChecksBehindAValidChecksum(t *testing.T) {
	tb := New()
	m, err := NewModel("m", cfg, replicas(2))
	require.NoError(t, err)
	tb.Models["m"] = m
	cases := map[string]func() []byte{
		"unknown slot in entry": func() []byte {
			f := &Frame{Kind: Full, Models: []ModelChange{{Name: "m", Reset: true, Replicas: replicas(2)}}}
			f.Models[0].Upserts.Add(1, 7)
			return Encode(f)
		},
		"keys not increasing": func() []byte {
			f := &Frame{Kind: Full, Models: []ModelChange{{Name: "m", Reset: true, Replicas: replicas(2)}}}
			f.Models[0].Upserts.Add(5, 0)
			f.Models[0].Upserts.Add(5, 1)
			return Encode(f)
		},
		"model twice": func() []byte {
			f := &Frame{Kind: Full, Models: []ModelChange{{Name: "m", Reset: true}, {Name: "m", Reset: true}}}
			return Encode(f)
		},
		"full frame without reset": func() []byte {
			return Encode(&Frame{Kind: Full, Models: []ModelChange{{Name: "m"}}})
		},
		"upsert and remove the same key": func() []byte {
			f := &Frame{Kind: Delta, Models: []ModelChange{{Name: "m", Replicas: replicas(2), Removes: []uint64{3}}}}
			f.Models[0].Upserts.Add(3, 0)
			return Encode(f)
		},
		"trailing bytes": func() []byte {
			b := EncodeFull(tb)
			return resum(append(b[:len(b)-4:len(b)-4], 0, 0, 0, 0, 0))
		},
		"huge replica count": func() []byte {
			b := EncodeFull(New())
			body := b[:headerSize]
			body = binary.AppendUvarint(body, 1)
			body = binary.AppendUvarint(body, 1)
			body = append(body, 'm', flagReset, 64, 16, 1, 0)
			body = binary.AppendUvarint(body, 1<<40)
			return resum(append(body, 0, 0, 0, 0))
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			holder := New()
			_, err := holder.Apply(EncodeFull(tb))
			require.NoError(t, err)
			before := contents(holder)
			_, err = holder.Apply(mk())
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrCorrupt), "%v", err)
			assert.Equal(t, before, contents(holder), "a rejected frame changes nothing")
		})
	}
}

func FuzzDecode(f *testing.F) {
	tb := sampleTable(f)
	f.Add(EncodeFull(tb))
	next := sampleTable(f)
	next.Version = 8
	_ = next.Models["llama"].Set(77, 1)
	f.Add(Encode(Diff(tb, next)))
	f.Add(EncodeFullFormat(loadedTable(f), FormatLoad))
	f.Add(EncodeFullFormat(homedTable(f), FormatHomes))
	f.Add([]byte("KVRT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Random bytes almost never pass the checksum; fix it up so the structural
		// decoder sees them too.
		for _, in := range [][]byte{b, fixup(b)} {
			holder := New()
			if _, err := holder.Apply(in); err != nil {
				continue
			}
			// Whatever decodes must re-encode and decode to the same table.
			again := New()
			_, err := again.Apply(EncodeFullFormat(holder, holder.Format))
			require.NoError(t, err)
			require.Equal(t, contents(holder), contents(again))
		}
	})
}

func fixup(b []byte) []byte {
	if len(b) < headerSize {
		return b
	}
	out := slices.Clone(b)
	copy(out, magic)
	out[4] = FormatVersion
	out = append(out, 0, 0, 0, 0)
	return resum(out)
}

// A fleet the size of docs/rule.md's example: 22 replicas, 200 prefixes of 8,000 tokens (about
// 500 text blocks each), each prefix on one or two replicas.
func benchTable(b *testing.B, stride uint32) *Table {
	tb := New()
	c := cfg
	c.Stride = stride
	m, err := NewModel("llama", c, replicas(22))
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(3, 4))
	for p := 0; p < 200; p++ {
		owner := uint32(p % 22)
		for blk := 0; blk < 500; blk++ {
			if (blk+1)%int(stride) != 0 {
				continue
			}
			if p%7 == 0 {
				require.NoError(b, m.Set(rng.Uint64(), owner, (owner+1)%22))
			} else {
				require.NoError(b, m.Set(rng.Uint64(), owner))
			}
		}
	}
	tb.Models["llama"] = m
	return tb
}

func BenchmarkDecodeFull(b *testing.B) {
	for _, stride := range []uint32{1, 8} {
		b.Run(fmt.Sprintf("stride%d", stride), func(b *testing.B) {
			frame := EncodeFull(benchTable(b, stride))
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New().Apply(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMatch500Blocks(b *testing.B) {
	tb := benchTable(b, 8)
	m := tb.Models["llama"]
	chain := make([]uint64, 500)
	var i int
	m.Each(func(k uint64, _ []uint32) bool { // a chain whose first 40 checkpoints hit
		if i < 40 {
			chain[i*8+7] = k
		}
		i++
		return i < 40
	})
	matched := make([]int, 22)
	b.ReportAllocs()
	for b.Loop() {
		matched, _ = m.Match(chain, matched)
	}
}

func TestDiffKeepsKeysWhenOnlyBytesPerTokenMoves(t *testing.T) {
	old := sampleTable(t)
	next := sampleTable(t)
	next.Version = 8
	next.Models["llama"].Config.BytesPerToken = 3.75
	d := Diff(old, next)
	for _, mc := range d.Models {
		assert.False(t, mc.Reset, "model %s", mc.Name)
		assert.Zero(t, mc.Upserts.Len(), "model %s", mc.Name)
	}
	holder := New()
	_, err := holder.Apply(EncodeFull(old))
	require.NoError(t, err)
	_, err = holder.Apply(Encode(d))
	require.NoError(t, err)
	assert.Equal(t, 3.75, holder.Models["llama"].Config.BytesPerToken)
	assert.Equal(t, contents(next), contents(holder))

	next.Models["llama"].Config.Stride = 8 // keys mean something else now
	for _, mc := range Diff(old, next).Models {
		if mc.Name == "llama" {
			assert.True(t, mc.Reset)
		}
	}
}

// Each reads without changing the model, so encodes can share a read lock.
func TestEachDoesNotMutate(t *testing.T) {
	m, err := NewModel("m", cfg, replicas(2))
	require.NoError(t, err)
	for k := uint64(1); k <= 50; k++ {
		require.NoError(t, m.Set(k*7, uint32(k%2)))
	}
	require.NoError(t, m.Set(14))
	before := m.entries.over.Len()
	require.NotZero(t, before, "changes are pending in the overlay")
	var keys []uint64
	m.Each(func(k uint64, _ []uint32) bool { keys = append(keys, k); return true })
	assert.Len(t, keys, 49)
	assert.True(t, slices.IsSorted(keys))
	assert.Equal(t, before, m.entries.over.Len(), "the overlay is untouched")
}

// ApplyFrame on CloneFor's copy leaves the original exactly as it was, through overlay
// writes, removals, compactions and new replica sets, so readers of the original can
// go on while a publisher applies the next version.
func TestCloneForLeavesTheOriginalAlone(t *testing.T) {
	cfg := ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	rs := []Replica{{Slot: 0, ID: "a", Addr: "10.0.0.1:1"}, {Slot: 1, ID: "b", Addr: "10.0.0.2:1"}, {Slot: 2, ID: "c", Addr: "10.0.0.3:1"}}
	m, err := NewModel("m", cfg, rs)
	if err != nil {
		t.Fatal(err)
	}
	for k := uint64(1); k <= 20000; k++ {
		if err := m.Set(k, uint32(k%2)); err != nil {
			t.Fatal(err)
		}
	}
	orig := New()
	orig.Version = 1
	orig.Models["m"] = m
	snapshot := func(tb *Table) map[uint64][]uint32 {
		out := map[uint64][]uint32{}
		tb.Models["m"].Each(func(k uint64, slots []uint32) bool {
			out[k] = append([]uint32(nil), slots...)
			return true
		})
		return out
	}
	before := snapshot(orig)

	f := &Frame{Kind: Delta, Version: 2, Base: 1}
	mc := ModelChange{Name: "m", Config: cfg, Replicas: rs}
	for k := uint64(10001); k <= 30000; k++ { // overwrites, new keys, a new set {0,2}: compacts
		mc.Upserts.Add(k, 0, 2)
	}
	for k := uint64(1); k <= 3000; k++ {
		mc.Removes = append(mc.Removes, k)
	}
	f.Models = []ModelChange{mc}
	next := orig.CloneFor(f)
	if err := next.ApplyFrame(f); err != nil {
		t.Fatal(err)
	}

	after := snapshot(orig)
	if len(after) != len(before) {
		t.Fatalf("the original has %d keys after the clone's apply, want %d", len(after), len(before))
	}
	for k, v := range before {
		if got := after[k]; len(got) != len(v) || got[0] != v[0] {
			t.Fatalf("key %d: original now %v, want %v", k, got, v)
		}
	}
	if orig.Version != 1 || next.Version != 2 {
		t.Fatalf("versions %d and %d", orig.Version, next.Version)
	}
	if got := next.Models["m"].Lookup(20000); len(got) != 2 || got[1] != 2 {
		t.Fatalf("the clone's key 20000 = %v, want [0 2]", got)
	}
	if got := next.Models["m"].Lookup(5); got != nil {
		t.Fatalf("the clone still holds removed key 5: %v", got)
	}
}
