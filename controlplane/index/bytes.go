package index

import (
	"math"
	"math/bits"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/internal/keymap"
)

// The byte budget's accounting (the limit itself, Budget.MaxBytes, is admitted in
// budget.go). The index's bytes are not read from the heap, which holds
// the publisher's tables and everything else too, but summed from the index's own
// structures, each priced from its Go layout:
//
//   - a holding (a key on one replica, whatever its sources): the replica's holdings
//     map, its slab entry and its slot in the model's holder list;
//   - a distinct key of a model: its slot in the model's key set and its holder list
//     (none of its own while one replica holds it: oneHolder), and its place in the
//     changed-key list until the next table build (modelkeys.go);
//   - an engine block of vLLM's KV events: the rank's block map (and, for engine blocks
//     larger than ours, the checkpoint keys it names);
//   - an SGLang page: its slab entry, its slot in the page map and its token tail;
//   - a speculative entry: its item in the expiry queue;
//   - a replica: its fixed structures (meterReplica's fixed part).
//
// A replica's holdings, a rank's blocks and a model's keys are keymaps
// (internal/keymap): one array of key-value slots, a power of two long, doubled when
// 3/4 full; they are priced at their array (keymapBytes), which stays at its peak
// after deletions until Reclaim shrinks it (once its entries fall to a quarter of
// their peak, reclaim.go). A model's keys, which can be the index's largest
// structure, are split over 256 keymaps, so that they double a shard at a time. The
// other maps are Go's (swiss tables): 8 slots and 8 control bytes a group, grown when
// 7/8 full, by doubling up to 1,024 slots, then table by table (mapBytes). Go maps are
// priced by their entries, since what one keeps after deletions cannot be seen. Slices
// are priced at their capacity. Structures that an in-flight admission is about to grow
// are priced at their size after it.
//
// The replica's structures are measured under its lock whenever it admits something
// (admitKeys, admitBlocks) and by BudgetState; the budget's recount (which takes no
// replica lock) prices a replica at its last measurement scaled to its current entry
// count (replica.size), and a replica never measured at worstEntry an entry. Between
// recounts every admitted entry is charged worstEntry, the most an entry of any kind
// costs in maps just grown, so the running figure stays above what a recount would
// find for the same entries. Not yet priced by kind: the slower tiers' maps (tiers.go), charged
// at their replica's mean bytes per entry.

const (
	mapHeader    = 48 // a map's header (internal/runtime/maps.Map)
	tableHeader  = 32 // one table's (maps.table) and its directory pointer
	groupSlots   = 8
	tableSlots   = 1024 // maxTableCapacity
	listMinBytes = 8    // a holder list's smallest allocation (tiny allocator)
	splitMid     = 0.99 // mapBytes: a large map's tables split around this fill...
	splitSD      = 0.025
	// replicaOverhead: a replica's entries in the index's replica maps (by ID twice), its
	// model slot, its spec's strings and its ranks' map header.
	replicaOverhead = 4*(16+8)*2 + 8 + 64 + mapHeader
)

// slotBytes is the size of one map slot of key K and value V.
func slotBytes[K comparable, V any]() int64 {
	var s struct {
		k K
		v V
	}
	return int64(unsafe.Sizeof(s))
}

var (
	holdSlot = keymap.SlotBytes[int32]()
	keySlot  = keymap.SlotBytes[keyState]()
	pageSlot = slotBytes[uint64, []int32]()
	seedSlot = slotBytes[seedKey, uint64]()
	// specCharge is what a placement's expiry item can cost (the queue grows by
	// append, so up to twice its items).
	specCharge = 2 * int64(unsafe.Sizeof(specItem{}))
	// worstEntry is what one new entry of any kind can cost at most: a holding of a
	// key new to the model, speculative, in maps just grown (a keymap 3/8 full, Go
	// maps 7/16 with a control byte a slot), changed since the last build (a changed
	// list's array is at most twice its entries).
	worstEntry = holdSlot*8/3 + keySlot*8/3 + 2*8 +
		int64(unsafe.Sizeof(holding{}))*5/4 + listMinBytes + 2 + 2*int64(unsafe.Sizeof(specItem{}))
)

// keymapBytes prices m once it holds n entries: its array, or the one growth gives it.
func keymapBytes[V any](m *keymap.Map[V], n int) int64 { return sizeClass(m.Bytes(n)) }

