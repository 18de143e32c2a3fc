package index

import (
	"math"

	"github.com/kvroute/kvroute/internal/keymap"
)

// holding is one key's state on one replica. The replica holds the key (and the table
// lists its slot) while any of: engine blocks map to it, it is in the LRU of reported
// keys, or a placement made it speculative.
type holding struct {
	key        uint64
	prev, next int32
	specUntil  specSec // 0 = not speculative
	tokRefs    int32
	flags      uint8
	// In the LRU: the owner slot of the reporter that confirmed the key last, and when
	// (confirmed.go); both fit the struct's padding.
	owner     uint8
	confirmed stamp
	// inFlight counts the placements on this replica whose outcome has not come back
	// (saturating), the last of them placed at placed: the engine is using the key's
	// blocks (inUse).
	inFlight uint8
	placed   stamp
}

const (
	inLRU    = 1
	lruToken = 2 // the LRU entry is token domain (no KV events for this replica)
	// wasPlaced: a proxy placed a request with this key on the replica (place), so the
	// key is one the filters route by, and worth a home when it goes (homes.go).
	wasPlaced = 4
)

func (h *holding) held() bool { return h.tokRefs > 0 || h.flags&inLRU != 0 || h.specUntil != 0 }

// maxInFlight is how long after its last placement a key counts as in use without an
// outcome: longer than a loaded request's whole run, and a bound on what a lost outcome
// (a proxy that died mid-request, a retry served elsewhere) leaves pinned.
const maxInFlight = 10 * 60 // seconds

// inUse says whether a request placed on the replica is still using h's blocks at now:
// a running request holds its blocks and the engine evicts only blocks no request holds
// (vLLM's free block queue, SGLang's unlocked radix nodes), so eviction volume does not
// age the key (ageText).
func (h *holding) inUse(now stamp) bool {
	return h.inFlight > 0 && h.placed.age(now) < maxInFlight
}

// place notes a placement of the key's chain on the replica at now; a count older than
// maxInFlight was left by lost outcomes and starts again.
func (h *holding) place(now stamp) {
	if h.inFlight > 0 && h.placed.age(now) >= maxInFlight {
		h.inFlight = 0
	}
	if h.inFlight < math.MaxUint8 {
		h.inFlight++
	}
	h.placed = now
	h.flags |= wasPlaced
}

// answered notes an outcome of the key's chain on the replica.
func (h *holding) answered() {
	if h.inFlight > 0 {
		h.inFlight--
	}
}

// flip is a change of whether a replica holds a key; placed, for a key let go, that a
// proxy placed it there (wasPlaced).
type flip struct {
	key    uint64
	on     bool
	placed bool
}

func (r *replica) ensure(k uint64) int32 {
	p, found := r.hold.Put(k)
	if found {
		return *p
	}
	var i int32
	if n := len(r.freeIdx); n > 0 {
		i, r.freeIdx = r.freeIdx[n-1], r.freeIdx[:n-1]
		r.slab[i] = holding{key: k, prev: -1, next: -1}
	} else {
		i = int32(len(r.slab))
		r.slab = append(r.slab, holding{key: k, prev: -1, next: -1})
	}
	*p = i
	return i
}

// settle publishes a change of whether r holds the key of holding i, and frees the
// holding once nothing refers to it.
func (ix *Index) settle(r *replica, i int32, was bool) {
	h := &r.slab[i]
	now := h.held()
	if now != was {
		r.flips = append(r.flips, flip{h.key, now, !now && h.flags&wasPlaced != 0}) // unlockReplica commits them
	}
	if !now {
		r.hold.Delete(h.key)
		r.freeIdx = append(r.freeIdx, i)
	}
}

// oneHolder backs the holder lists of a single slot (below its length): a key is often
// held by one replica, and a list of its own would be an allocation for each such key
// (slices.Insert) and a cache line more to read. A
// list sliced from it has capacity 1, so Insert copies it out instead of writing it.
var oneHolder = func() (a [4096]uint16) {
	for i := range a {
		a[i] = uint16(i)
	}
	return a
}()

// sharedList says whether s is a list of oneHolder's.
func sharedList(s []uint16) bool {
	return len(s) == 1 && cap(s) == 1 && int(s[0]) < len(oneHolder) && &s[0] == &oneHolder[s[0]]
}

func (r *replica) lruUnlink(i int32) {
	h := &r.slab[i]
	if h.flags&inLRU == 0 {
		return
	}
	if h.prev >= 0 {
		r.slab[h.prev].next = h.next
	} else {
		r.head = h.next
	}
	if h.next >= 0 {
		r.slab[h.next].prev = h.prev
	} else {
		r.tail = h.prev
	}
	if h.flags&lruToken != 0 {
		r.lruTok--
	} else {
		r.lruText--
	}
	r.owners.add(h.owner, -1)
	h.prev, h.next, h.owner = -1, -1, 0
	h.flags &^= inLRU | lruToken
}

