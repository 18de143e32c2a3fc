package fleet

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
)

// The yardstick: kvroute's figures against the best other policy's, figure by figure
// (the best may be a different policy for each), and whether each is within the bound
// docs/performance.md holds kvroute to. The other policies are Peers: not the oracle,
// which is kvroute's own rule with perfect information, nor kvroute's variants.

// Peers are the policies kvroute is measured against.
var Peers = []string{"round-robin", "random", "least-queued", "chwbl", "sglang-cache-aware", "weighted-scorers"}

// Figure is one figure of the yardstick and its bound.
type Figure struct {
	Name string
	// Higher is true when more is better (the cached rate): the bound is then a floor
	// on kvroute's ratio to the best, else a ceiling.
	Higher bool
	Bound  float64
	of     func(*sim.Result) float64
}

// Figures are the yardstick's figures: what users feel (TTFT, end-to-end) and, where
// the cache binds, the cached rate, which is then the fleet's capacity.
var Figures = []Figure{
	{Name: "cached", Higher: true, Bound: 0.97, of: func(r *sim.Result) float64 { return r.CachedTokenRate }},
	{Name: "TTFT p50", Bound: 1.05, of: func(r *sim.Result) float64 { return seconds(r.TTFTp50) }},
	{Name: "p95", Bound: 1.0, of: func(r *sim.Result) float64 { return seconds(r.TTFTp95) }},
	{Name: "p99", Bound: 1.1, of: func(r *sim.Result) float64 { return seconds(r.TTFTp99) }},
	{Name: "e2e p50", Bound: 1.05, of: func(r *sim.Result) float64 { return seconds(r.E2Ep50) }},
}

// off reports whether ratio, kvroute's value over the best peer's, is off f's bound.
func (f *Figure) off(ratio float64) bool {
	if f.Higher {
		return ratio < f.Bound
	}
	return ratio > f.Bound
}

// seconds is d in seconds; a run that gave up is slower than any.
func seconds(d time.Duration) float64 {
	if d == time.Duration(math.MaxInt64) {
		return math.Inf(1)
	}
	return d.Seconds()
}

// Against is one run's yardstick: per Figure, kvroute's value over the best peer's.
type Against struct {
	Ratio []float64 // NaN where the ratio says nothing (the best is 0, or both gave up)
	Best  []string  // the best peer on the figure
	Off   []bool    // the ratio is off the figure's bound
}

// OffCount is how many figures are off their bounds.
func (a *Against) OffCount() int {
	n := 0
	for _, off := range a.Off {
		if off {
			n++
		}
	}
	return n
}

// AgainstBest is subject's yardstick in results; false when subject or every peer
// did not run.
func AgainstBest(results []*sim.Result, subject string) (Against, bool) {
	return againstPeers(AllFigures(results), subject)
}

// againstPeers is subject's yardstick against the Peers among policies; false when
// subject or every peer is missing.
func againstPeers(policies []PolicyFigures, subject string) (Against, bool) {
	var me *PolicyFigures
	var peers []PolicyFigures
	for i, p := range policies {
		switch {
		case p.Policy == subject:
			me = &policies[i]
		case slices.Contains(Peers, p.Policy):
			peers = append(peers, p)
		}
	}
	if me == nil || len(peers) == 0 {
		return Against{}, false
	}
	return against(*me, peers), true
}

// PolicyFigures is a policy's value on each Figure: one run's, or a geometric mean over
// runs (overseeds.go).
type PolicyFigures struct {
	Policy string
	Values []float64 // indexed like Figures; seconds for the latencies
}

func figuresOf(r *sim.Result) []float64 {
	v := make([]float64, len(Figures))
	for i, f := range Figures {
		v[i] = f.of(r)
	}
	return v
}

// against is me's yardstick against the best of others on each figure.
func against(me PolicyFigures, others []PolicyFigures) Against {
	a := Against{Ratio: make([]float64, len(Figures)), Best: make([]string, len(Figures)), Off: make([]bool, len(Figures))}
	for i, f := range Figures {
		best := others[0]
		for _, p := range others[1:] {
			if v, b := p.Values[i], best.Values[i]; (f.Higher && v > b) || (!f.Higher && v < b) {
				best = p
			}
		}
		ratio := me.Values[i] / best.Values[i]
		if math.IsInf(best.Values[i], 0) && math.IsInf(me.Values[i], 0) {
			ratio = math.NaN()
		}
		a.Ratio[i], a.Best[i] = ratio, best.Policy
		a.Off[i] = !math.IsNaN(ratio) && f.off(ratio)
	}
	return a
}

// YardstickNote says what the yardstick's line is and its bounds.
func YardstickNote() string {
	var b []string
	for _, f := range Figures {
		rel := "at most"
		if f.Higher {
			rel = "at least"
		}
		b = append(b, fmt.Sprintf("%s %s %gx", f.Name, rel, f.Bound))
	}
	return "kvroute over the best other policy on each figure (not the oracle, nor kvroute's variants);\n" +
		"* off its bound: " + strings.Join(b, ", ")
}

