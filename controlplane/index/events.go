package index

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/internal/keymap"
	"github.com/kvroute/kvroute/shared/prefix"
)

// rank is one DP rank's KV-event state: the engine's block hashes mapped to our keys.
// The engine's hashes (vLLM's sha256, or Python's hash) are spread already, as keymap
// expects: every block stored and removed probes the map, and Go map operations would
// be much of ingest's CPU (BenchmarkIngestEndToEnd's profile).
type rank struct {
	blocks keymap.Map[blockRef]
	// multi holds the checkpoint keys of engine blocks larger than our blocks.
	multi keymap.Map[[]uint64]
	// tier maps the blocks held in slower media to their keys (tiers.go).
	tier map[tierHash]tierBlock
	// tiered: the stream has carried a slower medium; gone then keeps the GPU blocks
	// removed earlier in the batch being applied (tiers.go).
	tiered    bool
	gone      map[uint64]tierBlock
	blockSize int
	sg        *sglangRank // SGLang's pages (sglang.go)
	num       int         // the DP rank
	// peakNoted is the most blocks told to the reclaim's high-water marks (noteHWM
	// takes the budget's lock: the event path tells it only of a new peak).
	peakNoted int

	connected                 bool
	lastSeq                   int64
	batches, stored, removed  uint64
	clears, gaps, restarts    uint64
	decodeErrors, skipped     uint64
	orphans, uncertainDrops   uint64
	lastDecodeErr             string
	everConnected, hasBatches bool
	lastEvent                 time.Time // when the last batch arrived (live or replayed)
	// ts is the timestamp of the batch being applied (the engine's clock, seconds);
	// stay measures its GPU blocks' residency (residency.go), again how many of the
	// evicted ones come back (storedagain.go).
	ts    float64
	stay  residency
	again storedAgain
}

// blockRef is the key of an engine block's last (our-size) block and its chain position,
// and how many physical copies of the block the engine holds. vLLM caches a recomputed
// block whose hash is already cached as a second copy and publishes BlockStored for it;
// each copy's eviction publishes its own BlockRemoved (vllm/v1/core/block_pool.py
// @c59cb794, cache_full_blocks and _maybe_evict_cached_block), so the block stays
// cached until every copy is removed.
type blockRef struct {
	key    uint64
	pos    uint32
	copies int32
}

type seedKey struct {
	model, lora string
	salt        prefix.Salt
}

// Events adapts the index to kvevents.Handler.
func (ix *Index) Events() kvevents.Handler { return (*eventSink)(ix) }

type eventSink Index

func (s *eventSink) ix() *Index { return (*Index)(s) }

// stream locks the replica of a stream and returns it with its rank state, or nil for
// unknown replicas (discovery dropped it while its subscription was still winding
// down). No Index lock is taken: streams of different replicas run in parallel. The
// caller ends with ix.unlockReplica(r).
func (ix *Index) stream(id kvevents.StreamID) (*replica, *rank) {
	r := (*ix.byID.Load())[id.Replica]
	if r != nil {
		r.mu.Lock()
		if !r.gone {
			return r, r.rank(id.Rank)
		}
		r.mu.Unlock()
	}
	ix.unknownStreams.Add(1)
	return nil, nil
}

func (s *eventSink) Batch(id kvevents.StreamID, seq uint64, b *kvevents.Batch) {
	ix := s.ix()
	r, rk := ix.stream(id)
	if r == nil {
		return
	}
	defer ix.unlockStream(r)
	rk.lastSeq = int64(seq)
	rk.lastEvent = time.Now()
	rk.batches++
	rk.hasBatches = true
	rk.ts = b.TS
	for i := 0; i < len(b.Events) && !rk.tiered; i++ { // by index: an Event is 200 bytes to copy
		rk.tiered = !isGPU(b.Events[i].Medium)
	}
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			ix.stored(r, rk, ev)
		case kvevents.BlockRemoved:
			ix.blocksRemoved(r, rk, ev)
		case kvevents.AllBlocksCleared:
			rk.clears++
			ix.clearReplica(r)
			resetSGLang(r)
		default:
			rk.skipped++
		}
	}
	clear(rk.gone)
	rk.again.sweep(rk.ts)     // storedagain.go
	r.m.again.sweep(r, rk.ts) // fleetagain.go
}

