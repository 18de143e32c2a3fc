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

func TestECDFPointsKeepBothEndsAndTheTail(t *testing.T) {
	sorted := make([]time.Duration, 10000)
	for i := range sorted {
		sorted[i] = time.Duration(i+1) * time.Millisecond
	}
	pts := ecdfPoints(sorted, 400)
	require.LessOrEqual(t, len(pts), 402)
	assert.Equal(t, 0.001, pts[0].X)
	assert.Equal(t, 10.0, pts[len(pts)-1].X, "the slowest request is drawn")
	assert.Less(t, pts[len(pts)-1].Y, 1.0, "the tail scale needs every fraction below 1")
	tail := 0
	for i := 1; i < len(pts); i++ {
		assert.Greater(t, pts[i].X, pts[i-1].X)
		assert.Greater(t, pts[i].Y, pts[i-1].Y)
		if pts[i].Y > 0.99 {
			tail++
		}
	}
	assert.Greater(t, tail, 40, "the slowest 1 percent keeps many points for the stretched scale")

	few := ecdfPoints(sorted[:3], 400)
	assert.Equal(t, []float64{0.5 / 3, 1.5 / 3, 2.5 / 3}, []float64{few[0].Y, few[1].Y, few[2].Y})
}

func TestLogTicksAndBounds(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks{labelled: []float64{1, 2, 5}}).Ticks(0.1, 100) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	assert.ElementsMatch(t, []string{"0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50", "100"}, labels)
	lo, hi := niceBounds(0.143, 58.7)
	assert.Equal(t, 0.1, lo)
	assert.Equal(t, 100.0, hi)
	s := tailScale{}
	assert.InDelta(t, 0.5, s.Normalize(0, 0.9999, 0.99), 1e-9, "0.99 is halfway to 0.9999")
}

func TestPlotSearchWithoutAnswer(t *testing.T) {
	var b bytes.Buffer
	gaveUp := time.Duration(math.MaxInt64)
	searches := []*Search{
		{Policy: "random", Tried: map[int]time.Duration{4: gaveUp, 8: 1500 * time.Millisecond}},
		{Policy: "oracle", Replicas: 4, GPUs: 4, Result: &sim.Result{}, Tried: map[int]time.Duration{2: gaveUp, 4: 800 * time.Millisecond}},
	}
	require.NoError(t, PlotSearch(&b, "svg", "t", searches, time.Second, "p95"))
	assert.Contains(t, b.String(), "random (more than 1024)")
	assert.Contains(t, b.String(), "oracle (4 replicas)")
	assert.Contains(t, b.String(), "run stopped early (misses SLO)")
	assert.Error(t, PlotSearch(&b, "svg", "t", nil, time.Second, "p95"))
	assert.Error(t, PlotTTFT(&b, "svg", "t", []*sim.Result{{Policy: "x"}}))
}
