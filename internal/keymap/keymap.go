// Package keymap is a hash map from 64-bit keys that are already hashes (block-chain
// keys) to small values, for the request path compiled to wasm: open addressing with
// linear probing in one array, no hashing beyond a multiply, deletion by shifting back
// (no tombstones), growth by doubling at three-quarters full.
//
// Why not a Go map: in the wasm guest each lookup in a Go map cost about 300 ns (the
// runtime's hashing and group probing run without the native build's vector
// instructions), and a request makes hundreds (its checkpoint keys against the table's
// overlay and the proxy's own placements). BenchmarkGet has the two side by side, native
// and under wasm.
//
// Keys are mixed with a random seed chosen per map, so prompts crafted to make their
// keys collide in the table's low bits cannot build long probe runs: an attacker does
// not know where a key lands. Not safe for concurrent use.
package keymap

import (
	"iter"
	"math/bits"
	"math/rand/v2"
)

// Map maps uint64 keys to V. The zero Map is empty and ready to use.
type Map[V any] struct {
	slots []slot[V] // a power of two long, or nil
	n     int
	seed  uint64
	shift uint8 // 64 - log2(len(slots))
}

type slot[V any] struct {
	key  uint64
	val  V
	used bool
}

const minSlots = 16

// Len is the number of keys.
func (m *Map[V]) Len() int { return m.n }

// home is where k's probe sequence starts.
func (m *Map[V]) home(k uint64) int {
	return int(((k ^ m.seed) * 0x9E3779B97F4A7C15) >> m.shift)
}

// Get returns k's value and whether k is present.
func (m *Map[V]) Get(k uint64) (V, bool) {
	if m.n == 0 {
		var zero V
		return zero, false
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			var zero V
			return zero, false
		}
		if s.key == k {
			return s.val, true
		}
	}
}

// Ptr returns a pointer to k's value, valid until the next Set or Delete, or nil.
func (m *Map[V]) Ptr(k uint64) *V {
	if m.n == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			return nil
		}
		if s.key == k {
			return &s.val
		}
	}
}

// Set makes k's value v.
func (m *Map[V]) Set(k uint64, v V) {
	if (m.n+1)*4 > len(m.slots)*3 {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			*s = slot[V]{key: k, val: v, used: true}
			m.n++
			return
		}
		if s.key == k {
			s.val = v
			return
		}
	}
}

// Delete removes k, if present, and moves the later entries of its probe run back so
// that no lookup stops early at the hole.
func (m *Map[V]) Delete(k uint64) {
	if m.n == 0 {
		return
	}
	mask := len(m.slots) - 1
	i := m.home(k)
	for ; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if !s.used {
			return
		}
		if s.key == k {
			break
		}
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &m.slots[j]
		if !s.used {
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
	m.n = 0
}

// All yields every key and value, in no particular order. The map must not be changed
// during the iteration.
func (m *Map[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		for i := range m.slots {
			if s := &m.slots[i]; s.used && !yield(s.key, s.val) {
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

func (m *Map[V]) grow() {
	old := m.slots
	size := max(2*len(old), minSlots)
	m.slots = make([]slot[V], size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	if old == nil {
		m.seed = rand.Uint64()
	}
	m.n = 0
	for i := range old {
		if s := &old[i]; s.used {
			m.Set(s.key, s.val)
		}
	}
}
