package scrape

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	simmetrics "github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

// vllmPage is vLLM v1's whole /metrics page as the engine simulator writes it (every
// request histogram, cache_config_info with a label per CacheConfig field): 34 KB, of
// which the scraper reads eight families.
func vllmPage(tb testing.TB, tpot simmetrics.TPOTMode) []byte {
	tb.Helper()
	req := simmetrics.NewRequestHistograms(131072, tpot)
	for i := range 50 {
		req.ObserveFinished(simmetrics.FinishedRequest{PromptTokens: 100 * (i + 1), GenerationTokens: i + 1})
	}
	var buf bytes.Buffer
	err := simmetrics.Write(&buf, simmetrics.Snapshot{ModelName: "meta-llama/Llama-3.1-8B-Instruct", Engine: "0", Created: 1.7e9,
		Running: 3, Waiting: 4, KVUsage: 0.4375, QueuedPrefillTokens: 1234, PrefixQueries: 12345670, PrefixHits: 8123456,
		PromptTokens: 45000000, GenerationTokens: 3100000, Success: map[string]int64{"stop": 9000, "length": 900},
		TTFT: simmetrics.NewHistogram(simmetrics.TTFTBuckets), E2E: simmetrics.NewHistogram(simmetrics.E2EBuckets), Request: req,
		CacheConfig: []simmetrics.Label{{Name: "block_size", Value: "16"}, {Name: "cache_dtype", Value: "auto"},
			{Name: "calculate_kv_scales", Value: "False"}, {Name: "cpu_offload_gb", Value: "0"},
			{Name: "enable_prefix_caching", Value: "True"}, {Name: "gpu_memory_utilization", Value: "0.9"},
			{Name: "is_attention_free", Value: "False"}, {Name: "kv_sharing_fast_prefill", Value: "False"},
			{Name: "mamba_cache_dtype", Value: "auto"}, {Name: "mamba_page_size_padded", Value: "None"},
			{Name: "num_cpu_blocks", Value: "None"}, {Name: "num_gpu_blocks", Value: "20000"},
			{Name: "num_gpu_blocks_override", Value: "None"}, {Name: "prefix_caching_hash_algo", Value: "sha256"},
			{Name: "sliding_window", Value: "None"}, {Name: "swap_space", Value: "4"}, {Name: "swap_space_bytes", Value: "4294967296"}}})
	if err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func sglangPage(tb testing.TB) []byte { return sglangPageOf(tb, simmetrics.SGLangPage{PageSize: 1}) }

// sglangPageOf is the simulator's SGLang page at the revision o describes (NewLabels:
// SGLang main's labels and capacity gauge).
func sglangPageOf(tb testing.TB, o simmetrics.SGLangPage) []byte {
	tb.Helper()
	var buf bytes.Buffer
	err := simmetrics.WriteSGLang(&buf, simmetrics.Snapshot{ModelName: "m", Created: 1.7e9, Running: 3, Waiting: 4,
		KVUsage: 0.5, QueuedPrefillTokens: 1200, PrefixQueries: 1000, PrefixHits: 400, PromptTokens: 1000,
		GenerationTokens: 50, Success: map[string]int64{"length": 2}, CapacityTokens: 4096,
		TTFT: simmetrics.NewHistogram(simmetrics.SGLangTTFTBuckets), ITL: simmetrics.NewHistogram(simmetrics.SGLangITLBuckets),
		E2E: simmetrics.NewHistogram(simmetrics.SGLangE2EBuckets)}, o)
	if err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// same checks that parseFast, when it reads body, reads what parseReference does.
func same(t *testing.T, body []byte, n *names) (fast bool) {
	t.Helper()
	got, ok := parseFast(body, n)
	want, err := parseReference(body, n)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("parseFast read an exposition the reference refuses (%v):\n%q", err, body)
	}
	if g, w := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want); g != w {
		t.Fatalf("parseFast %s\nreference %s\nfor %q", g, w, body)
	}
	return true
}