func (s *eventSink) Restart(id kvevents.StreamID) {
	ix := s.ix()
	if r, rk := ix.stream(id); r != nil {
		rk.restarts++
		ix.clearReplica(r)
		resetSGLang(r)
		ix.unlockReplica(r)
	}
}

func (s *eventSink) Gap(id kvevents.StreamID, from, to uint64, replayed bool) {
	ix := s.ix()
	r, rk := ix.stream(id)
	if r == nil {
		return
	}
	defer ix.unlockReplica(r)
	rk.gaps++
	if !replayed {
		// Lost events: some stored or removed blocks are unknown, so this rank's
		// token-domain keys can no longer be trusted. Dropping them costs some
		// cache hits until the engine stores blocks again; keeping them would route
		// to blocks the engine may have evicted.
		rk.uncertainDrops++
		ix.dropRank(r, rk)
		ix.dropSGLang(r, rk)
	}
}

func (s *eventSink) DecodeError(id kvevents.StreamID, err error) {
	ix := s.ix()
	if r, rk := ix.stream(id); r != nil {
		rk.decodeErrors++
		rk.lastDecodeErr = err.Error()
		ix.unlockReplica(r)
	}
}

func (s *eventSink) Connected(id kvevents.StreamID, up bool) {
	ix := s.ix()
	if r, rk := ix.stream(id); r != nil {
		rk.connected = up
		rk.everConnected = rk.everConnected || up
		ix.unlockReplica(r)
	}
}

// stored maps a BlockStored event's blocks to token-domain keys. The chain seed is the
// replica's model, the event's LoRA name and the cache_salt of the chain's first block;
// each block's key is prefix.NextTokens(parent key, its token ids), i.e. exactly what
// prefix.TokenKeys gives a filter for the same token-id prompt. vLLM's own hash is only
// used to find the parent: it depends on the hash algorithm and PYTHONHASHSEED, ours
// does not.
func (ix *Index) stored(r *replica, rk *rank, ev *kvevents.Event) {
	n := uint64(len(ev.Hashes))
	if !isGPU(ev.Medium) && ev.GroupIdx == 0 && !isSGLang(r) {
		ix.tierStored(r, rk, ev) // tiers.go: found by hash, no tokens needed
		return
	}
	if !isGPU(ev.Medium) || ev.GroupIdx != 0 {
		rk.skipped += n // secondary KV groups (and SGLang's other media) do not route
		return
	}
	if ev.HasLoraID && ev.LoraName == "" {
		rk.skipped += n // an adapter we cannot name: its chain seed is unknown
		return
	}
	if isSGLang(r) {
		ix.sglangStored(r, rk, ev) // sglang.go: per-page hashes, any page size
		return
	}
	bt := ix.cfg.BlockTokens
	bs := ev.BlockSize
	if bs <= 0 || bs%bt != 0 || len(ev.Tokens) != len(ev.Hashes)*bs {
		rk.skipped += n // offload-origin events carry no tokens; other sizes cannot chain
		return
	}
	if !ix.admitBlocks(r, rk, ev) { // budget.go: counted there
		return
	}
	rk.blockSize = bs
	mult := bs / bt
	var key uint64
	var pos int
	if !ev.HasParent {
		key = r.seed(r.spec.Model, ev.LoraName, prefix.SaltFromCacheSalt(ev.CacheSalt()))
	} else {
		ref, ok := rk.blocks.Get(ev.Parent)
		if !ok {
			// The parent was stored before we subscribed (or lost in a gap): its chain
			// position and key are unknown, so are these blocks'.
			rk.orphans += n
			return
		}
		key, pos = ref.key, int(ref.pos)+1
	}
	var cks [8]uint64
	for i, h := range ev.Hashes {
		if pos > math.MaxInt32 {
			rk.skipped += n - uint64(i)
			return
		}
		ck := cks[:0]
		for t := 0; t < mult; t++ {
			off := (i*mult + t) * bt
			key = prefix.NextTokens(key, ev.Tokens[off:off+bt])
			if prefix.IsCheckpoint(pos, ix.cfg.Stride) {
				ck = append(ck, key)
			}
			pos++
		}
		ref, found := rk.blocks.Put(h)
		if found {
			if ref.key == key && ref.pos == uint32(pos-1) {
				ref.copies++ // another physical copy (a recomputed block-aligned tail)
				rk.stored++
				continue
			}
			ix.unrefKeys(r, rk, h, *ref) // the hash now stands for another chain
		}
		*ref = blockRef{key: key, pos: uint32(pos - 1), copies: 1}
		rk.stay.stored(h, rk.ts)
		rk.again.stored(h, rk.ts)
		r.m.again.stored(key, rk.ts)
		if mult > 1 && len(ck) > 0 {
			rk.multi.Set(h, append([]uint64(nil), ck...))
		}
		for _, k := range ck {
			ix.tokRef(r, k, 1)
		}
		rk.stored++
	}
}

