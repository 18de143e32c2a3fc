package workload

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/blocklru"
)

// PooledLRU is what perfect affinity keeps where the cache binds: the cached-token rate
// of one LRU prefix cache of capacity blocks that every request reaches in arrival
// order, as if the fleet's KV memory were one engine's and no two replicas ever held the
// same block. It counts hits as the reuse ceiling does (the longest cached prefix of a
// request's chain, capped at prompt-1 tokens), and after each request every block of its
// prompt is cached and touched tail first, so a prefix's root is the most recently used
// (vLLM frees a request's blocks in reverse; wasmtest/engine/cache/pool.go).
//
// It is a reference, not a bound: real engines also cache what they generate and cannot
// evict what running requests hold (both leave less room), and a routing that spreads
// prefixes over the replicas can keep, for some arrivals, more than one LRU would.
// Where the fleet holds every prefix it equals the reuse ceiling.
func PooledLRU(w Workload, blockSize int, from time.Duration, capacity int) Ceiling {
	p := newPooled(capacity)
	src := w.NewSource()
	for i := range w.Len() {
		at, _ := w.Arrival(i)
		p.add(src.Request(i), blockSize, at >= from)
	}
	p.c.finish()
	return p.c
}

// Ceilings is ReuseCeiling and PooledLRU in one walk of w's requests: building each
// request (its text, tokens and chain) is most of the cost of either.
func Ceilings(w Workload, blockSize int, from time.Duration, capacity int) (reuse, pooled Ceiling) {
	p := newPooled(capacity)
	walkReuse(w, false, func(i int, r *Request, known, _ int) {
		at, _ := w.Arrival(i)
		if at >= from {
			reuse.count(r, known, blockSize)
		}
		p.add(r, blockSize, at >= from)
	})
	reuse.finish()
	p.c.finish()
	return reuse, p.c
}

// pooledLRU is PooledLRU's cache and counts.
type pooledLRU struct {
	lru *blocklru.LRU // nil: no room
	c   Ceiling
}

func newPooled(capacity int) *pooledLRU {
	p := &pooledLRU{}
	if capacity > 0 {
		p.lru = blocklru.New(capacity)
	}
	return p
}

// add counts r's hit when measured, then caches its prompt's blocks.
func (p *pooledLRU) add(r *Request, blockSize int, measured bool) {
	hashes := r.Chain.Hashes
	known := 0
	if p.lru != nil {
		for known < len(hashes) && p.lru.Has(hashes[known]) {
			known++
		}
	}
	if measured {
		p.c.count(r, known, blockSize)
	}
	if p.lru == nil {
		return
	}
	for j := len(hashes) - 1; j >= 0; j-- {
		if !p.lru.Touch(hashes[j]) {
			p.lru.Add(hashes[j])
		}
	}
}
