// Package sched is the simulated engine's deterministic core: a continuous-batching
// scheduler modelled on vLLM v1's (vllm/v1/core/sched/scheduler.py) over the paged
// prefix cache of package cache, with step durations from package timing.
//
// It never reads a clock and never sleeps: time is a [time.Duration] of simulated time
// passed in by the caller. A driver loop is
//
//	for {
//		at, ok := eng.NextStepAt() // when the step in flight ends, or the next one can start
//		if !ok { break }           // idle: nothing queued
//		eng.Advance(at)            // finish due steps, start the next; hooks fire
//	}
//
// with Submit(at, req) interleaved at arrival times. A real-time driver sleeps until
// NextStepAt; a discrete-event simulator jumps to it. Same inputs, same outputs.
//
// A step, as in vLLM: running requests first, in admission order, each gets its
// remaining prefill chunk or one decode token within the token budget
// (MaxNumBatchedTokens); when a running request needs a block and none is free, the
// most recently admitted running request is preempted (recompute: its blocks are freed,
// it goes back to the front of the queue). Then, if nothing was preempted, waiting
// requests are admitted in arrival order while sequences (MaxNumSeqs), budget and
// blocks last, each looking up its longest cached prefix first. Blocks that become full
// are hashed and cached when scheduled, and the step's KV events are published at its
// start, as vLLM does. The step ends after timing.Profile.Step; then every request whose
// known tokens are all computed samples one token.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/radix"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// Config configures an Engine.
type Config struct {
	Profile timing.Profile
	// NumGPUBlocks overrides Profile.NumGPUBlocks() when > 0.
	NumGPUBlocks int
	// HashAlgo is cache.AlgoSimXXH64 (default) or cache.AlgoSHA256CBOR; HashSeed is
	// vLLM's PYTHONHASHSEED.
	HashAlgo string
	HashSeed string
	// CPUTierTokens > 0 adds vLLM's CPU offloading tier of that many tokens (whole
	// blocks), and CPULoadPerToken is what loading a token back costs (cpu.go).
	CPUTierTokens   int
	CPULoadPerToken time.Duration
	// Radix, when set, imitates SGLang's radix cache (radix.go): the profile's block
	// size must be its page size, and the events are the tree's.
	Radix *radix.Options

	// OnEvents receives the KV events of each step that produced some, at the step's
	// start (one vLLM EventBatch). The slice is the receiver's; BlockStored.TokenIDs may
	// alias Request.Prompt and must be treated as read-only. When nil, no events are built
	// at all (the fastest mode).
	OnEvents func(at time.Duration, events []kvevents.Event)
	// OnToken is called for every sampled token (r.Output already holds it).
	OnToken func(r *Request, at time.Duration)
	// OnFinish is called once per request, when it finished or was aborted.
	OnFinish func(r *Request, at time.Duration)
	// OnStep is called at the end of every step that sampled a token, after its
	// OnToken and OnFinish calls, with the prompt lengths of the requests that sampled
	// their first token in it and the number of tokens it sampled: vLLM's
	// IterationStats.num_prompt_tokens and num_generation_tokens. Steps that only
	// advanced a chunked prefill are not reported, as vLLM builds IterationStats only
	// for an EngineCoreOutputs batch with outputs (vllm/v1/engine/async_llm.py
	// @8ef0b5f5, output_handler: IterationStats() if (log_stats and num_outputs)).
	OnStep func(at time.Duration, promptTokens, generationTokens int)
}

// Stats are the engine's cumulative counters (vLLM's Prometheus counters).
type Stats struct {
	PrefixQueries    int64 // prompt tokens looked up in the prefix cache, resumed requests' not
	PrefixHits       int64 // of which cached
	CPUHits          int64 // of which loaded from the CPU tier (vLLM's external hits)
	Preemptions      int64
	PromptTokens     int64 // prompt tokens of requests that produced a first token
	GenerationTokens int64
	Finished         int64 // finish_reason "length"
	Aborted          int64
	Steps            int64
}

// State is the queue and cache state a router looks at.
type State struct {
	Waiting, Running int
	// QueuedPrefillTokens: uncached prompt tokens of requests that are waiting or not yet
	// fully prefilled (for waiting requests, estimated from the cache at arrival or
	// preemption).
	QueuedPrefillTokens int
	KVUsage             float64 // vLLM kv_cache_usage_perc, 0..1
	FreeBlocks          int     // unreferenced blocks (cached or not)
	CachedBlocks        int
	CPUBlocks           int // blocks in the CPU tier
}

