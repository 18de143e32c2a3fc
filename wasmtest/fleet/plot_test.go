package fleet

import (
	"bytes"
	"html"
	"math"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	xfont "golang.org/x/image/font"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"

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

// The pictures drawn where Liberation Sans is missing: a viewer takes the next family and
// draws a text at its textLength when it has one, else at its own width, here that of Go
// Regular (golang.org/x/image/font/gofont), a sans-serif a few percent wider. Every text,
// the legend's longest entries included, stays inside the picture.
func TestPlotsFitWithoutTheNamedFont(t *testing.T) {
	var ttft []time.Duration
	for i := range 200 {
		ttft = append(ttft, time.Duration(100+i*i)*time.Millisecond)
	}
	var results []*sim.Result
	for _, p := range []string{"round-robin", "least-queued", "sglang-cache-aware", "weighted-scorers", "kvroute"} {
		results = append(results, &sim.Result{Policy: p, TTFT: ttft})
	}
	var b bytes.Buffer
	require.NoError(t, PlotTTFT(&b, "svg", "TTFT per policy at 22 replicas (44 GPUs)\nseed: a subtitle", results))
	svg := b.String()

	goFont, err := opentype.Parse(goregular.TTF)
	require.NoError(t, err)
	width := regexp.MustCompile(`viewBox="0 0 ([0-9.]+) `).FindStringSubmatch(svg)
	require.NotNil(t, width)
	canvas, _ := strconv.ParseFloat(width[1], 64)
	texts := regexp.MustCompile(`(?s)<text x="([-0-9.e]+)"([^>]*)>([^<]*)</text>`).FindAllStringSubmatch(svg, -1)
	require.Greater(t, len(texts), 20)
	legend := 0
	for _, m := range texts {
		x, _ := strconv.ParseFloat(m[1], 64)
		attrs, text := m[2], html.UnescapeString(m[3])
		family := regexp.MustCompile(`font-family:([^;"]*)`).FindStringSubmatch(attrs)
		require.NotNil(t, family, "%q has no font-family", text)
		assert.Regexp(t, `,\s*sans-serif$`, family[1], "%q: a generic family last", text)
		var w float64
		if tl := regexp.MustCompile(`textLength="([0-9.e+]+)"`).FindStringSubmatch(attrs); tl != nil {
			w, _ = strconv.ParseFloat(tl[1], 64)
		} else {
			size, err := strconv.ParseFloat(regexp.MustCompile(`font-size:([0-9.]+)px`).FindStringSubmatch(attrs)[1], 64)
			require.NoError(t, err)
			face, err := opentype.NewFace(goFont, &opentype.FaceOptions{Size: size, DPI: 72})
			require.NoError(t, err)
			w = float64(xfont.MeasureString(face, text)) / 64
		}
		assert.LessOrEqual(t, x+w, canvas, "%q at x=%.1f, %.1f wide, runs past the picture's right edge (%.1f)", text, x, w, canvas)
		assert.GreaterOrEqual(t, x, 0.0, "%q starts left of the picture", text)
		if regexp.MustCompile(`^sglang-cache-aware`).MatchString(text) {
			legend++
		}
	}
	assert.Equal(t, 1, legend, "the longest legend entry was drawn and checked")
}
