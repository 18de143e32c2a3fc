// Package scrape reads an engine's Prometheus /metrics (vLLM or SGLang names; the ones
// routing uses are in docs/controlplane.md, "Metrics") into the few numbers routing
// needs: waiting and running requests, KV-cache usage, cache capacity, the prefix-cache
// and generated-token counters, and the queued prefill tokens when the engine exports
// them.
package scrape

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine kinds.
const (
	VLLM   = "vllm"
	SGLang = "sglang"
)

// QueuedTokensMetric is kvroute's extension gauge: uncached prompt tokens waiting for
// prefill, exported by engines that know it (the wasmtest engine simulator does). It is
// the exact Q(r) of the rule; without it Q(r) is estimated from waiting requests.
const QueuedTokensMetric = "kvroute:queued_prefill_tokens"

// Sample is one scrape's result. Has* fields say whether the engine exported a value.
type Sample struct {
	Waiting, Running float64
	KVUsage          float64
	HasKVUsage       bool
	QueuedTokens     float64
	HasQueuedTokens  bool
	// QueuedAt is when the engine measured QueuedTokens, by the samples' timestamps (the
	// earliest, when it sums several engines); zero when a sample has none.
	QueuedAt time.Time
	// CapacityTokens = num_gpu_blocks x block_size (vLLM cache_config_info) or
	// max_total_num_tokens (SGLang); 0 when unknown.
	CapacityTokens int64
	// BlockSize is the engine's KV block size in tokens (vLLM), 0 when unknown.
	BlockSize int
	// PromptTokensMean and HitRate are lifetime averages (request_prompt_tokens
	// histogram, prefix-cache counters), a fallback for the mean uncached prompt when no
	// outcome report has taught us yet; 0 when unknown.
	PromptTokensMean float64
	HitRate          float64
	// ComputedTokens and GenerationTokens are lifetime counters: the prompt tokens the
	// engine prefilled (prefix-cache queries less hits, which vLLM counts at a request's
	// first lookup, not after a preemption) and the tokens it generated
	// (SetTokenCounters). HasTokenCounters says the engine exported all three counters.
	// The index reads what share of the blocks the engine caches are prompt blocks from
	// them (controlplane/index/keyed.go).
	ComputedTokens   float64
	GenerationTokens float64
	HasTokenCounters bool
}

// names maps an engine kind to its metric names.
type names struct {
	waiting, running string
	usage            []string // first present wins
	capacityTokens   string   // gauge holding tokens directly (SGLang)
	cacheConfig      string   // info gauge with block_size / num_gpu_blocks labels (vLLM)
	promptHist       string
	hits, queries    string
	generation       string
	queued           string
	wanted           []string
}

// wants reports whether family is one of n's (a handful: a loop beats a map).
func (n *names) wants(family []byte) bool {
	for _, w := range n.wanted {
		if len(w) == len(family) && w == string(family) {
			return true
		}
	}
	return false
}

func namesFor(kind string) *names {
	var n names
	if kind == SGLang {
		n = names{
			waiting: "sglang:num_queue_reqs", running: "sglang:num_running_reqs",
			usage: []string{"sglang:token_usage"}, capacityTokens: "sglang:max_total_num_tokens",
			// Lifetime hit rate from TokenizerMetricsCollector's counters (SGLang
			// python/sglang/srt/metrics/collector.py @93d04878).
			hits: "sglang:cached_tokens", queries: "sglang:prompt_tokens",
			generation: "sglang:generation_tokens",
		}
	} else {
		n = names{
			waiting: "vllm:num_requests_waiting", running: "vllm:num_requests_running",
			// kv_cache_usage_perc since v0.10; gpu_cache_usage_perc before (removed Nov 2025).
			usage:       []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
			cacheConfig: "vllm:cache_config_info", promptHist: "vllm:request_prompt_tokens",
			hits: "vllm:prefix_cache_hits", queries: "vllm:prefix_cache_queries",
			generation: "vllm:generation_tokens",
		}
	}
	n.queued = QueuedTokensMetric
	for _, s := range append([]string{n.waiting, n.running, n.capacityTokens, n.cacheConfig, n.promptHist, n.hits, n.queries, n.generation, n.queued}, n.usage...) {
		if s != "" {
			n.wanted = append(n.wanted, s)
		}
	}
	return &n
}

