// What happens to an engine from outside its steps: an aborted request, a process
// restart, vLLM's /reset_prefix_cache.

package sched

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// Abort removes r (waiting or running) at time at, freeing its blocks; OnFinish fires
// with reason "abort". Aborting a finished request does nothing.
func (e *Engine) Abort(at time.Duration, r *Request) {
	switch r.state {
	case stateWaiting:
		e.waiting.remove(r)
		e.queuedPrefill -= r.pending
		r.pending = 0
	case stateRunning:
		if r.numComputed < r.prefillTarget {
			e.queuedPrefill -= r.prefillTarget - r.numComputed
		}
		e.pool.Release(r.blocks)
		r.blocks = r.blocks[:0]
		r.state = stateDone
		e.compactRunning()
	default:
		return
	}
	e.stats.Aborted++
	e.stalled = false
	e.done(r, max(at, e.clock), "abort")
}

// Restart simulates an engine process restart at time at: every request is aborted,
// the cache is emptied and counters are zeroed. No event is published: a new vLLM
// process starts with an empty pool and says nothing about the old one's blocks;
// AllBlocksCleared comes only from reset_prefix_cache (vllm/v1/core/block_pool.py
// @c59cb794, the only place that queues it). Subscribers learn of the restart from
// the event sequence starting over (package publisher).
func (e *Engine) Restart(at time.Duration) {
	at = max(at, e.clock)
	var all []*Request
	all = append(all, e.running...)
	for i := range e.waiting.len() {
		all = append(all, e.waiting.at(i))
	}
	e.running = e.running[:0]
	e.waiting.clear()
	e.batch = e.batch[:0]
	e.inflight, e.stalled = false, false
	e.queuedPrefill = 0
	e.lastEnd, e.clock = at, at
	e.events = e.events[:0]
	e.pool.Clear()
	if e.tree != nil {
		e.tree.Reset() // a new process's tree is empty; the replica publishes its AllBlocksCleared
		e.tree.Take()
	}
	if e.cpu != nil {
		e.cpu.clear() // a new process's CPU tier is empty too
	}
	for _, r := range all {
		r.blocks = r.blocks[:0]
		e.done(r, at, "abort")
	}
	e.stats = Stats{}
}

// ResetPrefixCache drops every cached block, as vLLM's reset_prefix_cache: it refuses
// (false) while any request holds blocks, and publishes AllBlocksCleared on success.
func (e *Engine) ResetPrefixCache(at time.Duration) bool {
	if e.tree != nil && e.waiting.len() > 0 {
		return false // SGLang's flush_cache also waits for an empty queue (radix.go)
	}
	if !e.pool.Reset() {
		return false
	}
	if e.tree != nil {
		e.tree.Reset()
		e.flushEvents(max(at, e.clock))
		return true
	}
	e.cleared(max(at, e.clock))
	return true
}

func (e *Engine) cleared(at time.Duration) {
	if e.cfg.OnEvents != nil {
		e.cfg.OnEvents(at, []kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	}
}
