// Package scrape reads an engine's Prometheus /metrics (vLLM or SGLang names, reference
// section 5) into the few numbers routing needs: waiting and running requests, KV-cache
// usage, cache capacity, and the queued prefill tokens when the engine exports them.
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
}

// names maps an engine kind to its metric names.
type names struct {
	waiting, running string
	usage            []string // first present wins
	capacityTokens   string   // gauge holding tokens directly (SGLang)
	cacheConfig      string   // info gauge with block_size / num_gpu_blocks labels (vLLM)
	promptHist       string
	hits, queries    string
	queued           string
	wanted           map[string]bool
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
		}
	} else {
		n = names{
			waiting: "vllm:num_requests_waiting", running: "vllm:num_requests_running",
			// kv_cache_usage_perc since v0.10; gpu_cache_usage_perc before (removed Nov 2025).
			usage:       []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
			cacheConfig: "vllm:cache_config_info", promptHist: "vllm:request_prompt_tokens",
			hits: "vllm:prefix_cache_hits", queries: "vllm:prefix_cache_queries",
		}
	}
	n.queued = QueuedTokensMetric
	n.wanted = map[string]bool{}
	for _, s := range append([]string{n.waiting, n.running, n.capacityTokens, n.cacheConfig, n.promptHist, n.hits, n.queries, n.queued}, n.usage...) {
		if s != "" {
			n.wanted[s] = true
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return Sample{}, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(body) > MaxBodyBytes {
		return Sample{}, fmt.Errorf("GET %s: body above %d bytes", url, MaxBodyBytes)
	}
	return Parse(body, kind)
}

// Parse reads a Prometheus text exposition. Only the families routing needs are handed to
// the expfmt parser: vLLM's /metrics is mostly histograms we do not use, and parsing them
// at 10-20 scrapes per second per replica would cost more than everything else.
func Parse(body []byte, kind string) (Sample, error) {
	n := vllmNames
	if kind == SGLang {
		n = sglangNames
	}
	var kept bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if name := familyOf(line); len(name) > 0 && n.wanted[string(name)] {
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
	if h, ok := sum(counter(fams, n.hits)); ok {
		if q, ok := sum(counter(fams, n.queries)); ok && q > 0 {
			s.HitRate = math.Min(1, h/q)
		}
	}
	return s, nil
}

// familyOf returns the metric family a line belongs to: the name of a sample line, or the
// name in "# HELP name" / "# TYPE name". Counters' samples end in _total (and _created),
// histograms' in _bucket/_sum/_count; those are mapped to their family.
var suffixes = [][]byte{[]byte("_total"), []byte("_created"), []byte("_bucket"), []byte("_sum"), []byte("_count")}

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
		if end := bytes.IndexAny(rest, " \t"); end >= 0 {
			rest = rest[:end]
		}
		name = rest
	} else {
		end := bytes.IndexAny(line, "{ \t")
		if end < 0 {
			end = len(line)
		}
		name = line[:end]
	}
	for _, suf := range suffixes {
		if bytes.HasSuffix(name, suf) {
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
