// Package replica runs one simulated engine in real time: a goroutine drives the
// deterministic core (package sched) against the wall clock, scaled by a time scale,
// publishes its KV events over ZMQ (package publisher) and keeps vLLM's metrics.
// Package server puts the OpenAI HTTP API in front of it.
//
// Simulated time t corresponds to wall time start + t x TimeScale: TimeScale 1 is real
// time, 0.001 runs one simulated second per wall millisecond. Latencies in responses
// and metrics are simulated seconds.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/metrics"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

// Config configures a Replica.
type Config struct {
	// Engine configures the core; its hooks are the replica's and must be nil.
	Engine sched.Config
	// TimeScale is wall seconds per simulated second (default 1).
	TimeScale float64
	// ModelName is the served model name (metrics label model_name).
	ModelName string
	// Events configures KV event publishing (vLLM's --kv-events-config); disabled when
	// !Events.Enabled().
	Events        publisher.Config
	EventsOptions publisher.Options
	// TPOT picks the per-token latency histogram's name(s) (vLLM version dependent;
	// zero: vllm:inter_token_latency_seconds alone, as vLLM >= 0.12).
	TPOT metrics.TPOTMode
	// Kind is the engine imitated beyond the event layout: "" or EngineVLLM, or
	// EngineSGLang (SGLang's /metrics names and buckets, and AllBlocksCleared as the
	// first event of every process start).
	Kind string
	// SGLang is the SGLang revision imitated with EngineSGLang (its metric labels).
	SGLang version.SGLang
	Logger *slog.Logger
}