// The pages engines serve are read by parseFast, never handed to the reference parser:
// the whole point is not paying for expfmt on every scrape.
func TestParseFastReadsEnginePages(t *testing.T) {
	pages := map[string][]byte{"vllmText": []byte(vllmText), "sglang": sglangPage(t),
		"sglangMain": sglangPageOf(t, simmetrics.SGLangPage{NewLabels: true, PageSize: 1})}
	for _, m := range []simmetrics.TPOTMode{simmetrics.TPOTHidden, simmetrics.TPOTOnly, simmetrics.TPOTDeprecated} {
		pages[fmt.Sprintf("vllm tpot %d", m)] = vllmPage(t, m)
	}
	for name, body := range pages {
		n := vllmNames
		if name == "sglang" {
			n = sglangNames
		}
		if !same(t, body, n) {
			t.Errorf("%s: handed to the reference parser", name)
		}
	}
	s, err := Parse(vllmPage(t, simmetrics.TPOTHidden), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Waiting: 4, Running: 3, KVUsage: 0.4375, HasKVUsage: true, QueuedTokens: 1234, HasQueuedTokens: true,
		CapacityTokens: 320000, BlockSize: 16, PromptTokensMean: 2550, HitRate: 8123456.0 / 12345670,
		ComputedTokens: 12345670 - 8123456, GenerationTokens: 3.1e6, HasTokenCounters: true}
	if s != want {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
}

// Before parseFast, a scrape of vLLM's page cost hundreds of allocations (the kept lines
// copied, then expfmt's protobuf families, one per sample and label).
func TestParseVLLMPageAllocations(t *testing.T) {
	body := vllmPage(t, simmetrics.TPOTHidden)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := Parse(body, VLLM); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Fatalf("%.0f allocations per page, want at most 2", allocs)
	}
}

// Expositions parseFast must read like expfmt or leave to it.
var fastCases = []string{
	vllmText,
	"vllm:num_requests_waiting 3\r\nvllm:num_requests_waiting{a=\"b\"} 4 1700000000000\r\n",
	"kvroute:queued_prefill_tokens{a=\"0\"} 3 1700000000001\nkvroute:queued_prefill_tokens{a=\"1\"} 4 -5\n",
	"vllm:num_requests_waiting{ a = \"1\" , b=\"2\", } 1\n",
	"vllm:num_requests_waiting{} 1\nvllm:num_requests_waiting {a=\"x\"}2\n",
	"vllm:num_requests_waiting{a=\"x\"}2 \n",
	"vllm:num_requests_waiting{a=\"x\",a=\"y\"} 2\n",
	"vllm:num_requests_waiting{a=\"x\\\"\"} 2\n",
	"vllm:num_requests_waiting{__name__=\"x\"} 2\n",
	"vllm:num_requests_waiting NaN\nvllm:num_requests_waiting +Inf\nvllm:num_requests_waiting 2\n",
	"vllm:num_requests_waiting 0x1p3\n",
	"vllm:num_requests_waiting 1_000\n",
	"vllm:num_requests_waiting\n",
	"vllm:num_requests_waiting 1 2 3\n",
	"# TYPE vllm:num_requests_waiting gauge\n# TYPE vllm:num_requests_waiting gauge\n",
	"vllm:num_requests_waiting 1\n# TYPE vllm:num_requests_waiting gauge\n",
	"# TYPE vllm:num_requests_waiting GAUGE\nvllm:num_requests_waiting 1\n",
	"# TYPE vllm:num_requests_waiting gauge \nvllm:num_requests_waiting 1\n",
	"# TYPE vllm:num_requests_waiting summary\nvllm:num_requests_waiting_sum 1\n",
	"# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_sum 1\nvllm:num_requests_waiting 1\n",
	"# HELP vllm:num_requests_waiting a\\nb\n# HELP vllm:num_requests_waiting c\n",
	"# HELP vllm:num_requests_waiting\n# HELP vllm:num_requests_waiting \n# HELP vllm:num_requests_waiting x\n",
	"# TYPE vllm:request_prompt_tokens histogram\n" +
		"vllm:request_prompt_tokens_bucket{le=\"10\",engine=\"0\"} 1\nvllm:request_prompt_tokens_bucket{engine=\"1\",le=\"+Inf\"} 3\n" +
		"vllm:request_prompt_tokens_sum{engine=\"1\"} 30.5\nvllm:request_prompt_tokens_count{engine=\"1\"} 3\n" +
		"vllm:request_prompt_tokens_count{engine=\"0\"} 1\nvllm:request_prompt_tokens_sum{engine=\"0\"} 7\n",
	"# TYPE vllm:request_prompt_tokens histogram\nvllm:request_prompt_tokens_count 2.5\nvllm:request_prompt_tokens_sum 5\n",
	"# TYPE vllm:request_prompt_tokens histogram\nvllm:request_prompt_tokens_bucket{le=\"1\"} 0.5\nvllm:request_prompt_tokens_count 2\nvllm:request_prompt_tokens_sum 5\n",
	"# TYPE vllm:request_prompt_tokens histogram\nvllm:request_prompt_tokens_count 2\nvllm:request_prompt_tokens_count 3\nvllm:request_prompt_tokens_sum 5\n",
	"# TYPE vllm:request_prompt_tokens histogram\nvllm:request_prompt_tokens_bucket{le=\"x\"} 1\n",
	"# TYPE vllm:request_prompt_tokens_count gauge\n# TYPE vllm:request_prompt_tokens histogram\nvllm:request_prompt_tokens_count 2\nvllm:request_prompt_tokens_sum 5\n",
	"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\nvllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"x\"} 1\n",
	"vllm:cache_config_info{block_size=\"99999999999999999999\",num_gpu_blocks=\"2\"} 1\n",
	"# TYPE vllm:cache_config_info histogram\nvllm:cache_config_info_count{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n",
	"vllm:prefix_cache_hits 5\nvllm:prefix_cache_queries_total 10\nvllm:prefix_cache_queries 1\n",
	"# TYPE vllm:prefix_cache_hits_total histogram\nvllm:prefix_cache_hits_total_count 1\nvllm:prefix_cache_hits 5\nvllm:prefix_cache_queries 10\n",
	"vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.5\n",
	"vllm:num_requests_waiting{model=\"\xff\"} 1\n",
	"vllm:num_requests_waiting{a=\"b\" 1\n",
	"vllm:num_requests_waiting\t1\n",
	"vllm:num_requests_waiting_total 5\nvllm:num_requests_waiting_created 6\nvllm:num_requests_waiting 1\n",
	"some_histogram_bucket{le=oops 1\nvllm:num_requests_waiting 1\n",
	"vllm:num_requests_waiting " + strings.Repeat("1", maxLine) + "\n",
}

