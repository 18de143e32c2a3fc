package index

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"
)

// Models' shares of the global limits (--max-keys, --max-index-bytes). Each model's
// share is its replicas' part of all replicas'. A model may hold more than its share,
// borrowing what the others do not use: an admission past the model's share must leave
// free, of the global room, what every other active model (one that asked for room in
// the last shareIdle) has not used of its own share. An admission within the model's
// share is bounded by the global room only; when that is short because another model
// borrowed while this one was idle, Reclaim takes the borrower's reported keys back,
// confirmed (least recently confirmed first) then speculative, down to its share or
// until the room is there, at the next build (the control plane reclaims after each,
// every 50 ms). What a borrower holds from KV events is not taken: its new blocks are
// not admitted past its share while the others are active, so it shrinks to its share
// as its engines evict. Drops past a share are counted under reason model_share.
//
// So one model's reports can fill its own share and, while the others are idle, theirs,
// but never the share of a model that is using it.

// shareIdle: a model that asked for no room for this long lends what it does not use of
// its share. A model under load stores KV blocks or gets reports every few seconds; a
// minute is also how long a speculative entry lives (Config.SpecTTL's default).
const shareIdle = time.Minute

// usage is what one scope (the whole index, or one model) holds against the limits:
// entries and bytes as of the last recount plus what was admitted since. Safe for
// concurrent use.
type usage struct {
	used     atomic.Int64 // entries at the last recount plus those admitted since
	countedN atomic.Int64 // entries at the last recount
	bytes    atomic.Int64 // bytes at the last recount (bytes.go)
	extra    atomic.Int64 // bytes admitted since beyond worstEntry an entry: expiry items, keymap growth
}

// set records a recount.
func (u *usage) set(entries, bytes int64) {
	u.used.Store(entries)
	u.countedN.Store(entries)
	u.bytes.Store(bytes)
	u.extra.Store(0)
}

// charge records an admission of entries and bytes beyond worstEntry each.
func (u *usage) charge(entries, bytes int64) {
	if entries != 0 {
		u.used.Add(entries)
	}
	if bytes != 0 {
		u.extra.Add(bytes)
	}
}

// bytesNow is the bytes at the last recount plus worstEntry for each entry admitted
// since, plus the bytes charged since.
func (u *usage) bytesNow() int64 {
	return u.bytes.Load() + max(u.used.Load()-u.countedN.Load(), 0)*worstEntry + u.extra.Load()
}

// limits are an entry and a byte limit (bytes 0: none).
type limits struct{ keys, bytes int64 }

// left is what limits leave: entries and bytes (noBytes when there is no byte limit).
type left struct{ keys, bytes int64 }

const noBytes = math.MaxInt64 / 4

func (u *usage) left(lim limits) left {
	l := left{keys: lim.keys - u.used.Load(), bytes: noBytes}
	if lim.bytes > 0 {
		l.bytes = lim.bytes - u.bytesNow()
	}
	return l
}

// entries is how many new entries l admits when admitting them also allocates grow
// bytes at once: worstEntry each besides.
func (l left) entries(grow int64) int64 {
	if l.bytes >= noBytes/2 {
		return l.keys
	}
	return min(l.keys, (l.bytes-grow)/worstEntry)
}

func (ix *Index) limits() limits {
	return limits{int64(ix.cfg.Budget.MaxKeys), ix.cfg.Budget.MaxBytes}
}

// shareOf is m's share of the limits: its replicas' part of all replicas'.
func (ix *Index) shareOf(m *model) limits {
	lim := ix.limits()
	w, all := m.weight.Load(), ix.budget.weight.Load()
	if all <= 0 || w >= all {
		return lim
	}
	part := float64(w) / float64(all)
	return limits{int64(float64(lim.keys) * part), int64(float64(lim.bytes) * part)}
}

// modelLeft is what model m may still add: the global room or, when that is more than
// what m has left of its share, what the global room leaves besides the reserve of
// the other active models (and at least what m has left of its share). limited says
// whether the share made it less than the global room. nowNs is the wall clock.
func (ix *Index) modelLeft(m *model, nowNs int64) (l left, limited bool) {
	g := ix.budget.left(ix.limits())
	if m.weight.Load() >= ix.budget.weight.Load() {
		return g, false // the only model
	}
	own := m.use.left(ix.shareOf(m))
	if own.keys >= g.keys && own.bytes >= g.bytes {
		return g, false
	}
	res := ix.reserve(m, nowNs)
	l = left{keys: min(g.keys, max(own.keys, g.keys-res.keys)), bytes: min(g.bytes, max(own.bytes, g.bytes-res.bytes))}
	return l, l != g
}

// reserve sums what the active models other than m have not used of their shares.
func (ix *Index) reserve(m *model, nowNs int64) left {
	var res left
	hasBytes := ix.cfg.Budget.MaxBytes > 0
	for _, o := range *ix.modelList.Load() {
		if o == m || !o.active(nowNs) {
			continue
		}
		ol := o.use.left(ix.shareOf(o))
		res.keys += max(ol.keys, 0)
		if hasBytes {
			res.bytes += max(ol.bytes, 0)
		}
	}
	return res
}

