package publish

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// homesUpdate is tierUpdate without tiers, with homes set (key, slot pairs) and forgotten.
func homesUpdate(reset bool, set [][2]uint64, forget []uint64, hs ...held) []index.ModelUpdate {
	ups := tierUpdate(reset, nil, hs...)
	for _, s := range set {
		ups[0].Homes.Add(s[0], uint32(s[1]))
	}
	ups[0].Homes.Removes = forget
	return ups
}

func homesOf(t *table.Table) map[uint64]uint32 {
	out := map[uint64]uint32{}
	t.Models["m"].EachHome(func(k uint64, s uint32) bool { out[k] = s; return true })
	return out
}

// A filter that lists format 4 gets the homes, in full frames, in the delta from the
// previous version and in deltas composed over several; one that lists format 3 gets
// the same frames without them.
func TestFormat4FramesCarryHomes(t *testing.T) {
	p := New(Options{FirstVersion: 1})
	now := time.Unix(1_800_000_000, 0)
	_, err := p.Publish(homesUpdate(true, [][2]uint64{{7, 1}}, nil, h(10, 0)), now)
	require.NoError(t, err)
	filter, old := table.New(), table.New()
	_, err = filter.Apply(p.FrameFormat(0, false, "", table.FormatHomes).Body)
	require.NoError(t, err)
	_, err = old.Apply(p.FrameFormat(0, false, "", table.FormatLoad).Body)
	require.NoError(t, err)
	assert.Equal(t, map[uint64]uint32{7: 1}, homesOf(filter))
	assert.Empty(t, homesOf(old))

	// v2: 10 let go by a (a home), 7 listed again (no home); v3: 20 a home on b.
	_, err = p.Publish(homesUpdate(false, [][2]uint64{{10, 0}}, []uint64{7}, gone(10), h(7, 1)), now.Add(time.Second))
	require.NoError(t, err)
	_, err = p.Publish(homesUpdate(false, [][2]uint64{{20, 1}}, nil), now.Add(2*time.Second))
	require.NoError(t, err)

	// The delta from v2 (encoded at publish) and the one composed from v1.
	v2 := table.New()
	_, err = v2.Apply(p.FrameFormat(0, false, "", table.FormatHomes).Body) // a filter at v3
	require.NoError(t, err)
	r := p.FrameFormat(1, true, "", table.FormatHomes)
	require.Equal(t, table.Delta, r.Kind)
	require.Equal(t, byte(table.FormatHomes), r.Body[4])
	_, err = filter.Apply(r.Body)
	require.NoError(t, err)
	want := map[uint64]uint32{10: 0, 20: 1}
	assert.Equal(t, want, homesOf(filter))
	assert.Equal(t, want, homesOf(v2))
	assert.Equal(t, []uint32{1}, filter.Models["m"].Lookup(7))

	r = p.FrameFormat(1, true, "", table.FormatLoad)
	_, err = old.Apply(r.Body)
	require.NoError(t, err)
	assert.Empty(t, homesOf(old))
	assert.Equal(t, []uint32{1}, old.Models["m"].Lookup(7))

	// The encoded delta from the previous version carries v3's home alone.
	step := table.New()
	_, err = step.Apply(p.FrameFormat(0, false, "", table.FormatHomes).Body)
	require.NoError(t, err)
	_, err = p.Publish(homesUpdate(false, nil, []uint64{20}), now.Add(3*time.Second))
	require.NoError(t, err)
	d, err := table.Decode(p.FrameFormat(3, true, "", table.FormatHomes).Body)
	require.NoError(t, err)
	assert.Equal(t, table.HomeChanges{Removes: []uint64{20}}, d.Models[0].Homes)
	require.NoError(t, step.ApplyFrame(d))
	assert.Equal(t, map[uint64]uint32{10: 0}, homesOf(step))
}
