// Package table is the prefix table the control plane serves and every filter holds: per
// model, the replicas (address, queue, KV usage, state age, health) and which replicas hold
// which prefix keys.
//
// In memory a model's entries are a sorted key array with an interned replica-set per key
// (12 bytes an entry, binary search, no per-entry allocation), plus a small overlay map
// that absorbs deltas until it is merged back.
//
// Files: table.go (the model), entries.go (its entries in memory), match.go (a chain
// against them), homes.go (keys listed nowhere and the replica that held each last),
// codec.go (frames: full, delta, formats 1 to 4), writer.go and reader.go (their bytes),
// patch.go (replica patches), apply.go (a frame onto a table, and the diff of two
// tables).
package table

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
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
	// Load (format 3; zero in tables of older formats): Running is the mean number of
	// requests the replica ran recently, prefilling or decoding, whose steps a prefill
	// placed there stalls (carried to 0.01); Busy the fraction of recent time it had
	// prefill work waiting, 0..1 (to 1e-4); MeanUncached the mean prompt tokens it
	// prefills for a request (0: unknown). shared/rule prices a placement's effect on
	// the other requests with them.
	Running      float64
	Busy         float64
	MeanUncached uint32
}

// ModelConfig is what a model's keys were computed with; the filter hashes with the same.
type ModelConfig struct {
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
	Config   ModelConfig
	Replicas []Replica // sorted by Slot
	// Tiers names the slower KV tiers the entries refer to: tier i is Tiers[i-1]
	// (vLLM's medium string, e.g. "CPU"). Empty in format-1 tables.
	Tiers   []string
	slotIdx []int32 // slot -> index in Replicas, -1 when unused
	entries entries
	homes   entries // homes.go: keys listed nowhere, with their last holder's slot
	gen     uint64  // Gen
}

// generations numbers the states of every model in the process (Model.Gen).
var generations atomic.Uint64

// touch gives m a new generation: what a match depends on (entries, replicas, config)
// may have changed.
func (m *Model) touch() { m.gen = generations.Add(1) }

// Gen is the model's generation: no two states of any models in the process share one,
// so a result computed from m is still m's while m.Gen() is what it was. Set, SetTiers
// and applied frames change it; Replicas' queue numbers, written directly, do not.
func (m *Model) Gen() uint64 { return m.gen }

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
func NewModel(name string, cfg ModelConfig, replicas []Replica) (*Model, error) {
	m := &Model{Name: name, Config: cfg}
	if err := m.setReplicas(replicas); err != nil {
		return nil, err
	}
	m.entries.reset()
	m.homes.reset()
	m.touch()
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
	m.touch()
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
	m.touch()
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
func (m *Model) Each(fn func(key uint64, slots []uint32) bool) { m.entries.each(fn) }

// SameGeometry reports whether keys computed under c and d are the same keys: block
// sizes and stride agree (the bytes-per-token estimate may differ).
func (c ModelConfig) SameGeometry(d ModelConfig) bool {
	return c.BlockBytes == d.BlockBytes && c.BlockTokens == d.BlockTokens && c.Stride == d.Stride
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
	c.touch()
	c.Replicas = slices.Clone(m.Replicas)
	c.slotIdx = slices.Clone(m.slotIdx)
	c.entries.capShared()
	c.homes.capShared()
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
