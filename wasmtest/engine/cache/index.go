package cache

import "math/bits"

// index maps cached block hashes to block ids: open addressing with linear probing,
// load factor <= 1/2, and backward-shift deletion. The pool evicts and inserts a block
// for almost every block it computes; Go's map keeps tombstones for deletes and its
// probes lengthen under that churn, this table never does.
type index struct {
	keys  []uint64
	ids   []int32 // -1 = empty slot
	shift uint
	n     int
}

func newIndex(maxEntries int) *index {
	b := bits.Len(uint(2*maxEntries - 1)) // capacity: a power of two >= 2 x entries
	b = max(b, 4)
	x := &index{keys: make([]uint64, 1<<b), ids: make([]int32, 1<<b), shift: uint(64 - b)}
	x.clear()
	return x
}

// home is a key's preferred slot: Fibonacci hashing, so small or patterned hashes spread too.
func (x *index) home(h uint64) int { return int((h * 0x9e3779b97f4a7c15) >> x.shift) }

func (x *index) mask() int { return len(x.ids) - 1 }

func (x *index) get(h uint64) (int32, bool) {
	for i := x.home(h); ; i = (i + 1) & x.mask() {
		id := x.ids[i]
		if id < 0 {
			return -1, false
		}
		if x.keys[i] == h {
			return id, true
		}
	}
}

// put sets h -> id, replacing an existing entry for h.
func (x *index) put(h uint64, id int32) {
	for i := x.home(h); ; i = (i + 1) & x.mask() {
		if x.ids[i] < 0 {
			x.keys[i], x.ids[i] = h, id
			x.n++
			return
		}
		if x.keys[i] == h {
			x.ids[i] = id
			return
		}
	}
}

// del removes h if present, shifting later entries of its probe run back.
func (x *index) del(h uint64) {
	m := x.mask()
	i := x.home(h)
	for ; ; i = (i + 1) & m {
		if x.ids[i] < 0 {
			return
		}
		if x.keys[i] == h {
			break
		}
	}
	x.n--
	for j := (i + 1) & m; x.ids[j] >= 0; j = (j + 1) & m {
		k := x.home(x.keys[j])
		// Entry j may move to the hole at i unless its home lies cyclically in (i, j].
		if (i < j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		x.keys[i], x.ids[i] = x.keys[j], x.ids[j]
		i = j
	}
	x.ids[i] = -1
}

func (x *index) len() int { return x.n }

func (x *index) clear() {
	for i := range x.ids {
		x.ids[i] = -1
	}
	x.n = 0
}
