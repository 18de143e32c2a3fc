package fleet

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// The yardstick over seeds. Past capacity a small difference (one tie broken the other
// way) can tip a fleet into a worse state or keep it out of one, so one seed is one draw
// of each policy's figures, and different seeds draw differently for every policy.
// Seed by seed, kvroute is held to the better of the peers' draws on each figure, which
// is strict: a policy exactly as good as the best peer, drawn independently of it, is
// off on many seeds. So over seeds the comparison also says what a policy is, its
// figures' geometric means over the seeds, and holds every policy to the same count:
// each peer seed by seed against the best of the others, kvroute among them. The
// per-seed count stays what docs/performance.md reports first.

// PolicyGeomeans is each policy's geometric mean of each figure over runs, in the
// order the first run lists them. A run that gave up makes its figure infinite.
func PolicyGeomeans(runs []SeedRun) []PolicyFigures {
	var names []string
	logs := map[string][]float64{}
	counts := map[string]int{}
	for _, r := range runs {
		for _, pf := range r.Policies {
			if _, ok := logs[pf.Policy]; !ok {
				names = append(names, pf.Policy)
				logs[pf.Policy] = make([]float64, len(Figures))
			}
			for i, v := range pf.Values {
				logs[pf.Policy][i] += math.Log(v)
			}
			counts[pf.Policy]++
		}
	}
	out := make([]PolicyFigures, len(names))
	for k, name := range names {
		v := make([]float64, len(Figures))
		for i, l := range logs[name] {
			v[i] = math.Exp(l / float64(counts[name]))
		}
		out[k] = PolicyFigures{Policy: name, Values: v}
	}
	return out
}

// AgainstBestOverSeeds is subject's yardstick on the figures' geometric means over runs:
// subject's against each peer's; false when subject or every peer did not run.
func AgainstBestOverSeeds(runs []SeedRun, subject string) (Against, bool) {
	return againstPeers(PolicyGeomeans(runs), subject)
}

// minHalfSeeds is the fewest runs AgainstBestOverHalves splits.
const minHalfSeeds = 4

// Half is subject's yardstick over the figures' geometric means of part of the runs.
type Half struct {
	First, Last uint64 // the seeds of its first and last run
	Against     Against
}

// AgainstBestOverHalves is subject's yardstick over the first half of runs and over the
// rest, each as AgainstBestOverSeeds; nil with fewer than minHalfSeeds runs or without
// subject and a peer. Where both halves agree with the whole, the seeds were enough to
// say it; where they disagree, more seeds are needed.
func AgainstBestOverHalves(runs []SeedRun, subject string) []Half {
	if len(runs) < minHalfSeeds {
		return nil
	}
	var out []Half
	for _, part := range [][]SeedRun{runs[:len(runs)/2], runs[len(runs)/2:]} {
		a, ok := AgainstBestOverSeeds(part, subject)
		if !ok {
			return nil
		}
		out = append(out, Half{First: part[0].Seed, Last: part[len(part)-1].Seed, Against: a})
	}
	return out
}

// Held is one policy held to the yardstick seed by seed: how many of its figures over
// the runs are off their bounds against the best of the others on each.
type Held struct {
	Policy  string `json:"policy"`
	Off     int    `json:"off"`
	Figures int    `json:"figures"`
}

// HeldToTheYardstick holds subject and each peer that ran to the yardstick, seed by seed,
// against the best of the others among them (the oracle and kvroute's variants are not
// among them). Subject's Off is the figures BoundsMet finds off its bounds.
func HeldToTheYardstick(runs []SeedRun, subject string) []Held {
	var held []Held
	index := map[string]int{}
	for _, r := range runs {
		var in []PolicyFigures
		for _, pf := range r.Policies {
			if pf.Policy == subject || slices.Contains(Peers, pf.Policy) {
				in = append(in, pf)
			}
		}
		if len(in) < 2 {
			continue
		}
		for k, me := range in {
			others := slices.Delete(slices.Clone(in), k, k+1)
			a := against(me, others)
			i, ok := index[me.Policy]
			if !ok {
				i = len(held)
				index[me.Policy] = i
				held = append(held, Held{Policy: me.Policy})
			}
			held[i].Off += a.OffCount()
			held[i].Figures += len(Figures)
		}
	}
	// subject first, then the peers as they ran
	slices.SortStableFunc(held, func(a, b Held) int {
		switch {
		case a.Policy == subject && b.Policy != subject:
			return -1
		case b.Policy == subject && a.Policy != subject:
			return 1
		}
		return 0
	})
	return held
}