func (ix *Index) blocksRemoved(r *replica, rk *rank, ev *kvevents.Event) {
	if !isGPU(ev.Medium) && ev.GroupIdx == 0 && !isSGLang(r) {
		ix.tierRemoved(r, rk, ev) // tiers.go
		return
	}
	if !isGPU(ev.Medium) || ev.GroupIdx != 0 {
		rk.skipped += uint64(len(ev.Hashes))
		return
	}
	if isSGLang(r) {
		ix.sglangRemoved(r, rk, ev) // sglang.go
		return
	}
	for _, h := range ev.Hashes {
		if ref := rk.blocks.Ptr(h); ref != nil && ref.copies > 1 {
			ref.copies-- // another copy of the block is still cached
		} else if ref != nil {
			if rk.tiered {
				ix.keepGone(rk, h, *ref) // tiers.go: its CPU copy may be published after
			}
			r.m.again.evicted(r, ref.key, rk.ts)
			ix.unrefBlock(r, rk, h, *ref)
			rk.stay.removed(h, rk.ts)
			rk.again.removed(h, rk.ts)
		}
		rk.removed++
	}
	// vLLM emits BlockRemoved only when it evicts a cached block to reuse it.
	ix.ageText(r, float64(len(ev.Hashes)*ix.engineBlockSize(r, rk)))
}

// seed is a token chain's seed, cached per replica (caller holds r.mu).
func (r *replica) seed(model, lora string, salt prefix.Salt) uint64 {
	k := seedKey{model, lora, salt}
	if s, ok := r.seeds[k]; ok {
		return s
	}
	s := prefix.Seed(prefix.Token, model, lora, salt)
	if r.seeds == nil || len(r.seeds) > 4096 {
		r.seeds = map[seedKey]uint64{}
	}
	r.seeds[k] = s
	return s
}

func (ix *Index) tokRef(r *replica, k uint64, delta int32) {
	i := r.ensure(k)
	h := &r.slab[i]
	was := h.held()
	before := h.tokRefs > 0
	h.tokRefs += delta
	if h.tokRefs < 0 {
		h.tokRefs = 0
	}
	if after := h.tokRefs > 0; after != before {
		if after {
			r.tokenKeys++
		} else {
			r.tokenKeys--
		}
	}
	ix.settle(r, i, was)
}

func (ix *Index) unrefBlock(r *replica, rk *rank, hash uint64, ref blockRef) {
	ix.unrefKeys(r, rk, hash, ref)
	rk.blocks.Delete(hash)
}

