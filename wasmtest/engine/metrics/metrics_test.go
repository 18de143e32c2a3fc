package metrics

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatFloatLikePrometheusClient(t *testing.T) {
	cases := map[float64]string{
		0:                  "0.0",
		1:                  "1.0",
		123:                "123.0",
		0.25:               "0.25",
		0.001:              "0.001",
		1e-05:              "1e-05",
		2560:               "2560.0",
		123456:             "123456.0",
		1234567:            "1.234567e+06",
		1700000000.5:       "1.7000000005e+09",
		17000000000:        "1.7e+010", // prometheus_client's quirk: "e+0" then the exponent
		1e16:               "1e+16",
		-3.5:               "-3.5",
		0.9999999999999999: "0.9999999999999999",
	}
	for v, want := range cases {
		assert.Equal(t, want, FormatFloat(v), "%v", v)
	}
}

func TestHistogramBucketsAreInclusive(t *testing.T) {
	h := NewHistogram([]float64{0.1, 1})
	for _, v := range []float64{0.1, 0.5, 1, 3} {
		h.Observe(v)
	}
	assert.Equal(t, []uint64{1, 2, 1}, h.Counts)
	assert.InDelta(t, 4.6, h.Sum, 1e-9)
	c := h.Clone()
	c.Observe(0)
	assert.Equal(t, uint64(1), h.Counts[0], "clone is independent")
}

func TestWrite(t *testing.T) {
	ttft := NewHistogram(TTFTBuckets)
	ttft.Observe(0.57)
	ttft.Observe(0.143)
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, Snapshot{
		ModelName: "meta-llama/Llama-3.3-70B-Instruct", Engine: "0", Created: 1700000000.5,
		Running: 3, Waiting: 2, KVUsage: 0.25, QueuedPrefillTokens: 12000,
		PrefixQueries: 16000, PrefixHits: 6000, Preemptions: 1, PromptTokens: 16000, GenerationTokens: 2,
		Success: map[string]int64{"length": 2},
		TTFT:    ttft, E2E: NewHistogram(E2EBuckets),
		CacheConfig: []Label{{"block_size", "16"}, {"num_gpu_blocks", "34882"}},
	}))
	page := buf.String()
	const lbl = `{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0"}`
	for _, line := range []string{
		"# TYPE vllm:num_requests_running gauge",
		"vllm:num_requests_running" + lbl + " 3.0",
		"vllm:num_requests_waiting" + lbl + " 2.0",
		"vllm:kv_cache_usage_perc" + lbl + " 0.25",
		"# TYPE vllm:prefix_cache_queries_total counter",
		"vllm:prefix_cache_queries_total" + lbl + " 16000.0",
		"vllm:prefix_cache_hits_total" + lbl + " 6000.0",
		"vllm:prefix_cache_hits_created" + lbl + " 1.7000000005e+09",
		"vllm:num_preemptions_total" + lbl + " 1.0",
		"vllm:prompt_tokens_total" + lbl + " 16000.0",
		"vllm:generation_tokens_total" + lbl + " 2.0",
		`vllm:request_success_total{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0",finished_reason="length"} 2.0`,
		"# TYPE vllm:time_to_first_token_seconds histogram",
		`vllm:time_to_first_token_seconds_bucket{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0",le="0.1"} 0.0`,
		`vllm:time_to_first_token_seconds_bucket{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0",le="0.25"} 1.0`,
		`vllm:time_to_first_token_seconds_bucket{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0",le="0.75"} 2.0`,
		`vllm:time_to_first_token_seconds_bucket{model_name="meta-llama/Llama-3.3-70B-Instruct",engine="0",le="+Inf"} 2.0`,
		"vllm:time_to_first_token_seconds_count" + lbl + " 2.0",
		"vllm:time_to_first_token_seconds_sum" + lbl + " 0.713",
		"# TYPE vllm:e2e_request_latency_seconds histogram",
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="34882",engine="0"} 1.0`,
		"# TYPE kvroute:queued_prefill_tokens gauge",
		"kvroute:queued_prefill_tokens" + lbl + " 12000.0",
	} {
		assert.Contains(t, page, line+"\n")
	}
	assert.True(t, strings.HasSuffix(page, "\n"))
}

// SGLang 0.4.7-0.5.0rc0's page: no moe_ep_rank, tokenizer metrics labelled by model
// alone, cached_tokens_total without cache_source, no capacity or page-size gauge, and
// E2E buckets ending at 800 s.
func TestSGLangOldPage(t *testing.T) {
	var b strings.Builder
	s := Snapshot{ModelName: "m", CapacityTokens: 100, TTFT: NewHistogram(SGLangTTFTBuckets),
		ITL: NewHistogram(SGLangITLBuckets), E2E: NewHistogram(SGLangOldE2EBuckets)}
	require.NoError(t, WriteSGLang(&b, s, SGLangPage{PageSize: 16}))
	page := b.String()
	assert.Contains(t, page, "\nsglang:num_running_reqs{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"} 0.0\n")
	assert.Contains(t, page, "\nsglang:cached_tokens_total{model_name=\"m\"} 0.0\n")
	assert.Contains(t, page, "\nsglang:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"800.0\"} 0.0\n")
	assert.Contains(t, page, "\nsglang:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"8.0\"} 0.0\n")
	for _, absent := range []string{"moe_ep_rank", "cache_source", "max_total_num_tokens", "sglang:page_size", "le=\"2400.0\""} {
		assert.NotContains(t, page, absent)
	}
}
