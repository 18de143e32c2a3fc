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

func result(name string, cached float64, p50, p95, p99, e2e time.Duration) *sim.Result {
	return &sim.Result{Policy: name, CachedTokenRate: cached, TTFTp50: p50, TTFTp95: p95, TTFTp99: p99, E2Ep50: e2e}
}

const ms = time.Millisecond

// Each figure is measured against the best peer on that figure, which may be a
// different peer each time; the oracle and kvroute's variants are not peers however
// good their figures.
func TestAgainstBestPicksEachFiguresBestPeer(t *testing.T) {
	results := []*sim.Result{
		result("round-robin", 0.10, 400*ms, 900*ms, 1200*ms, 5000*ms),
		result("weighted-scorers", 0.60, 500*ms, 800*ms, 1000*ms, 4000*ms),
		result("sglang-cache-aware", 0.62, 550*ms, 850*ms, 1100*ms, 4100*ms),
		result("kvroute", 0.61, 430*ms, 800*ms, 1150*ms, 4300*ms),
		result("oracle", 0.90, 100*ms, 100*ms, 100*ms, 100*ms),
		result(GPUOnlyName, 0.90, 100*ms, 100*ms, 100*ms, 100*ms),
	}
	a, ok := AgainstBest(results, "kvroute")
	require.True(t, ok)
	assert.Equal(t, []string{"sglang-cache-aware", "round-robin", "weighted-scorers", "weighted-scorers", "weighted-scorers"}, a.Best)
	want := []float64{0.61 / 0.62, 430.0 / 400, 1, 1.15, 4300.0 / 4000}
	for i := range want {
		assert.InDelta(t, want[i], a.Ratio[i], 1e-9, Figures[i].Name)
	}
	// cached 0.984 >= 0.97; p50 1.075 > 1.05; p95 exactly at its bound is within it;
	// p99 1.15 > 1.1; e2e 1.075 > 1.05.
	assert.Equal(t, []bool{false, true, false, true, true}, a.Off)
	assert.Equal(t, 3, a.OffCount())

	var out bytes.Buffer
	require.NoError(t, WriteAgainst(&out, &a))
	assert.Contains(t, out.String(), "cached 0.984 (sglang-cache-aware), TTFT p50 1.075* (round-robin), p95 1.000 (weighted-scorers)")
	assert.Contains(t, out.String(), ": 3 of 5 off")
}

// A ratio off its bound by less than the third decimal shows enough digits to say so.
func TestRatioTextShowsWhatIsOff(t *testing.T) {
	results := []*sim.Result{
		result("weighted-scorers", 0.5, 500*ms, 800000*time.Microsecond, time.Second, time.Second),
		result("kvroute", 0.5, 500*ms, 800080*time.Microsecond, time.Second, time.Second),
	}
	a, ok := AgainstBest(results, "kvroute")
	require.True(t, ok)
	assert.True(t, a.Off[2])
	assert.Equal(t, "1.0001*", ratioText(&a, 2))
	assert.Equal(t, "1.000", ratioText(&a, 3))
}

// A run that gave up (its percentiles are MaxInt64) is worse than any that did not;
// two that gave up say nothing of each other.
func TestAgainstBestWhenARunGaveUp(t *testing.T) {
	gaveUp := time.Duration(math.MaxInt64)
	results := []*sim.Result{
		result("least-queued", 0.2, time.Second, gaveUp, gaveUp, time.Second),
		result("kvroute", 0.3, gaveUp, time.Second, gaveUp, time.Second),
	}
	a, ok := AgainstBest(results, "kvroute")
	require.True(t, ok)
	assert.True(t, math.IsInf(a.Ratio[1], 1))
	assert.True(t, a.Off[1], "kvroute gave up where a peer did not")
	assert.Zero(t, a.Ratio[2])
	assert.False(t, a.Off[2])
	assert.True(t, math.IsNaN(a.Ratio[3]))
	assert.False(t, a.Off[3])
	assert.Equal(t, "-", ratioText(&a, 3))
	assert.Nil(t, JSONAgainst(&a)[1].Ratio, "JSON has no infinity")
	assert.True(t, JSONAgainst(&a)[1].Off)
}

func TestAgainstBestNeedsKvrouteAndAPeer(t *testing.T) {
	_, ok := AgainstBest([]*sim.Result{result("round-robin", 0, ms, ms, ms, ms)}, "kvroute")
	assert.False(t, ok)
	_, ok = AgainstBest([]*sim.Result{result("kvroute", 0, ms, ms, ms, ms), result("oracle", 0, ms, ms, ms, ms)}, "kvroute")
	assert.False(t, ok, "the oracle is not a peer")
}

// Over seeds: each figure's geometric mean, and the figures within their bounds.
func TestWriteSeedsSumsTheRuns(t *testing.T) {
	run := func(seed uint64, kvP95 time.Duration) SeedRun {
		a, ok := AgainstBest([]*sim.Result{
			result("weighted-scorers", 0.5, time.Second, time.Second, time.Second, time.Second),
			result("kvroute", 0.5, time.Second, kvP95, time.Second, time.Second),
		}, "kvroute")
		require.True(t, ok)
		return SeedRun{Seed: seed, Against: a}
	}
	runs := []SeedRun{run(1, 2*time.Second), run(2, time.Second/2)}
	g := Geomeans(runs)
	assert.InDelta(t, 1, g[2], 1e-9, "sqrt(2 x 0.5)")
	assert.InDelta(t, 1, g[0], 1e-9)
	var out bytes.Buffer
	require.NoError(t, WriteSeeds(&out, runs))
	assert.Regexp(t, `(?m)^\s+1\s+1\.000\s+1\.000\s+2\.000\*\s+1\.000\s+1\.000\s+1$`, out.String())
	assert.Regexp(t, `(?m)^\s+geomean\s+1\.000\s+1\.000\s+1\.000\s+1\.000\s+1\.000\s+1$`, out.String())
	assert.Contains(t, out.String(), "bounds met: 9 of 10")
	assert.NotContains(t, out.String(), "over the seeds", "runs without their policies' figures")
}