func TestParseFastIsReference(t *testing.T) {
	for _, c := range fastCases {
		same(t, []byte(c), vllmNames)
		same(t, []byte(c), sglangNames)
		// Parse gives the reference's answer, error included.
		got, gerr := Parse([]byte(c), VLLM)
		want, werr := parseReference([]byte(c), vllmNames)
		if (gerr != nil) != (werr != nil) || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("Parse %+v %v, reference %+v %v, for %q", got, gerr, want, werr, c)
		}
	}
}

func FuzzParseFastIsReference(f *testing.F) {
	for _, c := range fastCases[:len(fastCases)-1] {
		f.Add([]byte(c), false)
	}
	f.Add(vllmPage(f, simmetrics.TPOTDeprecated), false)
	f.Add(sglangPage(f), true)
	f.Add(sglangPageOf(f, simmetrics.SGLangPage{NewLabels: true, PageSize: 16}), true)
	f.Fuzz(func(t *testing.T, body []byte, sglang bool) {
		n := vllmNames
		if sglang {
			n = sglangNames
		}
		same(t, body, n)
	})
}

// The page through Parse (parseFast) and through the expfmt path alone (what Parse was
// before parseFast).
func BenchmarkParseVLLMPage(b *testing.B) {
	body := vllmPage(b, simmetrics.TPOTHidden)
	for _, c := range []struct {
		name  string
		parse func() (Sample, error)
	}{
		{"fast", func() (Sample, error) { return Parse(body, VLLM) }},
		{"reference", func() (Sample, error) { return parseReference(body, vllmNames) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.parse(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Fetch reads bodies into recycled buffers: a page above MaxBodyBytes is refused with
// or without a Content-Length, one just at it is read, and a small page after a large
// one is read alone.
func TestFetchBodyLimitWithRecycledBuffers(t *testing.T) {
	line := "vllm:num_requests_waiting 2\n"
	pad := func(n int) string { // comment lines, then the sample
		n -= len(line)
		return strings.Repeat("#\n", n/2) + strings.Repeat("\n", n%2) + line
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body string
		switch r.URL.Path {
		case "/at":
			body = pad(MaxBodyBytes)
		case "/above":
			body = pad(MaxBodyBytes + 1)
		default:
			body = "vllm:num_requests_waiting 7\n"
		}
		if r.URL.Query().Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		io.WriteString(w, body)
	}))
	defer srv.Close()
	c := Client(5 * time.Second)
	for _, q := range []string{"", "?chunked=1"} {
		if _, err := Fetch(context.Background(), c, srv.URL+"/above"+q, VLLM); err == nil || !strings.Contains(err.Error(), "body above") {
			t.Fatalf("%s: page above the limit: %v", q, err)
		}
		if s, err := Fetch(context.Background(), c, srv.URL+"/at"+q, VLLM); err != nil || s.Waiting != 2 {
			t.Fatalf("%s: page at the limit: %+v %v", q, s, err)
		}
		for range 3 {
			if s, err := Fetch(context.Background(), c, srv.URL+"/small"+q, VLLM); err != nil || s.Waiting != 7 {
				t.Fatalf("%s: small page: %+v %v", q, s, err)
			}
		}
	}
}
