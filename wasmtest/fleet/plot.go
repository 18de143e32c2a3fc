package fleet

import (
	"bytes"
	"fmt"
	"html"
	"image/color"
	"io"
	"maps"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
)

// The pictures kvroute-bench --plot draws (gonum.org/v1/plot): the TTFT distribution
// of every policy of a comparison, and TTFT p95 against replicas for a search. The
// legend sits to the right of the plot, never over the curves.

// PlotFormat returns the image format of path from its extension (svg, png or pdf).
func PlotFormat(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	switch ext {
	case "svg", "png", "pdf":
		return ext, nil
	}
	return "", fmt.Errorf("%s: want a .svg, .png or .pdf file", path)
}

// The size of every picture.
const (
	plotWidth  = 9 * vg.Inch
	plotHeight = 5.4 * vg.Inch
)

// sans is the font every text is measured and laid out in. SVG viewers that lack it
// take the next family of svgFamilies, which may be wider; svgFit keeps the layout.
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// svgFamilies replaces gonum's single family name: Liberation Sans, then the fonts made
// to its metrics (Arimo, Arial; Helvetica nearly), then whatever sans-serif the viewer has.
const svgFamilies = `font-family:'Liberation Sans',Arimo,Arial,Helvetica,sans-serif;`

// policyStyle gives each policy one colour in every picture; kvroute's line is the
// heaviest, the oracle's dashed.
func policyStyle(name string, i int) draw.LineStyle {
	colors := map[string]string{
		"round-robin": "9c755f", "random": "8c8c8c", "least-queued": "499894", "chwbl": "f28e2b",
		"sglang-cache-aware": "b07aa1", "weighted-scorers": "4e79a7", "kvroute": "d62728",
		kvroute.WasmName: "59a14f", "oracle": "000000",
	}
	others := []string{"17becf", "bcbd22", "e377c2", "7f7f7f"}
	hex, ok := colors[name]
	if !ok {
		hex = others[i%len(others)]
	}
	v, _ := strconv.ParseUint(hex, 16, 32)
	st := draw.LineStyle{Color: color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 255}, Width: vg.Points(1.6)}
	switch name {
	case "kvroute":
		st.Width = vg.Points(2.8)
	case "oracle":
		st.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	case kvroute.WasmName:
		st.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	}
	return st
}

func newPlot(xlabel, ylabel string) *plot.Plot {
	p := plot.New()
	p.X.Label.Text, p.Y.Label.Text = xlabel, ylabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 11)
		a.Tick.Label.Font = font.From(sans, 10)
	}
	p.X.Padding, p.Y.Padding = vg.Points(2), vg.Points(2)
	grid := plotter.NewGrid()
	grid.Vertical.Color = color.Gray{Y: 225}
	grid.Horizontal.Color = color.Gray{Y: 225}
	p.Add(grid)
	return p
}

func newLegend() plot.Legend {
	l := plot.NewLegend()
	l.TextStyle.Font = font.From(sans, 10.5)
	l.Top, l.Left = true, true
	l.ThumbnailWidth = vg.Points(26)
	l.Padding = vg.Points(5)
	return l
}

// render draws the title (its first line large, the others small) across the top, p
// below it and the legend l to p's right, in format.
func render(w io.Writer, p *plot.Plot, l plot.Legend, format, title string) error {
	return renderPanels(w, []*plot.Plot{p}, l, format, title, plotHeight)
}

// renderPanels is render for panels stacked top to bottom, their data areas aligned,
// on a canvas height high.
func renderPanels(w io.Writer, panels []*plot.Plot, l plot.Legend, format, title string, height vg.Length) error {
	p := panels[0]
	c, err := draw.NewFormattedCanvas(plotWidth, height, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	y := dc.Max.Y - vg.Points(8)
	for i, para := range strings.Split(title, "\n") {
		sty := text.Style{Color: color.Black, Font: font.From(sans, 13), XAlign: draw.XCenter, YAlign: draw.YTop, Handler: p.TextHandler}
		if i > 0 {
			sty.Color, sty.Font = color.Gray{Y: 70}, font.From(sans, 10)
		}
		for _, line := range wrapText(para, dc.Max.X-dc.Min.X-vg.Points(16), func(s string) vg.Length { return sty.Rectangle(s).Size().X }) {
			dc.FillText(sty, vg.Point{X: (dc.Min.X + dc.Max.X) / 2, Y: y}, line)
			y -= sty.Rectangle(line).Size().Y + vg.Points(4)
		}
	}
	legendWidth := l.Rectangle(dc).Size().X + vg.Points(20)
	pc := dc
	pc.Max.X -= legendWidth
	pc.Max.Y = y - vg.Points(6)
	pc = draw.Crop(pc, vg.Points(4), 0, vg.Points(4), 0)
	if len(panels) == 1 {
		p.Draw(pc)
	} else {
		column := make([][]*plot.Plot, len(panels))
		for i, panel := range panels {
			column[i] = []*plot.Plot{panel}
		}
		cells := plot.Align(column, draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Points(12)}, pc)
		for i, panel := range panels {
			panel.Draw(cells[i][0])
		}
	}
	lc := dc
	lc.Min.X = pc.Max.X + vg.Points(14)
	lc.Max.Y = pc.Max.Y - vg.Points(2)
	l.Draw(lc)
	if format != "svg" {
		_, err = c.WriteTo(w)
		return err
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return err
	}
	_, err = w.Write(svgFit(b.Bytes()))
	return err
}

