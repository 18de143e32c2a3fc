// Package blocklru is a fixed-capacity LRU set of block hashes: the approximate index
// weighted-scorers keeps per endpoint (wasmtest/fleet/policy) and the pooled LRU a
// workload's arrivals are measured against (wasmtest/fleet/workload). A map into a
// slice of entries linked in use order; no allocation once full.
package blocklru

// LRU holds at most its capacity of hashes, the least recently used out first.
type LRU struct {
	cap        int
	pos        map[uint64]int32
	ents       []entry
	head, tail int32 // head: the most recently used
}

type entry struct {
	h          uint64
	prev, next int32
}

// New returns an empty LRU of capacity hashes (at least 1).
func New(capacity int) *LRU {
	return &LRU{cap: max(capacity, 1), pos: map[uint64]int32{}, head: -1, tail: -1}
}

// Has says whether h is held, without touching it.
func (l *LRU) Has(h uint64) bool {
	_, ok := l.pos[h]
	return ok
}

// Touch makes h the most recently used; false when it is not held.
func (l *LRU) Touch(h uint64) bool {
	i, ok := l.pos[h]
	if !ok {
		return false
	}
	l.unlink(i)
	l.pushFront(i)
	return true
}

// Add inserts h, which must not be held, as the most recently used; when full it evicts
// the least recently used hash and returns it.
func (l *LRU) Add(h uint64) (evicted uint64, ok bool) {
	var i int32
	if len(l.ents) < l.cap {
		i = int32(len(l.ents))
		l.ents = append(l.ents, entry{h: h})
	} else {
		i = l.tail
		evicted, ok = l.ents[i].h, true
		delete(l.pos, evicted)
		l.unlink(i)
		l.ents[i].h = h
	}
	l.pos[h] = i
	l.pushFront(i)
	return evicted, ok
}

func (l *LRU) unlink(i int32) {
	e := &l.ents[i]
	if e.prev >= 0 {
		l.ents[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next >= 0 {
		l.ents[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
}

func (l *LRU) pushFront(i int32) {
	e := &l.ents[i]
	e.prev, e.next = -1, l.head
	if l.head >= 0 {
		l.ents[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}
