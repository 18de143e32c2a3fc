package index

import (
	"iter"
	"math/rand/v2"
	"slices"
	"unsafe"

	"github.com/kvroute/kvroute/internal/keymap"
)

// modelKeys is a model's key set: for every key some replica holds on its GPU, the
// replicas' slots; and the keys changed since the last table build (dirty), each
// listed once.
//
// Every slot change of every KV event lands here, under the model's lock, so it is
// one keymap probe: the entry carries its own changed mark, where Go maps for the
// holders and the changed set would make it three map operations
// (BenchmarkIngestEndToEnd's profile). The keys are spread over keyShards keymaps
// so that growth doubles one shard's array at a time, not the whole set's at once
// (a model's keys can be the index's largest structure); the shard is picked by a
// seeded mix of the key, as each keymap picks its slot, so prompts crafted to
// collide cannot fill one shard.
type modelKeys struct {
	seed   uint64
	shards []keymap.Map[keyState] // keyShards of them, made on first use
	dirty  []uint64
}

const (
	keyShardBits = 8
	keyShards    = 1 << keyShardBits
)

// keyState is one key's GPU holders, sorted, as a pointer and a length so that a
// keymap slot stays 24 bytes (a slice and a flag would make it 40). A list is never
// changed in place: a change makes a new one (copies of a few slots: most keys have
// one holder, and those point into oneHolder).
type keyState struct {
	first *uint16
	n     uint32
	dirty bool // listed in modelKeys.dirty
}

func (s *keyState) slots() []uint16 {
	if s.n == 0 {
		return nil
	}
	return unsafe.Slice(s.first, s.n)
}

func (mk *modelKeys) shard(k uint64) *keymap.Map[keyState] {
	if mk.shards == nil {
		mk.shards = make([]keymap.Map[keyState], keyShards)
		mk.seed = rand.Uint64()
	}
	return &mk.shards[((k^mk.seed)*0x9E3779B97F4A7C15)>>(64-keyShardBits)]
}

// get returns k's GPU holders (nil when none).
func (mk *modelKeys) get(k uint64) []uint16 {
	if mk.shards == nil {
		return nil
	}
	st, _ := mk.shard(k).Get(k)
	return st.slots()
}

// Len is the number of entries: keys held, and keys changed since the last build
// that no replica holds any more (kept until the build publishes their removal).
func (mk *modelKeys) Len() int {
	n := 0
	for i := range mk.shards {
		n += mk.shards[i].Len()
	}
	return n
}

// held yields every key some replica holds on its GPU.
func (mk *modelKeys) held() iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		for i := range mk.shards {
			for k, st := range mk.shards[i].All() {
				if st.n > 0 && !yield(k) {
					return
				}
			}
		}
	}
}

// markDirty lists k as changed, once until the next build. The pointer is k's entry.
func (mk *modelKeys) markDirty(k uint64, st *keyState) {
	if !st.dirty {
		st.dirty = true
		mk.dirty = append(mk.dirty, k)
	}
}

// touch lists k as changed (a slower tier's holders changed), adding an entry without
// GPU holders if k has none.
func (mk *modelKeys) touch(k uint64) {
	st, _ := mk.shard(k).Put(k)
	mk.markDirty(k, st)
}

// built forgets the changed set once a build has published it: entries without
// holders go, and the list's array is kept or given back (reuse).
func (mk *modelKeys) built() {
	for _, k := range mk.dirty {
		sh := mk.shard(k)
		if st := sh.Ptr(k); st != nil {
			st.dirty = false
			if st.n == 0 {
				sh.Delete(k)
			}
		}
	}
	mk.dirty = reuse(mk.dirty)
}

// Bytes prices the key set once fresh keys more are added: the shards' arrays, each
// as if it took its even share of them, rounded up (a seeded mix spreads keys evenly;
// a shard doubles all at once), and the changed list's array (twice the entries it
// will list, if they do not fit the one it has).
func (mk *modelKeys) Bytes(fresh int) int64 {
	share := (fresh + keyShards - 1) / keyShards
	var b int64
	if mk.shards == nil {
		if fresh > 0 {
			var empty keymap.Map[keyState]
			b = keyShards * (int64(unsafe.Sizeof(empty)) + keymapBytes(&empty, share))
		}
	} else {
		b = keyShards * int64(unsafe.Sizeof(mk.shards[0]))
		for i := range mk.shards {
			b += keymapBytes(&mk.shards[i], mk.shards[i].Len()+share)
		}
	}
	list := cap(mk.dirty)
	if n := len(mk.dirty) + fresh; n > list {
		list = 2 * n // append's growth, at most doubling
	}
	return b + sizeClass(8*int64(list))
}

// shrink moves every shard to the array its keys need.
func (mk *modelKeys) shrink() {
	for i := range mk.shards {
		mk.shards[i].Shrink()
	}
}

// setSlot changes whether slot holds k on its GPU; placed, when slot lets k go, says a
// proxy placed it there (a home if slot was its last holder). Caller holds m.mu.
func (m *model) setSlot(k uint64, slot uint32, on, placed bool) {
	sh := m.keys.shard(k)
	var st *keyState
	if on {
		st, _ = sh.Put(k)
	} else if st = sh.Ptr(k); st == nil {
		return
	}
	s := st.slots()
	j, found := slices.BinarySearch(s, uint16(slot))
	if on == found {
		return
	}
	own := len(s) > 0 && !sharedList(s)
	var next []uint16
	switch {
	case on && len(s) == 0 && slot < uint32(len(oneHolder)):
		next = oneHolder[slot : slot+1 : slot+1]
	case on:
		next = make([]uint16, len(s)+1)
		copy(next, s[:j])
		next[j] = uint16(slot)
		copy(next[j+1:], s[j:])
	case len(s) == 1:
		next = nil
		if placed && len(m.tiers) == 0 {
			m.homes.lastLeft(k, slot) // homes.go: a home if no tier lists it at the build
		}
	case len(s) == 2 && s[1-j] < uint16(len(oneHolder)):
		o := s[1-j]
		next = oneHolder[o : o+1 : o+1]
	default:
		next = make([]uint16, len(s)-1)
		copy(next, s[:j])
		copy(next[j:], s[j+1:])
	}
	if nown := len(next) > 0 && !sharedList(next); nown != own {
		if nown {
			m.lists++
		} else {
			m.lists--
		}
	}
	st.first, st.n = unsafe.SliceData(next), uint32(len(next))
	m.keys.markDirty(k, st)
}
