package index

import (
	"maps"
	"time"

	"github.com/kvroute/kvroute/internal/keymap"
)

// Maps (Go's and keymaps alike) never shrink and slices keep their capacity, so memory
// would stay at a flood's peak after its entries expired; Reclaim rebuilds what shrank
// to a quarter of its high-water mark.

const reclaimMin = 4096 // structures smaller than this are left alone

// reuse empties a list for the next interval, keeping its array while this one used a
// quarter of it or more (a steady stream reuses it) and giving it back when it is large
// and was mostly unused (one flood's worth should not stay allocated).
func reuse[T any](s []T) []T {
	if c := cap(s); c >= reclaimMin && c > 4*len(s) {
		return nil
	}
	return s[:0]
}

// hwmKey names one structure whose high-water mark is tracked.
type hwmKey struct {
	r    *replica
	m    *model
	rank int
	what uint8
}

const (
	hwmHold = iota
	hwmKeys
	hwmBlocks
	hwmMulti
)

func (ix *Index) noteHWM(k hwmKey, n int) {
	if n < reclaimMin {
		return
	}
	ix.budget.mu.Lock()
	defer ix.budget.mu.Unlock()
	if ix.budget.hwm == nil {
		ix.budget.hwm = map[hwmKey]int{}
	}
	if n > ix.budget.hwm[k] {
		ix.budget.hwm[k] = n
	}
}

// Reclaim recounts the budget, takes back from models past their share what active
// models are owed of theirs (shares.go), and gives memory back: every map that shrank to a
// quarter of its high-water mark is moved to the array its entries need (a replica's
// holdings together with their slab), and the speculative queue's array is cut to what it holds. The control plane
// calls it after each Flush (which is where speculative entries expire).
func (ix *Index) Reclaim(now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.budget.mu.Lock()
	ix.recount(now)
	ix.budget.mu.Unlock()
	ix.reclaimShares(time.Now()) // shares.go: active models get their shares back
	// Record the current sizes first: the maps grow between calls.
	for _, m := range ix.models {
		m.mu.Lock()
		n := m.keys.Len()
		m.mu.Unlock()
		ix.noteHWM(hwmKey{m: m, what: hwmKeys}, n)
	}
	for _, r := range ix.replicas {
		r.mu.Lock()
		ix.noteHWM(hwmKey{r: r, what: hwmHold}, max(r.hold.Len(), len(r.slab)))
		for _, rk := range r.ranks {
			ix.noteHWM(hwmKey{r: r, rank: rk.num, what: hwmBlocks}, rk.blocks.Len())
			ix.noteHWM(hwmKey{r: r, rank: rk.num, what: hwmMulti}, rk.multi.Len())
		}
		r.mu.Unlock()
	}
	// The marks are copied out: budget.mu comes after the replica and model locks.
	ix.budget.mu.Lock()
	hwm := maps.Clone(ix.budget.hwm)
	ix.budget.mu.Unlock()
	forget := func(k hwmKey) {
		ix.budget.mu.Lock()
		delete(ix.budget.hwm, k)
		ix.budget.mu.Unlock()
	}
	for k, peak := range hwm {
		switch {
		case k.r != nil && k.r.gone, k.m != nil && ix.models[k.m.name] != k.m:
			forget(k)
			continue
		}
		if k.r != nil {
			k.r.mu.Lock()
		} else {
			k.m.mu.Lock()
		}
		if ix.reclaimOne(k, peak) {
			ix.budget.reclaims++
			forget(k)
		}
		if k.r != nil {
			ix.unlockReplica(k.r)
		} else {
			k.m.mu.Unlock()
		}
	}
	if live := len(ix.specQ) - ix.specHead; cap(ix.specQ) >= reclaimMin && live*4 <= cap(ix.specQ) {
		q := make([]specItem, live, max(live, 64))
		copy(q, ix.specQ[ix.specHead:])
		ix.specQ, ix.specHead = q, 0
		ix.budget.reclaims++
	}
}

// reclaimOne rebuilds the structure k names when it shrank to a quarter of its peak,
// and says whether it did. Caller holds the replica's (or model's) lock.
func (ix *Index) reclaimOne(k hwmKey, peak int) bool {
	var rk *rank
	if k.r != nil {
		rk = k.r.rankOf(k.rank)
	}
	var cur int
	switch k.what {
	case hwmHold:
		cur = k.r.hold.Len()
	case hwmKeys:
		cur = k.m.keys.Len()
	case hwmBlocks:
		if rk != nil {
			cur = rk.blocks.Len()
		}
	case hwmMulti:
		if rk != nil {
			cur = rk.multi.Len()
		}
	}
	if cur*4 > peak {
		return false
	}
	switch k.what {
	case hwmHold:
		compactHoldings(k.r)
	case hwmKeys:
		k.m.keys.shrink()
	case hwmBlocks:
		if rk != nil {
			rk.blocks.Shrink()
			rk.peakNoted = 0 // the mark is forgotten: the next peak is told again
		}
	case hwmMulti:
		if rk != nil {
			rk.multi.Shrink()
		}
	}
	return true
}

// compactHoldings rebuilds r's holdings map and slab with only the live holdings,
// renumbering the LRU links.
func compactHoldings(r *replica) {
	remap := make([]int32, len(r.slab))
	for i := range remap {
		remap[i] = -1
	}
	slab := make([]holding, 0, r.hold.Len())
	var hold keymap.Map[int32]
	for k, i := range r.hold.All() {
		remap[i] = int32(len(slab))
		hold.Set(k, int32(len(slab)))
		slab = append(slab, r.slab[i])
	}
	fix := func(i int32) int32 {
		if i < 0 {
			return -1
		}
		return remap[i]
	}
	for j := range slab {
		slab[j].prev, slab[j].next = fix(slab[j].prev), fix(slab[j].next)
	}
	r.head, r.tail = fix(r.head), fix(r.tail)
	r.slab, r.hold, r.freeIdx = slab, hold, nil
}