// keymapGrowth is what adding n entries to m allocates at once. A keymap doubles its
// whole array (a Go map grows a table of 1,024 slots at a time), so the budget admits
// that beside the entries' worstEntry each, until the next recount measures it.
func keymapGrowth[V any](m *keymap.Map[V], n int) int64 {
	if m.Fits(n) {
		return 0 // every event pays this: no pricing when nothing grows
	}
	return keymapBytes(m, m.Len()+n) - keymapBytes(m, 0)
}

// mapBytes prices a map of n entries whose slots take slot bytes. Up to 8 entries fit
// one group; up to 1,024 slots a table doubles when 7/8 full, so n entries take the
// next power of two of n*8/7 slots; beyond, tables of 1,024 slots split in two one by
// one. Each table's groups are one allocation.
func mapBytes(n int, slot int64) int64 {
	if n <= 0 {
		return 0
	}
	group := groupSlots + groupSlots*slot
	if n <= groupSlots {
		return mapHeader + sizeClass(group)
	}
	if slots := int64(1) << bits.Len64(uint64((n*groupSlots+6)/7-1)); slots <= tableSlots {
		return mapHeader + 8 + tableHeader + sizeClass(slots/groupSlots*group)
	}
	// Past one table, the tables split one by one as each gets 7/8 full. Keys spread
	// evenly, so they split around the n at which all would be 7/8 full: the share
	// split by n is about normal around it, sd 2.5% (measured, TestMapBytes; centred 1%
	// early here to price a little high rather than low).
	c := int64(2 * tableSlots)
	for float64(n) > (splitMid+4*splitSD)*float64(c)*7/8 {
		c *= 2
	}
	x := float64(n) / (float64(c) * 7 / 8)
	split := 0.5 * (1 + math.Erf((x-splitMid)/(splitSD*math.Sqrt2)))
	tables := float64(c/tableSlots) * (1 + split)
	return mapHeader + int64(tables*float64(8+tableHeader+sizeClass(tableSlots/groupSlots*group)))
}

// meter is one replica's or model's structures at their last measurement. It is the
// replica's (model's) own, read by the recount without the replica's lock.
type meter struct {
	fixed, bytes, entries atomic.Int64
	at                    atomic.Int64 // a model's: UnixNano of the measurement
	measured              atomic.Bool
}

// estimate prices the replica metered by m at size entries.
func (m *meter) estimate(size int64) int64 {
	if !m.measured.Load() {
		return int64(unsafe.Sizeof(replica{})) + replicaOverhead + size*worstEntry
	}
	e := m.entries.Load()
	if e <= 0 {
		return m.fixed.Load() + size*worstEntry
	}
	return m.fixed.Load() + m.bytes.Load()*size/e
}

// stale says whether model m's measurement is older than recountEvery: the KV-event
// path measures a model at most that often (its lock is shared by the model's replicas).
func (m *model) stale(now time.Time) bool {
	return !m.meter.measured.Load() || now.UnixNano()-m.meter.at.Load() >= int64(recountEvery)
}

// meterReplica measures r's structures as they will be once hold more holdings, and
// blocks more engine blocks in rank rk, are added. Caller holds r.mu.
func (ix *Index) meterReplica(r *replica, hold int, rk *rank, blocks int) {
	nh := r.hold.Len() + hold
	slab := max(cap(r.slab), len(r.slab)+hold-len(r.freeIdx))
	b := keymapBytes(&r.hold, nh) + int64(slab)*int64(unsafe.Sizeof(holding{})) +
		int64(cap(r.freeIdx))*4 + int64(nh)*2 // its slot in the key's holder list
	entries := nh
	fixed := int64(unsafe.Sizeof(replica{})) + replicaOverhead + mapBytes(len(r.seeds), seedSlot) +
		int64(cap(r.scratch)) + int64(cap(r.flips))*int64(unsafe.Sizeof(flip{})) +
		int64(cap(r.owners.ids))*8 + int64(cap(r.owners.counts))*4
	for _, x := range r.ranks {
		fixed += int64(unsafe.Sizeof(rank{}))
		nb := x.blocks.Len()
		if x == rk {
			nb += blocks
		}
		entries += nb
		b += keymapBytes(&x.blocks, nb) + keymapBytes(&x.multi, x.multi.Len())
		if n := x.multi.Len(); n > 0 && x.blockSize > 0 {
			ks := (x.blockSize/max(ix.cfg.BlockTokens, 1))/max(ix.cfg.Stride, 1) + 1
			b += int64(n) * sizeClass(int64(8*ks))
		}
		if sg := x.sg; sg != nil {
			entries += sg.live
			b += mapBytes(len(sg.pages), pageSlot) + int64(len(sg.pages))*listMinBytes +
				int64(cap(sg.slab))*int64(unsafe.Sizeof(sgEntry{})) + int64(cap(sg.free))*4 +
				int64(sg.live)*sizeClass(int64(4*ix.cfg.BlockTokens/2)) // token tails, half a block on average
		}
	}
	m := &r.meter
	m.fixed.Store(fixed)
	m.bytes.Store(b)
	m.entries.Store(int64(entries))
	m.measured.Store(true)
}

