// Package table is the prefix table the control plane serves and every filter holds: per
// model, the replicas (address, queue, KV usage, state age, health) and which replicas hold
// which prefix keys.
//
// In memory a model's entries are a sorted key array with an interned replica-set per key
// (12 bytes an entry, binary search, no per-entry allocation), plus a small overlay map
// that absorbs deltas until it is merged back. The wire format is in codec.go.
package table

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
)

// Limits on what a table may describe; a frame beyond them is rejected as corrupt.
const (
	MaxSlot      = 1<<16 - 1 // replica slots are small integers assigned by the control plane
	MaxStringLen = 1024      // model names, replica ids and addresses
	// MaxTiers is how many slower KV tiers (media other than GPU memory) a model may name.
	MaxTiers = 8
	// MaxTierName bounds a tier's (medium's) name.
	MaxTierName = 32
)

// A holder is one value of an entry's set: the replica's slot in the low 16 bits and the
// tier that holds the key above them. Tier 0 is GPU memory, the only tier format-1 frames
// carry, so a format-1 set is a plain slot list; tier i > 0 is the model's Tiers[i-1]
// (e.g. "CPU"): the replica holds the key only there, and must load it before reuse.
// Sets are sorted, so GPU holders come first. See docs/table.md.
const tierShift = 16

// Holder packs a slot and a tier into one set value.
func Holder(slot uint32, tier int) uint32 { return uint32(tier)<<tierShift | slot&MaxSlot }

// SplitHolder is the inverse of Holder.
func SplitHolder(h uint32) (slot uint32, tier int) { return h & MaxSlot, int(h >> tierShift) }

// GPUOnly reports whether a set names GPU holders only (what a format-1 frame can carry).
func GPUOnly(set []uint32) bool { return len(set) == 0 || set[len(set)-1] <= MaxSlot }

// GPUPart is the GPU holders of a sorted set: a prefix of it, shared, not copied.
func GPUPart(set []uint32) []uint32 {
	n, _ := slices.BinarySearch(set, MaxSlot+1)
	return set[:n]
}

// Replica is one engine replica serving a model.
type Replica struct {
	// Slot identifies the replica in this model's entries. The control plane keeps a
	// replica's slot for as long as it knows the replica, so deltas can refer to it.
	Slot uint32
	// ID is a stable name (pod name, or address when there is none).
	ID string
	// Addr is "ip:port", the value the filter writes into the routing header.
	Addr string
	// Speed is the prefill rate in tokens per second; 0 means "same as the others".
	Speed uint32
	// Queued is the uncached prompt tokens waiting for prefill on the replica.
	Queued uint64
	// KVUsage is the KV-cache usage, 0..1 (carried with 1e-4 resolution).
	KVUsage float64
	// StateAgeMs is how old the control plane's knowledge of the replica was when the
	// table was generated.
	StateAgeMs uint32
	// Healthy is false when the control plane could not reach the replica.
	Healthy bool
}

// Config is what a model's keys were computed with; the filter hashes with the same.
type Config struct {
	BlockBytes  uint32 // text-domain block size in bytes
	BlockTokens uint32 // token-domain block size in tokens
	// Stride k: the table holds only every k-th key of a chain (positions k-1, 2k-1, ...).
	Stride uint32
	// BytesPerToken converts canonical prompt bytes to tokens (learned per model by the
	// control plane from the engines' usage.prompt_tokens); carried with 1e-3 resolution.
	BytesPerToken float64
}

// Model is one model's part of the table.
type Model struct {
	Name     string
	Config   Config
	Replicas []Replica // sorted by Slot
	// Tiers names the slower KV tiers the entries refer to: tier i is Tiers[i-1]
	// (vLLM's medium string, e.g. "CPU"). Empty in format-1 tables.
	Tiers   []string
	slotIdx []int32 // slot -> index in Replicas, -1 when unused
	entries entries
}

// Table is the whole table at one version.
type Table struct {
	Version     uint64
	GeneratedMs int64 // control plane clock, Unix milliseconds
	Models      map[string]*Model
	// Format is the wire format of the frames the table was built from (0 before the
	// first): a delta applies only to a table of its own format, since the same version
	// holds less in format 1 (GPU holders only) than in format 2.
	Format uint8
}

