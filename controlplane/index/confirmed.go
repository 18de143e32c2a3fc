package index

import (
	"hash/maphash"
	"time"
)

// Confirmed keys: a replica's LRU of reported keys (holdings.go) holds what successful
// outcomes confirmed. Two rules bound what one reporter can do with it:
//
//   - Age. A key no outcome confirmed again within ConfirmedTTL leaves, as a speculative
//     entry does after SpecTTL, whatever engine evictions or capacity did meanwhile
//     (expireConfirmed), and gives its budget back.
//   - Owners. Each key remembers the reporter (the report batch's proxy) that confirmed it
//     last. When a reporter's confirmation needs room in a full LRU, the keys that go
//     are, from the least recently used end, the reporter's own or those of a reporter
//     holding more than its fair share (the LRU's keys over the reporters holding some,
//     the newcomer counted), never those of one within its share (evictor).
//
// A reporter is named by the batch's proxy field, which the sender sets: the shares hold
// between proxies that report under their own names, not against one that makes up many.

// reporterID names a report batch's sender (its proxy field) by a seeded hash, so the
// index keeps no sender's string and a sender cannot pick a name that collides with
// another's. Never 0.
func (ix *Index) reporterID(proxy string) uint64 {
	return maphash.String(ix.seed, proxy) | 1
}

// stamp is a confirmation time: Unix seconds mod 2^16. An age is right within 9 hours
// either way (a build reads its clock before it takes the index's lock, so a report
// applied meanwhile can be stamped a second after it), so ConfirmedTTL is capped at
// maxConfirmedTTL and the expiry sweeps every second.
type stamp uint16

const maxConfirmedTTL = 8 * time.Hour

func stampOf(t time.Time) stamp { return stamp(t.Unix()) }

// age is how many seconds before now s was stamped (negative: after).
func (s stamp) age(now stamp) int64 { return int64(int16(now - s)) }

// owners are the reporters whose keys a replica's LRU holds, by slot: 1 to maxOwners
// for the first reporters seen (a slot is reused once its keys are gone), 0 for the
// reporters beyond, which share it.
type owners struct {
	ids    []uint64 // the reporter of slot i+1
	counts []int32  // LRU keys per slot
	active int      // slots with keys
}

const maxOwners = 255

// slot returns the owner slot of reporter id on this replica.
func (o *owners) slot(id uint64) uint8 {
	free := -1
	for i, x := range o.ids {
		if x == id {
			return uint8(i + 1)
		}
		if free < 0 && o.counts[i+1] == 0 {
			free = i
		}
	}
	switch {
	case free >= 0:
		o.ids[free] = id
		return uint8(free + 1)
	case len(o.ids) < maxOwners:
		if o.counts == nil {
			o.counts = []int32{0}
		}
		o.ids, o.counts = append(o.ids, id), append(o.counts, 0)
		return uint8(len(o.ids))
	}
	return 0
}

func (o *owners) add(slot uint8, d int32) {
	if o.counts == nil {
		o.counts = []int32{0}
	}
	before := o.counts[slot]
	o.counts[slot] += d
	switch after := o.counts[slot]; {
	case before == 0 && after > 0:
		o.active++
	case before > 0 && after == 0:
		o.active--
	}
}

func (o *owners) count(slot uint8) int32 {
	if int(slot) >= len(o.counts) {
		return 0
	}
	return o.counts[slot]
}

// evictor picks the keys that go when owner slot p's confirmation needs room in r's
// LRU. It walks from the least recently used end, resuming where its last victim was,
// so one confirmation's evictions walk the LRU about once however many keys within
// their owners' share lie at its end.
type evictor struct {
	r   *replica
	p   uint8
	cur int32
}

func newEvictor(r *replica, p uint8) *evictor { return &evictor{r: r, p: p, cur: r.tail} }

// evict drops one key p may take from the LRU, to the replica's slower tier when
// toTier (the GPU's capacity made room: evictToTier) and out of the index otherwise (the
// key budget); false when the LRU is empty. Some key always qualifies: the LRU's keys
// over its owners, p counted, is the mean of their counts, so unless p holds none some
// other owner holds more than that, and if all hold exactly that, p's own keys go.
func (e *evictor) evict(ix *Index, toTier bool) bool {
	r := e.r
	for pass := 0; pass < 2; pass++ {
		for i := e.cur; i >= 0 && r.slab[i].flags&inLRU != 0; i = r.slab[i].prev {
			if e.takes(r.slab[i].owner) {
				e.cur = r.slab[i].prev
				if toTier {
					ix.evictToTier(r, i)
				} else {
					ix.evictAt(r, i)
				}
				return true
			}
		}
		e.cur = r.tail // evictions lowered the share: what was skipped may qualify now
	}
	return false
}

// takes says whether a key of owner slot o may go for p: p's own, or o holds more than
// its fair share of the LRU.
func (e *evictor) takes(o uint8) bool {
	if o == e.p {
		return true
	}
	ow := &e.r.owners
	n := int64(ow.active)
	if ow.count(e.p) == 0 {
		n++
	}
	return int64(ow.count(o))*n > int64(e.r.lruText+e.r.lruTok)
}

// expireConfirmed drops the reported keys confirmed ConfirmedTTL or longer ago, at most
// once a second. Keys enter the LRU at its head when confirmed, so the stale ones are at
// its end; the keys a GPU's evictions moved to a slower tier (tiers.go) age the same way.
// Caller holds Index.mu.
func (ix *Index) expireConfirmed(now time.Time) {
	sec := now.Unix()
	if sec == ix.swept {
		return
	}
	ix.swept = sec
	ttl, at := int64(ix.cfg.ConfirmedTTL/time.Second), stampOf(now)
	for _, r := range ix.replicas {
		r.mu.Lock()
		for r.tail >= 0 && r.slab[r.tail].confirmed.age(at) >= ttl {
			ix.evictTail(r)
			ix.stats.ConfirmedExpired++
		}
		for el := r.off.l.Back(); el != nil && el.Value.(offKey).confirmed.age(at) >= ttl; el = r.off.l.Back() {
			ix.offEvictTail(r)
			ix.stats.ConfirmedExpired++
		}
		ix.unlockReplica(r)
	}
}
