package fleet

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"html"
	"image/color"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	xfont "golang.org/x/image/font"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"gonum.org/v1/plot/vg"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
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

func TestWrapTextFitsTheWidth(t *testing.T) {
	chars := func(s string) vg.Length { return vg.Length(len(s)) }
	assert.Equal(t, []string{"mooncake: a", "b c, 200", "requests"}, wrapText("mooncake: a b c, 200 requests", 11, chars))
	assert.Equal(t, []string{"/a/very/long/path.jsonl", "x"}, wrapText("/a/very/long/path.jsonl x", 10, chars), "a word wider than the line stays whole")
	assert.Equal(t, []string{"short"}, wrapText("short", 80, chars))
	assert.Equal(t, []string{""}, wrapText("", 80, chars), "an empty line stays a line")
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

// TestPlotSweep checks the picture's structure: it is an SVG document whose three
// panels each hold one line per policy through every rate (a policy's colour, as many
// vertices as rates), with a legend entry per policy and for the ceiling.
func TestPlotSweep(t *testing.T) {
	rates := []float64{10, 20, 30, 40}
	names := []string{"round-robin", "weighted-scorers", "kvroute", "oracle"}
	var points []*SweepPoint
	for k, r := range rates {
		p := &SweepPoint{Rate: r, Ceiling: workload.Ceiling{Rate: 0.8, Prompt: 1}}
		for i, n := range names {
			d := time.Duration(float64(100*time.Millisecond) * math.Pow(3, float64(k)) * float64(i+1))
			p.Results = append(p.Results, &sim.Result{Policy: n, TTFTp50: d / 4, TTFTp95: d, CachedTokenRate: 0.7 - 0.1*float64(k)})
		}
		points = append(points, p)
	}
	var b bytes.Buffer
	require.NoError(t, PlotSweep(&b, "svg", "sweep\nsubtitle", points))
	doc := parseSVG(t, b.Bytes())
	for i, n := range names {
		st := policyStyle(n, i)
		c := st.Color.(color.RGBA)
		// The oracle is black like the axes: its dashes tell it apart.
		stroke := fmt.Sprintf("stroke:#%02X%02X%02X;stroke-width:%g", c.R, c.G, c.B, st.Width.Points())
		if len(st.Dashes) > 0 {
			stroke += fmt.Sprintf(";stroke-dasharray:%g,%g", st.Dashes[0].Points(), st.Dashes[1].Points())
		}
		lines := 0
		for _, p := range doc.paths {
			if strings.Contains(p.style, stroke) && strings.Count(p.d, "L") == len(rates)-1 {
				lines++
			}
		}
		assert.Equal(t, 3, lines, "%s: one line through every rate in each of the three panels", n)
	}
	for _, want := range []string{"round-robin", "weighted-scorers", "kvroute", "oracle (exact engine state)",
		"reuse ceiling (infinite cache)", "TTFT p50 (s, log scale)", "TTFT p95 (s, log scale)", "cached prompt tokens",
		"offered load (requests/s)", "sweep", "subtitle"} {
		assert.Contains(t, doc.texts, want)
	}

	// A policy that completed nothing at a rate has no TTFT point there, but its line
	// goes on through the others.
	points[3].Results[0].TTFTp50, points[3].Results[0].TTFTp95 = 0, time.Duration(math.MaxInt64)
	b.Reset()
	require.NoError(t, PlotSweep(&b, "png", "t", points))
	assert.Error(t, PlotSweep(&b, "svg", "t", nil))
}

// svgNode is an SVG element with everything in it.
type svgNode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Nodes   []svgNode  `xml:",any"`
}

// svgDoc is what a test reads of an SVG picture: every path and every text, at any
// depth.
type svgDoc struct {
	paths []struct{ d, style string }
	texts []string
}

func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	var root svgNode
	require.NoError(t, xml.Unmarshal(b, &root), "well-formed XML")
	require.Equal(t, "svg", root.XMLName.Local)
	var doc svgDoc
	var walk func(n svgNode)
	walk = func(n svgNode) {
		switch n.XMLName.Local {
		case "text":
			doc.texts = append(doc.texts, n.Text)
		case "path":
			var p struct{ d, style string }
			for _, a := range n.Attrs {
				if a.Name.Local == "d" {
					p.d = a.Value
				} else if a.Name.Local == "style" {
					p.style = a.Value
				}
			}
			doc.paths = append(doc.paths, p)
		}
		for _, c := range n.Nodes {
			walk(c)
		}
	}
	walk(root)
	return doc
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
