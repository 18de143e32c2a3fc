package scrape

import (
	"testing"

	simmetrics "github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

// SGLang's /metrics as SGLang @93d04878 exposes it (python/sglang/srt/metrics/
// collector.py: SchedulerMetricsCollector gauges sglang:num_running_reqs,
// num_queue_reqs, token_usage; TokenizerMetricsCollector counters
// sglang:prompt_tokens_total and sglang:cached_tokens_total, which prometheus_client
// renders as family "sglang:prompt_tokens" with _total and _created samples). That
// revision has no sglang:max_total_num_tokens gauge, so capacity stays unknown. The
// lifetime prefix hit rate is cached / prompt tokens: before this, Parse left HitRate
// at 0 for SGLang ("HitRate: got 0, want 0.25").
func TestParseSGLangCollectorExposition(t *testing.T) {
	const l = `{engine_type="unified",model_name="q",tp_rank="0",pp_rank="0"}`
	text := `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs` + l + ` 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage` + l + ` 0.42
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs` + l + ` 5.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="q"} 4000.0
# HELP sglang:prompt_tokens_created Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_created gauge
sglang:prompt_tokens_created{model_name="q"} 1.7e+09
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="q"} 1000.0
# HELP sglang:cached_tokens_created Number of cached prompt tokens.
# TYPE sglang:cached_tokens_created gauge
sglang:cached_tokens_created{model_name="q"} 1.7e+09
`
	s, err := Parse([]byte(text), SGLang)
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 5 || s.Running != 7 || !s.HasKVUsage || s.KVUsage != 0.42 {
		t.Fatalf("queue/usage: %+v", s)
	}
	if s.CapacityTokens != 0 || s.BlockSize != 0 {
		t.Fatalf("capacity: got %d tokens, block %d; SGLang @93d04878 exports neither", s.CapacityTokens, s.BlockSize)
	}
	if s.HitRate != 0.25 {
		t.Fatalf("HitRate: got %v, want 0.25", s.HitRate)
	}
}

// The engine simulator's --engine sglang page (wasmtest/engine/metrics.WriteSGLang,
// SGLang @93d04878cf's names and labels) through Parse with SGLang's names: queue,
// running, KV usage, lifetime hit rate, and kvroute's queued-prefill extension; no
// capacity, as that revision exports none.
func TestParseSimulatedSGLangPage(t *testing.T) {
	page := sglangPage(t)
	s, err := Parse(page, SGLang)
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 4 || s.Running != 3 || !s.HasKVUsage || s.KVUsage != 0.5 || !s.HasQueuedTokens || s.QueuedTokens != 1200 {
		t.Fatalf("sample %+v", s)
	}
	if s.HitRate != 0.4 || s.CapacityTokens != 0 {
		t.Fatalf("hit rate %v, capacity %d", s.HitRate, s.CapacityTokens)
	}
	// The same page read with vLLM's names finds nothing of it.
	if v, err := Parse(page, VLLM); err != nil || v.Waiting != 0 || v.HasKVUsage || v.HitRate != 0 {
		t.Fatalf("vLLM names on an SGLang page: %+v %v", v, err)
	}
}

// SGLang main's page (moe_ep_rank on scheduler gauges, engine_type on tokenizer
// metrics, cache_source on cached tokens, sglang:max_total_num_tokens) reads the same,
// and now gives the pool's capacity.
func TestParseSimulatedSGLangMainPage(t *testing.T) {
	s, err := Parse(sglangPageOf(t, simmetrics.SGLangPage{NewLabels: true, PageSize: 1}), SGLang)
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 4 || s.Running != 3 || !s.HasKVUsage || s.KVUsage != 0.5 || !s.HasQueuedTokens || s.QueuedTokens != 1200 {
		t.Fatalf("sample %+v", s)
	}
	if s.HitRate != 0.4 || s.CapacityTokens != 4096 {
		t.Fatalf("hit rate %v, capacity %d", s.HitRate, s.CapacityTokens)
	}
}
