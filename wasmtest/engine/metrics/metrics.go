// Package metrics writes the simulator's GET /metrics page: vLLM v1's Prometheus
// metric names, help texts and labels (vllm/v1/metrics/loggers.py), in the text format
// as Python's prometheus_client renders it (labels in declaration order, model_name then
// engine; floats like "1.0"; counters as name_total plus a name_created gauge), so a
// scraper cannot tell the simulator from vLLM. Plus one kvroute extension gauge,
// kvroute:queued_prefill_tokens.
//
// Written by hand rather than with client_golang, which sorts labels and formats
// numbers differently.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TTFTBuckets are vLLM's vllm:time_to_first_token_seconds buckets.
var TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// E2EBuckets are vLLM's request latency buckets (vllm:e2e_request_latency_seconds).
var E2EBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// Histogram is a cumulative Prometheus histogram.
type Histogram struct {
	Buckets []float64 // upper bounds, ascending; +Inf is implicit
	Counts  []uint64  // per bucket, not cumulative; len = len(Buckets)+1
	Sum     float64
}

// NewHistogram returns an empty histogram with the given bounds.
func NewHistogram(buckets []float64) *Histogram {
	return &Histogram{Buckets: buckets, Counts: make([]uint64, len(buckets)+1)}
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.Buckets, v) // first bound >= v: le is inclusive
	h.Counts[i]++
	h.Sum += v
}

// Clone returns an independent copy.
func (h *Histogram) Clone() *Histogram {
	c := *h
	c.Counts = append([]uint64(nil), h.Counts...)
	return &c
}

// Label is one name="value" pair; ordered slices keep vLLM's label order.
type Label struct{ Name, Value string }

// Snapshot is everything the page shows, taken at one instant.
type Snapshot struct {
	ModelName string
	Engine    string // engine index, "0"
	// Created is the Unix time the counters were created (engine start or restart).
	Created float64

	Running, Waiting    int
	KVUsage             float64
	QueuedPrefillTokens int
	// QueuedAt is when QueuedPrefillTokens was read: the extension gauge carries it as
	// its sample's timestamp (none when zero).
	QueuedAt time.Time

	PrefixQueries, PrefixHits      int64
	Preemptions                    int64
	PromptTokens, GenerationTokens int64
	// Success counts finished requests by finished_reason ("stop", "length", "abort").
	Success map[string]int64

	TTFT, E2E *Histogram
	// ITL is SGLang's sglang:inter_token_latency_seconds (vLLM's is in Request).
	ITL *Histogram
	// Request holds the other request-level histograms (request.go); nil: not shown.
	Request *RequestHistograms
	// CacheConfig are vllm:cache_config_info's labels (engine is appended).
	CacheConfig []Label
	// CapacityTokens is the KV the pool can hand out, in tokens (SGLang's
	// sglang:max_total_num_tokens, and the scale of sglang:num_used_tokens).
	CapacityTokens int64
}

// Write renders s.
func Write(w io.Writer, s Snapshot) error {
	bw := bufio.NewWriter(w)
	p := &page{w: bw, base: []Label{{"model_name", s.ModelName}, {"engine", s.Engine}}, created: s.Created}
	p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(s.Running))
	p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(s.Waiting))
	p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.KVUsage)
	p.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", float64(s.PrefixQueries))
	p.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", float64(s.PrefixHits))
	p.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", float64(s.Preemptions))
	p.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", float64(s.PromptTokens))
	p.counter("vllm:generation_tokens", "Number of generation tokens processed.", float64(s.GenerationTokens))
	p.success(s.Success)
	if s.Request != nil {
		p.histogramsBeforeTTFT(s.Request)
	}
	if s.TTFT != nil {
		p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.TTFT)
	}
	if s.Request != nil {
		p.latencyHistograms(s.Request)
	}
	if s.E2E != nil {
		p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.E2E)
	}
	if s.Request != nil {
		p.phaseHistograms(s.Request)
	}
	p.header("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
	p.sample("vllm:cache_config_info", append(append([]Label{}, s.CacheConfig...), Label{"engine", s.Engine}), 1)
	p.queued(&s)
	return bw.Flush()
}

type page struct {
	w       *bufio.Writer
	base    []Label
	created float64
}

