package index

import "math"

type specItem struct {
	r     *replica
	key   uint64
	until int64
}

// specSec is when a holding's speculative entry ends, in Unix seconds rounded up (so
// that it never ends before its expiry item does), 0 for none: 4 bytes where a Unix
// millisecond time takes 8, in a struct every holding has.
type specSec uint32

// specSecOf is the specSec of Unix ms time until: at least 1, at most the type's limit.
func specSecOf(until int64) specSec {
	s := until/1000 + 1
	if until%1000 == 0 {
		s--
	}
	return specSec(min(max(s, 1), math.MaxUint32))
}

// expires says whether the expiry item it (Unix ms) is h's current one: a refreshed
// entry leaves a stale item with an earlier time (within the same second as the
// current one's, the entry ends with the stale item: less than a second early).
func (h *holding) expires(it *specItem) bool {
	return h.specUntil != 0 && h.specUntil == specSecOf(it.until)
}

// setSpec makes k speculative on r until (Unix ms) and returns its holding.
func (ix *Index) setSpec(r *replica, k uint64, until int64) int32 {
	i := r.ensure(k)
	h := &r.slab[i]
	was := h.held()
	if h.specUntil == 0 {
		r.specN++
	}
	h.specUntil = specSecOf(until)
	ix.specQ = append(ix.specQ, specItem{r, k, until})
	r.m.specItems.Add(1)
	ix.settle(r, i, was)
	return i
}

func (ix *Index) clearSpec(r *replica, k uint64) {
	i, ok := r.hold.Get(k)
	if !ok {
		return
	}
	h := &r.slab[i]
	if h.specUntil == 0 {
		return
	}
	h.specUntil = 0
	r.specN--
	ix.settle(r, i, true)
}

// expire drops speculative entries whose TTL passed. The queue is in TTL order since
// the TTL is fixed; a refreshed entry leaves a stale item, recognised by its time.
func (ix *Index) expire(nowMs int64) {
	for ix.specHead < len(ix.specQ) {
		it := ix.specQ[ix.specHead]
		if it.until > nowMs {
			break
		}
		ix.specQ[ix.specHead] = specItem{}
		ix.specHead++
		it.r.m.specItems.Add(-1)
		if it.r.gone {
			continue
		}
		it.r.mu.Lock()
		if i, ok := it.r.hold.Get(it.key); ok && it.r.slab[i].expires(&it) {
			ix.clearSpec(it.r, it.key)
			ix.stats.SpecExpired++
		}
		ix.unlockReplica(it.r)
	}
	if ix.specHead > 4096 && ix.specHead > len(ix.specQ)/2 {
		ix.specQ = append(ix.specQ[:0], ix.specQ[ix.specHead:]...)
		ix.specHead = 0
	}
}
