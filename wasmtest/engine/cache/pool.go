// Package cache is the simulator's paged prefix cache, modelled on vLLM v1's BlockPool
// (vllm/v1/core/block_pool.py) and its chained block hashes (kv_cache_utils.py).
//
//   - The KV pool is num_gpu_blocks blocks of block_size tokens. Block 0 is vLLM's
//     null block and is never handed out, so usage = 1 - free / (num_gpu_blocks - 1).
//   - Only full blocks are cached, keyed by their chained hash (see [Hasher]).
//   - Blocks referenced by a running request are pinned (ref count > 0). Unreferenced
//     blocks, cached or not, sit in a free queue in LRU order; allocation takes from
//     the head and evicts the block's hash if it had one. A request frees its blocks
//     tail first, so the tail of a prefix is evicted before its head (as vLLM does).
//   - A cache hit on a free block takes it out of the free queue.
//
// Every operation is O(1) per block and allocation-free in steady state: blocks live
// in one slice, the free queue is an intrusive doubly linked list of indexes, and the
// hash index is an open-addressing table sized for the pool up front (index.go).
//
// Duplicates, as vLLM: when a block becomes full with a hash that is already cached (a
// request recomputes a block it could not hit, e.g. the last block of a repeated
// block-aligned prompt, whose hit get_computed_blocks caps at num_tokens - 1), the new
// physical block is cached too, under the same hash, and BlockStored is published for
// it again; evicting either copy publishes its own BlockRemoved, so a hash can be
// removed once while another copy stays cached. Lookups return the copy cached first.
// (vllm/v1/core/block_pool.py @c59cb794: BlockHashToBlockMap keeps {block_id: block}
// per hash, "We currently don't de-duplicate the blocks in the cache";
// cache_full_blocks inserts and reports every newly full block;
// _maybe_evict_cached_block pops one block id and emits one BlockRemoved;
// get_one_block returns the first. vllm/v1/core/kv_cache_manager.py @ace980e6:
// max_cache_hit_length = request.num_tokens - 1.)
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package cache

import "fmt"

type block struct {
	hash       uint64
	ref        int32
	prev, next int32 // free queue links; -1 when not queued
	dup        int32 // next cached copy of the same hash, in caching order; -1 = none
	cached     bool
}

// Pool is the block pool of one engine. It is not safe for concurrent use.
type Pool struct {
	blocks  []block // len = num_gpu_blocks + 1: the last element is the free-queue sentinel
	index   *index
	numFree int

	// OnRemove, if set, is called with the hash of every cached block that is evicted
	// (vLLM publishes one BlockRemoved per evicted block).
	OnRemove func(hash uint64)
}

// NewPool returns a pool of numBlocks blocks (vLLM num_gpu_blocks, including the null
// block).
func NewPool(numBlocks int) (*Pool, error) {
	if numBlocks < 2 {
		return nil, fmt.Errorf("num_gpu_blocks %d: need at least 2 (one is the null block)", numBlocks)
	}
	if numBlocks > 1<<30 {
		return nil, fmt.Errorf("num_gpu_blocks %d: too large", numBlocks)
	}
	p := &Pool{blocks: make([]block, numBlocks+1), index: newIndex(numBlocks)}
	p.Clear()
	return p, nil
}

func (p *Pool) sentinel() int32 { return int32(len(p.blocks) - 1) }

// Clear empties the pool as a restart does: every block free, nothing cached, no
// OnRemove calls.
func (p *Pool) Clear() {
	p.index.clear()
	s := p.sentinel()
	p.blocks[s] = block{prev: s, next: s}
	for i := range s {
		p.blocks[i] = block{prev: -1, next: -1, dup: -1}
	}
	p.numFree = 0
	for i := int32(1); i < s; i++ { // block 0 is the null block
		p.pushTail(i)
	}
}

// NumBlocks returns num_gpu_blocks (including the null block).
func (p *Pool) NumBlocks() int { return len(p.blocks) - 1 }

// NumFree returns the number of unreferenced blocks (cached or not).
func (p *Pool) NumFree() int { return p.numFree }

// NumCached returns the number of blocks whose hash is cached.
func (p *Pool) NumCached() int { return p.index.len() }

// Usage is vLLM's kv_cache_usage_perc: the fraction of usable blocks in use.
func (p *Pool) Usage() float64 {
	usable := p.NumBlocks() - 1
	return 1 - float64(p.numFree)/float64(usable)
}

// Cached reports whether hash is cached.
func (p *Pool) Cached(hash uint64) bool {
	_, ok := p.index.get(hash)
	return ok
}

