package fleet

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

func TestBisectRate(t *testing.T) {
	cases := []struct {
		name    string
		guess   float64
		res     Resolution
		limit   float64 // the highest rate that passes
		held    float64 // the answer, when exact; else checked against limit and res
		missed  float64
		exact   bool
		maxRuns int
	}{
		{name: "limit above the start, 0.5 req/s", guess: 40, res: Resolution{Step: 0.5}, limit: 47.3, maxRuns: 10},
		{name: "limit below the start, 2%", guess: 40, res: Resolution{Fraction: 0.02}, limit: 9.1, maxRuns: 10},
		{name: "limit at the start", guess: 40, res: Resolution{Step: 0.5}, limit: 40, maxRuns: 10},
		{name: "holds up to the cap", guess: 40, res: Resolution{Step: 0.5}, limit: math.Inf(1), held: 40 * 1024, exact: true, maxRuns: 11},
		{name: "misses down to the resolution", guess: 40, res: Resolution{Step: 0.5}, limit: 0, missed: 0.625, exact: true, maxRuns: 7},
		{name: "misses down to the floor", guess: 40, res: Resolution{Fraction: 0.02}, limit: 0, missed: 40.0 / 1024, exact: true, maxRuns: 11},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runs := 0
			tried := map[float64]bool{}
			held, missed, err := bisectRate(c.guess, c.res, func(r float64) (bool, error) {
				runs++
				assert.False(t, tried[r], "rate %g run twice", r)
				tried[r] = true
				return r <= c.limit, nil
			})
			require.NoError(t, err)
			assert.LessOrEqual(t, runs, c.maxRuns)
			if c.exact {
				assert.Equal(t, c.held, held)
				assert.Equal(t, c.missed, missed)
				return
			}
			assert.LessOrEqual(t, held, c.limit, "the rate held passes")
			assert.Greater(t, missed, c.limit, "the rate missed fails")
			assert.True(t, tried[held] && tried[missed], "both ends were run")
			width := c.res.Step
			if c.res.Fraction > 0 {
				width = c.res.Fraction * held
			}
			assert.LessOrEqual(t, missed-held, width, "held %g and missed %g are within %s", held, missed, c.res)
		})
	}

	boom := errors.New("boom")
	_, _, err := bisectRate(40, Resolution{Step: 1}, func(r float64) (bool, error) {
		if r > 60 {
			return false, boom
		}
		return true, nil
	})
	assert.ErrorIs(t, err, boom, "a run's error ends the search")
	_, _, err = bisectRate(40, Resolution{}, func(float64) (bool, error) { return true, nil })
	assert.Error(t, err, "no resolution, no end")
}