// unrefKeys releases the keys of engine block hash (leaving the block in rk.blocks).
func (ix *Index) unrefKeys(r *replica, rk *rank, hash uint64, ref blockRef) {
	if ks, ok := rk.multi.Get(hash); ok {
		for _, k := range ks {
			ix.tokRef(r, k, -1)
		}
		rk.multi.Delete(hash)
	} else if prefix.IsCheckpoint(int(ref.pos), ix.cfg.Stride) {
		ix.tokRef(r, ref.key, -1)
	}
}

func (ix *Index) dropRank(r *replica, rk *rank) {
	r.dropTiers(rk)
	for h, ref := range rk.blocks.All() {
		ix.unrefKeys(r, rk, h, ref)
	}
	rk.blocks, rk.multi = keymap.Map[blockRef]{}, keymap.Map[[]uint64]{}
	rk.stay.reset()
	rk.again.reset()
}

func (r *replica) rank(n int) *rank {
	i, found := r.findRank(n)
	if !found {
		r.ranks = slices.Insert(r.ranks, i, &rank{lastSeq: -1, num: n})
	}
	return r.ranks[i]
}

// rankOf is DP rank n's state, nil when the rank has sent nothing.
func (r *replica) rankOf(n int) *rank {
	if i, found := r.findRank(n); found {
		return r.ranks[i]
	}
	return nil
}

func (r *replica) findRank(n int) (int, bool) {
	return slices.BinarySearchFunc(r.ranks, n, func(x *rank, n int) int { return cmp.Compare(x.num, n) })
}

// engineBlockSize is the engine's KV block size for eviction accounting.
func (ix *Index) engineBlockSize(r *replica, rk *rank) int {
	if rk != nil && rk.blockSize > 0 {
		return rk.blockSize
	}
	if r.sample.BlockSize > 0 {
		return r.sample.BlockSize
	}
	return ix.cfg.BlockTokens
}

// ageText applies eviction pressure: the engine evicted tokens' worth of blocks, and it
// evicts least recently used blocks first, so the least recently used reported keys of
// the replica go too (reported keys have no events of their own). On a replica without
// a slower tier, only the volume's prompt share ages them (keyed.go: the rest was the
// requests' outputs), and a key a request in flight uses stays: the engine evicts only
// blocks no request holds, so its share of the volume was blocks the index has no keys
// for, and keys that are not in use age no faster for it. It moves to the front, where
// its request's end puts it (vLLM frees a finished request's blocks to the most recently
// used end). On a replica with one, aging moves keys to the tier, still listed
// (tiers.go), and the request's outcome brings them back, so keys in use age as before:
// keeping them made the other keys reach the tier, and age out of it, later than the
// engine's blocks did (docs/performance.md, "Keys in use").
func (ix *Index) ageText(r *replica, tokens float64) {
	if r.tail < 0 {
		r.evictDebt = 0
		return
	}
	if r.offTier == 0 {
		tokens *= r.keyed.share() // keyed.go: the engine's outputs are evicted too
	}
	r.evictDebt += tokens
	now := stamp(ix.clock.Load())
	for r.tail >= 0 {
		h := &r.slab[r.tail]
		fp := ix.textFootprint(r.m)
		if h.flags&lruToken != 0 {
			fp = ix.tokenFootprint()
		}
		if r.evictDebt < fp {
			break
		}
		if r.offTier == 0 && h.inUse(now) {
			r.evictDebt -= fp
			r.lruPushFront(r.tail, h.flags&lruToken != 0, h.owner, h.confirmed)
			continue
		}
		r.evictDebt -= ix.evictToTier(r, r.tail)
	}
	if r.tail < 0 {
		r.evictDebt = 0
	}
}

func isGPU(medium string) bool {
	return medium == "" || medium == "GPU" || medium == "gpu" || medium == "cuda"
}
