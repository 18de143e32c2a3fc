package fleet

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
)

// seedRun is one seed's comparison as kvroute-bench --seeds records it.
func seedRun(t *testing.T, seed uint64, results ...*sim.Result) SeedRun {
	a, ok := AgainstBest(results, "kvroute")
	require.True(t, ok)
	return SeedRun{Seed: seed, Against: a, Policies: AllFigures(results)}
}

// Two peers whose p95 draws alternate (1 s and 2 s) and kvroute at 1.4 s on both seeds:
// seed by seed kvroute is off against the lucky peer each time, yet over the seeds it
// is the best policy on that figure, and each peer held to the same count is off too.
// The oracle is in no comparison however good its figures.
func TestOverSeedsComparesPoliciesNotDraws(t *testing.T) {
	const s = time.Second
	runs := []SeedRun{
		seedRun(t, 1,
			result("weighted-scorers", 0.5, s, 1*s, 3*s, 5*s),
			result("sglang-cache-aware", 0.5, s, 2*s, 3*s, 5*s),
			result("kvroute", 0.5, s, 1400*ms, 3*s, 5*s),
			result("oracle", 0.9, ms, ms, ms, ms)),
		seedRun(t, 2,
			result("weighted-scorers", 0.5, s, 2*s, 3*s, 5*s),
			result("sglang-cache-aware", 0.5, s, 1*s, 3*s, 5*s),
			result("kvroute", 0.5, s, 1400*ms, 3*s, 5*s),
			result("oracle", 0.9, ms, ms, ms, ms)),
	}
	met, figures := BoundsMet(runs)
	assert.Equal(t, 8, met, "seed by seed, kvroute's p95 is 1.4x the lucky peer's on both")
	assert.Equal(t, 10, figures)

	gs := PolicyGeomeans(runs)
	require.Len(t, gs, 4)
	assert.Equal(t, "weighted-scorers", gs[0].Policy)
	assert.InDelta(t, math.Sqrt2, gs[0].Values[2], 1e-9, "sqrt(1 x 2)")
	assert.InDelta(t, 1.4, gs[2].Values[2], 1e-9)

	a, ok := AgainstBestOverSeeds(runs, "kvroute")
	require.True(t, ok)
	assert.InDelta(t, 1.4/math.Sqrt2, a.Ratio[2], 1e-9)
	assert.Zero(t, a.OffCount(), "over the seeds kvroute is the best policy on p95")
	assert.NotContains(t, a.Best, "oracle")

	held := HeldToTheYardstick(runs, "kvroute")
	assert.Equal(t, []Held{
		{Policy: "kvroute", Off: 2, Figures: 10},
		{Policy: "weighted-scorers", Off: 1, Figures: 10}, // its 2 s draw against sglang's 1 s
		{Policy: "sglang-cache-aware", Off: 1, Figures: 10},
	}, held)

	var out bytes.Buffer
	require.NoError(t, WriteSeeds(&out, runs))
	text := out.String()
	assert.Contains(t, text, "bounds met: 8 of 10")
	assert.Regexp(t, `(?m)^\s+weighted-scorers\s+50\.0%\s+1\.000\s+1\.414\s+3\.000\s+5\.000$`, text)
	assert.Contains(t, text, "kvroute over the best other policy over the seeds: cached 1.000 (weighted-scorers), TTFT p50 1.000 (weighted-scorers), p95 0.990 (weighted-scorers)")
	assert.Contains(t, text, ": 0 of 5 off\n")
	assert.Contains(t, text, "figures off: kvroute 2 of 10, weighted-scorers 1 of 10, sglang-cache-aware 1 of 10\n")

	assert.NotContains(t, text, "each half", "two seeds are not split")

	gj, over, halves, hj := jsonOverSeeds(runs)
	require.Len(t, gj, 4)
	assert.InDelta(t, 1.414214, *gj[0].TTFTp95, 1e-6)
	require.Len(t, over, len(Figures))
	assert.False(t, over[2].Off)
	assert.Nil(t, halves)
	assert.Equal(t, held, hj)
}

// Over each half of the seeds: a verdict the halves disagree on needs more seeds.
func TestOverSeedsSplitsTheSeedsInHalves(t *testing.T) {
	s := time.Second
	run := func(seed uint64, kvP95 time.Duration) SeedRun {
		return seedRun(t, seed, result("weighted-scorers", 0.5, s, s, s, s), result("kvroute", 0.5, s, kvP95, s, s))
	}
	runs := []SeedRun{run(3, 2*s), run(4, 1200*ms), run(5, 500*ms), run(6, 800*ms), run(7, 900*ms)}
	halves := AgainstBestOverHalves(runs, "kvroute")
	require.Len(t, halves, 2)
	assert.Equal(t, []uint64{3, 4, 5, 7}, []uint64{halves[0].First, halves[0].Last, halves[1].First, halves[1].Last})
	assert.InDelta(t, math.Sqrt(2*1.2), halves[0].Against.Ratio[2], 1e-9)
	assert.True(t, halves[0].Against.Off[2])
	assert.InDelta(t, math.Cbrt(0.5*0.8*0.9), halves[1].Against.Ratio[2], 1e-9)
	assert.False(t, halves[1].Against.Off[2])

	var out bytes.Buffer
	require.NoError(t, WriteSeeds(&out, runs))
	assert.Contains(t, out.String(), "and over each half of the seeds (3-4 / 5-7): cached 1.000 / 1.000, TTFT p50 1.000 / 1.000, p95 1.549* / 0.711,")
	_, _, jh, _ := jsonOverSeeds(runs)
	require.Len(t, jh, 2)
	assert.Equal(t, uint64(5), jh[1].FirstSeed)
	assert.True(t, jh[0].Figures[2].Off)
	assert.Nil(t, AgainstBestOverHalves(runs[:3], "kvroute"), "too few seeds to split")
}

// A policy that gave up on one seed has given up over the seeds: infinite, printed as
// such, null in JSON, and off where kvroute did not give up.
func TestOverSeedsWhenARunGaveUp(t *testing.T) {
	gaveUp := time.Duration(math.MaxInt64)
	s := time.Second
	runs := []SeedRun{
		seedRun(t, 1, result("least-queued", 0.2, s, s, s, s), result("kvroute", 0.3, gaveUp, s, s, s)),
		seedRun(t, 2, result("least-queued", 0.2, s, s, s, s), result("kvroute", 0.3, s, s, s, s)),
	}
	gs := PolicyGeomeans(runs)
	assert.True(t, math.IsInf(gs[1].Values[1], 1))
	a, ok := AgainstBestOverSeeds(runs, "kvroute")
	require.True(t, ok)
	assert.True(t, a.Off[1])
	var out bytes.Buffer
	require.NoError(t, WriteSeeds(&out, runs))
	assert.Regexp(t, `(?m)^\s+kvroute\s+30\.0%\s+gave up\s+1\.000`, out.String())
	gj, _, _, _ := jsonOverSeeds(runs)
	assert.Nil(t, gj[1].TTFTp50)
}