var (
	vllmNames   = namesFor(VLLM)
	sglangNames = namesFor(SGLang)
)

// MaxBodyBytes bounds one /metrics response.
const MaxBodyBytes = 16 << 20

// Fetch GETs url and parses it. The client's timeout (or ctx) bounds the call.
func Fetch(ctx context.Context, c *http.Client, url, kind string) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return Sample{}, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	buf := bodies.Get().(*[]byte)
	defer putBody(buf)
	body, err := readBody(resp.Body, (*buf)[:0], resp.ContentLength)
	*buf = body
	if err != nil {
		return Sample{}, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(body) > MaxBodyBytes {
		return Sample{}, fmt.Errorf("GET %s: body above %d bytes", url, MaxBodyBytes)
	}
	return Parse(body, kind)
}

// bodies recycles scrape bodies: a vLLM page is 30-40 KB, read 10 times a second per
// replica, and Parse keeps nothing of it.
var bodies = sync.Pool{New: func() any { return new([]byte) }}

func putBody(b *[]byte) {
	if cap(*b) <= 1<<20 { // a rare huge page is not kept
		bodies.Put(b)
	}
}

// readBody appends r to buf up to MaxBodyBytes+1 bytes (io.ReadAll's growth, from the
// declared length when there is one).
func readBody(r io.Reader, buf []byte, declared int64) ([]byte, error) {
	if declared > 0 && declared <= MaxBodyBytes && int64(cap(buf)) < declared+1 {
		buf = make([]byte, 0, declared+1) // +1: the read that sees EOF needs room
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // let append pick the growth
		}
		room := min(cap(buf), MaxBodyBytes+1)
		n, err := r.Read(buf[len(buf):room])
		buf = buf[:len(buf)+n]
		if err == io.EOF || len(buf) > MaxBodyBytes {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// Parse reads a Prometheus text exposition: only the families routing needs, read in
// place (parseFast); an exposition that reader is not sure of goes to parseReference.
func Parse(body []byte, kind string) (Sample, error) {
	n := vllmNames
	if kind == SGLang {
		n = sglangNames
	}
	if s, ok := parseFast(body, n); ok {
		return s, nil
	}
	return parseReference(body, n)
}

// parseReference hands the lines of the families routing needs to the expfmt parser:
// vLLM's /metrics is mostly histograms we do not use, and parsing them at 10-20 scrapes
// per second per replica would cost more than everything else.
func parseReference(body []byte, n *names) (Sample, error) {
	var kept bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if n.wants(familyOf(line)) {
			kept.Write(line)
			kept.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return Sample{}, fmt.Errorf("metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(&kept)
	if err != nil {
		return Sample{}, fmt.Errorf("metrics: %w", err)
	}
	var s Sample
	s.Waiting, _ = sum(fams[n.waiting])
	s.Running, _ = sum(fams[n.running])
	for _, u := range n.usage {
		if v, ok := mean(fams[u]); ok {
			s.KVUsage, s.HasKVUsage = v, true
			break
		}
	}
	s.QueuedTokens, s.HasQueuedTokens = sum(fams[n.queued])
	if s.HasQueuedTokens {
		s.QueuedAt = stamped(fams[n.queued])
	}
	if n.capacityTokens != "" {
		if v, ok := sum(fams[n.capacityTokens]); ok {
			s.CapacityTokens = int64(v)
		}
	}
	if f := fams[n.cacheConfig]; f != nil {
		// One series per engine (DP rank) with the CacheConfig fields as labels.
		for _, m := range f.GetMetric() {
			bs, _ := strconv.Atoi(label(m, "block_size"))
			nb, _ := strconv.ParseInt(label(m, "num_gpu_blocks"), 10, 64)
			if bs > 0 {
				s.BlockSize = bs
			}
			if bs > 0 && nb > 0 {
				s.CapacityTokens += int64(bs) * nb
			}
		}
	}
	if f := fams[n.promptHist]; f != nil {
		var sumv, count float64
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				sumv += h.GetSampleSum()
				count += float64(h.GetSampleCount())
			}
		}
		if count > 0 {
			s.PromptTokensMean = sumv / count
		}
	}
	h, okH := sum(counter(fams, n.hits))
	q, okQ := sum(counter(fams, n.queries))
	if okH && okQ && q > 0 {
		s.HitRate = math.Min(1, h/q)
	}
	if g, ok := sum(counter(fams, n.generation)); ok && okH && okQ {
		s.SetTokenCounters(q, h, g)
	}
	return s, nil
}

// DateQueued keeps the engine's stamp on QueuedTokens within the scrape's round trip,
// from asked (when the scrape was sent) to answered (when its answer was read): an
// engine's clock may disagree with the scraper's, and the measurement cannot have been
// taken outside it. Without a stamp QueuedAt stays zero, and the index dates the queue
// from asked. The control plane and the fleet simulator both date a scrape so.
func (s *Sample) DateQueued(asked, answered time.Time) {
	switch {
	case s.QueuedAt.IsZero():
	case s.QueuedAt.Before(asked):
		s.QueuedAt = asked
	case s.QueuedAt.After(answered):
		s.QueuedAt = answered
	}
}

// SetTokenCounters fills the lifetime token counters from the prefix-cache queries and
// hits and the generated tokens, as an engine's counters give them.
func (s *Sample) SetTokenCounters(queries, hits, generated float64) {
	s.ComputedTokens = max(queries-hits, 0)
	s.GenerationTokens = max(generated, 0)
	s.HasTokenCounters = true
}

// familyOf returns the metric family a line belongs to: the name of a sample line, or the
// name in "# HELP name" / "# TYPE name". Counters' samples end in _total (and _created),
// histograms' in _bucket/_sum/_count; those are mapped to their family.
var suffixes = []string{"_total", "_created", "_bucket", "_sum", "_count"}

func familyOf(line []byte) []byte {
	if len(line) == 0 {
		return nil
	}
	var name []byte
	if line[0] == '#' {
		rest, ok := bytes.CutPrefix(line, []byte("# HELP "))
		if !ok {
			if rest, ok = bytes.CutPrefix(line, []byte("# TYPE ")); !ok {
				return nil
			}
		}
		if end := indexBlank(rest); end >= 0 {
			rest = rest[:end]
		}
		name = rest
	} else {
		end := indexName(line)
		if end < 0 {
			end = len(line)
		}
		name = line[:end]
	}
	for _, suf := range suffixes {
		if len(name) >= len(suf) && string(name[len(name)-len(suf):]) == suf {
			return name[:len(name)-len(suf)]
		}
	}
	return name
}

// counter finds a counter family by its name with or without "_total" (the TYPE line
// names it either way depending on the client library).
func counter(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f := fams[name+"_total"]; f != nil {
		return f
	}
	return fams[name]
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// sum adds a family's series (engines of one server, e.g. DP ranks).
func sum(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	var t float64
	ok := false
	for _, m := range f.GetMetric() {
		if v, has := value(m); has && !math.IsNaN(v) && !math.IsInf(v, 0) {
			t += v
			ok = true
		}
	}
	return t, ok
}

// stamped is the earliest timestamp of a family's finite series, zero when one has none.
func stamped(f *dto.MetricFamily) time.Time {
	var earliest int64
	n := 0
	for _, m := range f.GetMetric() {
		v, has := value(m)
		if !has || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if m.TimestampMs == nil {
			return time.Time{}
		}
		if n == 0 || m.GetTimestampMs() < earliest {
			earliest = m.GetTimestampMs()
		}
		n++
	}
	if n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(earliest)
}

// mean averages a family's series: KV usage of a server with several engines.
func mean(f *dto.MetricFamily) (float64, bool) {
	if f == nil {
		return 0, false
	}
	var t float64
	n := 0
	for _, m := range f.GetMetric() {
		if v, has := value(m); has && !math.IsNaN(v) && !math.IsInf(v, 0) {
			t += v
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return t / float64(n), true
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Client returns an HTTP client for scraping with the given per-request timeout.
func Client(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  false,
		},
	}
}
