package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
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

// WriteMemory writes how each policy leaves the replicas' KV memory (sim.FleetState):
// where every replica's memory is held by running requests, prefixes have no room to
// stay cached, and what a request was routed for can be evicted while it waits; and
// how much of what the replicas evict is stored again soon after, on the replica (as
// the control plane measures it) and anywhere in the fleet.
func WriteMemory(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tcached\tKV usage\tfree blocks\trunning\twaiting\tlost waiting\tevicted/s\tstored again\tin the fleet\tpreempt\t")
	for _, r := range results {
		m := r.Memory
		evicted := "-"
		if !math.IsNaN(m.Evicted) {
			evicted = fmt.Sprintf("%.0f", m.Evicted)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%d\t\n", r.Policy, pct(r.CachedTokenRate), pct(m.KVUsage),
			pct(m.Free), m.Running, m.Waiting, pct(m.LostWaiting), evicted, pct(m.StoredAgain), pct(m.StoredAgainFleet), r.Preemptions)
	}
	return tw.Flush()
}

// WriteFollowUps writes, when the workload has Responses follow-ups, how many each policy
// sent to a replica whose store lacked the previous response (vLLM's 404 not found);
// nothing otherwise.
func WriteFollowUps(w io.Writer, results []*sim.Result) error {
	if !slices.ContainsFunc(results, func(r *sim.Result) bool { return r.FollowUps > 0 }) {
		return nil
	}
	fmt.Fprintf(w, "\nResponses follow-ups by previous_response_id (in failed: those not found on the replica they reached)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tfollow-ups\tnot found\tshare\t")
	for _, r := range results {
		share := math.NaN()
		if r.FollowUps > 0 {
			share = float64(r.NotFound) / float64(r.FollowUps)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t\n", r.Policy, r.FollowUps, r.NotFound, pct(share))
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
	// FollowUps and NotFound are set on a workload with Responses follow-ups
	// (sim.Result): how many, and how many reached a replica without the response.
	FollowUps int  `json:"follow_ups,omitempty"`
	NotFound  *int `json:"follow_ups_not_found,omitempty"`
	// Memory is sim.FleetState, per replica and time-averaged, when asked for
	// (AddMemory).
	Memory *JSONMemory `json:"memory,omitempty"`
}

// JSONMemory is sim.FleetState in the JSON output.
type JSONMemory struct {
	KVUsage     float64 `json:"kv_usage"`
	Free        float64 `json:"free_blocks"`
	Running     float64 `json:"running"`
	Waiting     float64 `json:"waiting"`
	LostWaiting float64 `json:"lost_waiting"`
	// Evicted (blocks a replica evicted a second), StoredAgain and StoredAgainFleet (the
	// shares of them stored again within 5 minutes on their replica and anywhere) are
	// null when no eviction's window closed within the run.
	Evicted          *float64 `json:"evicted_blocks_per_s"`
	StoredAgain      *float64 `json:"stored_again"`
	StoredAgainFleet *float64 `json:"stored_again_fleet"`
}

// JSONReport is the --json document.
type JSONReport struct {
	Workload string `json:"workload"`
	Replicas int    `json:"replicas"`
	// Seed is the run's seed in --seeds' document (WriteSeedsJSON).
	Seed uint64 `json:"seed,omitempty"`
	// PolicySeed is --policy-seed when given (Options.PolicySeed).
	PolicySeed uint64 `json:"policy_seed,omitempty"`
	// ReuseCeiling is the workload's workload.Ceiling rate (absent when not computed).
	ReuseCeiling *float64 `json:"reuse_ceiling,omitempty"`
	// PooledLRU is workload.PooledLRU's rate over the fleet's KV memory (absent when not
	// computed).
	PooledLRU *float64     `json:"pooled_lru,omitempty"`
	Policies  []JSONPolicy `json:"policies"`
	// AgainstBest is kvroute's yardstick (yardstick.go), when kvroute and a peer ran.
	AgainstBest []JSONFigure `json:"against_best,omitempty"`
}

// JSONFigure is one figure of the yardstick: kvroute's value over the best peer's.
type JSONFigure struct {
	Figure string   `json:"figure"`
	Ratio  *float64 `json:"ratio"` // null when not a number: the best is 0, or a run gave up
	Best   string   `json:"best"`
	Bound  float64  `json:"bound"`
	Off    bool     `json:"off"`
}

// JSONAgainst is a in the JSON output.
func JSONAgainst(a *Against) []JSONFigure {
	out := make([]JSONFigure, len(Figures))
	for i, f := range Figures {
		out[i] = JSONFigure{Figure: f.Name, Ratio: jsonNum(a.Ratio[i]), Best: a.Best[i], Bound: f.Bound, Off: a.Off[i]}
	}
	return out
}

func jsonSecs(d time.Duration) *float64 {
	return jsonNum(seconds(d)) // null where the run gave up: above any bound
}

// JSONRow converts one result.
func JSONRow(r *sim.Result) JSONPolicy {
	row := JSONPolicy{
		Name: r.Policy, Requests: r.Requests, CachedTokenRate: round6(r.CachedTokenRate),
		TTFTp50: jsonSecs(r.TTFTp50), TTFTp95: jsonSecs(r.TTFTp95), TTFTp99: jsonSecs(r.TTFTp99),
		E2Ep50: jsonSecs(r.E2Ep50), MaxMeanQueue: round6(r.MaxMeanQueue), SpillRate: round6(r.SpillRate),
		Preemptions: r.Preemptions,
	}
	if r.FollowUps > 0 {
		nf := r.NotFound
		row.FollowUps, row.NotFound = r.FollowUps, &nf
	}
	return row
}

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }

// jsonNum is v to 6 decimals, or null where it is not a finite number (JSON has no
// infinity: a run that gave up, or a ratio that says nothing).
func jsonNum(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	v = round6(v)
	return &v
}

// NewJSONReport is the comparison as the JSON document.
func NewJSONReport(workload string, replicas int, results []*sim.Result) JSONReport {
	rep := JSONReport{Workload: workload, Replicas: replicas}
	for _, r := range results {
		rep.Policies = append(rep.Policies, JSONRow(r))
	}
	if a, ok := AgainstBest(results, "kvroute"); ok {
		rep.AgainstBest = JSONAgainst(&a)
	}
	return rep
}

// AddMemory adds each result's sim.FleetState to rep's rows (NewJSONReport's, from the
// same results in the same order).
func AddMemory(rep *JSONReport, results []*sim.Result) {
	for i, r := range results {
		m := r.Memory
		rep.Policies[i].Memory = &JSONMemory{KVUsage: round6(m.KVUsage), Free: round6(m.Free),
			Running: round6(m.Running), Waiting: round6(m.Waiting), LostWaiting: round6(m.LostWaiting)}
		if !math.IsNaN(m.StoredAgain) {
			own, fleet, evicted := round6(m.StoredAgain), round6(m.StoredAgainFleet), round6(m.Evicted)
			jm := rep.Policies[i].Memory
			jm.StoredAgain, jm.StoredAgainFleet, jm.Evicted = &own, &fleet, &evicted
		}
	}
}

// WriteJSON writes the comparison as the JSON document.
func WriteJSON(w io.Writer, workload string, replicas int, results []*sim.Result) error {
	return writeJSON(w, NewJSONReport(workload, replicas, results))
}

// WriteReportJSON writes rep (NewJSONReport's, with a ceiling set).
func WriteReportJSON(w io.Writer, rep JSONReport) error { return writeJSON(w, rep) }

func writeJSON(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

func ceilingJSON(c workload.Ceiling) *float64 {
	if c.Prompt == 0 {
		return nil
	}
	v := round6(c.Rate)
	return &v
}

// JSONSearchPolicy is one policy of the --find-replicas JSON: the replicas found and
// the run there, in the comparison's schema.
type JSONSearchPolicy struct {
	JSONPolicy
	Replicas int `json:"replicas"`
	GPUs     int `json:"gpus"`
}

// WriteSearchJSON writes the search's outcome, with the workload's reuse ceiling.
func WriteSearchJSON(w io.Writer, name string, slo time.Duration, ceiling workload.Ceiling, searches []*Search) error {
	doc := struct {
		Workload     string             `json:"workload"`
		SLO          float64            `json:"slo_ttft_p95_s"`
		ReuseCeiling *float64           `json:"reuse_ceiling,omitempty"`
		Policies     []JSONSearchPolicy `json:"policies"`
	}{Workload: name, SLO: slo.Seconds(), ReuseCeiling: ceilingJSON(ceiling)}
	for _, s := range searches {
		row := JSONSearchPolicy{Replicas: s.Replicas, GPUs: s.GPUs}
		if s.Result != nil {
			row.JSONPolicy = JSONRow(s.Result)
		} else {
			row.Name = s.Policy
		}
		doc.Policies = append(doc.Policies, row)
	}
	return writeJSON(w, doc)
}

// OracleNote says what the oracle policy is, wherever its numbers are printed.
const OracleNote = `oracle: kvroute's own rule (shared/rule) fed every engine's exact GPU prefix cache,
queued prefill tokens and load at the moment of each decision, where kvroute sees them
through reports, KV events, scrapes and table polls. kvroute's distance from it measures that
information pipeline, not the rule; it is not an upper bound on routing: another rule
can beat it.`

// CeilingNote says what the reuse ceiling (workload.Ceiling) is.
const CeilingNote = `the cached rate of one infinite prefix cache every request reaches
(each prompt's longest block-aligned prefix that an earlier request sent, up to prompt-1 tokens)`

// PooledNote says what the pooled LRU (workload.PooledLRU) is.
const PooledNote = `the cached rate of one LRU prefix cache as large as the fleet's KV memory that
every request reaches in arrival order: what perfect affinity keeps where the cache binds. Not a
bound: engines also cache their outputs and keep what running requests hold`

// WritePooled writes the pooled LRU's rate c over tokens of KV memory.
func WritePooled(w io.Writer, c workload.Ceiling, tokens int64) error {
	_, err := fmt.Fprintf(w, "pooled LRU %s over %d KV tokens: %s.\n", pct(c.Rate), tokens, PooledNote)
	return err
}

// WriteNotes writes what the numbers are measured against: the workload's reuse
// ceiling (nil: the table has a ceiling column, which the note explains) and, when the
// oracle ran, what it is.
func WriteNotes(w io.Writer, names []string, ceiling *workload.Ceiling) error {
	var err error
	if ceiling != nil {
		_, err = fmt.Fprintf(w, "reuse ceiling %s over %d measured requests: %s.\n", pct(ceiling.Rate), ceiling.Requests, CeilingNote)
	} else {
		_, err = fmt.Fprintf(w, "ceiling: the reuse ceiling of the arrivals at that rate, %s.\n", CeilingNote)
	}
	if err == nil && slices.Contains(names, "oracle") {
		_, err = fmt.Fprintln(w, OracleNote)
	}
	return err
}

func rate(v float64) string { return strconv.FormatFloat(v, 'g', 5, 64) }

// WriteRateSearch writes the highest-rate table: per policy the rate held, the lowest
// rate missed, the run at the rate held, and that workload's reuse ceiling; for a
// trace, the speedup that gives the rate.
func WriteRateSearch(w io.Writer, load Load, searches []*RateSearch) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	trace := load.TraceRate > 0
	row := func(cols ...string) { fmt.Fprintf(tw, "%s\t\n", strings.Join(cols, "\t")) }
	head := []string{"policy", "rate held"}
	if trace {
		head = append(head, "speedup")
	}
	row(append(head, "misses at", "TTFT p95 s", "cached", "ceiling", "tried (req/s: p95 s)")...)
	for _, s := range searches {
		var tried []string
		for _, r := range slices.Sorted(maps.Keys(s.Tried)) {
			tried = append(tried, fmt.Sprintf("%s: %s", rate(r), secs(s.Tried[r])))
		}
		held, speedup, missed, p95, cached, ceiling := "none", "-", "-", "-", "-", "-"
		if s.Missed > 0 {
			missed = rate(s.Missed)
		}
		if s.Result != nil {
			held, speedup = rate(s.Rate), strconv.FormatFloat(load.Speedup(s.Rate), 'g', 4, 64)
			if s.Missed == 0 {
				held = ">=" + held
			}
			p95, cached, ceiling = secs(s.Result.TTFTp95), pct(s.Result.CachedTokenRate), pct(s.Ceiling.Rate)
		}
		cols := []string{s.Policy, held}
		if trace {
			cols = append(cols, speedup)
		}
		row(append(cols, missed, p95, cached, ceiling, strings.Join(tried, ", "))...)
	}
	return tw.Flush()
}

// JSONRatePolicy is one policy of the --find-rate JSON: the rate held and the run
// there, in the comparison's schema.
type JSONRatePolicy struct {
	JSONPolicy
	RateHeld     float64         `json:"rate_held"`
	MissedAt     *float64        `json:"missed_at"` // null: held up to the search's cap
	Speedup      float64         `json:"speedup,omitempty"`
	ReuseCeiling *float64        `json:"reuse_ceiling,omitempty"`
	Tried        []JSONRateTried `json:"tried"`
}

// JSONRateTried is one run of a rate search.
type JSONRateTried struct {
	Rate    float64  `json:"rate"`
	TTFTp95 *float64 `json:"ttft_p95_s"` // null: stopped early, certain to miss
}

// WriteRateSearchJSON writes FindRate's outcome.
func WriteRateSearchJSON(w io.Writer, name string, replicas int, slo time.Duration, res Resolution, load Load, searches []*RateSearch) error {
	doc := struct {
		Workload   string           `json:"workload"`
		Replicas   int              `json:"replicas"`
		SLO        float64          `json:"slo_ttft_p95_s"`
		Resolution string           `json:"resolution"`
		TraceRate  float64          `json:"trace_rate,omitempty"`
		Policies   []JSONRatePolicy `json:"policies"`
	}{Workload: name, Replicas: replicas, SLO: slo.Seconds(), Resolution: res.String(), TraceRate: round6(load.TraceRate)}
	for _, s := range searches {
		row := JSONRatePolicy{RateHeld: s.Rate, Tried: []JSONRateTried{}}
		if s.Result != nil {
			row.JSONPolicy = JSONRow(s.Result)
			row.ReuseCeiling = ceilingJSON(s.Ceiling)
			row.Speedup = round6(load.Speedup(s.Rate))
		} else {
			row.Name = s.Policy
		}
		if s.Missed > 0 {
			row.MissedAt = &s.Missed
		}
		for _, r := range slices.Sorted(maps.Keys(s.Tried)) {
			row.Tried = append(row.Tried, JSONRateTried{Rate: r, TTFTp95: jsonSecs(s.Tried[r])})
		}
		doc.Policies = append(doc.Policies, row)
	}
	return writeJSON(w, doc)
}

// WriteSweep writes one row per rate and policy, each rate's reuse ceiling beside
// them.
func WriteSweep(w io.Writer, load Load, points []*SweepPoint) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	trace := load.TraceRate > 0
	row := func(cols ...string) { fmt.Fprintf(tw, "%s\t\n", strings.Join(cols, "\t")) }
	head := []string{"rate"}
	if trace {
		head = append(head, "speedup")
	}
	row(append(head, "policy", "requests", "failed", "cached", "ceiling", "TTFT p50 s", "p95 s", "p99 s", "e2e p50 s")...)
	for _, p := range points {
		at := []string{rate(p.Rate)}
		if trace {
			at = append(at, strconv.FormatFloat(load.Speedup(p.Rate), 'g', 4, 64))
		}
		for _, r := range p.Results {
			row(append(slices.Clone(at), r.Policy, strconv.Itoa(r.Requests), strconv.Itoa(r.Failed), pct(r.CachedTokenRate),
				pct(p.Ceiling.Rate), secs(r.TTFTp50), secs(r.TTFTp95), secs(r.TTFTp99), secs(r.E2Ep50))...)
		}
	}
	return tw.Flush()
}

// WriteSweepJSON writes Sweep's outcome: per rate, the ceiling and every policy's row.
func WriteSweepJSON(w io.Writer, name string, replicas int, load Load, points []*SweepPoint) error {
	type jsonPoint struct {
		Rate         float64      `json:"rate"`
		Speedup      float64      `json:"speedup,omitempty"`
		ReuseCeiling *float64     `json:"reuse_ceiling,omitempty"`
		Policies     []JSONPolicy `json:"policies"`
	}
	doc := struct {
		Workload  string      `json:"workload"`
		Replicas  int         `json:"replicas"`
		TraceRate float64     `json:"trace_rate,omitempty"`
		Rates     []jsonPoint `json:"rates"`
	}{Workload: name, Replicas: replicas, TraceRate: round6(load.TraceRate)}
	for _, p := range points {
		jp := jsonPoint{Rate: p.Rate, Speedup: round6(load.Speedup(p.Rate)), ReuseCeiling: ceilingJSON(p.Ceiling)}
		for _, r := range p.Results {
			jp.Policies = append(jp.Policies, JSONRow(r))
		}
		doc.Rates = append(doc.Rates, jp)
	}
	return writeJSON(w, doc)
}