func (p *page) header(name, help, typ string) {
	fmt.Fprintf(p.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *page) sample(name string, labels []Label, v float64) {
	p.sampleAt(name, labels, v, time.Time{})
}

// sampleAt writes a sample line, with at as its timestamp (Unix ms) unless at is zero.
func (p *page) sampleAt(name string, labels []Label, v float64, at time.Time) {
	p.w.WriteString(name)
	if len(labels) > 0 {
		p.w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				p.w.WriteByte(',')
			}
			p.w.WriteString(l.Name)
			p.w.WriteString(`="`)
			p.w.WriteString(escape(l.Value))
			p.w.WriteByte('"')
		}
		p.w.WriteByte('}')
	}
	p.w.WriteByte(' ')
	p.w.WriteString(FormatFloat(v))
	if !at.IsZero() {
		p.w.WriteByte(' ')
		p.w.WriteString(strconv.FormatInt(at.UnixMilli(), 10))
	}
	p.w.WriteByte('\n')
}

func (p *page) gauge(name, help string, v float64) {
	p.header(name, help, "gauge")
	p.sample(name, p.base, v)
}

// queued writes kvroute's extension gauge, stamped with when it was read: dated when
// the control plane sent its scrape instead, a request that reached the engine while the
// scrape was on its way would be counted by the gauge and, by the proxies' ledgers, as
// sent after it (controlplane/scrape, Sample.QueuedAt). vLLM and SGLang do not export
// the gauge; an engine that does says when it read it.
func (p *page) queued(s *Snapshot) {
	const name = "kvroute:queued_prefill_tokens"
	p.header(name, "Uncached prompt tokens of requests that are waiting or not yet fully prefilled (kvroute extension).", "gauge")
	p.sampleAt(name, p.base, float64(s.QueuedPrefillTokens), s.QueuedAt)
}

func (p *page) counter(name, help string, v float64) {
	p.header(name+"_total", help, "counter")
	p.sample(name+"_total", p.base, v)
	p.header(name+"_created", help, "gauge")
	p.sample(name+"_created", p.base, p.created)
}

func (p *page) success(byReason map[string]int64) {
	const name, help = "vllm:request_success", "Count of successfully processed requests."
	reasons := []string{"stop", "length", "abort"}
	p.header(name+"_total", help, "counter")
	for _, r := range reasons {
		p.sample(name+"_total", append(append([]Label{}, p.base...), Label{"finished_reason", r}), float64(byReason[r]))
	}
	p.header(name+"_created", help, "gauge")
	for _, r := range reasons {
		p.sample(name+"_created", append(append([]Label{}, p.base...), Label{"finished_reason", r}), p.created)
	}
}

func (p *page) histogram(name, help string, h *Histogram) {
	p.header(name, help, "histogram")
	var cum uint64
	for i, b := range h.Buckets {
		cum += h.Counts[i]
		p.sample(name+"_bucket", append(append([]Label{}, p.base...), Label{"le", FormatFloat(b)}), float64(cum))
	}
	cum += h.Counts[len(h.Buckets)]
	p.sample(name+"_bucket", append(append([]Label{}, p.base...), Label{"le", "+Inf"}), float64(cum))
	p.sample(name+"_count", p.base, float64(cum))
	p.sample(name+"_sum", p.base, h.Sum)
	p.header(name+"_created", help, "gauge")
	p.sample(name+"_created", p.base, p.created)
}

var escaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func escape(s string) string { return escaper.Replace(s) }

// FormatFloat formats v as prometheus_client's floatToGoString does: Python's repr
// ("1.0", "0.25", "1e-05"), switched to Go-style exponents for positive values with more
// than 6 integer digits ("1.7e+09").
func FormatFloat(d float64) string {
	switch {
	case math.IsInf(d, 1):
		return "+Inf"
	case math.IsInf(d, -1):
		return "-Inf"
	case math.IsNaN(d):
		return "NaN"
	}
	s := pyRepr(d)
	dot := strings.IndexByte(s, '.')
	if d > 0 && dot > 6 {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return fmt.Sprintf("%se+0%d", mantissa, dot-1)
	}
	return s
}

// pyRepr is Python's repr(float): shortest round-trip digits, positional for
// 1e-4 <= |d| < 1e16 (always with a '.'), scientific otherwise.
func pyRepr(d float64) string {
	a := math.Abs(d)
	if a != 0 && (a >= 1e16 || a < 1e-4) {
		return strconv.FormatFloat(d, 'e', -1, 64)
	}
	s := strconv.FormatFloat(d, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
