package index

import (
	"container/list"
	"slices"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// Slower KV tiers (docs/controlplane.md): engines that offload blocks to a
// medium other than GPU memory publish them on the same stream. vLLM's OffloadingConnector
// appends its events to the step's GPU events (vllm/v1/core/sched/scheduler.py
// @00024d31, update_from_output), with medium "CPU" (CPULoadStoreSpec.medium(),
// vllm/v1/kv_offload/mediums.py @0c2bbc47) and, unless self-describing events are
// enabled (vLLM PR 43468), only block hashes: token_ids [], block_size 0, no parent
// (OffloadingConnectorScheduler.take_events, offloading/scheduler.py @0072b0b7). The
// blocks are copies of GPU blocks made as they are computed, with the GPU block's hash
// (at the default offloaded block size), so a tier's block is found by hash among the
// rank's GPU blocks (or its earlier tier copies); one that cannot be found (stored after
// the GPU evicted its block and the index forgot it) is counted as an orphan. Its LRU
// manager stores a hash at most once (prepare_store skips stored ones) and publishes
// one BlockRemoved per eviction (lru_manager.py @3a04cf8f), so a tier holds a block
// once: a repeated store changes nothing. LMCache's vLLM connector publishes CPU
// stores too, and no removals (LMCache PR 5076): its entries leave with the budget.
//
// A replica holds a key in a tier while one of its tier blocks maps to it; the table
// lists it in its fastest tier (GPU, from the existing holdings, wins). A block loaded
// back into GPU memory is published again by the GPU (BlockStored with tokens) and so
// counts as GPU; its CPU copy stays listed for when the GPU evicts it again.
// AllBlocksCleared, a restart and lost events drop every tier with the GPU's holdings:
// vLLM's reset_prefix_cache may or may not reset the connector (it depends on the
// version and the caller), and forgetting a block costs a hit, keeping a gone one a
// misroute.

// inputTierBlocks names the budget's drops of blocks in slower tiers.
const inputTierBlocks = "kv_tier_blocks"

// tierHash is one engine block in one slower tier.
type tierHash struct {
	hash uint64
	tier uint8
}

// tierBlock is what a tier block maps to: the checkpoint keys it holds (usually one,
// none when the block is not at a checkpoint).
type tierBlock struct {
	key   uint64
	ck    bool     // the block is at a checkpoint: key counts
	multi []uint64 // engine blocks larger than ours: their checkpoint keys
}

// tierKey is one key held in one tier.
type tierKey struct {
	key  uint64
	tier uint8
}

// tierFlip is a change of whether a replica holds a key in a tier.
type tierFlip struct {
	key  uint64
	tier uint8
	on   bool
}

// tierOf returns the model's tier number of a medium (1-based), adding the medium
// when it is new; 0 when the model already names table.MaxTiers media.
func (m *model) tierOf(medium string) uint8 {
	name := api.NormalizeMedium(medium)
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.tiers, name); i >= 0 {
		return uint8(i + 1)
	}
	if len(m.tiers) >= table.MaxTiers || name == "" || len(name) > table.MaxTierName {
		return 0
	}
	m.tiers = append(m.tiers, name) // published with the first key that names it (dirty)
	m.homes.dropAll()               // homes.go: the filters credit none with a slower tier
	return uint8(len(m.tiers))
}

// tierStored indexes a BlockStored event of a slower medium (caller holds r.mu).
func (ix *Index) tierStored(r *replica, rk *rank, ev *kvevents.Event) {
	n := uint64(len(ev.Hashes))
	tier := r.m.tierOf(ev.Medium)
	if tier == 0 {
		rk.skipped += n // more media than a table can name
		return
	}
	if r.offTier == 0 {
		r.offTier = tier // where the GPU's evicted reported keys go (offload)
	}
	room, reason := ix.tierRoom(r, rk, len(ev.Hashes))
	for i, h := range ev.Hashes {
		th := tierHash{h, tier}
		if _, ok := rk.tier[th]; ok {
			rk.stored++ // stored once per tier: a repeat changes nothing
			continue
		}
		b, ok := ix.resolve(rk, h)
		if !ok {
			rk.orphans++
			continue
		}
		if room <= 0 {
			ix.drop(inputTierBlocks, reason, len(ev.Hashes)-i)
			return
		}
		room--
		if rk.tier == nil {
			rk.tier = map[tierHash]tierBlock{}
		}
		rk.tier[th] = b
		for _, k := range b.keys() {
			r.tierRef(k, tier, 1)
		}
		rk.stored++
	}
}

