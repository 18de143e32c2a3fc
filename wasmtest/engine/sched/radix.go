// SGLang mode: the radix tree (package radix) mirrors what the block pool caches, at
// the points SGLang's scheduler touches its RadixCache, and its events replace the
// pool's:
//
//   - admission matches fill_ids without the last token (Req.init_next_round_input,
//     python/sglang/srt/managers/schedule_batch.py: max_prefix_len = input_len - 1),
//     splitting the node the match ends in;
//   - each prefill chunk inserts the prompt tokens computed so far
//     (cache_unfinished_req); decoded tokens are inserted once, when the request
//     finishes, up to kv_committed_len (cache_finished_req);
//   - the pool's LRU picks the page to evict; its whole node leaves the tree (SGLang
//     evicts a leaf at a time, RadixCache.evict), and the pool drops the node's other
//     pages with it;
//   - /flush_cache refuses while requests run or wait (Scheduler.flush_cache).

package sched

import "github.com/kvroute/kvroute/wasmtest/engine/cache"

func (e *Engine) radixExtra(r *Request) string {
	x := cache.Extra{LoRA: r.LoRA, Salt: r.CacheSalt}
	if x.IsZero() {
		return ""
	}
	return x.LoRA + "\x00" + x.Salt // SGLang's extra_key: lora id and cache salt
}

// radixTokens returns r's first n tokens without writing into r.Prompt.
func (e *Engine) radixTokens(r *Request, n int) []uint32 {
	if n <= len(r.Prompt) {
		return r.Prompt[:n]
	}
	e.radixBuf = append(append(e.radixBuf[:0], r.Prompt...), r.Output[:n-len(r.Prompt)]...)
	return e.radixBuf
}

// radixMatch is match_prefix of r's first n tokens.
func (e *Engine) radixMatch(r *Request, n int) {
	e.tree.Match(e.radixTokens(r, n), e.radixExtra(r))
}

// radixInsert inserts r's first full blocks, already committed to the pool.
func (e *Engine) radixInsert(r *Request, full int) {
	if err := e.tree.Insert(e.radixTokens(r, full*e.bs), r.chain.Hashes[:full], e.radixExtra(r)); err != nil {
		panic(err) // whole pages by construction
	}
}

// radixEvicted removes the node of a page the pool evicted, unless another copy of the
// page is still cached.
func (e *Engine) radixEvicted(hash uint64) {
	if e.pool.Copies(hash) > 0 {
		return
	}
	for _, h := range e.tree.Evicted(hash) {
		e.pool.Drop(h)
	}
}
