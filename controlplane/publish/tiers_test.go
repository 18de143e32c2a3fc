package publish

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type held struct {
	key  uint64
	hold []uint32 // holders; nil: removed
}

func tierUpdate(reset bool, tiers []string, hs ...held) []index.ModelUpdate {
	u := index.ModelUpdate{Name: "m", Reset: reset, Tiers: tiers,
		Config: table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4},
		Replicas: []table.Replica{{Slot: 0, ID: "a", Addr: "10.0.0.1:8000", Healthy: true},
			{Slot: 1, ID: "b", Addr: "10.0.0.2:8000", Healthy: true}}}
	for _, h := range hs {
		if h.hold == nil {
			u.Removes = append(u.Removes, h.key)
		} else {
			u.Upserts.Add(h.key, h.hold...)
		}
	}
	return []index.ModelUpdate{u}
}

var cpu = []string{"CPU"}

func h(key uint64, hold ...uint32) held {
	if hold == nil {
		hold = []uint32{}
	}
	return held{key, hold}
}
func gone(key uint64) held { return held{key, nil} }

// An older filter polls without the formats header and gets format 1: the frames a
// control plane without slower tiers sends for the same GPU holdings, byte for byte,
// whatever the slower tiers did meanwhile. oldP is fed what such a control plane's index
// emits (GPU changes only), p what the tiered index emits.
func TestFormat1FramesAreWhatAControlPlaneWithoutTiersSends(t *testing.T) {
	p, oldP := New(Options{FirstVersion: 1}), New(Options{FirstVersion: 1})
	now := time.Unix(1_800_000_000, 0)
	c1 := table.Holder(0, 1)
	c1b := table.Holder(1, 1)
	steps := []struct{ tiered, gpuOnly []index.ModelUpdate }{
		// v1: keys 10 and 20 in GPU, 30 only in CPU.
		{tierUpdate(true, cpu, h(10, 0), h(20, 1), h(30, c1)), tierUpdate(true, nil, h(10, 0), h(20, 1))},
		// v2: 10 also offloaded (tier only), 20 evicted from GPU but kept in CPU, 40 new.
		{tierUpdate(false, cpu, h(10, 0, c1b), h(20, c1b), h(40, 0)), tierUpdate(false, nil, h(40, 0))},
		// v3: the CPU tier evicts 30; nothing GPU changes.
		{tierUpdate(false, cpu, gone(30)), tierUpdate(false, nil)},
		// v4: 20 loaded back into GPU (B), 10 gone from GPU and CPU.
		{tierUpdate(false, cpu, h(20, 1), gone(10)), tierUpdate(false, nil, h(20, 1), gone(10))},
	}
	// v2 in the old world: key 20 left GPU memory, so it is removed.
	steps[1].gpuOnly[0].Removes = []uint64{20}
	for i, s := range steps {
		at := now.Add(time.Duration(i) * time.Second)
		_, err := p.Publish(s.tiered, at)
		require.NoError(t, err)
		_, err = oldP.Publish(s.gpuOnly, at)
		require.NoError(t, err)
		// Every delta an older filter can ask for, and the full frame.
		for have := uint64(0); have <= uint64(i+1); have++ {
			got := p.Frame(have, have > 0, "")
			want := oldP.Frame(have, have > 0, "")
			assert.Equal(t, want.Kind, got.Kind, "v%d from %d", i+1, have)
			assert.True(t, bytes.Equal(want.Body, got.Body), "v%d from %d: format-1 frame differs", i+1, have)
			if want.Body != nil {
				assert.Equal(t, byte(table.FormatVersion), got.Body[4])
			}
		}
	}
}

// A newer filter lists format 2 and gets the slower tiers; its table, built from full
// frames and deltas alike, is the publisher's.
func TestFormat2FramesCarryTiers(t *testing.T) {
	p := New(Options{FirstVersion: 1})
	now := time.Unix(1_800_000_000, 0)
	c1 := table.Holder(0, 1)
	_, err := p.Publish(tierUpdate(true, cpu, h(10, 0), h(30, c1)), now)
	require.NoError(t, err)
	filter := table.New()
	r := p.FrameFormat(0, false, "", table.FormatTiers)
	require.Equal(t, table.Full, r.Kind)
	_, err = filter.Apply(r.Body)
	require.NoError(t, err)
	assert.Equal(t, []uint32{c1}, filter.Models["m"].Lookup(30))
	assert.Equal(t, cpu, filter.Models["m"].Tiers)

	_, err = p.Publish(tierUpdate(false, cpu, h(10, 0, table.Holder(1, 1)), gone(30)), now.Add(time.Second))
	require.NoError(t, err)
	_, err = p.Publish(tierUpdate(false, cpu, h(50, table.Holder(1, 1))), now.Add(2*time.Second))
	require.NoError(t, err)
	r = p.FrameFormat(1, true, "", table.FormatTiers) // composed from v1 to v3
	require.Equal(t, table.Delta, r.Kind)
	require.Equal(t, byte(table.FormatTiers), r.Body[4])
	_, err = filter.Apply(r.Body)
	require.NoError(t, err)
	m := filter.Models["m"]
	assert.Equal(t, []uint32{0, table.Holder(1, 1)}, m.Lookup(10))
	assert.Nil(t, m.Lookup(30))
	assert.Equal(t, []uint32{table.Holder(1, 1)}, m.Lookup(50))
	// A format-1 delta does not apply to the format-2 table: the filter asks for a
	// full frame instead of mixing formats.
	_, err = p.Publish(tierUpdate(false, cpu, h(60, 0)), now.Add(3*time.Second))
	require.NoError(t, err)
	_, err = filter.Apply(p.Frame(3, true, "").Body)
	assert.ErrorIs(t, err, table.ErrBaseMismatch)
}