// wrapText breaks s at spaces into lines no wider than width (a word wider than that
// stays whole on its own line, as a trace's path may be).
func wrapText(s string, width vg.Length, widthOf func(string) vg.Length) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && widthOf(line+" "+word) > width {
			lines, line = append(lines, line), word
			continue
		}
		line = strings.TrimPrefix(line+" "+word, " ")
	}
	return append(lines, line)
}

// svgText is one text element as gonum's SVG canvas writes it (vg/vgsvg FillString).
var svgText = regexp.MustCompile(`(?s)<text ([^>]*?)style="font-family:Liberation Sans;([^"]*?font-size:([0-9.]+)px[^"]*)">([^<]*)</text>`)

// svgFit gives every text the width it has in Liberation Sans, where the layout put it
// (textLength, glyphs and spacing scaled to fit), and the family list svgFamilies: a
// viewer without the font then draws each text the same width in another one, where it
// clipped the legend's longest entries at the picture's edge.
func svgFit(svg []byte) []byte {
	return svgText.ReplaceAllFunc(svg, func(m []byte) []byte {
		g := svgText.FindSubmatch(m)
		size, err := strconv.ParseFloat(string(g[3]), 64)
		if err != nil {
			return m
		}
		face := font.DefaultCache.Lookup(sans, vg.Length(size))
		w := face.Width(html.UnescapeString(string(g[4])))
		return fmt.Appendf(nil, `<text %stextLength="%.5g" lengthAdjust="spacingAndGlyphs" style="%s%s">%s</text>`,
			g[1], w.Points(), svgFamilies, g[2], g[4])
	})
}

// tailScale stretches the top of a [0, 1) axis: a fraction p sits at -log10(1-p), so
// 0.9, 0.99 and 0.999 are evenly spaced and the tail of a distribution shows.
type tailScale struct{}

func (tailScale) Normalize(lo, hi, x float64) float64 {
	f := func(p float64) float64 { return -math.Log10(1 - p) }
	return (f(x) - f(lo)) / (f(hi) - f(lo))
}

// logTicks labels a logarithmic axis at the mantissas in labelled (1, 2, 5: 0.1, 0.2,
// 0.5, 1, ...) and puts unlabelled ticks at every other integer mantissa.
type logTicks struct{ labelled []float64 }

func (t logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		dec := math.Pow(10, e)
		for m := 1.0; m < 10; m++ {
			v := m * dec
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			tk := plot.Tick{Value: v}
			if slices.Contains(t.labelled, m) {
				tk.Label = strconv.FormatFloat(v, 'g', 4, 64)
			}
			ticks = append(ticks, tk)
		}
		for _, m := range t.labelled {
			if m != math.Trunc(m) && m*dec >= lo && m*dec <= hi {
				ticks = append(ticks, plot.Tick{Value: m * dec, Label: strconv.FormatFloat(m*dec, 'g', 4, 64)})
			}
		}
	}
	return ticks
}

// niceBounds widens [lo, hi] to the enclosing 1-2-5 values.
func niceBounds(lo, hi float64) (float64, float64) {
	down := func(v float64) float64 {
		dec := math.Pow(10, math.Floor(math.Log10(v)))
		for _, m := range []float64{5, 2, 1} {
			if m*dec <= v*(1+1e-9) {
				return m * dec
			}
		}
		return dec
	}
	up := func(v float64) float64 {
		dec := math.Pow(10, math.Floor(math.Log10(v)))
		for _, m := range []float64{1, 2, 5, 10} {
			if m*dec >= v*(1-1e-9) {
				return m * dec
			}
		}
		return 10 * dec
	}
	return down(lo), up(hi)
}