// lruPushFront makes holding i the most recently used reported key, confirmed by owner
// slot owner at at.
func (r *replica) lruPushFront(i int32, token bool, owner uint8, at stamp) {
	r.lruUnlink(i)
	h := &r.slab[i]
	h.flags |= inLRU
	h.owner, h.confirmed = owner, at
	r.owners.add(owner, 1)
	if token {
		h.flags |= lruToken
		r.lruTok++
	} else {
		r.lruText++
	}
	h.prev, h.next = -1, r.head
	if r.head >= 0 {
		r.slab[r.head].prev = i
	}
	r.head = i
	if r.tail < 0 {
		r.tail = i
	}
}

// footprints in tokens of one checkpoint key: it stands for stride blocks.
func (ix *Index) textFootprint(m *model) float64 {
	return float64(ix.cfg.Stride) * float64(ix.cfg.BlockBytes) / m.bytesPerToken()
}

func (ix *Index) tokenFootprint() float64 { return float64(ix.cfg.Stride * ix.cfg.BlockTokens) }

func (ix *Index) lruTokens(r *replica) float64 {
	return float64(r.lruText)*ix.textFootprint(r.m) + float64(r.lruTok)*ix.tokenFootprint()
}

// evictTail drops the least recently used reported key; it returns its footprint.
func (ix *Index) evictTail(r *replica) float64 {
	if r.tail < 0 {
		return 0
	}
	return ix.evictAt(r, r.tail)
}

// evictToTier drops reported key i from the LRU as evictAt does and, on a replica with a
// slower tier, lists it there (offload, tiers.go): the engine copied its blocks to the
// tier as it computed them, so what has left GPU memory is still in the tier.
func (ix *Index) evictToTier(r *replica, i int32) float64 {
	h := r.slab[i] // a copy: evictAt may free the slot
	fp := ix.evictAt(r, i)
	if r.offTier > 0 {
		ix.offload(r, h.key, h.flags&lruToken != 0, h.confirmed)
	}
	return fp
}

// evictAt drops reported key i from the LRU; it returns its footprint.
func (ix *Index) evictAt(r *replica, i int32) float64 {
	fp := ix.textFootprint(r.m)
	if r.slab[i].flags&lruToken != 0 {
		fp = ix.tokenFootprint()
	}
	r.lruUnlink(i)
	ix.lruEvicted.Add(1)
	ix.settle(r, i, true)
	return fp
}

// fitCapacity keeps the reported keys' estimated tokens within the engine's KV capacity
// (num_gpu_blocks x block_size): an engine cannot hold more than that in GPU memory, so
// the oldest reported prefixes must have left it by now, for its slower tier when it has
// one (evictToTier). ev, when a reporter's confirmation made the room needed, picks which
// go (confirmed.go); nil: the least recently used.
func (ix *Index) fitCapacity(r *replica, ev *evictor) {
	capTok := float64(r.sample.CapacityTokens)
	for r.tail >= 0 && ((capTok > 0 && ix.lruTokens(r) > capTok) || r.lruText+r.lruTok > ix.cfg.MaxKeysPerReplica) {
		if ev == nil {
			ix.evictToTier(r, r.tail)
		} else if !ev.evict(ix, true) {
			return
		}
	}
}

// dropHoldings removes every holding for which drop is true, whatever its sources.
func (ix *Index) dropHoldings(r *replica, drop func(*holding) bool) {
	for _, i := range r.hold.All() { // settle may delete the key yielded
		h := &r.slab[i]
		if !drop(h) {
			continue
		}
		r.lruUnlink(i)
		if h.tokRefs > 0 {
			r.tokenKeys--
		}
		if h.specUntil != 0 {
			r.specN--
		}
		h.tokRefs, h.specUntil = 0, 0
		ix.settle(r, i, true)
	}
}

// clearReplica: the engine's cache is empty (AllBlocksCleared, or its publisher
// restarted): every entry of the replica vanishes, both domains, speculative ones too.
func (ix *Index) clearReplica(r *replica) {
	ix.dropHoldings(r, func(*holding) bool { return true })
	r.dropTiers(nil) // every medium: see tiers.go
	for _, rk := range r.ranks {
		rk.blocks, rk.multi = keymap.Map[blockRef]{}, keymap.Map[[]uint64]{}
		rk.stay.reset()
		rk.again.reset()
	}
	r.m.again.drop(r)
	r.evictDebt = 0
}
