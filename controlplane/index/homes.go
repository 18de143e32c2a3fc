package index

import (
	"slices"

	"github.com/kvroute/kvroute/internal/keymap"
	"github.com/kvroute/kvroute/shared/table"
)

// modelHomes are a model's homes (table format 4, shared/table/homes.go): checkpoint
// keys the table stopped listing, each with the slot of the replica whose GPU held it
// last. Where the fleet's caches cannot hold the working set, a prefix is often evicted
// everywhere between two of its requests; the filters send it back to its home, so each
// returning prefix stays on one replica (docs/rule.md, "Homes"). The control plane sees
// every proxy's placements and every engine's evictions, so every proxy and worker VM
// shares one memory.
//
// At most max keys, first in, first out: the newest departures are remembered. A key
// the table lists again is no home. Guarded by the model's mu.
type modelHomes struct {
	max  int
	at   keymap.Map[homeAt]
	ring []uint64 // the keys in the order they became homes, up to max; next is the oldest
	next int
	// left: keys whose last GPU holder let them go since the last build, with its slot
	// (setSlot); at the build, those still listed nowhere become homes.
	left []leftKey
	// changed: keys whose home changed since the last build (repeats allowed).
	changed []uint64
	// bySlot counts the homes of each slot (debug.go).
	bySlot []int
}

type homeAt struct {
	pos  uint32 // in ring
	slot uint16
}

type leftKey struct {
	key  uint64
	slot uint16
}

// DefaultMaxHomes bounds a model's homes: 131,072 checkpoint keys (a key every 4 blocks
// of 16 tokens: 8 M tokens of prefixes), 5 MB here (TestHomesAreBounded) and 1.6 MB in
// every filter's table. On the Mooncake trace at 4 replicas a proxy's own memory of
// 65,536 keys a stride of 8 blocks apart did about as well as an unbounded one
// (docs/performance.md, "Homes").
const DefaultMaxHomes = 1 << 17

// lastLeft notes that slot, the last replica whose GPU held k, let it go.
func (h *modelHomes) lastLeft(k uint64, slot uint32) {
	if h.max > 0 {
		h.left = append(h.left, leftKey{k, uint16(slot)})
	}
}

// listed: the table lists k again, so it is no home.
func (h *modelHomes) listed(k uint64) {
	if h.at.Len() > 0 {
		if at, ok := h.at.Get(k); ok {
			h.forget(k, at)
		}
	}
}

// put makes k a home on slot, in place of the oldest home when there are max.
func (h *modelHomes) put(k uint64, slot uint16) {
	if len(h.ring) < h.max {
		h.next = len(h.ring)
		h.ring = append(h.ring, k)
	} else {
		old := h.ring[h.next]
		if at, ok := h.at.Get(old); ok && int(at.pos) == h.next {
			h.forget(old, at)
		}
		h.ring[h.next] = k
	}
	if at, ok := h.at.Get(k); ok {
		h.bySlot[at.slot]--
	}
	h.at.Set(k, homeAt{pos: uint32(h.next), slot: slot})
	if int(slot) >= len(h.bySlot) {
		h.bySlot = append(h.bySlot, make([]int, int(slot)+1-len(h.bySlot))...)
	}
	h.bySlot[slot]++
	h.changed = append(h.changed, k)
	h.next = (h.next + 1) % h.max
}

// forget drops home k (at is its value).
func (h *modelHomes) forget(k uint64, at homeAt) {
	h.at.Delete(k)
	h.bySlot[at.slot]--
	h.changed = append(h.changed, k)
}

// count is the number of homes on slot.
func (h *modelHomes) count(slot uint32) int {
	if int(slot) < len(h.bySlot) {
		return h.bySlot[slot]
	}
	return 0
}

// dropSlot forgets the homes of a replica that left (its slot will be reused).
func (h *modelHomes) dropSlot(slot uint32) {
	h.drop(func(s uint16) bool { return uint32(s) == slot })
}

// dropAll forgets every home: the model has a slower tier, whose listings return its
// prefixes, and the filters credit no homes there (shared/route/homes.go creditHome).
func (h *modelHomes) dropAll() { h.drop(func(uint16) bool { return true }) }

// drop forgets the homes, and the keys let go, of the slots gone says.
func (h *modelHomes) drop(gone func(slot uint16) bool) {
	var keys []uint64
	var ats []homeAt
	for k, at := range h.at.All() {
		if gone(at.slot) {
			keys, ats = append(keys, k), append(ats, at)
		}
	}
	for i, k := range keys {
		h.forget(k, ats[i])
	}
	h.left = slices.DeleteFunc(h.left, func(l leftKey) bool { return gone(l.slot) })
}

// build makes homes of the keys let go since the last build that unlisted says the
// table lists nowhere now, whose replica is still the model's (slots), and returns what
// changed since the last build (every home when reset).
func (h *modelHomes) build(reset bool, slots []*replica, unlisted func(uint64) bool) table.HomeChanges {
	for _, l := range h.left {
		if int(l.slot) < len(slots) && slots[l.slot] != nil && unlisted(l.key) {
			h.put(l.key, l.slot)
		}
	}
	var out table.HomeChanges
	keys := h.changed
	if reset {
		keys = keys[:0]
		for k := range h.at.All() {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		if at, ok := h.at.Get(k); ok {
			out.Add(k, uint32(at.slot))
		} else if !reset {
			out.Removes = append(out.Removes, k)
		}
	}
	h.left, h.changed = reuse(h.left), reuse(keys)
	return out
}

// homesOf is the number of m's homes on slot (takes m.mu).
func (m *model) homesOf(slot uint32) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.homes.count(slot)
}

// len is the number of homes.
func (h *modelHomes) len() int { return h.at.Len() }
