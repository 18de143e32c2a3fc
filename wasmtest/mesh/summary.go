package mesh

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Summary is a snapshot of what the mesh is doing.
type Summary struct {
	// Requests the proxy has seen.
	Requests int64
	// Outcomes are the outcome reports with usage the filter sent; the rates are over
	// them: cached prompt tokens the filter predicted, and what the engines reported.
	Outcomes                  int64
	PredictedRate, ActualRate float64
	// Queues are the replicas' queued prefill tokens (the engines' own view).
	Queues []int
	// Replicas are the simulated replicas' own numbers, in the order of Queues.
	Replicas []ReplicaSummary
	// TableVersion and TableAge are the filter's view of the table.
	TableVersion int64
	TableAge     time.Duration
	// Filter are the filter's own counters (its proxy-wasm metrics, filter/metrics.go).
	Filter FilterCounts
}

// FilterCounts are the filter's counters since the proxy started: requests placed by
// the rule, of them sent away from the longest prefix, routed least-queued, left to the
// proxy's fallback, with bodies above max_body_bytes, and placed requests answered
// without usage (no outcome: the stream did not ask and the engine does not force it).
type FilterCounts struct {
	Decisions, Spills, Fallbacks, Unrouted, Oversized, WithoutUsage int64
}

// filterMetrics are the metric names behind FilterCounts' fields, in order.
var filterMetrics = []string{"kvroute_decisions_total", "kvroute_spills_total", "kvroute_fallbacks_total",
	"kvroute_unrouted_total", "kvroute_oversized_bodies_total", "kvroute_outcomes_without_usage_total"}

// ReplicaSummary is one replica's state as the engine itself reports it (its /metrics
// page).
type ReplicaSummary struct {
	Name             string // vllm-<i>, as the banner names it
	Running, Waiting int
	// QueuedPrefillTokens are the uncached prompt tokens waiting for prefill.
	QueuedPrefillTokens int
	// KVUsage is vllm:kv_cache_usage_perc, 0..1.
	KVUsage float64
	// PrefixQueries and PrefixHits are vllm:prefix_cache_queries and _hits: prompt
	// tokens looked up in the prefix cache and found there, since the engine started.
	PrefixQueries, PrefixHits int64
}

// HitRate is PrefixHits / PrefixQueries (NaN before the first query).
func (r ReplicaSummary) HitRate() float64 {
	if r.PrefixQueries <= 0 {
		return math.NaN()
	}
	return float64(r.PrefixHits) / float64(r.PrefixQueries)
}

// Summary reads the counters now.
func (m *Mesh) Summary() Summary {
	s := Summary{Requests: m.Proxy.Stats().Requests}
	t := m.Reports.Totals()
	s.Outcomes = t.Outcomes
	if t.PromptTokens > 0 {
		s.PredictedRate = float64(t.PredictedCached) / float64(t.PromptTokens)
		s.ActualRate = float64(t.ActualCached) / float64(t.PromptTokens)
	}
	for i, e := range m.Engines {
		ms := e.Replica().Metrics()
		s.Queues = append(s.Queues, ms.QueuedPrefillTokens)
		s.Replicas = append(s.Replicas, ReplicaSummary{
			Name: fmt.Sprintf("vllm-%d", i), Running: ms.Running, Waiting: ms.Waiting,
			QueuedPrefillTokens: ms.QueuedPrefillTokens, KVUsage: ms.KVUsage,
			PrefixQueries: ms.PrefixQueries, PrefixHits: ms.PrefixHits,
		})
	}
	if v, ok := m.Host.Metric("kvroute_table_version"); ok {
		s.TableVersion = v.Value
	}
	if v, ok := m.Host.Metric("kvroute_table_age_ms"); ok {
		s.TableAge = time.Duration(v.Value) * time.Millisecond
	}
	f := &s.Filter
	for i, p := range []*int64{&f.Decisions, &f.Spills, &f.Fallbacks, &f.Unrouted, &f.Oversized, &f.WithoutUsage} {
		if v, ok := m.Host.Metric(filterMetrics[i]); ok {
			*p = v.Value
		}
	}
	return s
}

// outcomes says how many outcomes the rates are over, and how many were lost for want of
// usage when any were.
func (s Summary) outcomes() string {
	if s.Filter.WithoutUsage == 0 {
		return fmt.Sprintf("%d outcomes", s.Outcomes)
	}
	return fmt.Sprintf("%d outcomes, %d without usage", s.Outcomes, s.Filter.WithoutUsage)
}

// String is the filter's counters as the one-line form prints them.
func (f FilterCounts) String() string {
	return fmt.Sprintf("filter decisions %d spills %d fallbacks %d unrouted %d oversized %d",
		f.Decisions, f.Spills, f.Fallbacks, f.Unrouted, f.Oversized)
}

func (s Summary) tableAge() string {
	if s.TableVersion > 0 {
		return s.TableAge.Round(time.Millisecond).String()
	}
	return "none"
}

