package route

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/table"
)

// The memo's answer is Match's: for chains drawn from a few prefixes with other tails,
// cut short or repeated, against models changed between matches (keys set and removed,
// replicas replaced by a frame, another model object) or not.
func TestMatchMemoAnswersAsMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	newModel := func(n int) *table.Model {
		m, err := table.NewModel("llama", table.ModelConfig{BlockBytes: 64, Stride: uint32(1 + rng.IntN(4))}, replicasN(n))
		require.NoError(t, err)
		return m
	}
	bases := make([][]uint64, 4)
	for i := range bases {
		bases[i] = make([]uint64, 200)
		for j := range bases[i] {
			bases[i][j] = rng.Uint64()
		}
	}
	models := []*table.Model{newModel(4), newModel(6)}
	for _, m := range models {
		for _, b := range bases {
			for _, k := range b {
				if rng.IntN(2) == 0 {
					require.NoError(t, m.Set(k, anySlot(rng, m)))
				}
			}
		}
	}
	r := exactRouter()
	reused := 0
	for i := range 3000 {
		m := models[rng.IntN(len(models))]
		b := bases[rng.IntN(len(bases))]
		keys := slices.Clone(b[:rng.IntN(len(b)+1)])
		if rng.IntN(2) == 0 {
			for range rng.IntN(20) {
				keys = append(keys, rng.Uint64())
			}
		}
		switch rng.IntN(6) {
		case 0: // a key of a base set or removed
			k := b[rng.IntN(len(b))]
			if rng.IntN(2) == 0 {
				require.NoError(t, m.Set(k))
			} else {
				require.NoError(t, m.Set(k, anySlot(rng, m)))
			}
		case 1: // replicas replaced by a frame: indices move
			tb := table.New()
			tb.Version = 1
			tb.Models["llama"] = m
			f := &table.Frame{Kind: table.Delta, Version: 2, Base: 1,
				Models: []table.ModelChange{{Name: "llama", Config: m.Config, Replicas: someReplicas(rng)}}}
			require.NoError(t, tb.ApplyFrame(f))
		case 2:
			models[rng.IntN(len(models))] = newModel(3 + rng.IntN(4))
		}
		if mm := &r.mm; mm.model == m && mm.gen == m.Gen() {
			reused += commonKeys(mm.keys, keys)
		}
		r.match(m, keys)
		want, _ := m.Match(keys, nil)
		require.Equal(t, want, r.matched, "match %d", i)
	}
	require.Greater(t, reused, 5_000, "the memo was used")
}

func anySlot(rng *rand.Rand, m *table.Model) uint32 {
	return m.Replicas[rng.IntN(len(m.Replicas))].Slot
}

// someReplicas is a random non-empty subset of six replicas, in slot order.
func someReplicas(rng *rand.Rand) []table.Replica {
	var rs []table.Replica
	for len(rs) == 0 {
		rs = rs[:0]
		for _, r := range replicasN(6) {
			if rng.IntN(2) == 0 {
				rs = append(rs, r)
			}
		}
	}
	return rs
}

func replicasN(n int) []table.Replica {
	rs := make([]table.Replica, n)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), ID: string(rune('a' + i)), Addr: "10.0.0." + string(rune('1'+i)) + ":8000", Healthy: true}
	}
	return rs
}
