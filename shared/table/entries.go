// A model's entries in memory: a sorted key array with an interned replica set per key,
// and the overlay map that absorbs deltas until it is merged back.

package table

import (
	"encoding/binary"
	"maps"
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute/internal/keymap"
)

// entries: sorted base arrays plus an overlay of changes since the last merge.
type entries struct {
	keys []uint64           // sorted, unique
	sets []uint32           // set id per key
	over keymap.Map[uint32] // newer value per key; tombstone = removed
	pool setPool
	// live counts keys that exist (base minus tombstoned plus overlay-only).
	live int
	// index[b] is the first base key whose top bits are b (index has one more entry than
	// buckets): see buildIndex.
	index []uint32
	shift uint8
}

const tombstone = ^uint32(0)

func (e *entries) reset() {
	e.keys, e.sets, e.over, e.live, e.index = nil, nil, keymap.Map[uint32]{}, 0, nil
	e.pool = setPool{}
}

// capShared makes e, a copy of another model's entries, safe to change while the
// other is read: the overlay and the pool's index are copied, and the shared slices
// capped, so an append never writes into memory the original still reads. The sorted
// base arrays are only ever replaced (compact), never written, so they stay shared.
func (e *entries) capShared() {
	e.keys = e.keys[:len(e.keys):len(e.keys)]
	e.sets = e.sets[:len(e.sets):len(e.sets)]
	e.over = e.over.Clone()
	e.pool = setPool{
		data: e.pool.data[:len(e.pool.data):len(e.pool.data)],
		off:  e.pool.off[:len(e.pool.off):len(e.pool.off)],
		ids:  maps.Clone(e.pool.ids),
	}
}

// indexKeysPerBucket sizes the index: about four keys a bucket (32 bytes, a cache line),
// so the index costs about a byte per key.
const indexKeysPerBucket = 4

// buildIndex indexes the sorted base keys by their top bits. Keys are hashes, spread
// evenly, so base reads one bucket of about four keys where a binary search over the
// whole array took log2(n) steps, most of them cache misses (17 for the 183,000 keys of a
// 1,000-replica table), and each step costs several times more in the wasm guest. A
// bucket is itself binary-searched: keys crafted to share their top bits make a lookup
// no slower than before, not a linear scan.
func (e *entries) buildIndex() {
	n := len(e.keys)
	if n < 4*indexKeysPerBucket {
		e.index = nil
		return
	}
	b := bits.Len(uint(n/indexKeysPerBucket)) - 1 // 2^b buckets, b >= 2
	e.shift = uint8(64 - b)
	index := make([]uint32, 1<<b+1)
	j := 0
	for bucket := range 1 << b {
		for j < n && e.keys[j]>>e.shift < uint64(bucket) {
			j++
		}
		index[bucket] = uint32(j)
	}
	index[1<<b] = uint32(n)
	e.index = index
}

func (e *entries) len() int { return e.live }