// meterModel measures m's key structures as they will be once fresh new keys are added.
// Caller holds m.mu.
func (ix *Index) meterModel(m *model, fresh int, now time.Time) {
	b := int64(unsafe.Sizeof(model{})) + int64(cap(m.slots))*8 +
		m.keys.Bytes(fresh) + int64(m.lists+fresh)*listMinBytes
	mt := &m.meter
	mt.bytes.Store(b)
	mt.at.Store(now.UnixNano())
	mt.measured.Store(true)
}

// meterModelSoon is meterModel from the KV-event path when m's measurement is stale: a
// refresh waits for a later event when the model's lock is busy, as a batch's end does
// (unlockStream); only a first measurement waits for the lock.
func (ix *Index) meterModelSoon(m *model, fresh int, now time.Time) {
	if !m.stale(now) {
		return
	}
	if !m.meter.measured.Load() {
		m.mu.Lock()
	} else if !m.mu.TryLock() {
		return
	}
	ix.meterModel(m, fresh, now)
	m.mu.Unlock()
}

// meterSpec measures the speculative queue. Caller holds Index.mu.
func (ix *Index) meterSpec(add int) {
	n := max(cap(ix.specQ), len(ix.specQ)+add)
	ix.budget.spec.Store(int64(n) * int64(unsafe.Sizeof(specItem{})))
}

// specGrowth is what the array append gives the speculative queue for n more items
// adds to the one it has, 0 when they fit (runtime.growslice: doubling up to 256
// items, then a quarter and 192 more). Caller holds Index.mu.
func (ix *Index) specGrowth(n int) int64 {
	need, c := len(ix.specQ)+n, cap(ix.specQ)
	if need <= c {
		return 0
	}
	for c < need {
		if c < 256 {
			c = max(2*c, 1)
		} else {
			c += (c + 3*256) / 4
		}
	}
	size := int64(unsafe.Sizeof(specItem{}))
	return sizeClass(int64(c)*size) - sizeClass(int64(cap(ix.specQ))*size)
}

// meterAll measures every replica and model. Caller holds Index.mu and no other lock.
func (ix *Index) meterAll() {
	for _, r := range ix.replicas {
		r.mu.Lock()
		ix.meterReplica(r, 0, nil, 0)
		ix.unlockReplica(r)
	}
	now := time.Now()
	for _, m := range ix.models {
		m.mu.Lock()
		ix.meterModel(m, 0, now)
		m.mu.Unlock()
	}
	ix.meterSpec(0)
}

// count is the recount's sum of entries (every replica's size as of its last unlock)
// and their price: every replica at its last measurement scaled to its current
// entries, every model, the speculative queue. It records each model's part in its
// usage (shares.go: the speculative queue's items by their model). Caller holds
// budget.mu.
func (ix *Index) count(byID map[string]*replica) (entries, bytes int64) {
	total := ix.budget.spec.Load()
	type part struct{ entries, bytes int64 }
	models := make(map[*model]part, 1)
	for _, r := range byID {
		n := r.size.Load()
		b := r.meter.estimate(n)
		entries += n
		total += b
		p, ok := models[r.m]
		if !ok {
			p.bytes = r.m.meter.bytes.Load()
			total += p.bytes
			p.bytes += r.m.specItems.Load() * specItemBytes
		}
		models[r.m] = part{p.entries + n, p.bytes + b}
	}
	for m, p := range models {
		m.use.set(p.entries, p.bytes)
	}
	return entries, total
}

// sizeClasses are the Go allocator's small object sizes (internal/runtime/gc); larger
// objects take whole 8 KB pages.
var sizeClasses = [...]int64{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224,
	240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280,
	1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912,
	8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576,
	27264, 28672, 32768}

// sizeClass is what an allocation of n bytes takes.
func sizeClass(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if n > sizeClasses[len(sizeClasses)-1] {
		return (n + 8191) &^ 8191 // keymap arrays, mostly: no search
	}
	if i, _ := slices.BinarySearch(sizeClasses[:], n); i < len(sizeClasses) {
		return sizeClasses[i]
	}
	return (n + 8191) &^ 8191
}