// ecdfPoints samples the empirical CDF of sorted durations: seconds against the
// plotting position (k+0.5)/n of the k-th smallest, which stays below 1 for the tail
// scale. Past maxPoints it keeps ranks evenly spaced in the fraction and, as many
// again, evenly spaced on the tail scale, so the body and the tail keep their shape.
func ecdfPoints(sorted []time.Duration, maxPoints int) plotter.XYs {
	n := len(sorted)
	pos := func(k int) float64 { return (float64(k) + 0.5) / float64(n) }
	var ranks []int
	if n <= maxPoints {
		for k := range n {
			ranks = append(ranks, k)
		}
	} else {
		half := maxPoints / 2
		top := -math.Log10(1 - pos(n-1))
		for i := 0; i <= half; i++ {
			ranks = append(ranks, (n-1)*i/half)
			p := 1 - math.Pow(10, -top*float64(i)/float64(half))
			ranks = append(ranks, min(n-1, int(p*float64(n))))
		}
		slices.Sort(ranks)
		ranks = slices.Compact(ranks)
	}
	xys := make(plotter.XYs, 0, len(ranks))
	for _, k := range ranks {
		xys = append(xys, plotter.XY{X: sorted[k].Seconds(), Y: pos(k)})
	}
	return xys
}

// PlotTTFT draws each policy's TTFT distribution as an empirical CDF on a logarithmic
// time axis, with the 95th percentile marked; format is svg, png or pdf.
func PlotTTFT(w io.Writer, format, title string, results []*sim.Result) error {
	p := newPlot("time to first token (s, log scale)", "fraction of requests with TTFT ≤ x (tail stretched)")
	l := newLegend()
	lo, hi := math.Inf(1), 0.0
	for _, r := range results {
		if len(r.TTFT) > 0 {
			lo, hi = min(lo, r.TTFT[0].Seconds()), max(hi, r.TTFT[len(r.TTFT)-1].Seconds())
		}
	}
	if hi == 0 {
		return fmt.Errorf("no completed request to plot")
	}
	lo, hi = niceBounds(max(lo, 1e-3), max(hi, 2*lo))
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{labelled: []float64{1, 2, 5}}
	p.X.Min, p.X.Max = lo, hi
	top := 0.0
	for _, r := range results {
		if n := len(r.TTFT); n > 0 {
			top = max(top, 1-0.5/float64(n))
		}
	}
	p.Y.Scale, p.Y.Min, p.Y.Max = tailScale{}, 0, top
	p.Y.Tick.Marker = plot.ConstantTicks(fractionTicks(top))

	p95 := plotter.NewFunction(func(float64) float64 { return 0.95 })
	p95.LineStyle = draw.LineStyle{Color: color.Gray{Y: 110}, Width: vg.Points(0.8), Dashes: []vg.Length{vg.Points(2), vg.Points(2)}}
	p.Add(p95)
	for i, r := range results {
		if len(r.TTFT) == 0 {
			continue
		}
		line, err := plotter.NewLine(ecdfPoints(r.TTFT, 800))
		if err != nil {
			return fmt.Errorf("%s: %w", r.Policy, err)
		}
		line.LineStyle = policyStyle(r.Policy, i)
		p.Add(line)
		l.Add(fmt.Sprintf("%s (p95 %s s)", r.Policy, shortSecs(r.TTFTp95)), line)
	}
	l.Add("p95 (0.95 of requests)", p95)
	return render(w, p, l, format, title)
}