// ratioText is a ratio to 3 decimals, or as many more (up to 6) as show that one off
// its bound is: 1.0002 against a bound of 1, not 1.000.
func ratioText(a *Against, i int) string {
	v := a.Ratio[i]
	if math.IsNaN(v) {
		return "-"
	}
	s := fmt.Sprintf("%.3f", v)
	if a.Off[i] {
		f := Figures[i]
		for d := 4; d <= 6; d++ {
			if r, _ := strconv.ParseFloat(s, 64); f.off(r) {
				break
			}
			s = strconv.FormatFloat(v, 'f', d, 64)
		}
		s += "*"
	}
	return s
}

// WriteAgainst writes one run's yardstick: each figure's ratio and the peer it is
// measured against.
func WriteAgainst(w io.Writer, a *Against) error {
	_, err := fmt.Fprintf(w, "%s\n%s\n", YardstickNote(), againstLine(a))
	return err
}

// againstLine is a yardstick on one line: each figure's ratio and the peer it is
// measured against, then how many are off.
func againstLine(a *Against) string {
	var parts []string
	for i, f := range Figures {
		parts = append(parts, fmt.Sprintf("%s %s (%s)", f.Name, ratioText(a, i), a.Best[i]))
	}
	return fmt.Sprintf("%s: %d of %d off", strings.Join(parts, ", "), a.OffCount(), len(Figures))
}

// SeedRun is one seed's yardstick and the comparison it was measured on.
type SeedRun struct {
	Seed    uint64
	Against Against
	// Policies are every policy's figures on the seed (AllFigures), for the figures
	// over the seeds (overseeds.go); nil leaves those out.
	Policies []PolicyFigures
}

// AllFigures is each result's figures, in results' order.
func AllFigures(results []*sim.Result) []PolicyFigures {
	out := make([]PolicyFigures, len(results))
	for i, r := range results {
		out[i] = PolicyFigures{r.Policy, figuresOf(r)}
	}
	return out
}

// BoundsMet is how many figures of runs are within their bounds, of how many.
func BoundsMet(runs []SeedRun) (met, figures int) {
	for _, r := range runs {
		figures += len(Figures)
		met += len(Figures) - r.Against.OffCount()
	}
	return met, figures
}

// Geomeans are each figure's geometric mean ratio over runs (NaN ratios left out).
func Geomeans(runs []SeedRun) []float64 {
	out := make([]float64, len(Figures))
	for i := range Figures {
		sum, n := 0.0, 0
		for _, r := range runs {
			if v := r.Against.Ratio[i]; !math.IsNaN(v) && v > 0 {
				sum += math.Log(v)
				n++
			}
		}
		out[i] = math.NaN()
		if n > 0 {
			out[i] = math.Exp(sum / float64(n))
		}
	}
	return out
}

// WriteSeeds writes the yardstick of every seed, then the geometric mean of each figure,
// how many figures of all the runs are within their bounds, and the figures over the
// seeds (overseeds.go).
func WriteSeeds(w io.Writer, runs []SeedRun) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "seed\t")
	for _, f := range Figures {
		fmt.Fprintf(tw, "%s\t", f.Name)
	}
	fmt.Fprintln(tw, "off\t")
	for _, r := range runs {
		fmt.Fprintf(tw, "%d\t", r.Seed)
		for i := range Figures {
			fmt.Fprintf(tw, "%s\t", ratioText(&r.Against, i))
		}
		fmt.Fprintf(tw, "%d\t\n", r.Against.OffCount())
	}
	met, total := BoundsMet(runs)
	fmt.Fprint(tw, "geomean\t")
	for _, g := range Geomeans(runs) {
		if math.IsNaN(g) {
			fmt.Fprint(tw, "-\t")
			continue
		}
		fmt.Fprintf(tw, "%.3f\t", g)
	}
	fmt.Fprintf(tw, "%d\t\n", total-met)
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "bounds met: %d of %d\n", met, total); err != nil {
		return err
	}
	return writeOverSeeds(w, runs)
}

// WriteSeedsJSON writes --seeds' document: each seed's comparison (with its yardstick),
// each figure's geometric mean ratio over the runs and the figures over the seeds.
func WriteSeedsJSON(w io.Writer, reports []JSONReport, runs []SeedRun) error {
	type geomean struct {
		Figure string   `json:"figure"`
		Ratio  *float64 `json:"ratio"`
	}
	doc := struct {
		Runs      []JSONReport `json:"runs"`
		Geomeans  []geomean    `json:"geomeans,omitempty"`
		BoundsMet int          `json:"bounds_met"`
		Figures   int          `json:"figures"`
		// The figures over the seeds (overseeds.go).
		PolicyGeomeans        []JSONGeomean `json:"policy_geomeans,omitempty"`
		AgainstBestOverSeeds  []JSONFigure  `json:"against_best_over_seeds,omitempty"`
		AgainstBestOverHalves []JSONHalf    `json:"against_best_over_halves,omitempty"`
		Held                  []Held        `json:"held,omitempty"`
	}{Runs: reports}
	if len(runs) > 0 {
		for i, g := range Geomeans(runs) {
			doc.Geomeans = append(doc.Geomeans, geomean{Figure: Figures[i].Name, Ratio: jsonNum(g)})
		}
	}
	doc.BoundsMet, doc.Figures = BoundsMet(runs)
	doc.PolicyGeomeans, doc.AgainstBestOverSeeds, doc.AgainstBestOverHalves, doc.Held = jsonOverSeeds(runs)
	return writeJSON(w, doc)
}
