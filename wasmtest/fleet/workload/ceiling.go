package workload

import (
	"slices"
	"time"
)

// Ceiling is the most prefix caching can save on a workload's arrivals, whatever the
// routing: the cached-token rate of one infinite prefix cache that every request
// reaches (perfect affinity, no eviction).
type Ceiling struct {
	// Rate is Cacheable / Prompt.
	Rate float64
	// Cacheable sums, over the measured requests, the longest block-aligned prefix of
	// each request's block chain that some earlier request (measured or not) also had,
	// capped at prompt-1 tokens as the engine caps a hit (sched.Engine.CachedPrefixChain:
	// the last prompt token is always computed).
	Cacheable int64
	// Prompt sums the measured requests' prompt tokens.
	Prompt int64
	// Requests is the number of measured requests.
	Requests int
}

// ReuseCeiling computes w's Ceiling over the requests arriving at or after from (the
// warm-up); blockSize is the block size w's chains were hashed with (the profile's).
// It builds every request once and keeps every distinct block hash: memory grows with
// the workload's distinct blocks, not with its requests. Only prompt blocks count: the
// workloads resend answers as the client's text, never the engine's output tokens, so
// output blocks an engine caches are never a later prompt's prefix.
func ReuseCeiling(w Workload, blockSize int, from time.Duration) Ceiling {
	var c Ceiling
	seen := map[uint64]struct{}{}
	src := w.NewSource()
	for i := range w.Len() {
		r := src.Request(i)
		hashes := r.Chain.Hashes
		// A block hash chains every block before it, and every request leaves all its
		// hashes in seen, so the known hashes of a chain are a prefix of it: the
		// longest prefix an earlier request had, found by bisection.
		known, _ := slices.BinarySearchFunc(hashes, true, func(h uint64, _ bool) int {
			if _, ok := seen[h]; ok {
				return -1
			}
			return 1
		})
		if at, _ := w.Arrival(i); at >= from {
			usable := (len(r.Tokens) - 1) / blockSize
			c.Cacheable += int64(min(known, usable) * blockSize)
			c.Prompt += int64(len(r.Tokens))
			c.Requests++
		}
		for _, h := range hashes[known:] {
			seen[h] = struct{}{}
		}
	}
	if c.Prompt > 0 {
		c.Rate = float64(c.Cacheable) / float64(c.Prompt)
	}
	return c
}