// String is the one-line form `kvroute-mesh` prints every few seconds when its output is
// not a terminal.
func (s Summary) String() string {
	q := make([]string, len(s.Queues))
	for i, v := range s.Queues {
		q[i] = fmt.Sprint(v)
	}
	line := fmt.Sprintf("requests %d | cached tokens predicted %.1f%% actual %.1f%% (%s) | %s | queued prefill tokens [%s] | table age %s",
		s.Requests, 100*s.PredictedRate, 100*s.ActualRate, s.outcomes(), s.Filter, strings.Join(q, " "), s.tableAge())
	if len(s.Replicas) > 0 {
		kv := make([]string, len(s.Replicas))
		hit := make([]string, len(s.Replicas))
		for i, r := range s.Replicas {
			kv[i], hit[i] = percent(r.KVUsage), percent(r.HitRate())
		}
		line += fmt.Sprintf(" | KV usage [%s] | prefix hit rate [%s]", strings.Join(kv, " "), strings.Join(hit, " "))
	}
	return line
}

func percent(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

// Table is the multi-line form: the totals on two lines, the filter's counters on two
// more, then one row per replica with its queue, KV usage and prefix-cache hit rate,
// since the start and since prev (the previous summary, since ago; nil: none), and a line
// saying what the hit rates are. Every line is shorter than 80 columns for up to 99
// replicas, queues and counters under a billion, so a redraw never wraps.
func (s Summary) Table(now time.Time, prev *Summary, since time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  requests %d  table age %s\n", now.Format("15:04:05"), s.Requests, s.tableAge())
	fmt.Fprintf(&b, "cached tokens: predicted %.1f%%, actual %.1f%% (%s)\n", 100*s.PredictedRate, 100*s.ActualRate, s.outcomes())
	f := s.Filter
	fmt.Fprintf(&b, "filter  %10s %10s %10s %10s %10s\n", "decisions", "spills", "fallbacks", "unrouted", "oversized")
	fmt.Fprintf(&b, "        %10d %10d %10d %10d %10d\n", f.Decisions, f.Spills, f.Fallbacks, f.Unrouted, f.Oversized)
	if len(s.Replicas) == 0 {
		return b.String()
	}
	last, note := "last", "hit rate: prompt tokens the engines found cached, since they started"
	if since > 0 {
		last = "last " + since.Round(time.Second).String()
		note = "hit rate: prompt tokens found cached, since start and in the " + last
	}
	nameW := len("replica")
	for _, r := range s.Replicas {
		nameW = max(nameW, len(r.Name))
	}
	lastW := max(len(last), len("100.0%"))
	fmt.Fprintf(&b, "%-*s  %7s  %7s  %14s  %8s  %8s  %*s\n", nameW, "replica", "running", "waiting", "queued prefill", "KV usage", "hit rate", lastW, last)
	for i, r := range s.Replicas {
		recent := math.NaN()
		if prev != nil && i < len(prev.Replicas) && prev.Replicas[i].Name == r.Name {
			p := prev.Replicas[i]
			if dq, dh := r.PrefixQueries-p.PrefixQueries, r.PrefixHits-p.PrefixHits; dq > 0 && dh >= 0 {
				recent = float64(dh) / float64(dq)
			}
		}
		fmt.Fprintf(&b, "%-*s  %7d  %7d  %14d  %8s  %8s  %*s\n", nameW, r.Name, r.Running, r.Waiting, r.QueuedPrefillTokens,
			percent(r.KVUsage), percent(r.HitRate()), lastW, percent(recent))
	}
	b.WriteString(note + "\n")
	return b.String()
}

// SummaryPrinter prints summaries: on a terminal a table redrawn in place (the cursor
// moves back up over the previous one), otherwise one line each, as logs want them.
type SummaryPrinter struct {
	W io.Writer
	// Terminal: W is a terminal that understands ANSI cursor movement.
	Terminal bool

	lines    int // lines of the table drawn last
	prev     *Summary
	prevTime time.Time
}

// Print writes s as of now.
func (p *SummaryPrinter) Print(now time.Time, s Summary) error {
	if !p.Terminal {
		_, err := fmt.Fprintln(p.W, now.Format("15:04:05"), s)
		return err
	}
	var since time.Duration
	if p.prev != nil {
		since = now.Sub(p.prevTime)
	}
	table := s.Table(now, p.prev, since)
	var b strings.Builder
	if p.lines > 0 {
		// Up to the first line of the previous table, to column 1, erase to the end of
		// the screen.
		fmt.Fprintf(&b, "\x1b[%dA\r\x1b[J", p.lines)
	}
	b.WriteString(table)
	p.lines = strings.Count(table, "\n")
	p.prev, p.prevTime = &s, now
	_, err := io.WriteString(p.W, b.String())
	return err
}

// Forget makes the next Print start a new table below whatever was written since (a
// message the table must not overwrite).
func (p *SummaryPrinter) Forget() { p.lines = 0 }