// Engines a replica can imitate.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// Replica is one running simulated engine. Its methods are safe for concurrent use.
type Replica struct {
	cfg   Config
	log   *slog.Logger
	scale float64
	start time.Time
	pub   *publisher.Publisher

	mu         sync.Mutex
	eng        *sched.Engine
	ttft       *metrics.Histogram
	e2e        *metrics.Histogram
	itl        *metrics.Histogram // SGLang's; nil for vLLM (its ITL is in reqHist)
	reqHist    *metrics.RequestHistograms
	success    map[string]int64
	created    time.Time
	pubErrs    int64
	observer   func(kvevents.Batch)
	restarting bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// New starts a replica (and its publisher, if enabled).
func New(cfg Config) (*Replica, error) {
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("time scale %v must be positive", cfg.TimeScale)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Engine.OnEvents != nil || cfg.Engine.OnToken != nil || cfg.Engine.OnFinish != nil || cfg.Engine.OnStep != nil {
		return nil, errors.New("replica: engine hooks are reserved for the replica")
	}
	r := &Replica{cfg: cfg, log: cfg.Logger, scale: cfg.TimeScale, start: time.Now(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	ec := cfg.Engine
	ec.OnEvents = r.onEvents
	ec.OnToken = r.onToken
	ec.OnFinish = r.onFinish
	ec.OnStep = r.onStep
	eng, err := sched.New(ec)
	if err != nil {
		return nil, err
	}
	r.eng = eng
	r.resetMetrics()
	if cfg.Events.Enabled() {
		opt := cfg.EventsOptions
		if opt.Logger == nil {
			opt.Logger = cfg.Logger
		}
		if r.pub, err = publisher.Open(cfg.Events, opt); err != nil {
			return nil, err
		}
	}
	switch cfg.Kind {
	case "", EngineVLLM:
	case EngineSGLang:
		r.startupCleared()
	default:
		return nil, fmt.Errorf("replica: unknown engine %q (want vllm or sglang)", cfg.Kind)
	}
	go r.drive()
	return r, nil
}

func (r *Replica) resetMetrics() {
	r.ttft = metrics.NewHistogram(metrics.TTFTBuckets)
	r.e2e = metrics.NewHistogram(metrics.E2EBuckets)
	r.itl = nil
	if r.cfg.Kind == EngineSGLang {
		r.ttft = metrics.NewHistogram(metrics.SGLangTTFTBuckets)
		r.itl = metrics.NewHistogram(metrics.SGLangITLBuckets)
		r.e2e = metrics.NewHistogram(metrics.SGLangE2EBuckets)
		if !r.cfg.SGLang.NewLabels() {
			r.e2e = metrics.NewHistogram(metrics.SGLangOldE2EBuckets)
		}
	}
	r.reqHist = metrics.NewRequestHistograms(r.eng.Profile().MaxModelLen, r.cfg.TPOT)
	r.success = map[string]int64{}
	r.created = time.Now()
}

// Profile returns the timing profile (limits and costs).
func (r *Replica) Profile() timing.Profile { return r.eng.Profile() }

// NumGPUBlocks returns the pool size in blocks.
func (r *Replica) NumGPUBlocks() int { return r.eng.NumGPUBlocks() }

// Publisher returns the KV event publisher, or nil when events are disabled.
func (r *Replica) Publisher() *publisher.Publisher { return r.pub }

// Now returns the current simulated time.
func (r *Replica) Now() time.Duration {
	return time.Duration(float64(time.Since(r.start)) / r.scale)
}

func (r *Replica) wallAt(t time.Duration) time.Time {
	return r.start.Add(time.Duration(float64(t) * r.scale))
}

// drive is the real-time loop: advance the core to now, sleep until its next step.
func (r *Replica) drive() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		r.eng.Advance(r.Now())
		next, busy := r.eng.NextStepAt()
		r.mu.Unlock()
		wait := time.Hour
		if busy {
			wait = time.Until(r.wallAt(next))
		}
		timer.Reset(max(wait, 0))
		select {
		case <-timer.C:
		case <-r.wake:
		case <-r.stop:
			return
		}
	}
}

func (r *Replica) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Close stops the driver and the publisher. Requests in flight never finish.
func (r *Replica) Close() error {
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	<-r.done
	if r.pub != nil {
		return r.pub.Close()
	}
	return nil
}

// Request is what a client asks of the replica.
type Request struct {
	ID        string // for logs and sched; no prompt text anywhere
	Prompt    []uint32
	MaxTokens int
	CacheSalt string
	LoRA      string
	LoraID    int
}

// ErrRestarted is a request's error when the engine restarted under it.
var ErrRestarted = errors.New("engine restarted")

// Handle follows one submitted request.
type Handle struct {
	r   *Replica
	req *sched.Request // owned by the engine: touched only under r.mu

	mu       sync.Mutex
	notify   chan struct{}
	tokens   []uint32
	cached   int
	ttft     time.Duration
	done     bool
	reason   string
	err      error
	promptN  int
	finished time.Duration
	lastAt   time.Duration // simulated time of the latest token (engine-owned: under r.mu)
}

// Submit queues a request at the current simulated time.
func (r *Replica) Submit(req Request) (*Handle, error) {
	h := &Handle{r: r, notify: make(chan struct{}, 1), promptN: len(req.Prompt), cached: -1}
	sr := &sched.Request{ID: req.ID, Prompt: req.Prompt, MaxTokens: req.MaxTokens, CacheSalt: req.CacheSalt,
		LoRA: req.LoRA, LoraID: req.LoraID, Owner: h}
	h.req = sr
	r.mu.Lock()
	err := r.eng.Submit(r.Now(), sr)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r.log.Debug("request queued", "id", req.ID, "prompt_tokens", len(req.Prompt), "max_tokens", req.MaxTokens,
		"salted", req.CacheSalt != "", "lora", req.LoRA)
	r.kick()
	return h, nil
}

// Abort cancels the request (client went away); no-op if it already finished.
func (h *Handle) Abort() {
	h.r.mu.Lock()
	h.r.eng.Abort(h.r.Now(), h.req)
	h.r.mu.Unlock()
	h.r.kick()
}

// Progress is a snapshot of a request.
type Progress struct {
	Tokens       []uint32 // all output tokens so far (shared; do not modify)
	CachedTokens int      // prefix-cache hit, known once the request was scheduled (-1 before)
	PromptTokens int
	TTFT         time.Duration // simulated
	Done         bool
	FinishReason string
	Err          error
}

// Wait blocks until the request has more than have tokens, finished, or ctx ends.
func (h *Handle) Wait(ctx context.Context, have int) (Progress, error) {
	for {
		h.mu.Lock()
		p := Progress{Tokens: h.tokens, CachedTokens: h.cached, PromptTokens: h.promptN, TTFT: h.ttft,
			Done: h.done, FinishReason: h.reason, Err: h.err}
		h.mu.Unlock()
		if len(p.Tokens) > have || p.Done {
			return p, nil
		}
		select {
		case <-h.notify:
		case <-ctx.Done():
			return p, ctx.Err()
		}
	}
}

func (h *Handle) signal() {
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// Hooks: called by the core with r.mu held.

func (r *Replica) onToken(sr *sched.Request, at time.Duration) {
	h := sr.Owner.(*Handle)
	h.mu.Lock()
	h.tokens = append(h.tokens, sr.Output[len(sr.Output)-1])
	if len(h.tokens) == 1 {
		h.cached, h.ttft = sr.CachedTokens, sr.TTFT()
		r.ttft.Observe(sr.TTFT().Seconds())
	} else {
		// vLLM's inter-token latency: this output's time - the previous one's
		// (vllm/v1/metrics/stats.py @28ed1fb8, update_from_output).
		r.reqHist.ITL.Observe((at - h.lastAt).Seconds())
		if r.itl != nil {
			r.itl.Observe((at - h.lastAt).Seconds())
		}
	}
	h.lastAt = at
	h.mu.Unlock()
	h.signal()
}

func (r *Replica) onFinish(sr *sched.Request, at time.Duration) {
	h := sr.Owner.(*Handle)
	r.success[sr.FinishReason]++
	if sr.FinishReason != "abort" {
		r.e2e.Observe((at - sr.Arrival).Seconds())
		// FinishedRequestStats (vllm/v1/metrics/stats.py @28ed1fb8): queued = first
		// scheduled - queued, prefill = first token - first scheduled, decode = last
		// token - first token, inference = last token - first scheduled.
		r.reqHist.ObserveFinished(metrics.FinishedRequest{
			Queue:            (sr.ScheduledAt - sr.Arrival).Seconds(),
			Prefill:          (sr.FirstTokenAt - sr.ScheduledAt).Seconds(),
			Decode:           (h.lastAt - sr.FirstTokenAt).Seconds(),
			Inference:        (h.lastAt - sr.ScheduledAt).Seconds(),
			PromptTokens:     len(sr.Prompt),
			GenerationTokens: len(sr.Output),
			MaxTokens:        sr.MaxTokens,
		})
	}
	h.mu.Lock()
	h.done, h.reason, h.finished = true, sr.FinishReason, at
	if r.restarting {
		h.err = ErrRestarted
	}
	if h.cached < 0 {
		h.cached = max(sr.CachedTokens, 0)
	}
	h.mu.Unlock()
	h.signal()
	r.log.Debug("request finished", "id", sr.ID, "reason", sr.FinishReason, "prompt_tokens", len(sr.Prompt),
		"cached_tokens", sr.CachedTokens, "output_tokens", len(sr.Output), "ttft_s", sr.TTFT().Seconds())
}

// onStep records vllm:iteration_tokens_total for a step that produced outputs.
func (r *Replica) onStep(at time.Duration, promptTokens, generationTokens int) {
	r.reqHist.IterationTokens.Observe(float64(promptTokens + generationTokens))
}

func (r *Replica) onEvents(at time.Duration, evs []kvevents.Event) {
	b := kvevents.Batch{TS: float64(r.wallAt(at).UnixNano()) / 1e9, Events: evs}
	if r.observer != nil {
		r.observer(b)
	}
	if r.pub == nil {
		return
	}
	if _, err := r.pub.Publish(b); err != nil {
		r.pubErrs++
		r.log.Warn("kv events: publish failed", "err", err)
	}
}

// PublishErrors counts event batches the publisher failed to encode or queue.
func (r *Replica) PublishErrors() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pubErrs
}

// ObserveEvents sets a function that sees every event batch as Go values, before it is
// published (nil to stop). It runs with the replica locked: it must not call back.
func (r *Replica) ObserveEvents(f func(kvevents.Batch)) {
	r.mu.Lock()
	r.observer = f
	r.mu.Unlock()
}

// Restart simulates an engine process restart: every request fails with ErrRestarted,
// the cache is emptied, the publisher starts a new sequence at 0 with an empty replay
// buffer (vLLM numbers batches with a per-publisher itertools.count(),
// vllm/distributed/kv_events.py; docs/kv-events.md, "Transport") and, as a new process,
// sends no AllBlocksCleared (only reset_prefix_cache does, vllm/v1/core/block_pool.py
// @c59cb794),
// and metrics counters restart from zero.
func (r *Replica) Restart() {
	r.mu.Lock()
	if r.pub != nil {
		r.pub.Reset()
	}
	r.restarting = true
	r.eng.Restart(r.Now())
	r.restarting = false
	r.resetMetrics()
	if r.cfg.Kind == EngineSGLang {
		r.startupCleared()
	}
	r.mu.Unlock()
	r.log.Info("engine restarted")
	r.kick()
}

// startupCleared publishes what a starting SGLang process publishes first:
// AllBlocksCleared. RadixCache.__init__ calls reset(), which queues it
// (python/sglang/srt/mem_cache/radix_cache.py @95769b28, reset and
// _record_all_cleared_event; the scheduler publishes the queue at its first step).
// A subscriber that connects later never sees it (PUB drops what no one subscribed
// to) unless it replays from sequence 0.
func (r *Replica) startupCleared() {
	r.onEvents(r.Now(), []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
}

// ResetPrefixCache is vLLM's POST /reset_prefix_cache: false while requests hold blocks.
func (r *Replica) ResetPrefixCache() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.ResetPrefixCache(r.Now())
}

// State returns the core's queue and cache state.
func (r *Replica) State() sched.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.State()
}