// writeOverSeeds writes the figures over the seeds: each policy's geometric means,
// kvroute's yardstick on them, and every contender held to the per-seed count; nothing
// when the runs carry no policies' figures.
func writeOverSeeds(w io.Writer, runs []SeedRun) error {
	gs := PolicyGeomeans(runs)
	if len(gs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nover the seeds, each policy's geometric mean (one seed is one draw of each policy's figures)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tcached\tTTFT p50 s\tp95 s\tp99 s\te2e p50 s\t")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%s\t", g.Policy, pct(g.Values[0]))
		for _, v := range g.Values[1:] {
			fmt.Fprintf(tw, "%s\t", geoSecs(v))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if a, ok := AgainstBestOverSeeds(runs, "kvroute"); ok {
		fmt.Fprintf(w, "kvroute over the best other policy over the seeds: %s\n", againstLine(&a))
	}
	if halves := AgainstBestOverHalves(runs, "kvroute"); halves != nil {
		var parts []string
		for i, f := range Figures {
			parts = append(parts, fmt.Sprintf("%s %s / %s", f.Name, ratioText(&halves[0].Against, i), ratioText(&halves[1].Against, i)))
		}
		fmt.Fprintf(w, "and over each half of the seeds (%d-%d / %d-%d): %s\n", halves[0].First, halves[0].Last,
			halves[1].First, halves[1].Last, strings.Join(parts, ", "))
	}
	if held := HeldToTheYardstick(runs, "kvroute"); len(held) > 1 {
		var parts []string
		for _, h := range held {
			parts = append(parts, fmt.Sprintf("%s %d of %d", h.Policy, h.Off, h.Figures))
		}
		fmt.Fprintf(w, "each held to the yardstick seed by seed against the best of the others (kvroute and the peers), figures off: %s\n",
			strings.Join(parts, ", "))
	}
	return nil
}

// geoSecs is a geometric mean of seconds; infinite where a run gave up.
func geoSecs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 1):
		return "gave up"
	}
	return fmt.Sprintf("%.3f", v)
}

// JSONGeomean is one policy's figures over the seeds in --seeds' document; null where
// a run gave up.
type JSONGeomean struct {
	Policy          string   `json:"policy"`
	CachedTokenRate *float64 `json:"cached_token_rate"`
	TTFTp50         *float64 `json:"ttft_p50_s"`
	TTFTp95         *float64 `json:"ttft_p95_s"`
	TTFTp99         *float64 `json:"ttft_p99_s"`
	E2Ep50          *float64 `json:"e2e_p50_s"`
}

// JSONHalf is one half of the seeds' yardstick (AgainstBestOverHalves).
type JSONHalf struct {
	FirstSeed uint64       `json:"first_seed"`
	LastSeed  uint64       `json:"last_seed"`
	Figures   []JSONFigure `json:"figures"`
}

// jsonOverSeeds fills --seeds' document with the figures over the seeds.
func jsonOverSeeds(runs []SeedRun) (gs []JSONGeomean, over []JSONFigure, halves []JSONHalf, held []Held) {
	for _, g := range PolicyGeomeans(runs) {
		v := g.Values
		gs = append(gs, JSONGeomean{Policy: g.Policy, CachedTokenRate: jsonNum(v[0]), TTFTp50: jsonNum(v[1]),
			TTFTp95: jsonNum(v[2]), TTFTp99: jsonNum(v[3]), E2Ep50: jsonNum(v[4])})
	}
	if a, ok := AgainstBestOverSeeds(runs, "kvroute"); ok {
		over = JSONAgainst(&a)
	}
	for _, h := range AgainstBestOverHalves(runs, "kvroute") {
		halves = append(halves, JSONHalf{FirstSeed: h.First, LastSeed: h.Last, Figures: JSONAgainst(&h.Against)})
	}
	return gs, over, halves, HeldToTheYardstick(runs, "kvroute")
}