// tierRemoved unindexes a BlockRemoved event of a slower medium (caller holds r.mu).
func (ix *Index) tierRemoved(r *replica, rk *rank, ev *kvevents.Event) {
	tier := r.m.tierOf(ev.Medium)
	if tier == 0 {
		rk.skipped += uint64(len(ev.Hashes))
		return
	}
	for _, h := range ev.Hashes {
		th := tierHash{h, tier}
		b, ok := rk.tier[th]
		if !ok {
			continue
		}
		for _, k := range b.keys() {
			r.tierRef(k, tier, -1)
		}
		delete(rk.tier, th)
		rk.removed++
	}
	if tier == r.offTier {
		ix.ageOffloaded(r, float64(len(ev.Hashes)*ix.engineBlockSize(r, rk)))
	}
}

// Reported keys (the filters' placements and outcomes, text domain above all) have no
// events of their own: the GPU's holdings of them age by the volume the GPU evicts
// (ageText). An engine with a CPU tier has those blocks in CPU memory by then (vLLM
// copies each block as it is computed), so the keys the GPU's eviction pressure takes
// move to the replica's tier, into this LRU, which that tier's own removals age the
// same way. It holds at most the replica's key limit.
type offLRU struct {
	l     list.List // of offKey, most recent at the front
	idx   map[uint64]*list.Element
	debt  float64
	token int // token-domain entries
}

type offKey struct {
	key       uint64
	token     bool
	confirmed stamp // when it was confirmed last (it ages out like the GPU's: confirmed.go)
}

// offload puts a reported key the GPU evicted into the replica's slower tier.
func (ix *Index) offload(r *replica, k uint64, token bool, confirmed stamp) {
	o := &r.off
	if el, ok := o.idx[k]; ok {
		v := el.Value.(offKey)
		v.confirmed = confirmed
		el.Value = v
		o.l.MoveToFront(el)
		return
	}
	if o.idx == nil {
		o.idx = map[uint64]*list.Element{}
	}
	o.idx[k] = o.l.PushFront(offKey{k, token, confirmed})
	if token {
		o.token++
	}
	r.tierRef(k, r.offTier, 1)
	for o.l.Len() > ix.keyLimit(r) {
		ix.offEvictTail(r)
	}
}

// offEvictTail drops the least recently offloaded key; it returns its footprint.
func (ix *Index) offEvictTail(r *replica) float64 {
	o := &r.off
	el := o.l.Back()
	if el == nil {
		return 0
	}
	ok := o.l.Remove(el).(offKey)
	delete(o.idx, ok.key)
	r.tierRef(ok.key, r.offTier, -1)
	if ok.token {
		o.token--
		return ix.tokenFootprint()
	}
	return ix.textFootprint(r.m)
}

// ageOffloaded applies a tier's eviction pressure to the offloaded reported keys.
func (ix *Index) ageOffloaded(r *replica, tokens float64) {
	o := &r.off
	if o.l.Len() == 0 {
		o.debt = 0
		return
	}
	o.debt += tokens
	for o.l.Len() > 0 {
		fp := ix.textFootprint(r.m)
		if o.l.Back().Value.(offKey).token {
			fp = ix.tokenFootprint()
		}
		if o.debt < fp {
			break
		}
		o.debt -= ix.offEvictTail(r)
	}
	if o.l.Len() == 0 {
		o.debt = 0
	}
}

// resolve finds the keys of an engine block by its hash: among the rank's GPU blocks,
// those the GPU removed earlier in the same batch, or its copies in other tiers. vLLM
// puts a step's GPU events before the connector's (see above), and a block's copy can
// complete in the step whose allocation evicts the GPU block: BlockRemoved GPU, then
// BlockStored CPU, in one batch.
func (ix *Index) resolve(rk *rank, h uint64) (tierBlock, bool) {
	if ref, ok := rk.blocks.Get(h); ok {
		return ix.blockKeys(rk, h, ref), true
	}
	if b, ok := rk.gone[h]; ok {
		return b, true
	}
	for th, b := range rk.tier {
		if th.hash == h {
			return b, true
		}
	}
	return tierBlock{}, false
}