func TestParseResolution(t *testing.T) {
	for in, want := range map[string]Resolution{"0.5": {Step: 0.5}, "2%": {Fraction: 0.02}, " 10 % ": {Fraction: 0.1}, "3": {Step: 3}} {
		got, err := ParseResolution(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "%", "0", "-1", "0%", "100%", "x", "NaN", "Inf"} {
		_, err := ParseResolution(bad)
		assert.Error(t, err, "%q", bad)
	}
	assert.Equal(t, "2%", Resolution{Fraction: 0.02}.String())
	assert.Equal(t, "0.5 req/s", Resolution{Step: 0.5}.String())
}

// tinyGSPLoad is a generated workload as a function of its rate, and the rate each
// workload it built was built at.
func tinyGSPLoad(t *testing.T) (Load, func(workload.Workload) float64) {
	var mu sync.Mutex
	rates := map[workload.Workload]float64{}
	c := workload.DefaultGSP()
	c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens = 3, 4, 128, 32, 8
	load := Load{Rate: 20, At: func(rate float64) (workload.Workload, error) {
		at := c
		at.Rate = rate
		w, err := workload.NewGSP(at)
		mu.Lock()
		rates[w] = rate
		mu.Unlock()
		return w, err
	}}
	return load, func(w workload.Workload) float64 {
		mu.Lock()
		defer mu.Unlock()
		r, ok := rates[w]
		require.True(t, ok, "a workload the load built")
		return r
	}
}

// TestFindRateWithAFakeFleet runs the search against a stand-in simulation whose TTFT
// p95 grows with the rate and whose runs past a policy's capacity stop early, as the
// real ones do.
func TestFindRateWithAFakeFleet(t *testing.T) {
	load, rateOf := tinyGSPLoad(t)
	capacity := map[string]float64{"holds-31": 31, "holds-7": 7, "never": 0}
	slo := time.Second
	fake := func(cfg sim.Config, name string, o Options) (*sim.Result, error) {
		assert.Equal(t, slo, cfg.AbortTTFT, "runs stop early once the SLO is certainly missed")
		assert.Equal(t, 0.95, cfg.AbortQuantile)
		assert.Equal(t, 5, cfg.Replicas, "replicas held")
		r := rateOf(cfg.Workload)
		c := capacity[name]
		if r > 2*c {
			inf := time.Duration(math.MaxInt64)
			return &sim.Result{Policy: name, Aborted: true, TTFTp50: inf, TTFTp95: inf, TTFTp99: inf, E2Ep50: inf}, nil
		}
		// p95 reaches the SLO exactly at the capacity.
		p95 := time.Duration(float64(slo) * r / c)
		return &sim.Result{Policy: name, TTFTp95: p95, CachedTokenRate: 0.5, Requests: cfg.Workload.Len()}, nil
	}
	o := tinyOptions()
	o.Replicas = 5
	searches, err := findRate(load, []string{"holds-31", "holds-7", "never"}, o, slo, 0.95, Resolution{Step: 0.5}, fake)
	require.NoError(t, err)
	require.Len(t, searches, 3)

	for _, s := range searches[:2] {
		c := capacity[s.Policy]
		assert.LessOrEqual(t, s.Rate, c, s.Policy)
		assert.Greater(t, s.Missed, c, s.Policy)
		assert.LessOrEqual(t, s.Missed-s.Rate, 0.5, s.Policy)
		require.NotNil(t, s.Result, s.Policy)
		assert.Equal(t, s.Rate, rateOf(s.Workload), "%s: the workload kept is the one at the rate held", s.Policy)
		assert.LessOrEqual(t, s.Result.TTFTp95, slo)
		assert.Equal(t, workload.ReuseCeiling(s.Workload, o.Profile.BlockSize, o.Warmup), s.Ceiling, s.Policy)
		assert.Positive(t, s.Ceiling.Rate)
		assert.Contains(t, s.Tried, load.Rate, "%s: the search starts at the load's rate", s.Policy)
	}
	stopped := 0
	for _, p := range searches[1].Tried {
		if p == time.Duration(math.MaxInt64) {
			stopped++
		}
	}
	assert.Positive(t, stopped, "runs far past the capacity stopped early and count as misses")

	never := searches[2]
	assert.Zero(t, never.Rate)
	assert.Nil(t, never.Result)
	assert.Equal(t, 0.625, never.Missed, "halved from 20 until below the 0.5 req/s resolution")

	_, err = findRate(Load{}, []string{"x"}, o, slo, 0.95, Resolution{Step: 1}, fake)
	assert.Error(t, err, "a load without a rate")
}

func TestFindRateRunsTheSimulation(t *testing.T) {
	load, _ := tinyGSPLoad(t)
	o := tinyOptions()
	o.Replicas = 1
	searches, err := FindRate(load, []string{"oracle"}, o, 50*time.Millisecond, 0.95, Resolution{Fraction: 0.5})
	require.NoError(t, err)
	s := searches[0]
	assert.Equal(t, "oracle", s.Policy)
	require.NotNil(t, s.Result)
	assert.LessOrEqual(t, s.Result.TTFTp95, 50*time.Millisecond)
	assert.Equal(t, "oracle", s.Result.Policy)
	assert.Positive(t, s.Rate)
}