// Metrics returns the metrics page's snapshot.
func (r *Replica) Metrics() metrics.Snapshot {
	r.mu.Lock()
	st, stats := r.eng.State(), r.eng.Stats()
	success := make(map[string]int64, len(r.success))
	for k, v := range r.success {
		success[k] = v
	}
	s := metrics.Snapshot{
		ModelName: r.cfg.ModelName, Engine: "0", Created: float64(r.created.UnixNano()) / 1e9,
		Running: st.Running, Waiting: st.Waiting, KVUsage: st.KVUsage, QueuedPrefillTokens: st.QueuedPrefillTokens, QueuedAt: time.Now(),
		PrefixQueries: stats.PrefixQueries, PrefixHits: stats.PrefixHits, Preemptions: stats.Preemptions,
		PromptTokens: stats.PromptTokens, GenerationTokens: stats.GenerationTokens, Success: success,
		TTFT: r.ttft.Clone(), E2E: r.e2e.Clone(), Request: r.reqHist.Clone(),
		// The pool's null block is never handed out; SGLang's max_total_num_tokens is
		// what its allocator can hand out (mem_cache/allocator.py: pages 1..num_pages).
		CapacityTokens: int64(r.eng.NumGPUBlocks()-1) * int64(r.eng.Profile().BlockSize),
	}
	if r.itl != nil {
		s.ITL = r.itl.Clone()
	}
	r.mu.Unlock()
	p := r.eng.Profile()
	algo := r.cfg.Engine.HashAlgo
	if algo == "" {
		algo = "sim_xxh64"
	}
	for _, kv := range [][2]string{
		{"block_size", strconv.Itoa(p.BlockSize)},
		{"cache_dtype", "auto"},
		{"calculate_kv_scales", "False"},
		{"cpu_offload_gb", "0"},
		{"enable_prefix_caching", "True"},
		{"gpu_memory_utilization", "0.92"},
		{"is_attention_free", "False"},
		{"num_cpu_blocks", "0"},
		{"num_gpu_blocks", strconv.Itoa(r.eng.NumGPUBlocks())},
		{"num_gpu_blocks_override", "None"},
		{"prefix_caching_hash_algo", algo},
		{"sliding_window", "None"},
		{"swap_space", "0"},
	} {
		s.CacheConfig = append(s.CacheConfig, metrics.Label{Name: kv[0], Value: kv[1]})
	}
	return s
}
