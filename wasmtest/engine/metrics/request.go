package metrics

// Request-level and iteration histograms of vLLM v1's PrometheusStatLogger.
//
// Names, help texts, label sets (model_name, engine) and bucket boundaries follow
// vllm/v1/metrics/loggers.py @005a810b (vLLM 0.10.x) and the newest boundaries in
// vllm/v1/metrics/buckets.py @139b1c3f (PR #48866 moved every default list there,
// unchanged): REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS,
// INTER_TOKEN_LATENCY_BUCKETS, ITERATION_TOKENS_BUCKETS and build_1_2_5_buckets.
// What each one observes is vllm/v1/metrics/stats.py @28ed1fb8
// (IterationStats.update_from_output / update_from_finished_request):
//
//	inter_token_latency   per output after the first: its time - the previous output's
//	queue_time            first SCHEDULED - QUEUED
//	prefill_time          first token - first SCHEDULED (preemptions included)
//	decode_time           last token - first token
//	inference_time        last token - first SCHEDULED
//	request_prompt_tokens / request_generation_tokens   per finished request
//	iteration_tokens_total  per engine step with outputs: prompt lengths of requests
//	                        that got their first token + tokens generated
//
// vllm:time_per_output_token_seconds is the same observation under its pre-0.11 name
// (PR #24110 renamed it; 0.11 shows both, the old one with "DEPRECATED" in its help;
// 0.12 hides it behind --show-hidden-metrics-for-version; PR #32661 removed it).

// RequestLatencyBuckets are vLLM's request_latency_buckets (e2e, queue, inference,
// prefill and decode time).
var RequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// ITLBuckets are the buckets of vllm:inter_token_latency_seconds (and of
// vllm:time_per_output_token_seconds).
var ITLBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}

// IterationTokensBuckets are the buckets of vllm:iteration_tokens_total.
var IterationTokensBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

// Buckets125 is vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, ... up to max
// inclusive (request_prompt_tokens, request_generation_tokens,
// request_params_max_tokens).
func Buckets125(max int) []float64 {
	var out []float64
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p > max {
				return out
			}
			out = append(out, float64(m*p))
		}
	}
}

// TPOTMode says whether and how vllm:time_per_output_token_seconds is shown.
type TPOTMode uint8

const (
	TPOTHidden     TPOTMode = iota // vLLM >= 0.12 (hidden, later removed)
	TPOTOnly                       // vLLM < 0.11: the only per-token latency histogram
	TPOTDeprecated                 // vLLM 0.11: shown next to inter_token_latency
)

// RequestHistograms are the request-level histograms (nil: not shown).
type RequestHistograms struct {
	PromptTokens, GenerationTokens, IterationTokens, ParamsMaxTokens *Histogram
	ITL                                                              *Histogram // one histogram for both names
	TPOT                                                             TPOTMode
	Queue, Inference, Prefill, Decode                                *Histogram // e2e is Snapshot.E2E
}

// NewRequestHistograms returns empty histograms with vLLM's buckets for a model of
// maxModelLen tokens.
func NewRequestHistograms(maxModelLen int, tpot TPOTMode) *RequestHistograms {
	tok := Buckets125(maxModelLen)
	return &RequestHistograms{
		PromptTokens:     NewHistogram(tok),
		GenerationTokens: NewHistogram(tok),
		IterationTokens:  NewHistogram(IterationTokensBuckets),
		ParamsMaxTokens:  NewHistogram(tok),
		ITL:              NewHistogram(ITLBuckets),
		TPOT:             tpot,
		Queue:            NewHistogram(RequestLatencyBuckets),
		Inference:        NewHistogram(RequestLatencyBuckets),
		Prefill:          NewHistogram(RequestLatencyBuckets),
		Decode:           NewHistogram(RequestLatencyBuckets),
	}
}

// Clone returns an independent copy.
func (r *RequestHistograms) Clone() *RequestHistograms {
	c := *r
	for _, p := range []**Histogram{&c.PromptTokens, &c.GenerationTokens, &c.IterationTokens, &c.ParamsMaxTokens,
		&c.ITL, &c.Queue, &c.Inference, &c.Prefill, &c.Decode} {
		*p = (*p).Clone()
	}
	return &c
}

// FinishedRequest is what vLLM's FinishedRequestStats holds, in seconds and tokens.
type FinishedRequest struct {
	Queue, Prefill, Decode, Inference float64
	PromptTokens, GenerationTokens    int
	MaxTokens                         int // the max_tokens parameter; 0 = unset
}

// ObserveFinished records one finished request as PrometheusStatLogger.record does,
// except e2e, which is Snapshot.E2E's.
func (r *RequestHistograms) ObserveFinished(f FinishedRequest) {
	r.Queue.Observe(f.Queue)
	r.Prefill.Observe(f.Prefill)
	r.Inference.Observe(f.Inference)
	r.Decode.Observe(f.Decode)
	r.PromptTokens.Observe(float64(f.PromptTokens))
	r.GenerationTokens.Observe(float64(f.GenerationTokens))
	if f.MaxTokens > 0 {
		r.ParamsMaxTokens.Observe(float64(f.MaxTokens))
	}
}

// histogramsBeforeTTFT writes, in vLLM's registration order, the count histograms
// that precede time_to_first_token.
func (p *page) histogramsBeforeTTFT(r *RequestHistograms) {
	p.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", r.PromptTokens)
	p.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", r.GenerationTokens)
	p.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", r.IterationTokens)
	p.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", r.ParamsMaxTokens)
}

// latencyHistograms writes the per-token latency histograms that follow
// time_to_first_token.
func (p *page) latencyHistograms(r *RequestHistograms) {
	switch r.TPOT {
	case TPOTOnly:
		p.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", r.ITL)
		return
	case TPOTDeprecated:
		p.histogram("vllm:time_per_output_token_seconds",
			"Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.", r.ITL)
	}
	p.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", r.ITL)
}

// phaseHistograms writes the request phase histograms that follow
// e2e_request_latency.
func (p *page) phaseHistograms(r *RequestHistograms) {
	p.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", r.Queue)
	p.histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", r.Inference)
	p.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", r.Prefill)
	p.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", r.Decode)
}