// active says whether m asked for room within shareIdle of nowNs.
func (m *model) active(nowNs int64) bool { return nowNs-m.wanted.Load() <= int64(shareIdle) }

// roomFor is how many new entries the limits let model m add when admitting them also
// allocates grow bytes at once, and the reason when fewer than want: reasonGlobal, or
// reasonShare when m's share bound. The running counts only grow between recounts
// (removals are not tracked), so a shortfall triggers a recount, at most every
// recountEvery. now is when the input arrived (the wall clock).
func (ix *Index) roomFor(m *model, want int, grow int64, now time.Time) (int, string) {
	nowNs := now.UnixNano()
	if want > 0 && nowNs-m.wanted.Load() > int64(time.Second) {
		m.wanted.Store(nowNs) // a store a second at most: the event path reads it
	}
	room, why := ix.modelRoom(m, want, grow, nowNs)
	if room < int64(want) {
		ix.recountSoon()
		room, why = ix.modelRoom(m, want, grow, nowNs)
	}
	return int(room), why
}

// modelRoom is roomFor without the recount. Within m's share, the global room decides
// whether want fits and how much does: what the others reserve is not looked up.
func (ix *Index) modelRoom(m *model, want int, grow, nowNs int64) (int64, string) {
	if m.weight.Load() < ix.budget.weight.Load() && m.use.left(ix.shareOf(m)).entries(grow) >= int64(want) {
		return ix.budget.left(ix.limits()).entries(grow), reasonGlobal
	}
	l, limited := ix.modelLeft(m, nowNs)
	if limited {
		return l.entries(grow), reasonShare
	}
	return l.entries(grow), reasonGlobal
}

// charge records n entries, and bytes beyond worstEntry each, admitted for model m.
func (ix *Index) charge(m *model, n, bytes int64) {
	ix.budget.charge(n, bytes)
	m.use.charge(n, bytes)
}

// reclaimShares gives the active models their shares back: when the global room is
// less than what they have left of their shares, the models past their own share lose
// reported keys (takeBack) until it is not, or they are down to their share. Caller
// holds Index.mu and no other lock.
func (ix *Index) reclaimShares(now time.Time) {
	models := *ix.modelList.Load()
	if len(models) < 2 {
		return
	}
	nowNs := now.UnixNano()
	var owed left
	for _, m := range models {
		if m.active(nowNs) {
			l := m.use.left(ix.shareOf(m))
			owed.keys, owed.bytes = owed.keys+max(l.keys, 0), owed.bytes+max(l.bytes, 0)
		}
	}
	g := ix.budget.left(ix.limits())
	need := owed.keys - g.keys
	if ix.cfg.Budget.MaxBytes > 0 {
		need = max(need, (owed.bytes-g.bytes+worstEntry-1)/worstEntry)
	}
	var freed int64
	for _, m := range models {
		if need <= freed {
			break
		}
		if over := -m.use.left(ix.shareOf(m)).entries(0); over > 0 {
			freed += ix.takeBack(m, min(need-freed, over))
		}
	}
	if freed > 0 {
		ix.budget.mu.Lock()
		ix.budget.shareReclaimed += uint64(freed)
		ix.recount(now)
		ix.budget.mu.Unlock()
	}
}

// takeBack drops up to n of model m's reported keys, the least recently confirmed of
// each replica in turn, then speculative entries, soonest to expire first; it returns
// the entries freed (keys that KV events also hold stay). Caller holds Index.mu.
func (ix *Index) takeBack(m *model, n int64) int64 {
	var freed int64
	for progress := true; progress && freed < n; {
		progress = false
		left := 0 // replicas not yet visited in this round
		for _, r := range m.slots {
			if r != nil {
				left++
			}
		}
		for _, r := range m.slots {
			if r == nil || freed >= n {
				continue
			}
			quota := (n - freed + int64(left) - 1) / int64(left) // an even part of what is left
			left--
			r.mu.Lock()
			before := r.hold.Len()
			for r.tail >= 0 && int64(before-r.hold.Len()) < quota {
				ix.evictTail(r)
			}
			got := int64(before - r.hold.Len())
			ix.unlockReplica(r)
			freed += got
			progress = progress || got > 0
		}
	}
	for i := ix.specHead; i < len(ix.specQ) && freed < n; i++ {
		it := ix.specQ[i]
		if it.r.m != m || it.r.gone {
			continue
		}
		it.r.mu.Lock()
		before := it.r.hold.Len()
		if j, ok := it.r.hold.Get(it.key); ok && it.r.slab[j].expires(&it) {
			ix.clearSpec(it.r, it.key)
		}
		freed += int64(before - it.r.hold.Len())
		ix.unlockReplica(it.r)
	}
	return freed
}

// specItemBytes is what one expiry item of the speculative queue takes.
const specItemBytes = int64(unsafe.Sizeof(specItem{}))
