package table

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// MatchHits lists what Match reads: through MatchOfHits, its hits give Match's answer
// (into a reused slice holding an older answer too), and its hits
// from a position on are the whole chain's hits at or past it, for every stride and
// position.
func TestMatchHitsAreWhatMatchReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, stride := range []uint32{1, 2, 4, 7} {
		m, err := NewModel("m", ModelConfig{BlockBytes: 64, Stride: stride}, replicas(6))
		require.NoError(t, err)
		keys := make([]uint64, 300)
		for i := range keys {
			keys[i] = rng.Uint64()
			if rng.IntN(3) > 0 {
				require.NoError(t, m.Set(keys[i], uint32(rng.IntN(6)), uint32(rng.IntN(6))))
			}
		}
		want, _ := m.Match(keys, nil)
		all := m.MatchHits(keys, 0, nil)
		require.Equal(t, want, m.MatchOfHits(all, nil), "stride %d", stride)
		stale := []int{9, 9, 9, 9, 9, 9, 9}
		require.Equal(t, want, m.MatchOfHits(all, stale), "stride %d, a reused slice", stride)
		for from := 0; from <= len(keys); from++ {
			var past []Hit
			for _, h := range all {
				if int(h.Block) >= from {
					past = append(past, h)
				}
			}
			require.Equal(t, past, m.MatchHits(keys, from, nil), "stride %d from %d", stride, from)
		}
	}
}

// Gen changes with everything a match reads (entries, replicas, config, tiers), by
// every way a model changes; and no two models share one.
func TestGenChangesWithEveryChange(t *testing.T) {
	m, err := NewModel("llama", cfg, replicas(3))
	require.NoError(t, err)
	other, err := NewModel("llama", cfg, replicas(3))
	require.NoError(t, err)
	require.NotEqual(t, m.Gen(), other.Gen())
	seen := map[uint64]bool{m.Gen(): true, other.Gen(): true}
	step := func(what string) {
		t.Helper()
		require.False(t, seen[m.Gen()], what)
		seen[m.Gen()] = true
	}
	require.NoError(t, m.Set(1, 0))
	step("Set")
	require.NoError(t, m.Set(1))
	step("Set removing")
	require.NoError(t, m.SetTiers([]string{"CPU"}))
	step("SetTiers")

	tb := New()
	tb.Version = 1
	tb.Models["llama"] = m
	f := &Frame{Kind: Delta, Version: 2, Base: 1, Models: []ModelChange{{Name: "llama", Config: cfg, Replicas: replicas(2), Tiers: []string{"CPU"}}}}
	next := tb.CloneFor(f)
	m = next.Models["llama"]
	step("CloneFor")
	require.NoError(t, next.ApplyFrame(f))
	step("a delta, replicas only")
	f = &Frame{Kind: Delta, Version: 3, Base: 2, Models: []ModelChange{{Name: "llama", Config: cfg, Replicas: replicas(2), Tiers: []string{"CPU"}, Removes: []uint64{7}}}}
	require.NoError(t, next.ApplyFrame(f))
	step("a delta removing a key")
	f = &Frame{Kind: Full, Version: 4, Models: []ModelChange{{Name: "llama", Reset: true, Config: cfg, Replicas: replicas(2)}}}
	require.NoError(t, next.ApplyFrame(f))
	m = next.Models["llama"]
	step("a full frame")
	before := m.Gen()
	m.Replicas[0].Queued++
	require.Equal(t, before, m.Gen(), "queue numbers are not what a match reads")
}
