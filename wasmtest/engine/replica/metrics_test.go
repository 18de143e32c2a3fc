package replica

import (
	"bytes"
	"io"
	"log/slog"
	"math"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/metrics"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// scrapeFamilies renders r's /metrics page and parses it with Prometheus' own text
// parser (legacy name validation, as a Prometheus server scraping text format).
func scrapeFamilies(t *testing.T, r *Replica) map[string]*dto.MetricFamily {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, metrics.Write(&buf, r.Metrics()))
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(&buf)
	require.NoError(t, err)
	return fams
}

func hist(t *testing.T, fams map[string]*dto.MetricFamily, name string) *dto.Histogram {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "%s missing from /metrics", name)
	require.Equal(t, dto.MetricType_HISTOGRAM, f.GetType(), name)
	require.Len(t, f.GetMetric(), 1, name)
	var labels []string
	for _, l := range f.GetMetric()[0].GetLabel() {
		labels = append(labels, l.GetName()+"="+l.GetValue())
	}
	assert.ElementsMatch(t, []string{"model_name=m", "engine=0"}, labels, name)
	return f.GetMetric()[0].GetHistogram()
}

func bounds(h *dto.Histogram) []float64 {
	var out []float64
	for _, b := range h.GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

// One request alone through the simulator moves every request-level histogram of
// vLLM's PrometheusStatLogger by exactly that request's timings (stats.py @28ed1fb8).
// Before this change the page had only TTFT and e2e: every other family was missing.
func TestRequestMetricsMoveByOneRequest(t *testing.T) {
	r := newReplica(t)
	prof := timing.Fast()
	const n, out = 100, 5
	prompt := make([]uint32, n)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	p := wait(t, must(r.Submit(Request{ID: "a", Prompt: prompt, MaxTokens: out})))
	require.Equal(t, "length", p.FinishReason)

	// Alone: one prefill step, then one decode step per further token, each reading
	// the context of the sequence so far (numComputed + the new token).
	ttft := prof.Step(n, 0, 0).Seconds()
	var itls []float64
	decode := 0.0
	for k := 1; k < out; k++ {
		d := prof.Step(0, 1, n+k).Seconds()
		itls = append(itls, d)
		decode += d
	}
	fams := scrapeFamilies(t, r)

	type want struct {
		count   uint64
		sum     float64
		buckets []float64
	}
	// Bucket lists typed from vllm/v1/metrics/buckets.py @139b1c3f and loggers.py @005a810b.
	latency := []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	itl := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	ttftB := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	iter := []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	// build_1_2_5_buckets(max_model_len = 32768)
	tok := []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}
	for name, w := range map[string]want{
		"vllm:time_to_first_token_seconds":    {1, ttft, ttftB},
		"vllm:inter_token_latency_seconds":    {out - 1, decode, itl},
		"vllm:e2e_request_latency_seconds":    {1, ttft + decode, latency},
		"vllm:request_queue_time_seconds":     {1, 0, latency},
		"vllm:request_prefill_time_seconds":   {1, ttft, latency},
		"vllm:request_decode_time_seconds":    {1, decode, latency},
		"vllm:request_inference_time_seconds": {1, ttft + decode, latency},
		"vllm:request_prompt_tokens":          {1, n, tok},
		"vllm:request_generation_tokens":      {1, out, tok},
		"vllm:request_params_max_tokens":      {1, out, tok},
		// One observation per step with outputs: prompt + first token, then 1 per decode.
		"vllm:iteration_tokens_total": {out, n + out, iter},
	} {
		h := hist(t, fams, name)
		assert.Equal(t, w.count, h.GetSampleCount(), name)
		assert.InDelta(t, w.sum, h.GetSampleSum(), 1e-9, name)
		assert.Equal(t, append(w.buckets, math.Inf(1)), bounds(h), name)
	}
	// Per-observation placement: each ITL lands in its own bucket.
	h := hist(t, fams, "vllm:inter_token_latency_seconds")
	for i, b := range h.GetBucket() {
		var c uint64
		for _, v := range itls {
			if v <= b.GetUpperBound() {
				c++
			}
		}
		assert.Equal(t, c, b.GetCumulativeCount(), "bucket %d", i)
	}
	h = hist(t, fams, "vllm:iteration_tokens_total")
	assert.Equal(t, uint64(out-1), h.GetBucket()[0].GetCumulativeCount(), "4 decode steps of 1 token in le=1")
	assert.Equal(t, uint64(out-1), h.GetBucket()[4].GetCumulativeCount(), "the first step (100 prompt + 1) is above le=64")
	assert.Equal(t, uint64(out), h.GetBucket()[5].GetCumulativeCount(), "and within le=128")

	succ := fams["vllm:request_success_total"]
	require.NotNil(t, succ)
	for _, m := range succ.GetMetric() {
		var reason string
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" {
				reason = l.GetValue()
			}
		}
		if reason == "length" {
			assert.Equal(t, 1.0, m.GetCounter().GetValue())
		} else {
			assert.Zero(t, m.GetCounter().GetValue(), reason)
		}
	}
	_, old := fams["vllm:time_per_output_token_seconds"]
	assert.False(t, old, "hidden since vLLM 0.12")
}

// The per-token latency histogram follows --vllm-version (PR #24110): its old name
// alone before 0.11, both names in 0.11, the new one alone from 0.12.
func TestTPOTByVersion(t *testing.T) {
	for _, c := range []struct {
		mode     metrics.TPOTMode
		tpot     bool
		itl      bool
		tpotHelp string
	}{
		{metrics.TPOTOnly, true, false, "Histogram of time per output token in seconds."},
		{metrics.TPOTDeprecated, true, true, "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead."},
		{metrics.TPOTHidden, false, true, ""},
	} {
		r, err := New(Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 0.001, ModelName: "m", TPOT: c.mode,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		wait(t, must(r.Submit(Request{ID: "a", Prompt: []uint32{1, 2, 3}, MaxTokens: 3})))
		fams := scrapeFamilies(t, r)
		r.Close()
		f, ok := fams["vllm:time_per_output_token_seconds"]
		assert.Equal(t, c.tpot, ok, "mode %d", c.mode)
		if ok {
			assert.Equal(t, c.tpotHelp, f.GetHelp())
			assert.Equal(t, uint64(2), f.GetMetric()[0].GetHistogram().GetSampleCount())
		}
		_, ok = fams["vllm:inter_token_latency_seconds"]
		assert.Equal(t, c.itl, ok, "mode %d", c.mode)
	}
}
