package scrape

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A trimmed vLLM V1 /metrics with two engines (DP ranks) and the families we skip.
const vllmText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 4.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_cpu_blocks="None",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",num_cpu_blocks="None",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama"} 300.0
vllm:generation_tokens_total{engine="1",model_name="llama"} 200.0
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="1.0",model_name="llama"} 0.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="llama"} 10.0
vllm:request_prompt_tokens_count{engine="0",model_name="llama"} 10.0
vllm:request_prompt_tokens_sum{engine="0",model_name="llama"} 8000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 1.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
`

func TestParseVLLM(t *testing.T) {
	s, err := Parse([]byte(vllmText), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Waiting: 6, Running: 4, KVUsage: 0.375, HasKVUsage: true, CapacityTokens: 32000, BlockSize: 16, PromptTokensMean: 800, HitRate: 0.25,
		ComputedTokens: 750, GenerationTokens: 500, HasTokenCounters: true}
	if s != want {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
}

func TestParseOldAndExtensionNames(t *testing.T) {
	text := `# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="x"} 0.9
# TYPE kvroute:queued_prefill_tokens gauge
kvroute:queued_prefill_tokens{model_name="x"} 4096
vllm:num_requests_waiting{model_name="x"} 2
`
	s, err := Parse([]byte(text), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	if s.KVUsage != 0.9 || !s.HasKVUsage || s.QueuedTokens != 4096 || !s.HasQueuedTokens || s.Waiting != 2 {
		t.Fatalf("%+v", s)
	}
}

// The queued-tokens gauge may say when the engine measured it (the exposition format's
// sample timestamp, ms): the index dates the queue from it. Several engines' samples
// are as old as the oldest; one without a timestamp leaves the time unknown.
func TestParseQueuedTokensTimestamp(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       time.Time
	}{
		{"one engine", "kvroute:queued_prefill_tokens{engine=\"0\"} 4096 1800000000123\n", time.UnixMilli(1800000000123)},
		{"two engines", "kvroute:queued_prefill_tokens{engine=\"0\"} 1 1800000000123\nkvroute:queued_prefill_tokens{engine=\"1\"} 2 1800000000100\n",
			time.UnixMilli(1800000000100)},
		{"one without", "kvroute:queued_prefill_tokens{engine=\"0\"} 1 1800000000123\nkvroute:queued_prefill_tokens{engine=\"1\"} 2\n", time.Time{}},
		{"none", "kvroute:queued_prefill_tokens 4096\n", time.Time{}},
		{"a NaN sample's does not count", "kvroute:queued_prefill_tokens{engine=\"0\"} 1 1800000000123\nkvroute:queued_prefill_tokens{engine=\"1\"} NaN 1\n",
			time.UnixMilli(1800000000123)},
	} {
		for name, parse := range map[string]func([]byte, *names) (Sample, error){
			"fast": func(b []byte, n *names) (Sample, error) { return Parse(b, VLLM) }, "reference": parseReference,
		} {
			s, err := parse([]byte(c.text), vllmNames)
			if err != nil {
				t.Fatalf("%s, %s: %v", c.name, name, err)
			}
			if !s.HasQueuedTokens || !s.QueuedAt.Equal(c.want) {
				t.Errorf("%s, %s: queued %v measured at %v, want %v", c.name, name, s.QueuedTokens, s.QueuedAt, c.want)
			}
		}
	}
}

func TestParseSGLang(t *testing.T) {
	text := `# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="q",tp_rank="0",pp_rank="0"} 5.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="q",tp_rank="0",pp_rank="0"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="q",tp_rank="0",pp_rank="0"} 0.42
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="q",tp_rank="0",pp_rank="0"} 500000.0
`
	s, err := Parse([]byte(text), SGLang)
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 5 || s.Running != 7 || s.KVUsage != 0.42 || s.CapacityTokens != 500000 {
		t.Fatalf("%+v", s)
	}
}

func TestParseErrors(t *testing.T) {
	if _, err := Parse([]byte("vllm:num_requests_waiting{model_name=\"x\" 2\n"), VLLM); err == nil {
		t.Fatal("broken exposition accepted")
	}
	// Broken lines of families we skip do not matter.
	if _, err := Parse([]byte("some_histogram_bucket{le=oops 1\nvllm:num_requests_waiting 1\n"), VLLM); err != nil {
		t.Fatal(err)
	}
}

func TestFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/slow" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write([]byte(vllmText))
	}))
	defer srv.Close()
	c := Client(200 * time.Millisecond)
	s, err := Fetch(context.Background(), c, srv.URL+"/metrics", VLLM)
	if err != nil || s.Waiting != 6 {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := Fetch(context.Background(), c, srv.URL+"/fail", VLLM); err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("status error: %v", err)
	}
	if _, err := Fetch(context.Background(), c, srv.URL+"/slow", VLLM); err == nil {
		t.Fatal("timeout not enforced")
	}
}

func BenchmarkParseVLLM(b *testing.B) {
	body := []byte(strings.Repeat(vllmText[strings.Index(vllmText, "# HELP vllm:time_to"):], 40) + vllmText)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Parse(body, VLLM); err != nil {
			b.Fatal(err)
		}
	}
}

// A stamped queue is dated by its stamp, kept within the scrape's round trip: an engine
// whose clock runs ahead or behind cannot date its numbers outside it.
func TestDateQueuedStaysWithinTheScrape(t *testing.T) {
	asked := time.Unix(1_800_000_000, 0)
	answered := asked.Add(20 * time.Millisecond)
	for _, c := range []struct {
		stamp, want time.Time
	}{
		{time.Time{}, time.Time{}},
		{asked.Add(9 * time.Millisecond), asked.Add(9 * time.Millisecond)},
		{asked.Add(-time.Second), asked},
		{answered.Add(time.Second), answered},
	} {
		s := Sample{QueuedAt: c.stamp}
		if s.DateQueued(asked, answered); !s.QueuedAt.Equal(c.want) {
			t.Errorf("stamp %v: measured at %v, want %v", c.stamp, s.QueuedAt, c.want)
		}
	}
}
