package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
)

func secs(d time.Duration) string {
	if d == time.Duration(math.MaxInt64) {
		return "gave up"
	}
	return fmt.Sprintf("%.3f", d.Seconds())
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

// WriteTable writes one row per policy: the columns.
func WriteTable(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\trequests\tcached\tTTFT p50 s\tp95 s\tp99 s\te2e p50 s\tmax/mean Q\tspill\tpreempt\tfailed\twall s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%d\t%d\t%.1f\t\n", r.Policy, r.Requests,
			pct(r.CachedTokenRate), secs(r.TTFTp50), secs(r.TTFTp95), secs(r.TTFTp99), secs(r.E2Ep50),
			r.MaxMeanQueue, pct(r.SpillRate), r.Preemptions, r.Failed, r.Wall.Seconds())
	}
	return tw.Flush()
}

// WriteHot writes the hot-group split: how many replicas served the hot group and its
// TTFT against everyone else's.
func WriteHot(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\thot reqs\treplicas >=1%\teffective\thot TTFT p95 s\tothers p95 s\thot/others\t")
	for _, r := range results {
		if r.Hot == nil {
			continue
		}
		ratio := "-"
		if r.Others.TTFTp95 > 0 {
			ratio = fmt.Sprintf("%.2f", r.Hot.TTFTp95.Seconds()/r.Others.TTFTp95.Seconds())
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\t%s\t%s\t\n", r.Policy, r.Hot.Requests, r.Hot.Replicas,
			r.Hot.Effective, secs(r.Hot.TTFTp95), secs(r.Others.TTFTp95), ratio)
	}
	return tw.Flush()
}

// WritePhases writes each policy's numbers per phase (sim.Config.Phases), with the
// cached rate and TTFT p95 relative to the first phase.
func WritePhases(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tphase\trequests\tfailed\tcached\tvs first\tTTFT p50 s\tp95 s\tp99 s\tp95 vs first\t")
	for _, r := range results {
		for i, ph := range r.Phases {
			first := r.Phases[0]
			rel, relP95 := "-", "-"
			if i > 0 && first.CachedTokenRate > 0 {
				rel = fmt.Sprintf("%.2f", ph.CachedTokenRate/first.CachedTokenRate)
			}
			if i > 0 && first.TTFTp95 > 0 {
				relP95 = fmt.Sprintf("%.2f", ph.TTFTp95.Seconds()/first.TTFTp95.Seconds())
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Policy, ph.Name, ph.Requests, ph.Failed,
				pct(ph.CachedTokenRate), rel, secs(ph.TTFTp50), secs(ph.TTFTp95), secs(ph.TTFTp99), relP95)
		}
	}
	return tw.Flush()
}

// WriteSearch writes the fewest-replicas table.
func WriteSearch(w io.Writer, searches []*Search, slo time.Duration) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\treplicas\tGPUs\tTTFT p95 s\tcached\ttried (replicas: p95 s)\t\n")
	for _, s := range searches {
		var tried []string
		for n := 1; n <= SearchLimit; n++ {
			if p, ok := s.Tried[n]; ok {
				tried = append(tried, fmt.Sprintf("%d: %s", n, secs(p)))
			}
		}
		if s.Replicas == 0 {
			fmt.Fprintf(tw, "%s\t>%d\t-\t-\t-\t%s\t\n", s.Policy, SearchLimit, strings.Join(tried, ", "))
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t\n", s.Policy, s.Replicas, s.GPUs, secs(s.Result.TTFTp95),
			pct(s.Result.CachedTokenRate), strings.Join(tried, ", "))
	}
	return tw.Flush()
}

// JSONPolicy is one row of the JSON output (the schema).
type JSONPolicy struct {
	Name            string   `json:"name"`
	Requests        int      `json:"requests"`
	CachedTokenRate float64  `json:"cached_token_rate"`
	TTFTp50         *float64 `json:"ttft_p50_s"`
	TTFTp95         *float64 `json:"ttft_p95_s"`
	TTFTp99         *float64 `json:"ttft_p99_s"`
	E2Ep50          *float64 `json:"e2e_p50_s"`
	MaxMeanQueue    float64  `json:"max_mean_queue"`
	SpillRate       float64  `json:"spill_rate"`
	Preemptions     int      `json:"preemptions"`
}

// JSONReport is the --json document.
type JSONReport struct {
	Workload string       `json:"workload"`
	Replicas int          `json:"replicas"`
	Policies []JSONPolicy `json:"policies"`
}

func jsonSecs(d time.Duration) *float64 {
	if d == time.Duration(math.MaxInt64) {
		return nil // the run gave up: above any bound
	}
	v := math.Round(d.Seconds()*1e6) / 1e6
	return &v
}

// JSONRow converts one result.
func JSONRow(r *sim.Result) JSONPolicy {
	return JSONPolicy{
		Name: r.Policy, Requests: r.Requests, CachedTokenRate: round6(r.CachedTokenRate),
		TTFTp50: jsonSecs(r.TTFTp50), TTFTp95: jsonSecs(r.TTFTp95), TTFTp99: jsonSecs(r.TTFTp99),
		E2Ep50: jsonSecs(r.E2Ep50), MaxMeanQueue: round6(r.MaxMeanQueue), SpillRate: round6(r.SpillRate),
		Preemptions: r.Preemptions,
	}
}

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }

// WriteJSON writes the comparison as the JSON document.
func WriteJSON(w io.Writer, workload string, replicas int, results []*sim.Result) error {
	rep := JSONReport{Workload: workload, Replicas: replicas}
	for _, r := range results {
		rep.Policies = append(rep.Policies, JSONRow(r))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// JSONSearchPolicy is one policy of the --find-replicas JSON: the replicas found and
// the run there, in the comparison's schema.
type JSONSearchPolicy struct {
	JSONPolicy
	Replicas int `json:"replicas"`
	GPUs     int `json:"gpus"`
}

// WriteSearchJSON writes the search's outcome.
func WriteSearchJSON(w io.Writer, workload string, slo time.Duration, searches []*Search) error {
	doc := struct {
		Workload string             `json:"workload"`
		SLO      float64            `json:"slo_ttft_p95_s"`
		Policies []JSONSearchPolicy `json:"policies"`
	}{Workload: workload, SLO: slo.Seconds()}
	for _, s := range searches {
		row := JSONSearchPolicy{Replicas: s.Replicas, GPUs: s.GPUs}
		if s.Result != nil {
			row.JSONPolicy = JSONRow(s.Result)
		} else {
			row.Name = s.Policy
		}
		doc.Policies = append(doc.Policies, row)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
