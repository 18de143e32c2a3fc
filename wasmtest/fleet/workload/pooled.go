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
	var c Ceiling
	var lru *blocklru.LRU
	if capacity > 0 {
		lru = blocklru.New(capacity)
	}
	src := w.NewSource()
	for i := range w.Len() {
		r := src.Request(i)
		hashes := r.Chain.Hashes
		known := 0
		for lru != nil && known < len(hashes) && lru.Has(hashes[known]) {
			known++
		}
		if at, _ := w.Arrival(i); at >= from {
			c.Cacheable += int64(usable(r, known, blockSize))
			c.Prompt += int64(len(r.Tokens))
			c.Requests++
		}
		for j := len(hashes) - 1; lru != nil && j >= 0; j-- {
			if !lru.Touch(hashes[j]) {
				lru.Add(hashes[j])
			}
		}
	}
	if c.Prompt > 0 {
		c.Rate = float64(c.Cacheable) / float64(c.Prompt)
	}
	return c
}