// fractionTicks labels 0, 0.5, 0.9, 0.95, 0.99, 0.999, ... up to top.
func fractionTicks(top float64) []plot.Tick {
	var ts []plot.Tick
	for _, v := range []float64{0, 0.5, 0.9, 0.95, 0.99, 0.999, 0.9999, 0.99999} {
		if v <= top {
			ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
	}
	for _, v := range []float64{0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.98, 0.998, 0.9998} {
		if v <= top {
			ts = append(ts, plot.Tick{Value: v})
		}
	}
	return ts
}

func shortSecs(d time.Duration) string {
	if d == time.Duration(math.MaxInt64) {
		return "gave up"
	}
	s := d.Seconds()
	switch {
	case s >= 10:
		return strconv.FormatFloat(s, 'f', 1, 64)
	case s >= 1:
		return strconv.FormatFloat(s, 'f', 2, 64)
	}
	return strconv.FormatFloat(s, 'f', 3, 64)
}

// PlotSearch draws, per policy, the TTFT quantile of every replica count the search
// ran (small rings joined by a line; runs stopped early, certain to miss the SLO, as
// triangles along the top), the fewest replicas that met the SLO as a filled dot, and
// the SLO as a dashed line. Both axes are logarithmic.
func PlotSearch(w io.Writer, format, title string, searches []*Search, slo time.Duration, quantile string) error {
	p := newPlot("replicas (log scale)", "TTFT "+quantile+" (s, log scale)")
	l := newLegend()
	nlo, nhi := math.Inf(1), 0.0
	ylo, yhi := slo.Seconds(), slo.Seconds()
	gaveUp := false
	for _, s := range searches {
		for n, d := range s.Tried {
			nlo, nhi = min(nlo, float64(n)), max(nhi, float64(n))
			if d == time.Duration(math.MaxInt64) {
				gaveUp = true
				continue
			}
			ylo, yhi = min(ylo, d.Seconds()), max(yhi, d.Seconds())
		}
	}
	if nhi == 0 {
		return fmt.Errorf("no search run to plot")
	}
	finiteTop := yhi
	ylo, yhi = niceBounds(ylo, yhi)
	// Runs stopped early go in a band above everything else, one row per policy so
	// that rows at the same replica count do not hide each other.
	top, step := yhi, 1.0
	if gaveUp {
		yhi *= 2.5
		top = yhi / 1.1
		if len(searches) > 1 {
			step = min(1.08, math.Pow(top/(finiteTop*1.25), 1/float64(len(searches)-1)))
		}
	}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{labelled: []float64{1, 2, 5}}
	p.Y.Min, p.Y.Max = ylo, yhi
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{labelled: []float64{1, 1.5, 2, 3, 5, 7}}
	p.X.Min, p.X.Max = math.Max(1, math.Floor(nlo/1.15)), math.Ceil(nhi*1.15)

	sloLine := plotter.NewFunction(func(float64) float64 { return slo.Seconds() })
	sloLine.LineStyle = draw.LineStyle{Color: color.Gray{Y: 60}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
	p.Add(sloLine)
	for i, s := range searches {
		st := policyStyle(s.Policy, i)
		st.Width = min(st.Width, vg.Points(2))
		var pts, stopped plotter.XYs
		for _, n := range slices.Sorted(maps.Keys(s.Tried)) {
			if d := s.Tried[n]; d == time.Duration(math.MaxInt64) {
				stopped = append(stopped, plotter.XY{X: float64(n), Y: top / math.Pow(step, float64(i))})
			} else {
				pts = append(pts, plotter.XY{X: float64(n), Y: d.Seconds()})
			}
		}
		var thumbs []plot.Thumbnailer
		if len(pts) > 0 {
			lp, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Policy, err)
			}
			lp.LineStyle = st
			sc.GlyphStyle = draw.GlyphStyle{Color: st.Color, Radius: vg.Points(2.5), Shape: draw.RingGlyph{}}
			p.Add(lp, sc)
			thumbs = append(thumbs, lp)
		}
		if len(stopped) > 0 {
			sc, err := plotter.NewScatter(stopped)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Policy, err)
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: st.Color, Radius: vg.Points(3.5), Shape: draw.TriangleGlyph{}}
			p.Add(sc)
		}
		label := fmt.Sprintf("%s (more than %d)", s.Policy, SearchLimit)
		if s.Replicas > 0 {
			best, err := plotter.NewScatter(plotter.XYs{{X: float64(s.Replicas), Y: s.Tried[s.Replicas].Seconds()}})
			if err != nil {
				return fmt.Errorf("%s: %w", s.Policy, err)
			}
			best.GlyphStyle = draw.GlyphStyle{Color: st.Color, Radius: vg.Points(4.5), Shape: draw.CircleGlyph{}}
			p.Add(best)
			thumbs = append(thumbs, best)
			label = fmt.Sprintf("%s (%d replicas)", s.Policy, s.Replicas)
			if s.Replicas == 1 {
				label = s.Policy + " (1 replica)"
			}
		}
		l.Add(label, thumbs...)
	}
	l.Add(fmt.Sprintf("SLO: %s ≤ %s s", quantile, strconv.FormatFloat(slo.Seconds(), 'g', 4, 64)), sloLine)
	if gaveUp {
		l.Add("run stopped early (misses SLO)", stoppedThumb{})
	}
	l.Add("fewest replicas meeting SLO", bestThumb{})
	return render(w, p, l, format, title)
}

type stoppedThumb struct{}

func (stoppedThumb) Thumbnail(c *draw.Canvas) {
	c.DrawGlyph(draw.GlyphStyle{Color: color.Gray{Y: 80}, Radius: vg.Points(3.5), Shape: draw.TriangleGlyph{}}, c.Center())
}

type bestThumb struct{}