// New returns an empty table at version 0.
func New() *Table { return &Table{Models: map[string]*Model{}} }

// NewModel returns a model with the given replicas and no entries.
func NewModel(name string, cfg Config, replicas []Replica) (*Model, error) {
	m := &Model{Name: name, Config: cfg}
	if err := m.setReplicas(replicas); err != nil {
		return nil, err
	}
	m.entries.reset()
	return m, nil
}

func (m *Model) setReplicas(rs []Replica) error {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Replica) int { return cmp.Compare(a.Slot, b.Slot) })
	maxSlot := -1
	for i, r := range rs {
		if r.Slot > MaxSlot {
			return fmt.Errorf("model %q: replica slot %d above %d", m.Name, r.Slot, MaxSlot)
		}
		if i > 0 && rs[i-1].Slot == r.Slot {
			return fmt.Errorf("model %q: replica slot %d used twice", m.Name, r.Slot)
		}
		maxSlot = int(r.Slot)
	}
	idx := make([]int32, maxSlot+1)
	for i := range idx {
		idx[i] = -1
	}
	for i, r := range rs {
		idx[r.Slot] = int32(i)
	}
	m.Replicas, m.slotIdx = rs, idx
	return nil
}

// ReplicaIndex returns the index in Replicas of the replica in slot s, or -1.
func (m *Model) ReplicaIndex(s uint32) int {
	if int(s) >= len(m.slotIdx) {
		return -1
	}
	return int(m.slotIdx[s])
}

// Set records that the replicas in slots hold key; an empty slots removes the key.
// Every slot must belong to a replica of the model. Slots may be holders (Holder) of
// the model's tiers; a replica listed in several tiers keeps the fastest.
func (m *Model) Set(key uint64, slots ...uint32) error {
	if len(slots) == 0 {
		m.entries.remove(key)
		return nil
	}
	s := slices.Clone(slots)
	slices.Sort(s)
	s = slices.Compact(s)
	for _, h := range s {
		sl, tier := SplitHolder(h)
		if tier > len(m.Tiers) {
			return fmt.Errorf("model %q: key %#x names tier %d of %d", m.Name, key, tier, len(m.Tiers))
		}
		if m.ReplicaIndex(sl) < 0 {
			return fmt.Errorf("model %q: key %#x names slot %d, which has no replica", m.Name, key, sl)
		}
	}
	m.entries.upsert(key, fastest(s))
	return nil
}

// fastest drops from a sorted set the holders of a slot already listed in a faster
// tier, in place.
func fastest(s []uint32) []uint32 {
	if GPUOnly(s) {
		return s
	}
	out := s[:0]
	for _, h := range s {
		sl, _ := SplitHolder(h)
		if !slices.ContainsFunc(out, func(o uint32) bool { return o&MaxSlot == sl }) {
			out = append(out, h)
		}
	}
	return out
}

// SetTiers names the model's slower tiers (see Model.Tiers). Names must be non-empty,
// distinct and at most MaxTierName bytes; at most MaxTiers of them.
func (m *Model) SetTiers(names []string) error {
	if err := checkTiers(names); err != nil {
		return fmt.Errorf("model %q: %w", m.Name, err)
	}
	m.Tiers = slices.Clone(names)
	return nil
}

func checkTiers(names []string) error {
	if len(names) > MaxTiers {
		return fmt.Errorf("%d tiers, at most %d", len(names), MaxTiers)
	}
	for i, n := range names {
		if n == "" || len(n) > MaxTierName {
			return fmt.Errorf("tier %d name %q: want 1 to %d bytes", i+1, n, MaxTierName)
		}
		if slices.Contains(names[:i], n) {
			return fmt.Errorf("tier %q named twice", n)
		}
	}
	return nil
}

// Len is the number of keys in the model.
func (m *Model) Len() int { return m.entries.len() }

