package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

func TestParseSweep(t *testing.T) {
	good := []struct {
		in   string
		want []float64
	}{
		{"10:60:10", []float64{10, 20, 30, 40, 50, 60}},
		{"0.1:0.3:0.1", []float64{0.1, 0.2, 0.3}},
		{"10:12:5", []float64{10}},
		{"5:5:1", []float64{5}},
		{" 2 : 3 : 0.5 ", []float64{2, 2.5, 3}},
	}
	for _, c := range good {
		got, err := ParseSweep(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
	bad := []struct{ in, says string }{
		{"10:60", "want A:B:STEP"},
		{"10:60:5:1", "want A:B:STEP"},
		{"", "want A:B:STEP"},
		{"x:60:5", `A "x" is not a number`},
		{"10::5", `B "" is not a number`},
		{"10:60:Inf", `STEP "Inf" is not a number`},
		{"0:10:1", "A must be positive"},
		{"-5:10:1", "A must be positive"},
		{"10:5:1", "B must not be below A"},
		{"1:10:0", "STEP must be positive"},
		{"1:10:-1", "STEP must be positive"},
		{"1:1000:1", "1000 rates, at most 100"},
	}
	for _, c := range bad {
		_, err := ParseSweep(c.in)
		assert.ErrorContains(t, err, c.says, c.in)
	}
}

func TestSweepRunsEveryPolicyAtEveryRate(t *testing.T) {
	load, rateOf := tinyGSPLoad(t)
	o := tinyOptions()
	o.Replicas = 2
	names := []string{"round-robin", "oracle"}
	points, err := Sweep(load, names, o, []float64{10, 40, 160})
	require.NoError(t, err)
	require.Len(t, points, 3)
	for k, p := range points {
		assert.Equal(t, []float64{10, 40, 160}[k], p.Rate)
		assert.Equal(t, p.Rate, rateOf(p.Workload))
		assert.Equal(t, workload.ReuseCeiling(p.Workload, o.Profile.BlockSize, o.Warmup), p.Ceiling)
		require.Len(t, p.Results, 2)
		for i, r := range p.Results {
			assert.Equal(t, names[i], r.Policy, "results in the order of the names")
			assert.Equal(t, p.Workload.Len(), r.Requests)
			assert.False(t, r.Aborted, "a sweep runs every workload to the end")
			assert.LessOrEqual(t, r.CachedTokenRate, p.Ceiling.Rate+1e-12, "%s at %g req/s beats the reuse ceiling", r.Policy, p.Rate)
		}
	}
}