func (bestThumb) Thumbnail(c *draw.Canvas) {
	c.DrawGlyph(draw.GlyphStyle{Color: color.Gray{Y: 80}, Radius: vg.Points(4.5), Shape: draw.CircleGlyph{}}, c.Center())
}

// sweepHeight is the height of PlotSweep's picture: three panels.
const sweepHeight = 10 * vg.Inch

// PlotSweep draws, against the offered load, each policy's TTFT p50 and p95 (log
// scales) and cached-token rate, one line per policy in each panel, with every rate's
// reuse ceiling dashed in the last: a collapse shows as a cliff in all three.
func PlotSweep(w io.Writer, format, title string, points []*SweepPoint) error {
	if len(points) == 0 || len(points[0].Results) == 0 {
		return fmt.Errorf("no sweep run to plot")
	}
	panels := []*plot.Plot{
		newPlot("", "TTFT p50 (s, log scale)"),
		newPlot("", "TTFT p95 (s, log scale)"),
		newPlot("offered load (requests/s)", "cached prompt tokens"),
	}
	// Each panel's value of a run; false: none to draw (a TTFT is absent when no
	// request completed, and a log scale has no 0).
	values := []func(*sim.Result) (float64, bool){
		func(r *sim.Result) (float64, bool) { return drawnSecs(r.TTFTp50) },
		func(r *sim.Result) (float64, bool) { return drawnSecs(r.TTFTp95) },
		func(r *sim.Result) (float64, bool) { return r.CachedTokenRate, true },
	}
	xlo, xhi := points[0].Rate, points[len(points)-1].Rate
	pad := max((xhi-xlo)*0.03, 0.5)
	for _, p := range panels {
		p.X.Min, p.X.Max = xlo-pad, xhi+pad
	}
	for k, p := range panels[:2] {
		lo, hi := math.Inf(1), 0.0
		for _, pt := range points {
			for _, r := range pt.Results {
				if v, ok := values[k](r); ok {
					lo, hi = min(lo, v), max(hi, v)
				}
			}
		}
		if hi == 0 {
			lo, hi = 0.1, 1 // nothing completed at any rate: an empty panel
		}
		lo, hi = niceBounds(lo, max(hi, 2*lo))
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{labelled: []float64{1, 2, 5}}
		p.Y.Min, p.Y.Max = lo, hi
	}
	cached := panels[2]
	cached.Y.Min, cached.Y.Max = 0, 1
	cached.Y.Tick.Marker = percentTicks{}

	l := newLegend()
	for i := range points[0].Results {
		name := points[0].Results[i].Policy
		st := policyStyle(name, i)
		var thumb plot.Thumbnailer
		for k, p := range panels {
			var xys plotter.XYs
			for _, pt := range points {
				if v, ok := values[k](pt.Results[i]); ok {
					xys = append(xys, plotter.XY{X: pt.Rate, Y: v})
				}
			}
			if len(xys) == 0 {
				continue
			}
			lp, sc, err := plotter.NewLinePoints(xys)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			lp.LineStyle = st
			sc.GlyphStyle = draw.GlyphStyle{Color: st.Color, Radius: vg.Points(2.2), Shape: draw.CircleGlyph{}}
			p.Add(lp, sc)
			thumb = lp
		}
		label := name
		if name == "oracle" {
			label = "oracle (exact engine state)"
		}
		if thumb != nil {
			l.Add(label, thumb)
		}
	}
	ceiling := make(plotter.XYs, len(points))
	for k, pt := range points {
		ceiling[k] = plotter.XY{X: pt.Rate, Y: pt.Ceiling.Rate}
	}
	cl, err := plotter.NewLine(ceiling)
	if err != nil {
		return err
	}
	cl.LineStyle = draw.LineStyle{Color: color.Gray{Y: 60}, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}}
	cached.Add(cl)
	l.Add("reuse ceiling (infinite cache)", cl)
	return renderPanels(w, panels, l, format, title, sweepHeight)
}

// drawnSecs is d in seconds, false when there is nothing to draw on a log scale: no
// request completed (0) or the run stopped early (MaxInt64).
func drawnSecs(d time.Duration) (float64, bool) {
	if d <= 0 || d == time.Duration(math.MaxInt64) {
		return 0, false
	}
	return d.Seconds(), true
}

// percentTicks labels a [0, 1] axis in percent, every 20 with unlabelled ticks between.
type percentTicks struct{}

func (percentTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for v := 0; v <= 100; v += 10 {
		f := float64(v) / 100
		if f < lo || f > hi {
			continue
		}
		t := plot.Tick{Value: f}
		if v%20 == 0 {
			t.Label = strconv.Itoa(v) + "%"
		}
		ts = append(ts, t)
	}
	return ts
}
