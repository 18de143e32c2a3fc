package table

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// homedTable is loadedTable with three homes: keys 500 and 600 on slot 1, 700 on slot 9
// (a replica that has left).
func homedTable(t testing.TB) *Table {
	tb := loadedTable(t)
	m := tb.Models["llama"]
	require.NoError(t, m.SetHome(500, 1))
	require.NoError(t, m.SetHome(600, 1))
	require.NoError(t, m.SetHome(700, 9))
	return tb
}

// Format 4 carries the homes; every older format is the same frame without them, byte
// for byte what the table without homes encodes to.
func TestFormat4RoundTrip(t *testing.T) {
	tb := homedTable(t)
	got := New()
	f, err := got.Apply(EncodeFullFormat(tb, FormatHomes))
	require.NoError(t, err)
	assert.Equal(t, uint8(FormatHomes), f.Format)
	assert.Equal(t, contents(tb), contents(got))
	assert.Equal(t, 3, got.Models["llama"].HomesLen())

	for _, format := range []uint8{FormatVersion, FormatTiers, FormatLoad} {
		assert.Equal(t, EncodeFullFormat(loadedTable(t), format), EncodeFullFormat(tb, format), "format %d", format)
		old := New()
		_, err := old.Apply(EncodeFullFormat(tb, format))
		require.NoError(t, err)
		assert.Zero(t, old.Models["llama"].HomesLen(), "format %d", format)
	}

	// A delta sets and forgets homes; in format 3 it carries none of it.
	next := homedTable(t)
	next.Version = 8
	nm := next.Models["llama"]
	nm.RemoveHome(600)
	require.NoError(t, nm.SetHome(500, 2))
	require.NoError(t, nm.SetHome(800, 0))
	d := Diff(tb, next)
	d.Format = FormatHomes
	assert.Equal(t, HomeChanges{Keys: []uint64{500, 800}, Slots: []uint32{2, 0}, Removes: []uint64{600}}, d.Models[0].Homes)
	_, err = got.Apply(Encode(d))
	require.NoError(t, err)
	assert.Equal(t, contents(next), contents(got))
	d3 := *d
	d3.Format = FormatLoad
	dec, err := Decode(Encode(&d3))
	require.NoError(t, err)
	assert.True(t, dec.Models[0].Homes.Empty())
}

// Home is the replica that held last the longest prefix of the chain with a home; a
// home whose replica left counts for nothing.
func TestHomeIsTheLongestRememberedPrefix(t *testing.T) {
	m := homedTable(t).Models["llama"]
	const stride = 4
	m.Config.Stride = stride
	chain := make([]uint64, 4*stride)
	for i := range chain {
		chain[i] = uint64(1000 + i) // no home
	}
	r, blocks := m.Home(chain)
	assert.Equal(t, -1, r)
	assert.Zero(t, blocks)

	chain[stride-1] = 500   // first checkpoint: slot 1
	chain[2*stride-1] = 600 // second: slot 1
	chain[3*stride-1] = 700 // third: slot 9, gone
	chain[3*stride+1] = 800 // not a checkpoint
	r, blocks = m.Home(chain)
	assert.Equal(t, m.ReplicaIndex(1), r)
	assert.Equal(t, 2*stride, blocks, "the deepest home whose replica is still there")

	require.NoError(t, m.SetHome(700, 2))
	r, blocks = m.Home(chain)
	assert.Equal(t, m.ReplicaIndex(2), r)
	assert.Equal(t, 3*stride, blocks)

	// Homes are no entries: a match does not see them.
	matched, longest := m.Match(chain, nil)
	assert.Zero(t, longest)
	assert.Equal(t, make([]int, len(m.Replicas)), matched)
}

func TestFormat4StructuralChecks(t *testing.T) {
	tb := homedTable(t)
	full := EncodeFullFormat(tb, FormatHomes)
	// The homes section is last: u64 keys 500, 600, 700 with their slots, then 0 removes.
	homes := "03" + "f401000000000000" + "01" + "5802000000000000" + "01" + "bc02000000000000" + "09" + "00"
	cases := map[string][]byte{
		"home keys not increasing": resum(replace(t, full, homes, "03"+"5802000000000000"+"01"+"f401000000000000"+"01"+"bc02000000000000"+"09"+"00")),
		"home slot above MaxSlot":  resum(replace(t, full, homes, "03"+"f401000000000000"+"01"+"5802000000000000"+"01"+"bc02000000000000"+"808004"+"00")),
		"a reset section removes homes": resum(replace(t, full, homes,
			"03"+"f401000000000000"+"01"+"5802000000000000"+"01"+"bc02000000000000"+"09"+"01"+"2003000000000000")),
		"format 4 payload read as format 3": resum(setFormat(full, FormatLoad)),
		"format 3 payload read as format 4": resum(setFormat(EncodeFullFormat(tb, FormatLoad), FormatHomes)),
		"format 5":                          resum(setFormat(full, FormatHomes+1)),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(b)
			assert.ErrorIs(t, err, ErrCorrupt)
		})
	}

	// A delta may not both set and forget a home.
	next := homedTable(t)
	next.Version = 8
	require.NoError(t, next.Models["llama"].SetHome(800, 1))
	d := Diff(tb, next)
	d.Format = FormatHomes
	d.Models[0].Homes.Removes = []uint64{800}
	_, err := Decode(Encode(d))
	assert.ErrorIs(t, err, ErrCorrupt)
}

// A publisher's clone of a model takes the homes with it: changing the clone's leaves the
// original's as they were.
func TestCloneForKeepsTheOriginalsHomes(t *testing.T) {
	tb := homedTable(t)
	next := homedTable(t)
	next.Version = 8
	require.NoError(t, next.Models["llama"].SetHome(900, 2))
	next.Models["llama"].RemoveHome(500)
	d := Diff(tb, next)
	d.Format = FormatHomes
	before := contents(tb)
	c := tb.CloneFor(d)
	require.NoError(t, c.ApplyFrame(d))
	assert.Equal(t, before, contents(tb))
	var keys []uint64
	c.Models["llama"].EachHome(func(k uint64, _ uint32) bool { keys = append(keys, k); return true })
	assert.True(t, slices.Equal([]uint64{600, 700, 900}, keys), "%v", keys)
}