func (e *entries) base(key uint64) (uint32, bool) {
	keys, lo, hi := e.keys, 0, len(e.keys)
	if e.index != nil {
		b := key >> e.shift
		lo, hi = int(e.index[b]), int(e.index[b+1])
	}
	// The binary search written out: in the wasm guest the call to slices.BinarySearch
	// costs about as much as the search (BenchmarkMatch500Blocks, under wazero).
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if keys[mid] < key {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(keys) && keys[lo] == key {
		return e.sets[lo], true
	}
	return 0, false
}

func (e *entries) get(key uint64) (uint32, bool) {
	if id, ok := e.over.Get(key); ok {
		return id, id != tombstone
	}
	return e.base(key)
}

func (e *entries) upsert(key uint64, slots []uint32) {
	_, existed := e.get(key)
	if !existed {
		e.live++
	}
	e.over.Set(key, e.pool.intern(slots))
	e.maybeCompact()
}

func (e *entries) remove(key uint64) {
	if _, existed := e.get(key); !existed {
		return
	}
	e.live--
	if _, inBase := e.base(key); inBase {
		e.over.Set(key, tombstone)
	} else {
		e.over.Delete(key)
	}
	e.maybeCompact()
}

// each calls fn for every key in increasing key order with its set, until fn returns
// false; it only reads e.
func (e *entries) each(fn func(key uint64, slots []uint32) bool) {
	if e.over.Len() == 0 {
		for i, k := range e.keys {
			if !fn(k, e.pool.get(e.sets[i])) {
				return
			}
		}
		return
	}
	ov := make([]uint64, 0, e.over.Len())
	for k := range e.over.All() {
		ov = append(ov, k)
	}
	slices.Sort(ov)
	i, j := 0, 0
	for i < len(e.keys) || j < len(ov) {
		var k uint64
		var id uint32
		switch {
		case j == len(ov) || (i < len(e.keys) && e.keys[i] < ov[j]):
			k, id = e.keys[i], e.sets[i]
			i++
		default:
			k = ov[j]
			id, _ = e.over.Get(k)
			if i < len(e.keys) && e.keys[i] == k {
				i++
			}
			j++
		}
		if id != tombstone && !fn(k, e.pool.get(id)) {
			return
		}
	}
}

// maybeCompact merges the overlay once it is a quarter of the base: lookups stay one
// map probe plus a binary search, and a merge costs O(n) only every n/4 changes.
func (e *entries) maybeCompact() {
	if e.over.Len() > 4096 && e.over.Len() > len(e.keys)/4 {
		e.compact()
	}
}

func (e *entries) compact() {
	if e.over.Len() == 0 {
		return
	}
	ov := make([]uint64, 0, e.over.Len())
	for k := range e.over.All() {
		ov = append(ov, k)
	}
	slices.Sort(ov)
	keys := make([]uint64, 0, e.live)
	sets := make([]uint32, 0, e.live)
	var pool setPool
	old := e.pool
	add := func(k uint64, id uint32) {
		keys = append(keys, k)
		sets = append(sets, pool.intern(old.get(id)))
	}
	i, j := 0, 0
	for i < len(e.keys) || j < len(ov) {
		switch {
		case j == len(ov) || (i < len(e.keys) && e.keys[i] < ov[j]):
			add(e.keys[i], e.sets[i])
			i++
		default:
			k := ov[j]
			if i < len(e.keys) && e.keys[i] == k {
				i++
			}
			if id, _ := e.over.Get(k); id != tombstone {
				add(k, id)
			}
			j++
		}
	}
	e.keys, e.sets, e.over, e.pool = keys, sets, keymap.Map[uint32]{}, pool
	e.live = len(keys)
	e.buildIndex()
}

// setPool interns replica sets (sorted slot lists): a fleet has far fewer distinct sets
// than keys, since every block of a cached prefix is usually held by the same replicas.
type setPool struct {
	data   []uint32
	off    []uint32 // set i is data[off[i]:off[i+1]]
	ids    map[string]uint32
	keybuf []byte
}

func (p *setPool) get(id uint32) []uint32 {
	if int(id)+1 >= len(p.off) {
		return nil
	}
	return p.data[p.off[id]:p.off[id+1]]
}

func (p *setPool) intern(slots []uint32) uint32 {
	p.keybuf = p.keybuf[:0]
	for _, s := range slots {
		p.keybuf = binary.LittleEndian.AppendUint32(p.keybuf, s)
	}
	if id, ok := p.ids[string(p.keybuf)]; ok {
		return id
	}
	if p.ids == nil {
		p.ids = map[string]uint32{}
		p.off = append(p.off[:0], 0)
	}
	id := uint32(len(p.off) - 1)
	p.data = append(p.data, slots...)
	p.off = append(p.off, uint32(len(p.data)))
	p.ids[string(p.keybuf)] = id
	return id
}