// Match finds the longest run of leading hashes (at most max) that are cached, appends
// their block ids to ids, and returns them with how many of those blocks are free
// (a hit on them will take them out of the free queue).
func (p *Pool) Match(hashes []uint64, max int, ids []int32) (hit []int32, free int) {
	if max > len(hashes) {
		max = len(hashes)
	}
	for _, h := range hashes[:max] {
		id, ok := p.index.get(h)
		if !ok {
			break
		}
		ids = append(ids, id)
		if p.blocks[id].ref == 0 {
			free++
		}
	}
	return ids, free
}

// CountHits returns how many leading hashes (at most max) are cached.
func (p *Pool) CountHits(hashes []uint64, max int) int {
	if max > len(hashes) {
		max = len(hashes)
	}
	for i, h := range hashes[:max] {
		if _, ok := p.index.get(h); !ok {
			return i
		}
	}
	return max
}

// Pin takes a reference on every block in ids (cache hits from [Pool.Match]).
func (p *Pool) Pin(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		if b.ref == 0 {
			p.unlink(id)
		}
		b.ref++
	}
}

// Allocate takes n blocks from the head of the free queue (evicting cached ones),
// appends their ids to table with one reference each, and returns it. It fails without
// side effects if fewer than n blocks are free.
func (p *Pool) Allocate(n int, table []int32) ([]int32, bool) {
	if n > p.numFree {
		return table, false
	}
	s := p.sentinel()
	for range n {
		id := p.blocks[s].next
		p.unlink(id)
		b := &p.blocks[id]
		if b.cached {
			p.uncache(id)
			if p.OnRemove != nil {
				p.OnRemove(b.hash)
			}
		}
		b.hash = 0
		b.ref = 1
		table = append(table, id)
	}
	return table, true
}

// Commit caches block id (full, referenced by the caller) under hash and reports
// whether it is newly cached (false only if id already holds hash). A hash that other
// blocks already hold gets one more copy, as in vLLM (see the package comment): the
// caller publishes BlockStored for it.
func (p *Pool) Commit(id int32, hash uint64) (isNew bool) {
	b := &p.blocks[id]
	if b.cached && b.hash == hash {
		return false
	}
	if b.cached {
		p.uncache(id)
	}
	b.hash, b.cached, b.dup = hash, true, -1
	head, ok := p.index.get(hash)
	if !ok {
		p.index.put(hash, id)
		return true
	}
	for p.blocks[head].dup >= 0 {
		head = p.blocks[head].dup
	}
	p.blocks[head].dup = id
	return true
}

// uncache takes cached block id out of its hash's copies (the hash stays cached while
// another copy holds it).
func (p *Pool) uncache(id int32) {
	b := &p.blocks[id]
	head, _ := p.index.get(b.hash)
	switch {
	case head == id && b.dup >= 0:
		p.index.put(b.hash, b.dup)
	case head == id:
		p.index.del(b.hash)
	default:
		for p.blocks[head].dup != id {
			head = p.blocks[head].dup
		}
		p.blocks[head].dup = b.dup
	}
	b.cached, b.dup = false, -1
}

// Copies returns how many blocks hold hash.
func (p *Pool) Copies(hash uint64) int {
	id, ok := p.index.get(hash)
	if !ok {
		return 0
	}
	n := 0
	for ; id >= 0; id = p.blocks[id].dup {
		n++
	}
	return n
}

// Release drops one reference on every block in table, last block first, so that a
// prefix's tail is queued for eviction before its head.
func (p *Pool) Release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		id := table[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		} else if b.ref < 0 {
			panic(fmt.Sprintf("cache: block %d released more often than referenced", id))
		}
	}
}

// Reset drops every cached hash, as vLLM's reset_prefix_cache does. Like vLLM it
// refuses (returns false) while any block is referenced. No OnRemove calls: the caller
// publishes AllBlocksCleared.
func (p *Pool) Reset() bool {
	if p.numFree != p.NumBlocks()-1 {
		return false
	}
	p.index.clear()
	for i := range p.blocks[:p.sentinel()] {
		p.blocks[i].hash, p.blocks[i].cached, p.blocks[i].dup = 0, false, -1
	}
	return true
}

func (p *Pool) pushTail(id int32) {
	s := p.sentinel()
	last := p.blocks[s].prev
	p.blocks[id].prev, p.blocks[id].next = last, s
	p.blocks[last].next = id
	p.blocks[s].prev = id
	p.numFree++
}

func (p *Pool) unlink(id int32) {
	b := &p.blocks[id]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.numFree--
}

// Drop uncaches every copy of hash without calling OnRemove: the owner removed it
// itself (SGLang mode, where a radix node's pages leave together).
func (p *Pool) Drop(hash uint64) {
	for {
		id, ok := p.index.get(hash)
		if !ok {
			return
		}
		p.uncache(id)
		p.blocks[id].hash = 0
	}
}