// Lookup returns the slots holding key (nil when absent). The slice is the table's own;
// do not modify it.
func (m *Model) Lookup(key uint64) []uint32 {
	id, ok := m.entries.get(key)
	if !ok {
		return nil
	}
	return m.entries.pool.get(id)
}

// Each calls fn for every key in increasing key order with the slots holding it, until
// fn returns false. It only reads m, so several may run at once (nothing may change m
// meanwhile).
func (m *Model) Each(fn func(key uint64, slots []uint32) bool) {
	e := &m.entries
	if len(e.over) == 0 {
		for i, k := range e.keys {
			if !fn(k, e.pool.get(e.sets[i])) {
				return
			}
		}
		return
	}
	ov := make([]uint64, 0, len(e.over))
	for k := range e.over {
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
			k, id = ov[j], e.over[ov[j]]
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

// SameGeometry reports whether keys computed under c and d are the same keys: block
// sizes and stride agree (the bytes-per-token estimate may differ).
func (c Config) SameGeometry(d Config) bool {
	return c.BlockBytes == d.BlockBytes && c.BlockTokens == d.BlockTokens && c.Stride == d.Stride
}

// Match finds, for each replica, how many blocks of the chain keys (every key of the
// request's chain, in order) it holds: matched[i] is for Replicas[i], in blocks, and is
// a multiple of the stride. A replica holds a block when the table lists it on that
// block's checkpoint key; the longest such checkpoint counts. matched is reused when it
// has room. The result's largest value is returned too.
func (m *Model) Match(keys []uint64, matched []int) ([]int, int) {
	matched = resize(matched, len(m.Replicas))
	stride := int(m.Config.Stride)
	if stride < 1 {
		stride = 1
	}
	longest := 0
	for i := stride - 1; i < len(keys); i += stride {
		id, ok := m.entries.get(keys[i])
		if !ok {
			continue
		}
		for _, s := range m.entries.pool.get(id) {
			if r := m.ReplicaIndex(s); r >= 0 {
				matched[r] = i + 1
			}
		}
		longest = i + 1
	}
	return matched, longest
}

// MatchTiers is Match plus the slower tiers. matched is as Match gives it (GPU holders
// only). For each replica, loadable[i] is how many blocks past matched[i] it holds in
// slower tiers without a gap (vLLM looks up its offloaded blocks from the first block
// the GPU misses and stops at the first one it lacks), and loadCost[i] is those blocks
// weighted by their tier's cost: ratios[t-1] for tier t (a missing ratio counts 1, as
// if uncached). The slices are reused when they have room.
func (m *Model) MatchTiers(keys []uint64, ratios []float64, matched, loadable []int, loadCost []float64) ([]int, []int, []float64) {
	n := len(m.Replicas)
	matched = resize(matched, n)
	loadable = resize(loadable, n) // during the walk: end of the covered run, in blocks
	if cap(loadCost) < n {
		loadCost = make([]float64, n)
	}
	loadCost = loadCost[:n]
	clear(loadCost)
	stride := int(m.Config.Stride)
	if stride < 1 {
		stride = 1
	}
	for i := stride - 1; i < len(keys); i += stride {
		id, ok := m.entries.get(keys[i])
		if !ok {
			continue
		}
		for _, h := range m.entries.pool.get(id) {
			sl, tier := SplitHolder(h)
			r := m.ReplicaIndex(sl)
			if r < 0 {
				continue
			}
			switch {
			case tier == 0:
				matched[r], loadable[r], loadCost[r] = i+1, i+1, 0
			case loadable[r] == i+1-stride: // contiguous with what r already covers
				ratio := 1.0
				if tier <= len(ratios) {
					ratio = ratios[tier-1]
				}
				loadable[r], loadCost[r] = i+1, loadCost[r]+float64(stride)*ratio
			}
		}
	}
	for r := range loadable {
		loadable[r] -= matched[r]
	}
	return matched, loadable, loadCost
}

func resize(s []int, n int) []int {
	if cap(s) < n {
		s = make([]int, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// entries: sorted base arrays plus an overlay of changes since the last merge.
type entries struct {
	keys []uint64          // sorted, unique
	sets []uint32          // set id per key
	over map[uint64]uint32 // newer value per key; tombstone = removed
	pool setPool
	// live counts keys that exist (base minus tombstoned plus overlay-only).
	live int
}

const tombstone = ^uint32(0)

func (e *entries) reset() {
	e.keys, e.sets, e.over, e.live = nil, nil, nil, 0
	e.pool = setPool{}
}

func (e *entries) len() int { return e.live }

func (e *entries) base(key uint64) (uint32, bool) {
	i, ok := slices.BinarySearch(e.keys, key)
	if !ok {
		return 0, false
	}
	return e.sets[i], true
}

func (e *entries) get(key uint64) (uint32, bool) {
	if e.over != nil {
		if id, ok := e.over[key]; ok {
			return id, id != tombstone
		}
	}
	return e.base(key)
}

func (e *entries) upsert(key uint64, slots []uint32) {
	_, existed := e.get(key)
	if !existed {
		e.live++
	}
	if e.over == nil {
		e.over = map[uint64]uint32{}
	}
	e.over[key] = e.pool.intern(slots)
	e.maybeCompact()
}

func (e *entries) remove(key uint64) {
	if _, existed := e.get(key); !existed {
		return
	}
	e.live--
	if _, inBase := e.base(key); inBase {
		if e.over == nil {
			e.over = map[uint64]uint32{}
		}
		e.over[key] = tombstone
	} else {
		delete(e.over, key)
	}
	e.maybeCompact()
}

// maybeCompact merges the overlay once it is a quarter of the base: lookups stay one
// map probe plus a binary search, and a merge costs O(n) only every n/4 changes.
func (e *entries) maybeCompact() {
	if len(e.over) > 4096 && len(e.over) > len(e.keys)/4 {
		e.compact()
	}
}

func (e *entries) compact() {
	if len(e.over) == 0 {
		return
	}
	ov := make([]uint64, 0, len(e.over))
	for k := range e.over {
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
			if id := e.over[k]; id != tombstone {
				add(k, id)
			}
			j++
		}
	}
	e.keys, e.sets, e.over, e.pool = keys, sets, nil, pool
	e.live = len(keys)
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

// CloneFor returns a table that shares everything with t except the models f would change
// in place (a delta's models that are neither removed nor reset), which it copies, so
// that ApplyFrame(f) on the result leaves t as it was. A publisher applies the next
// version to the clone while readers go on using t, then swaps them.
func (t *Table) CloneFor(f *Frame) *Table {
	c := &Table{Version: t.Version, GeneratedMs: t.GeneratedMs, Models: maps.Clone(t.Models), Format: t.Format}
	if c.Models == nil {
		c.Models = map[string]*Model{}
	}
	if f.Kind != Delta {
		return c
	}
	for i := range f.Models {
		mc := &f.Models[i]
		if m := c.Models[mc.Name]; m != nil && !mc.Removed && !mc.Reset {
			c.Models[mc.Name] = m.clone()
		}
	}
	return c
}

// clone copies what ApplyFrame changes in place (the overlay, the set pool's index, the
// replica lists) and caps the slices it shares, so an append in the copy never writes
// into memory the original still reads. The sorted base arrays are only ever replaced
// (compact), never written, so they are shared.
func (m *Model) clone() *Model {
	c := *m
	c.Replicas = slices.Clone(m.Replicas)
	c.slotIdx = slices.Clone(m.slotIdx)
	e := &c.entries
	e.keys = e.keys[:len(e.keys):len(e.keys)]
	e.sets = e.sets[:len(e.sets):len(e.sets)]
	e.over = maps.Clone(e.over)
	e.pool = setPool{
		data: e.pool.data[:len(e.pool.data):len(e.pool.data)],
		off:  e.pool.off[:len(e.pool.off):len(e.pool.off)],
		ids:  maps.Clone(e.pool.ids),
	}
	return &c
}

// ModelNames returns the table's model names, sorted.
func (t *Table) ModelNames() []string {
	names := make([]string, 0, len(t.Models))
	for n := range t.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
