package sched

import (
	"container/list"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// cpuTier is vLLM's CPU offloading tier: the OffloadingConnector with the CPU spec and
// its LRU manager (vllm/v1/kv_offload/lru_manager.py @3a04cf8f, cpu.py @02fcc613).
//
//   - Every block a request fills is offloaded as it is computed (a copy: the GPU keeps
//     its own), not when the GPU evicts it. prepare_store skips blocks already stored and
//     evicts least recently used ready blocks to make room, publishing one BlockRemoved
//     for them at once; complete_store, when the copy is done (here: at the end of the
//     step), makes the blocks loadable and publishes one BlockStored.
//   - Both carry medium "CPU" and only the block hashes: token_ids [], block_size 0, no
//     parent (OffloadingConnectorScheduler.take_events, offloading/scheduler.py
//     @0072b0b7). They follow the step's GPU events in the same batch: the scheduler
//     appends the connector's events to the KV cache manager's (vllm/v1/core/sched/
//     scheduler.py @00024d31, update_from_output).
//   - A request looks its blocks up past its GPU prefix hit, consecutive blocks only,
//     and touches every block of its prompt (get_num_new_matched_tokens). The loaded
//     blocks are allocated on the GPU and cached there like computed ones, so the GPU
//     publishes BlockStored for them (with tokens) as for any new block.
//
// Loading costs loadPerToken per token, added to the step that admits the request (the
// simulator's steps are synchronous; vLLM overlaps the copy with other requests' steps,
// so this slightly overstates what a load costs the others).
type cpuTier struct {
	capacity     int // blocks
	loadPerToken time.Duration
	lru          *list.List // of *cpuBlock, least recently used first
	blocks       map[uint64]*list.Element
	pending      [][]uint64 // stores prepared in the step in flight, one per request
	events       []kvevents.Event
	emit         bool
}

type cpuBlock struct {
	hash  uint64
	ready bool
}

func newCPUTier(blocks int, loadPerToken time.Duration, emit bool) *cpuTier {
	return &cpuTier{capacity: blocks, loadPerToken: loadPerToken, lru: list.New(), blocks: map[uint64]*list.Element{}, emit: emit}
}

// lookup is how many consecutive blocks of hashes from index from (to below end) are
// stored and ready.
func (c *cpuTier) lookup(hashes []uint64, from, end int) int {
	n := 0
	for b := from; b < end && b < len(hashes); b++ {
		el, ok := c.blocks[hashes[b]]
		if !ok || !el.Value.(*cpuBlock).ready {
			break
		}
		n++
	}
	return n
}

// touch marks the stored blocks of hashes recently used, the first most recently (so
// a prefix outlives its tail, as vLLM's touch walks the hashes in reverse).
func (c *cpuTier) touch(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if el, ok := c.blocks[hashes[i]]; ok {
			c.lru.MoveToBack(el)
		}
	}
}

// prepareStore starts offloading the blocks of hashes not stored yet, evicting LRU
// ready blocks to make room; it stores nothing when it cannot make room for all.
func (c *cpuTier) prepareStore(hashes []uint64) {
	var todo []uint64
	for _, h := range hashes {
		if _, ok := c.blocks[h]; !ok {
			todo = append(todo, h)
		}
	}
	if len(todo) == 0 || len(todo) > c.capacity {
		return
	}
	evict := len(c.blocks) + len(todo) - c.capacity
	var victims []*list.Element
	for el := c.lru.Front(); el != nil && len(victims) < evict; el = el.Next() {
		if el.Value.(*cpuBlock).ready {
			victims = append(victims, el)
		}
	}
	if len(victims) < evict {
		return // prepare_store returns None: nothing is stored
	}
	var removed []uint64
	for _, el := range victims {
		b := c.lru.Remove(el).(*cpuBlock)
		delete(c.blocks, b.hash)
		removed = append(removed, b.hash)
	}
	if len(removed) > 0 && c.emit {
		c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: removed, Medium: kvevents.MediumCPU})
	}
	for _, h := range todo {
		if _, ok := c.blocks[h]; !ok { // a chain's hashes are distinct; be safe anyway
			c.blocks[h] = c.lru.PushBack(&cpuBlock{hash: h})
		}
	}
	c.pending = append(c.pending, todo)
}

// completeStores makes the step's stores loadable and publishes them.
func (c *cpuTier) completeStores() {
	for _, hs := range c.pending {
		for _, h := range hs {
			if el, ok := c.blocks[h]; ok {
				el.Value.(*cpuBlock).ready = true
			}
		}
		if c.emit {
			// BlockSize 0 and no tokens: the connector's placeholder payload.
			c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hs, Medium: kvevents.MediumCPU})
		}
	}
	c.pending = c.pending[:0]
}

// take returns the connector events queued since the last take.
func (c *cpuTier) take() []kvevents.Event {
	evs := c.events
	c.events = nil
	return evs
}

func (c *cpuTier) clear() {
	c.lru.Init()
	clear(c.blocks)
	c.pending, c.events = c.pending[:0], nil
}

// len is the number of blocks stored (ready or not).
func (c *cpuTier) len() int { return len(c.blocks) }
