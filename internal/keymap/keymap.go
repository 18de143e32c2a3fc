// Package keymap is a hash map from 64-bit keys that are already hashes (block-chain
// keys) to small values: open addressing with linear probing in one array, no hashing
// beyond a multiply, deletion by shifting back (no tombstones), growth by doubling at
// three-quarters full. A slot is the key and the value, nothing else: key 0 marks an
// empty slot, and the key 0 itself is kept beside the array.
//
// Why not a Go map: in the wasm guest a Go map's lookup is several times as slow (the
// runtime's hashing and group probing run without the native build's vector
// instructions), and a request makes hundreds (its checkpoint keys against the table's
// overlay and the proxy's own placements). BenchmarkGet has the two side by side, native
// and under wasm. Natively it is faster too, and the control plane's index keeps its
// engine blocks and holdings in it (controlplane/index).
//
// Keys are mixed with a random seed chosen per map, so prompts crafted to make their
// keys collide in the table's low bits cannot build long probe runs: an attacker does
// not know where a key lands. The array never shrinks by itself (Shrink); Bytes gives
// its size. Not safe for concurrent use.
package keymap

import (
	"iter"
	"math/bits"
	"math/rand/v2"
	"unsafe"
)

// Map maps uint64 keys to V. The zero Map is empty and ready to use.
type Map[V any] struct {
	slots []slot[V] // a power of two long, or nil
	n     int       // keys in slots (the key 0 not counted)
	seed  uint64
	shift uint8 // 64 - log2(len(slots))
	// the key 0, which cannot be in slots (it marks them empty)
	hasZero bool
	zero    V
}

type slot[V any] struct {
	key uint64 // 0: empty
	val V
}

const minSlots = 16

// Len is the number of keys.
func (m *Map[V]) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

// home is where k's probe sequence starts.
func (m *Map[V]) home(k uint64) int {
	return int(((k ^ m.seed) * 0x9E3779B97F4A7C15) >> m.shift)
}

// Get returns k's value and whether k is present. Kept small enough for Go to inline
// (cost 78 of 80; TestGetIsInlined): in the wasm guest the call cost as much as the
// lookup.
func (m *Map[V]) Get(k uint64) (v V, ok bool) {
	if k == 0 {
		return m.zero, m.hasZero // m.zero is the zero value without the key 0
	}
	if m.n != 0 {
		mask := len(m.slots) - 1
		for i := m.home(k); m.slots[i].key != 0; i = (i + 1) & mask {
			if m.slots[i].key == k {
				return m.slots[i].val, true
			}
		}
	}
	return v, false
}

// Ptr returns a pointer to k's value, valid until the next change to the map other
// than through the pointer, or nil.
func (m *Map[V]) Ptr(k uint64) *V {
	if k == 0 {
		if m.hasZero {
			return &m.zero
		}
		return nil
	}
	if m.n == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == k {
			return &s.val
		}
		if s.key == 0 {
			return nil
		}
	}
}

// Put returns a pointer to k's value, adding k with the zero value if it is absent
// (found says whether it was present). The pointer is valid as Ptr's is.
func (m *Map[V]) Put(k uint64) (v *V, found bool) {
	if k == 0 {
		found, m.hasZero = m.hasZero, true
		return &m.zero, found
	}
	if (m.n+1)*4 > len(m.slots)*3 {
		m.grow(max(2*len(m.slots), minSlots))
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == k {
			return &s.val, true
		}
		if s.key == 0 {
			s.key = k
			m.n++
			return &s.val, false
		}
	}
}

// Set makes k's value v.
func (m *Map[V]) Set(k uint64, v V) {
	p, _ := m.Put(k)
	*p = v
}

// Delete removes k, if present, and moves the later entries of its probe run back so
// that no lookup stops early at the hole.
func (m *Map[V]) Delete(k uint64) {
	if k == 0 {
		var zero V
		m.hasZero, m.zero = false, zero
		return
	}
	if m.n == 0 {
		return
	}
	mask := len(m.slots) - 1
	i := m.home(k)
	for ; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == 0 {
			return
		}
		if s.key == k {
			break
		}
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &m.slots[j]
		if s.key == 0 {
			break
		}
		// s may move to the hole at i if its home is not in (i, j] (cyclically): then
		// its probe from home passes i before it reaches j.
		h := m.home(s.key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = *s
			i = j
		}
	}
	m.slots[i] = slot[V]{}
	m.n--
}

// Clear removes every key, keeping the storage.
func (m *Map[V]) Clear() {
	clear(m.slots)
	var zero V
	m.n, m.hasZero, m.zero = 0, false, zero
}

// All yields every key and value, in no particular order. The map must not be changed
// during the iteration, except that the key just yielded may be deleted.
func (m *Map[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		if m.hasZero && !yield(0, m.zero) {
			return
		}
		// Backwards from an empty slot: a deletion moves entries of the probe run after
		// the hole, which lies between the hole and that empty slot, all yielded
		// already, and moves them back, to slots yielded already too.
		if m.n == 0 {
			return
		}
		mask := len(m.slots) - 1
		e := 0
		for m.slots[e].key != 0 {
			e++
		}
		for i := (e - 1) & mask; i != e; i = (i - 1) & mask {
			if s := &m.slots[i]; s.key != 0 && !yield(s.key, s.val) {
				return
			}
		}
	}
}

// Clone returns a copy that shares nothing with m.
func (m *Map[V]) Clone() Map[V] {
	c := *m
	if m.slots != nil {
		c.slots = append([]slot[V](nil), m.slots...)
	}
	return c
}

// Fits says whether n more keys fit the array the map has (whatever keys they are).
func (m *Map[V]) Fits(n int) bool { return (m.n+n)*4 <= len(m.slots)*3 }

// Bytes is the size of the map's array once it holds n keys: the array it has, or the
// larger one growth gives it for n.
func (m *Map[V]) Bytes(n int) int64 {
	return int64(max(len(m.slots), slotsFor(n))) * SlotBytes[V]()
}

// SlotBytes is the size of one slot of a Map[V]: a map of n keys just grown takes
// n*8/3 of them.
func SlotBytes[V any]() int64 { return int64(unsafe.Sizeof(slot[V]{})) }

// Shrink moves the keys to the array they need when that is smaller than the one they
// are in (after deletions: growth never gives memory back).
func (m *Map[V]) Shrink() {
	if size := slotsFor(m.n); size < len(m.slots) {
		m.grow(size)
	}
}

// slotsFor is the array growth gives a map of n keys: the smallest power of two, at
// least minSlots, that they fill to at most three-quarters (none for none).
func slotsFor(n int) int {
	if n <= 0 {
		return 0
	}
	return max(minSlots, 1<<bits.Len(uint((n*4+2)/3-1)))
}

// grow moves the keys to a new array of size slots (0: none).
func (m *Map[V]) grow(size int) {
	old := m.slots
	m.slots, m.n = nil, 0
	if size > 0 {
		m.slots = make([]slot[V], size)
		m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	}
	if old == nil {
		m.seed = rand.Uint64()
	}
	for i := range old {
		if s := &old[i]; s.key != 0 {
			p, _ := m.Put(s.key)
			*p = s.val
		}
	}
}
