// One scheduler step: what runs, what is admitted, which blocks are cached and which
// events the step publishes, and what finishes when it ends.

package sched

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.bs - 1) / e.bs }

func (e *Engine) startStep(t time.Duration) bool {
	budget := e.prof.MaxNumBatchedTokens
	e.batch = e.batch[:0]
	e.loadTime = 0
	preempted := false
	prefill, decodes, decodeCtx := 0, 0, 0

	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		numNew := min(r.numTokens()-r.numComputed, budget)
		for {
			need := e.blocksFor(r.numComputed+numNew) - len(r.blocks)
			if need <= 0 {
				break
			}
			if tbl, ok := e.pool.Allocate(need, r.blocks); ok {
				r.blocks = tbl
				break
			}
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == r {
				r = nil
				break
			}
		}
		if r == nil {
			break
		}
		if r.numComputed < r.prefillTarget {
			prefill += numNew
		} else {
			decodes++
			decodeCtx += r.numComputed + numNew
		}
		e.schedule(r, numNew)
		budget -= numNew
	}

	for !preempted && e.waiting.len() > 0 && len(e.running) < e.prof.MaxNumSeqs && budget > 0 {
		r := e.waiting.at(0)
		if r.Arrival > t {
			break
		}
		total := r.numTokens()
		var free int
		e.ids, free = e.pool.Match(r.chain.Hashes, (total-1)/e.bs, e.ids[:0])
		loaded := 0 // blocks loaded from the CPU tier, past the GPU hit
		if e.cpu != nil {
			loaded = e.cpu.lookup(r.chain.Hashes, len(e.ids), (total-1)/e.bs)
		}
		computed := (len(e.ids) + loaded) * e.bs
		numNew := min(total-computed, budget)
		need := e.blocksFor(computed+numNew) - len(e.ids)
		if need+free > e.pool.NumFree() {
			break
		}
		e.waiting.popFront()
		if e.cpu != nil {
			e.cpu.touch(r.chain.Hashes[:min(len(r.chain.Hashes), (total-1)/e.bs)])
			e.cpu.prepareStore(r.chain.Hashes[:len(e.ids)]) // GPU hits the CPU lost
			e.loadTime += time.Duration(loaded*e.bs) * e.cpu.loadPerToken
			e.stats.CPUHits += int64(loaded * e.bs)
		}
		if e.tree != nil {
			e.radixMatch(r, (total-1)/e.bs*e.bs)
		}
		e.pool.Pin(e.ids)
		r.blocks = append(r.blocks[:0], e.ids...)
		r.blocks, _ = e.pool.Allocate(need, r.blocks)
		r.numComputed, r.numCommitted, r.prefillTarget = computed, len(e.ids), total
		e.queuedPrefill += total - computed - r.pending
		r.pending = 0
		if r.Preemptions == 0 {
			// vLLM's Prometheus counters count a request's first lookup only: a resumed
			// request's goes to PrefixCacheStats' preempted_* fields, which no counter
			// exports (vllm/v1/metrics/stats.py @28ed1fb8, PrefixCacheStats.record;
			// vllm/v1/metrics/loggers.py, PrometheusStatLogger.record).
			e.stats.PrefixQueries += int64(total)
			e.stats.PrefixHits += int64(computed)
		}
		if r.CachedTokens < 0 {
			r.CachedTokens, r.ScheduledAt = computed, t
			r.LoadedTokens = loaded * e.bs
		}
		r.state = stateRunning
		e.running = append(e.running, r)
		prefill += numNew
		e.schedule(r, numNew)
		budget -= numNew
	}

	if len(e.batch) == 0 {
		if preempted {
			// Everything that ran was preempted: schedule again from the queue.
			return e.startStep(t)
		}
		e.flushEvents(t)
		return false
	}
	e.stats.Steps++
	e.flushEvents(t)
	e.inflight = true
	e.stepEnd = t + e.prof.Step(prefill, decodes, decodeCtx) + e.loadTime
	return true
}

// schedule adds r to the step with numNew tokens and caches the blocks they fill.
func (e *Engine) schedule(r *Request, numNew int) {
	r.scheduled = numNew
	e.batch = append(e.batch, r)
	full := (r.numComputed + numNew) / e.bs
	if e.tree != nil {
		full = min(full, r.prefillTarget/e.bs) // SGLang caches decoded tokens at the end (radix.go)
	}
	e.commit(r, full)
}

// commit caches r's blocks up to full and records their BlockStored events.
func (e *Engine) commit(r *Request, full int) {
	if full <= r.numCommitted {
		return
	}
	for b := len(r.chain.Hashes); b < full; b++ {
		e.tokBuf = r.tokensRange(b*e.bs, (b+1)*e.bs, e.tokBuf)
		e.hasher.ExtendBlock(&r.chain, e.tokBuf)
	}
	if e.tree != nil {
		for b := r.numCommitted; b < full; b++ {
			e.pool.Commit(r.blocks[b], r.chain.Hashes[b])
		}
		e.radixInsert(r, full)
		r.numCommitted = full
		return
	}
	runStart := -1
	for b := r.numCommitted; b < full; b++ {
		isNew := e.pool.Commit(r.blocks[b], r.chain.Hashes[b])
		if isNew && runStart < 0 {
			runStart = b
		}
		if !isNew && runStart >= 0 {
			e.stored(r, runStart, b)
			runStart = -1
		}
	}
	if runStart >= 0 {
		e.stored(r, runStart, full)
	}
	if e.cpu != nil {
		e.cpu.prepareStore(r.chain.Hashes[r.numCommitted:full]) // offloaded as computed
	}
	r.numCommitted = full
}

