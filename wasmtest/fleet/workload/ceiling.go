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
func ReuseCeiling(w Workload, blockSize int, from time.Duration) Ceiling {
	var c Ceiling
	walkReuse(w, false, func(i int, r *Request, known, _ int) {
		if at, _ := w.Arrival(i); at >= from {
			c.count(r, known, blockSize)
		}
	})
	c.finish()
	return c
}

// count adds a measured request that finds its first known blocks cached.
func (c *Ceiling) count(r *Request, known, blockSize int) {
	c.Cacheable += int64(usable(r, known, blockSize))
	c.Prompt += int64(len(r.Tokens))
	c.Requests++
}

// finish sets Rate from the counts.
func (c *Ceiling) finish() {
	if c.Prompt > 0 {
		c.Rate = float64(c.Cacheable) / float64(c.Prompt)
	}
}

// Reuse is what one request could take from the requests before it.
type Reuse struct {
	// Tokens is the longest block-aligned prefix of its chain that an earlier request
	// also had, capped as Ceiling caps it.
	Tokens int
	// From is the latest earlier request that had all of that prefix; -1 when Tokens
	// is 0.
	From int
}

// Reuses returns every request's Reuse, in arrival order: where the ceiling's reuse
// comes from, request by request (kvroute-bench --requests-csv).
func Reuses(w Workload, blockSize int) []Reuse {
	out := make([]Reuse, w.Len())
	walkReuse(w, true, func(i int, r *Request, known, last int) {
		out[i] = Reuse{Tokens: usable(r, known, blockSize), From: -1}
		if out[i].Tokens > 0 {
			out[i].From = last
		}
	})
	return out
}

// usable is the tokens of known blocks a request's engine could hit: the last prompt
// token is always computed (sched.Engine.CachedPrefixChain).
func usable(r *Request, known, blockSize int) int {
	return min(known, (len(r.Tokens)-1)/blockSize) * blockSize
}

// walkReuse builds every request of w once, in arrival order, and calls fn with the
// number of leading blocks of its chain an earlier request also had and, with latest,
// the latest such request (else the first; -1 when none). Without latest only a chain's
// new blocks are recorded: the ceiling needs no source, and over the seed workload that
// takes a fifth less time. Memory grows with the workload's distinct blocks, not with
// its requests. Only prompt blocks count: the workloads resend answers as the client's text,
// never the engine's output tokens, so output blocks an engine caches are never a later
// prompt's prefix.
func walkReuse(w Workload, latest bool, fn func(i int, r *Request, known, last int)) {
	seen := map[uint64]int32{} // block hash -> the latest (or first) request whose chain had it
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
		last := -1
		if known > 0 {
			last = int(seen[hashes[known-1]])
		}
		fn(i, r, known, last)
		from := known
		if latest {
			from = 0
		}
		for _, h := range hashes[from:] {
			seen[h] = int32(i)
		}
	}
}