func (ix *Index) blockKeys(rk *rank, h uint64, ref blockRef) tierBlock {
	b := tierBlock{key: ref.key, ck: prefix.IsCheckpoint(int(ref.pos), ix.cfg.Stride)}
	if ks, ok := rk.multi.Get(h); ok {
		b.multi = slices.Clone(ks)
	}
	return b
}

// keepGone remembers, until the end of the batch, the keys of a GPU block the batch
// removed (bounded by the batch: cleared after it).
func (ix *Index) keepGone(rk *rank, h uint64, ref blockRef) {
	if rk.gone == nil {
		rk.gone = map[uint64]tierBlock{}
	}
	rk.gone[h] = ix.blockKeys(rk, h, ref)
}

func (b tierBlock) keys() []uint64 {
	if b.multi != nil {
		return b.multi
	}
	if b.ck {
		return []uint64{b.key}
	}
	return nil
}

// tierRoom is how many of n new tier blocks the budget admits for rank rk: a rank's
// tier blocks are bounded like its GPU blocks (blockLimit), and they and the keys they
// add (one per stride blocks) count against the global MaxKeys.
func (ix *Index) tierRoom(r *replica, rk *rank, n int) (int, string) {
	stride := max(ix.cfg.Stride, 1)
	cost := func(blocks int) int { return blocks + blocks/stride + 1 }
	room := ix.blockLimit(r, rk) - len(rk.tier)
	reason := reasonReplica
	if g, why := ix.roomFor(r.m, cost(n), 0, rk.lastEvent); g < cost(min(room, n)) {
		room, reason = max(g-1, 0)*stride/(stride+1), why
	}
	admitted := min(max(room, 0), n)
	if admitted > 0 {
		ix.charge(r.m, int64(cost(admitted)), 0)
	}
	return admitted, reason
}

// tierRef counts a tier block's reference to key k (caller holds r.mu).
func (r *replica) tierRef(k uint64, tier uint8, delta int32) {
	tk := tierKey{k, tier}
	before := r.tierHold[tk]
	after := max(before+delta, 0)
	if after == 0 {
		delete(r.tierHold, tk)
	} else {
		if r.tierHold == nil {
			r.tierHold = map[tierKey]int32{}
		}
		r.tierHold[tk] = after
	}
	if (before > 0) != (after > 0) {
		r.tierFlips = append(r.tierFlips, tierFlip{k, tier, after > 0})
	}
}

// dropTiers forgets every tier block of rk (nil: of every rank, and the offloaded
// reported keys) and the keys they held.
func (r *replica) dropTiers(rk *rank) {
	if rk == nil {
		for el := r.off.l.Front(); el != nil; el = el.Next() {
			r.tierRef(el.Value.(offKey).key, r.offTier, -1)
		}
		r.off = offLRU{}
	}
	for _, x := range r.ranks {
		if rk != nil && x != rk {
			continue
		}
		for th, b := range x.tier {
			for _, k := range b.keys() {
				r.tierRef(k, th.tier, -1)
			}
		}
		x.tier = nil
	}
}

// setTier changes whether slot holds k in tier. Caller holds m.mu.
func (m *model) setTier(k uint64, tier uint8, slot uint32, on bool) {
	h := table.Holder(slot, int(tier))
	s := m.tierKeys[k]
	j, found := slices.BinarySearch(s, h)
	switch {
	case on && !found:
		s = slices.Insert(s, j, h)
	case !on && found:
		s = slices.Delete(s, j, j+1)
	default:
		return
	}
	if len(s) == 0 {
		delete(m.tierKeys, k)
	} else {
		if m.tierKeys == nil {
			m.tierKeys = map[uint64][]uint32{}
		}
		m.tierKeys[k] = s
	}
	m.keys.touch(k)
}

// holders appends key k's table set: the GPU slots, then each other replica in its
// fastest slower tier. Caller holds m.mu.
func (m *model) holders(k uint64, dst []uint32) []uint32 {
	gpu := m.keys.get(k)
	for _, x := range gpu {
		dst = append(dst, uint32(x))
	}
	n := len(dst)
	for _, h := range m.tierKeys[k] {
		slot, _ := table.SplitHolder(h)
		if _, inGPU := slices.BinarySearch(gpu, uint16(slot)); inGPU {
			continue
		}
		if slices.ContainsFunc(dst[n:], func(o uint32) bool { return o&table.MaxSlot == slot }) {
			continue // already listed in a faster tier
		}
		dst = append(dst, h)
	}
	return dst
}