// stored records a BlockStored event for r's blocks [lo, hi).
func (e *Engine) stored(r *Request, lo, hi int) {
	if e.cfg.OnEvents == nil {
		return
	}
	ev := kvevents.Event{
		Kind:            kvevents.BlockStored,
		BlockHashes:     append([]uint64(nil), r.chain.Hashes[lo:hi]...),
		TokenIDs:        r.tokensRange(lo*e.bs, hi*e.bs, nil),
		BlockSize:       e.bs,
		LoraID:          r.LoraID,
		LoraName:        r.LoRA,
		Medium:          kvevents.MediumGPU,
		KVCacheSpecKind: kvevents.SpecFullAttention,
	}
	if lo > 0 {
		ev.ParentBlockHash, ev.HasParent = r.chain.Hashes[lo-1], true
	}
	if x := r.chain.Extra; !x.IsZero() {
		ev.ExtraKeys = make([][]string, hi-lo)
		for i := range ev.ExtraKeys {
			ev.ExtraKeys[i] = x.Keys(lo + i)
		}
	}
	e.events = append(e.events, ev)
}

func (e *Engine) onRemove(hash uint64) {
	if e.tree != nil {
		e.radixEvicted(hash)
		return
	}
	if e.cfg.OnEvents == nil {
		return
	}
	e.events = append(e.events, kvevents.Event{
		Kind:        kvevents.BlockRemoved,
		BlockHashes: []uint64{hash},
		Medium:      kvevents.MediumGPU,
	})
}

func (e *Engine) flushEvents(t time.Duration) {
	if e.cpu != nil && e.cfg.OnEvents != nil {
		e.events = append(e.events, e.cpu.take()...) // the connector's follow the GPU's
	}
	if e.tree != nil {
		e.events = append(e.events, e.tree.Take()...)
	}
	if len(e.events) == 0 || e.cfg.OnEvents == nil {
		e.events = e.events[:0]
		return
	}
	evs := e.events
	e.events = nil
	e.cfg.OnEvents(t, evs)
}

// preempt frees a running request's blocks and puts it back at the queue's front
// (vLLM v1 recompute preemption).
func (e *Engine) preempt(r *Request) {
	if r.numComputed < r.prefillTarget {
		e.queuedPrefill -= r.prefillTarget - r.numComputed
	}
	e.pool.Release(r.blocks)
	r.blocks = r.blocks[:0]
	r.numComputed, r.numCommitted, r.prefillTarget = 0, 0, 0
	r.Preemptions++
	e.stats.Preemptions++
	e.enqueue(r, true)
}

func (e *Engine) finishStep() {
	at := e.stepEnd
	e.inflight = false
	e.lastEnd = at
	if e.cpu != nil {
		e.cpu.completeStores() // the step's copies are done
	}
	finished := false
	stepPrompt, stepGen := 0, 0
	for _, r := range e.batch {
		if r.state != stateRunning {
			continue // aborted during the step
		}
		if r.numComputed < r.prefillTarget {
			e.queuedPrefill -= r.scheduled
		}
		r.numComputed += r.scheduled
		r.scheduled = 0
		if r.numComputed < r.numTokens() {
			continue // prefill chunk: nothing sampled yet
		}
		r.Output = append(r.Output, tokenizer.OutputToken(r.seed, len(r.Output)))
		e.stats.GenerationTokens++
		stepGen++
		if len(r.Output) == 1 {
			r.FirstTokenAt = at
			e.stats.PromptTokens += int64(len(r.Prompt))
			stepPrompt += len(r.Prompt)
		}
		if e.cfg.OnToken != nil {
			e.cfg.OnToken(r, at)
		}
		if len(r.Output) >= r.MaxTokens {
			if e.tree != nil {
				e.commit(r, r.numComputed/e.bs) // cache_finished_req: up to kv_committed_len
			}
			e.pool.Release(r.blocks)
			r.blocks = r.blocks[:0]
			e.stats.Finished++
			e.done(r, at, "length")
			finished = true
		}
	}
	e.batch = e.batch[:0]
	if finished {
		e.compactRunning()
		if e.tree != nil {
			e.flushEvents(at) // what finished requests inserted, published with this step's results
		}
	}
	if stepGen > 0 && e.cfg.OnStep != nil {
		e.cfg.OnStep(at, stepPrompt, stepGen)
	}
}

func (e *Engine) done(r *Request, at time.Duration, reason string) {
	r.state = stateDone
	r.FinishedAt = at
	r.FinishReason = reason
	if e.cfg.OnFinish != nil {
		e.cfg.OnFinish(r, at)
	}
}

func (e *Engine) compactRunning() {
	k := 0
	for _, r := range e.running {
		if r.state == stateRunning {
			e.running[k] = r
			k++
		}
	}
	clear(e.running[k:])
	e.running = e.running[:k]
}