// ErrTooLong is returned by Submit for requests that can never run.
var ErrTooLong = errors.New("request exceeds the engine's limits")

// Engine is one simulated replica's scheduler. It is not safe for concurrent use.
type Engine struct {
	cfg    Config
	prof   timing.Profile
	bs     int
	pool   *cache.Pool
	hasher *cache.Hasher

	waiting queue
	running []*Request
	batch   []*Request // scheduled in the step in flight

	inflight bool
	stepEnd  time.Duration
	lastEnd  time.Duration // end of the last finished step
	clock    time.Duration // latest time seen
	stalled  bool          // work exists but nothing could be scheduled

	events        []kvevents.Event
	cpu           *cpuTier      // nil without a CPU tier
	tree          *radix.Tree   // SGLang mode only (radix.go)
	loadTime      time.Duration // CPU-tier loads of the step being built
	queuedPrefill int
	stats         Stats
	ids           []int32  // scratch: cache hits
	tokBuf        []uint32 // scratch: block tokens spanning prompt and output
	radixBuf      []uint32 // scratch: a request's tokens for the radix tree
}

// New returns an idle engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	p := cfg.Profile
	if err := p.Validate(); err != nil {
		return nil, err
	}
	n := cfg.NumGPUBlocks
	if n <= 0 {
		n = p.NumGPUBlocks()
	}
	if cfg.HashAlgo == "" {
		cfg.HashAlgo = cache.AlgoSimXXH64
	}
	h, err := cache.NewHasher(cfg.HashAlgo, cfg.HashSeed, p.BlockSize)
	if err != nil {
		return nil, err
	}
	pool, err := cache.NewPool(n)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, prof: p, bs: p.BlockSize, pool: pool, hasher: h}
	pool.OnRemove = e.onRemove
	if cfg.CPUTierTokens < 0 || cfg.CPULoadPerToken < 0 {
		return nil, fmt.Errorf("CPU tier: %d tokens, %v a token: want >= 0", cfg.CPUTierTokens, cfg.CPULoadPerToken)
	}
	if cfg.CPUTierTokens > 0 {
		blocks := cfg.CPUTierTokens / p.BlockSize
		if blocks < 1 {
			return nil, fmt.Errorf("CPU tier of %d tokens holds no %d-token block", cfg.CPUTierTokens, p.BlockSize)
		}
		e.cpu = newCPUTier(blocks, cfg.CPULoadPerToken, cfg.OnEvents != nil)
	}
	if cfg.Radix != nil {
		if e.cpu != nil {
			return nil, errors.New("the CPU tier is vLLM's; SGLang mode has none")
		}
		if cfg.Radix.PageSize != p.BlockSize {
			return nil, fmt.Errorf("SGLang page size %d must be the block size %d", cfg.Radix.PageSize, p.BlockSize)
		}
		if e.tree, err = radix.New(*cfg.Radix); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Profile returns the timing profile.
func (e *Engine) Profile() timing.Profile { return e.prof }

// NumGPUBlocks returns the pool size in blocks (vLLM num_gpu_blocks).
func (e *Engine) NumGPUBlocks() int { return e.pool.NumBlocks() }

// Hasher returns the engine's block hasher (for precomputing Request.Chain).
func (e *Engine) Hasher() *cache.Hasher { return e.hasher }

// Stats returns the cumulative counters.
func (e *Engine) Stats() Stats { return e.stats }

// State returns the current queue and cache state.
func (e *Engine) State() State {
	s := State{
		Waiting:             e.waiting.len(),
		Running:             len(e.running),
		QueuedPrefillTokens: e.queuedPrefill,
		KVUsage:             e.pool.Usage(),
		FreeBlocks:          e.pool.NumFree(),
		CachedBlocks:        e.pool.NumCached(),
	}
	if e.cpu != nil {
		s.CPUBlocks = e.cpu.len()
	}
	return s
}

// CachedPrefix returns how many tokens of prompt the engine would serve from its cache
// right now (block aligned, at most len(prompt)-1), without changing anything.
func (e *Engine) CachedPrefix(prompt []uint32, x cache.Extra) int {
	return e.CachedPrefixChain(e.hasher.NewChain(prompt, x), len(prompt))
}

// CachedPrefixChain is CachedPrefix for a precomputed chain of a numTokens-token prompt.
func (e *Engine) CachedPrefixChain(c *cache.Chain, numTokens int) int {
	return e.pool.CountHits(c.Hashes, (numTokens-1)/e.bs) * e.bs
}

// Submit queues r, arriving at time at (not before the latest time the engine has
// seen; earlier times are raised to it). It fails for requests that can never run.
func (e *Engine) Submit(at time.Duration, r *Request) error {
	switch {
	case r.state != stateNew:
		return fmt.Errorf("request %q submitted twice", r.ID)
	case len(r.Prompt) == 0:
		return fmt.Errorf("request %q: empty prompt", r.ID)
	case r.MaxTokens < 1:
		return fmt.Errorf("request %q: max tokens %d < 1", r.ID, r.MaxTokens)
	case len(r.Prompt)+r.MaxTokens > e.prof.MaxModelLen:
		return fmt.Errorf("request %q: %d prompt + %d output tokens > max model len %d: %w",
			r.ID, len(r.Prompt), r.MaxTokens, e.prof.MaxModelLen, ErrTooLong)
	case e.blocksFor(len(r.Prompt)+r.MaxTokens) > e.pool.NumBlocks()-1:
		return fmt.Errorf("request %q: needs %d blocks, pool has %d: %w",
			r.ID, e.blocksFor(len(r.Prompt)+r.MaxTokens), e.pool.NumBlocks()-1, ErrTooLong)
	}
	at = max(at, e.clock)
	e.clock = at
	x := cache.Extra{LoRA: r.LoRA, Salt: r.CacheSalt}
	outBlocks := r.MaxTokens/e.bs + 1
	if r.Chain != nil && r.Chain.Extra == x && len(r.Chain.Hashes) == len(r.Prompt)/e.bs {
		r.chain = *r.Chain.Clone(outBlocks)
	} else {
		r.chain.Hashes = make([]uint64, 0, len(r.Prompt)/e.bs+outBlocks)
		e.hasher.Start(&r.chain, x)
		e.hasher.Extend(&r.chain, r.Prompt)
	}
	r.seed = uint64(len(r.Prompt))*0x9e3779b97f4a7c15 ^ uint64(r.Prompt[len(r.Prompt)-1])
	if n := len(r.chain.Hashes); n > 0 {
		r.seed ^= r.chain.Hashes[n-1]
	}
	r.Arrival = at
	r.CachedTokens = -1
	r.Output = make([]uint32, 0, r.MaxTokens)
	r.blocks = make([]int32, 0, e.blocksFor(len(r.Prompt)+r.MaxTokens))
	e.enqueue(r, false)
	e.stalled = false
	return nil
}

// enqueue puts r in the waiting queue with an estimate of its uncached tokens.
func (e *Engine) enqueue(r *Request, front bool) {
	total := r.numTokens()
	r.pending = total - e.pool.CountHits(r.chain.Hashes, (total-1)/e.bs)*e.bs
	e.queuedPrefill += r.pending
	r.state = stateWaiting
	if front {
		e.waiting.pushFront(r)
	} else {
		e.waiting.pushBack(r)
	}
}

// NextStepAt returns when Advance has something to do: the end of the step in flight,
// or when the next step can start. ok is false when the engine is idle.
func (e *Engine) NextStepAt() (at time.Duration, ok bool) {
	if e.inflight {
		return e.stepEnd, true
	}
	if e.stalled || (len(e.running) == 0 && e.waiting.len() == 0) {
		return 0, false
	}
	return e.nextStart(), true
}

func (e *Engine) nextStart() time.Duration {
	if len(e.running) == 0 && e.waiting.len() > 0 {
		return max(e.lastEnd, e.waiting.at(0).Arrival)
	}
	return e.lastEnd
}

// Advance runs the engine up to time now: it finishes every step that ends by now and
// starts the next one at the end of the previous (or at the first arrival when idle).
// Hooks fire from inside Advance.
func (e *Engine) Advance(now time.Duration) {
	for {
		if e.inflight {
			if e.stepEnd > now {
				break
			}
			e.finishStep()
			continue
		}
		if e.stalled || (len(e.running) == 0 && e.waiting.len() == 0) {
			break
		}
		start := e.nextStart()
		if start > now {
			break
		}
		if !e.startStep(start) {
			e.stalled = true
			break
		}
	}
	e.clock = max(e.clock, now)
}

// RunUntilIdle advances the engine step by step from now until nothing is left to run
// and returns the time the last step ended (now if none ran): a whole workload in
// virtual time.
func (e *Engine) RunUntilIdle(now time.Duration) time.Duration {
	for {
		at, ok := e.NextStepAt()
		if !ok {
			return now
		}
		e.Advance(at)
		now = at
	}
}
