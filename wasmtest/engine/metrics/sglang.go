package metrics

import (
	"bufio"
	"io"
)

// SGLang's /metrics (python/sglang/srt/metrics/collector.py; prometheus_client text
// format, needs --enable-metrics), at two revisions (SGLangPage):
//
//   - SchedulerMetricsCollector gauges: sglang:num_running_reqs, num_used_tokens,
//     token_usage (0..1), gen_throughput, num_queue_reqs, num_grammar_queue_reqs,
//     cache_hit_rate, labelled model_name, engine_type ("unified" outside PD
//     disaggregation), tp_rank, pp_rank (collector.py @93d04878cf) and, on main,
//     moe_ep_rank after them (the scheduler's labels dict, scheduler_metrics_mixin.py:
//     model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; dp_rank only with
//     data parallelism). Main also has sglang:max_total_num_tokens ("Maximum total
//     number of tokens in the KV cache pool.", collector.py @00ae9c15) and
//     sglang:page_size, so a scraper learns the pool's capacity; the older revision
//     has neither. (sglang:page_size's HELP text was not read from source.)
//   - TokenizerMetricsCollector counters: sglang:prompt_tokens_total,
//     generation_tokens_total, cached_tokens_total, num_requests_total,
//     num_aborted_requests_total (prometheus_client writes <family>_total and
//     <family>_created), labelled model_name and, on main, engine_type
//     (tokenizer_manager.py init_metric_collector_watchdog: labels model_name,
//     engine_type); on main cached_tokens_total carries cache_source ("device" for GPU
//     hits: "Number of cached prompt tokens by source (device/host/storage).").
//   - Histograms sglang:time_to_first_token_seconds, sglang:inter_token_latency_seconds
//     and sglang:e2e_request_latency_seconds with SGLang's default buckets; the E2E
//     buckets end at 800 s in 0.4.7-0.5.0rc0 (collector.py's hard-coded list then) and
//     at 2400 s later (SGLangE2EBuckets, collector.py @93d04878cf).
//
// Not written: the gauges and histograms a router does not read (speculative decoding,
// PD queues, grammar, per-stage latency, utilization). Plus kvroute's extension gauge
// kvroute:queued_prefill_tokens, as on the vLLM page.

// SGLangTTFTBuckets and SGLangE2EBuckets are TokenizerMetricsCollector's default buckets
// (collector.py @93d04878cf); SGLangOldE2EBuckets are 0.4.7-0.5.0rc0's; SGLangITLBuckets
// are sglang:inter_token_latency_seconds's at both.
var (
	SGLangTTFTBuckets   = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	SGLangE2EBuckets    = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400}
	SGLangOldE2EBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800}
	SGLangITLBuckets    = []float64{0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000}
)

// SGLangPage is what differs between the SGLang revisions' pages.
type SGLangPage struct {
	// NewLabels: moe_ep_rank, engine_type on tokenizer metrics, cache_source, and the
	// max_total_num_tokens and page_size gauges (main).
	NewLabels bool
	PageSize  int
}

// WriteSGLang renders s with SGLang's names. s.TTFT, s.ITL and s.E2E should have
// SGLang's buckets; s.CapacityTokens gives sglang:num_used_tokens.
func WriteSGLang(w io.Writer, s Snapshot, o SGLangPage) error {
	bw := bufio.NewWriter(w)
	base := []Label{{"model_name", s.ModelName}, {"engine_type", "unified"}, {"tp_rank", "0"}, {"pp_rank", "0"}}
	tokBase := []Label{{"model_name", s.ModelName}}
	if o.NewLabels {
		base = append(base, Label{"moe_ep_rank", "0"})
		tokBase = append(tokBase, Label{"engine_type", "unified"})
	}
	sched := &page{w: bw, created: s.Created, base: base}
	sched.gauge("sglang:num_running_reqs", "The number of running requests.", float64(s.Running))
	sched.gauge("sglang:num_used_tokens", "The number of used tokens.", float64(int64(s.KVUsage*float64(s.CapacityTokens)+0.5)))
	sched.gauge("sglang:token_usage", "The token usage.", s.KVUsage)
	sched.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0)
	sched.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(s.Waiting))
	sched.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)
	hit := 0.0
	if s.PrefixQueries > 0 {
		hit = float64(s.PrefixHits) / float64(s.PrefixQueries) // SGLang's is per batch; lifetime here
	}
	sched.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit)
	if o.NewLabels {
		sched.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", float64(s.CapacityTokens))
		sched.gauge("sglang:page_size", "The page size of the KV cache.", float64(o.PageSize))
	}

	tok := &page{w: bw, created: s.Created, base: tokBase}
	tok.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", float64(s.PromptTokens))
	tok.counter("sglang:generation_tokens", "Number of generation tokens processed.", float64(s.GenerationTokens))
	if o.NewLabels {
		src := &page{w: bw, created: s.Created, base: append(append([]Label{}, tokBase...), Label{"cache_source", "device"})}
		src.counter("sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).", float64(s.PrefixHits))
	} else {
		tok.counter("sglang:cached_tokens", "Number of cached prompt tokens.", float64(s.PrefixHits))
	}
	var n int64
	for _, v := range s.Success {
		n += v
	}
	tok.counter("sglang:num_requests", "Number of requests processed.", float64(n))
	tok.counter("sglang:num_aborted_requests", "Number of requests aborted.", float64(s.Success["abort"]))
	if s.TTFT != nil {
		tok.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.TTFT)
	}
	if s.ITL != nil {
		tok.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.ITL)
	}
	if s.E2E != nil {
		tok.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.E2E)
	}
	tok.queued(&s)
	return bw.Flush()
}
