package metrics

import (
	"bufio"
	"io"
)

// SGLang's /metrics, as SGLang @93d04878cf renders it (python/sglang/srt/metrics/
// collector.py; prometheus_client text format, needs --enable-metrics):
//
//   - SchedulerMetricsCollector gauges with labels model_name, engine_type ("unified"
//     outside PD disaggregation), tp_rank, pp_rank: sglang:num_running_reqs,
//     num_used_tokens, token_usage (0..1), gen_throughput, num_queue_reqs,
//     num_grammar_queue_reqs, cache_hit_rate;
//   - TokenizerMetricsCollector counters with label model_name: sglang:prompt_tokens_total,
//     generation_tokens_total, cached_tokens_total, num_requests_total,
//     num_aborted_requests_total (prometheus_client strips "_total" from a Counter's
//     name and writes <family>_total and <family>_created), and the histograms
//     sglang:time_to_first_token_seconds and sglang:e2e_request_latency_seconds with
//     SGLang's default buckets (SGLangTTFTBuckets, SGLangE2EBuckets).
//
// That revision exports no sglang:max_total_num_tokens gauge, so a scraper learns no
// capacity. The scheduler gauges' label order (model_name, engine_type, tp_rank,
// pp_rank here) was not checked against a live SGLang; scrapers do not depend on it.
// Not written: the gauges and histograms a router does not read
// (speculative decoding, PD queues, grammar, per-stage latency, utilization). Plus
// kvroute's extension gauge kvroute:queued_prefill_tokens, as on the vLLM page.

// SGLangTTFTBuckets and SGLangE2EBuckets are TokenizerMetricsCollector's default buckets
// (collector.py @93d04878cf).
var (
	SGLangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	SGLangE2EBuckets  = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400}
)

// WriteSGLang renders s with SGLang's names. s.TTFT and s.E2E should have SGLang's
// buckets; s.CapacityTokens gives sglang:num_used_tokens.
func WriteSGLang(w io.Writer, s Snapshot) error {
	bw := bufio.NewWriter(w)
	sched := &page{w: bw, created: s.Created, base: []Label{{"model_name", s.ModelName}, {"engine_type", "unified"}, {"tp_rank", "0"}, {"pp_rank", "0"}}}
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

	tok := &page{w: bw, created: s.Created, base: []Label{{"model_name", s.ModelName}}}
	tok.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", float64(s.PromptTokens))
	tok.counter("sglang:generation_tokens", "Number of generation tokens processed.", float64(s.GenerationTokens))
	tok.counter("sglang:cached_tokens", "Number of cached prompt tokens.", float64(s.PrefixHits))
	var n int64
	for _, v := range s.Success {
		n += v
	}
	tok.counter("sglang:num_requests", "Number of requests processed.", float64(n))
	tok.counter("sglang:num_aborted_requests", "Number of requests aborted.", float64(s.Success["abort"]))
	if s.TTFT != nil {
		tok.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.TTFT)
	}
	if s.E2E != nil {
		tok.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.E2E)
	}
	tok.gauge("kvroute:queued_prefill_tokens", "Uncached prompt tokens of requests that are waiting or not yet fully prefilled (kvroute extension).", float64(s.QueuedPrefillTokens))
	return bw.Flush()
}
