// Package index is the control plane's live view of the fleet: per model, which replicas
// hold which prefix keys, and each replica's queue, KV usage and health. It is fed by the
// KV-event subscriptions (exact token-domain keys; eviction pressure and clears), the
// filters' reports (speculative and confirmed keys, mostly text domain) and the metrics
// scrapes, and it hands the publisher only what changed since the last table version.
//
// Only checkpoint keys (chain positions stride-1, 2*stride-1, ...) are stored: that is
// all the table carries. Nothing here ever sees prompt text: keys are hashes.
package index

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// Config are the index's knobs; zero values take the defaults.
type Config struct {
	// BlockBytes and BlockTokens are the text and token block sizes; Stride the table's
	// checkpoint stride. They are published in every model's table.Config.
	BlockBytes  int
	BlockTokens int
	Stride      int
	// DefaultBytesPerToken is published until outcomes teach the real ratio.
	DefaultBytesPerToken float64
	// SpecTTL: a placement's speculative entries vanish after this unless an outcome
	// confirms them (the engine may have dropped or not yet run the request). Outcomes
	// come at the end of the response, so this must outlive a loaded request's whole
	// run: at 10 s the fleet simulation lost its entries under load and went cache-blind
	// (wasmtest/fleet/README.md); 60 s holds.
	SpecTTL time.Duration
	// UnhealthyAfter consecutive failed scrapes mark a replica unhealthy.
	UnhealthyAfter int
	// DefaultUncachedTokens is the mean uncached prompt assumed per waiting request
	// before outcomes or the engine's histograms say better.
	DefaultUncachedTokens float64
	// MaxKeysPerReplica caps the reported (LRU) keys of one replica whatever its
	// capacity, so a misbehaving reporter cannot grow memory without bound.
	MaxKeysPerReplica int
	// RefreshInterval: while scrapes succeed, a version is published at least this
	// often even when no value changed, so the state age filters see stays small.
	RefreshInterval time.Duration
	// Budget bounds the state every input can create (budget.go).
	Budget Budget
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.BlockBytes, prefix.DefaultBlockBytes)
	def(&c.BlockTokens, prefix.DefaultBlockTokens)
	def(&c.Stride, 4)
	def(&c.UnhealthyAfter, 3)
	def(&c.MaxKeysPerReplica, 1<<20)
	if c.DefaultBytesPerToken <= 0 {
		c.DefaultBytesPerToken = 4
	}
	if c.SpecTTL <= 0 {
		c.SpecTTL = 60 * time.Second
	}
	if c.DefaultUncachedTokens <= 0 {
		c.DefaultUncachedTokens = 512
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = 100 * time.Millisecond
	}
	c.Budget = c.Budget.withDefaults()
	return c
}

// Spec describes one replica as discovery sees it.
type Spec struct {
	ID    string // stable name (pod name or address)
	Model string // served model name: the table's model and the token chains' seed
	Addr  string // ip:port the filter routes to
	Kind  string // scrape.VLLM or scrape.SGLang
	Speed uint32 // prefill tokens/s, 0 = same as the others
	// Events says whether the replica publishes KV events (so token-domain reports are
	// left to the events, which are exact).
	Events bool
}

// Index is safe for concurrent use.
//
// Locking (issue 15: ingest that scales with cores). mu guards the index's structure
// (replicas, models, slots, the speculative queue, scrape and learned values); every
// replica's mu guards its holdings, LRU and KV-event state; every model's mu guards its
// key -> slots map and changed keys. Order: Index.mu, then replica.mu, then model.mu
// (budgetMu last). KV events take no Index lock: a stream finds its replica in byID,
// applies a whole batch under the replica's lock, and commits the batch's slot changes
// to the model under the model's lock at once, so different replicas ingest in
// parallel while each replica's batches stay in order (one subscription goroutine per
// stream), and a table build (Flush, under the model's lock) sees whole batches only.
type Index struct {
	mu         sync.Mutex
	cfg        Config
	models     map[string]*model
	replicas   map[string]*replica
	goneModels []string // models removed since the last Flush
	specQ      []specItem
	specHead   int
	ready      bool
	stats      Stats
	// lastFlush is when the last version was produced; scraped says whether any
	// replica scraped successfully since.
	lastFlush time.Time
	scraped   bool
	budget    budgetState // budget.go
	// byID is replicas for the KV-event path's lookup (it takes no mu); counters it
	// updates.
	byID                       atomic.Pointer[map[string]*replica]
	unknownStreams, lruEvicted atomic.Uint64
}

// Stats are global counters (the per-replica ones are in DebugState).
type Stats struct {
	ReportsAccepted, ReportsSkipped uint64
	Placements, Confirms, Refutes   uint64
	FalseHits                       uint64
	SpecExpired                     uint64
	UnknownStreams                  uint64
	LRUEvicted                      uint64
}

type seedKey struct {
	model, lora string
	salt        prefix.Salt
}

type model struct {
	name    string
	created bool // not yet published: the next version resets it
	// bpt: bytes per token of canonical prompt text, learned from outcomes (float64
	// bits: read by the KV-event path, which does not hold Index.mu).
	bpt    atomic.Uint64
	bptPub float64
	bptN   int
	// uncached: mean uncached prompt tokens per request, learned from outcomes.
	uncached  float64
	uncachedN int
	slots     []*replica // by slot; nil = free
	free      []uint32   // reusable slots
	freeNext  []uint32   // freed since the last Flush: reusable once it is published
	keys      map[uint64][]uint16
	dirty     map[uint64]struct{}
	members   bool // replica list changed
	// mu guards keys and dirty (the only model state the KV-event path changes).
	mu sync.Mutex
}

func (m *model) bytesPerToken() float64     { return math.Float64frombits(m.bpt.Load()) }
func (m *model) setBytesPerToken(v float64) { m.bpt.Store(math.Float64bits(v)) }

type replica struct {
	// mu guards the holdings, the LRU, the ranks and the pending slot changes; spec and
	// sample are written under both Index.mu and mu, so either lock reads them.
	mu      sync.Mutex
	flips   []flip // slot changes not yet committed to the model (commit)
	scratch []byte
	seeds   map[seedKey]uint64
	size    atomic.Int64 // budget entries at the last unlock (budget.go recount)

	spec    Spec
	m       *model
	slot    uint32
	gone    bool
	addedAt time.Time

	hold    map[uint64]int32
	slab    []holding
	freeIdx []int32
	// LRU of reported keys, most recent at head.
	head, tail       int32
	lruText, lruTok  int
	specN, tokenKeys int
	evictDebt        float64

	ranks map[int]*rank

	// scrape state
	sample        scrape.Sample
	scrapedOK     bool
	lastOK        time.Time
	fails         int
	scrapeErrs    uint64
	healthy       bool
	pub           table.Replica // last published values
	published     bool
	lastScrapeErr string
}

// holding is one key's state on one replica. The replica holds the key (and the table
// lists its slot) while any of: engine blocks map to it, it is in the LRU of reported
// keys, or a placement made it speculative.
type holding struct {
	key        uint64
	prev, next int32
	specUntil  int64 // Unix ms; 0 = not speculative
	tokRefs    int32
	flags      uint8
}

const (
	inLRU    = 1
	lruToken = 2 // the LRU entry is token domain (no KV events for this replica)
)

func (h *holding) held() bool { return h.tokRefs > 0 || h.flags&inLRU != 0 || h.specUntil != 0 }

// rank is one DP rank's KV-event state: the engine's block hashes mapped to our keys.
type rank struct {
	blocks map[uint64]blockRef
	// multi holds the checkpoint keys of engine blocks larger than our blocks.
	multi     map[uint64][]uint64
	blockSize int
	sg        *sglangRank // SGLang's pages (sglang.go)

	connected                 bool
	lastSeq                   int64
	batches, stored, removed  uint64
	clears, gaps, restarts    uint64
	decodeErrors, skipped     uint64
	orphans, uncertainDrops   uint64
	lastDecodeErr             string
	everConnected, hasBatches bool
	lastEvent                 time.Time // when the last batch arrived (live or replayed)
}

// blockRef is the key of an engine block's last (our-size) block and its chain position,
// and how many physical copies of the block the engine holds. vLLM caches a recomputed
// block whose hash is already cached as a second copy and publishes BlockStored for it;
// each copy's eviction publishes its own BlockRemoved (vllm/v1/core/block_pool.py
// @c59cb794, cache_full_blocks and _maybe_evict_cached_block), so the block stays
// cached until every copy is removed.
type blockRef struct {
	key    uint64
	pos    uint32
	copies int32
}

type specItem struct {
	r     *replica
	key   uint64
	until int64
}

// flip is a change of whether a replica holds a key.
type flip struct {
	key uint64
	on  bool
}

// New returns an empty index.
func New(cfg Config) *Index {
	ix := &Index{
		cfg:      cfg.withDefaults(),
		models:   map[string]*model{},
		replicas: map[string]*replica{},
	}
	ix.byID.Store(&map[string]*replica{})
	return ix
}

// unlockReplica commits r's pending slot changes to its model, records its budget
// size and releases r.mu. Every section that locks a replica ends with it.
func (ix *Index) unlockReplica(r *replica) {
	if len(r.flips) > 0 {
		m := r.m
		m.mu.Lock()
		for _, f := range r.flips {
			m.setSlot(f.key, r.slot, f.on)
		}
		m.mu.Unlock()
		r.flips = r.flips[:0]
	}
	n := len(r.hold)
	for _, rk := range r.ranks {
		n += len(rk.blocks)
		if rk.sg != nil {
			n += rk.sg.live // SGLang pages are tracked apart from rk.blocks (sglang.go)
		}
	}
	r.size.Store(int64(n))
	r.mu.Unlock()
}

// publishIDs refreshes byID after the replica set changed. Caller holds mu.
func (ix *Index) publishIDs() {
	m := make(map[string]*replica, len(ix.replicas))
	for id, r := range ix.replicas {
		m[id] = r
	}
	ix.byID.Store(&m)
}

// Config returns the effective configuration.
func (ix *Index) Config() Config { return ix.cfg }

// Ready reports whether discovery has delivered its first replica list.
func (ix *Index) Ready() bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.ready
}

// Stats returns the global counters.
func (ix *Index) Stats() Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := ix.stats
	st.UnknownStreams, st.LRUEvicted = ix.unknownStreams.Load(), ix.lruEvicted.Load()
	return st
}

func (ix *Index) tableConfig(m *model) table.Config {
	return table.Config{
		BlockBytes:    uint32(ix.cfg.BlockBytes),
		BlockTokens:   uint32(ix.cfg.BlockTokens),
		Stride:        uint32(ix.cfg.Stride),
		BytesPerToken: m.bptPub,
	}
}

// SetReplicas replaces the replica list (discovery's latest view). Replicas that
// disappear lose their entries in the next version; a replica whose model or address
// changed is a new replica (a different engine process).
func (ix *Index) SetReplicas(specs []Spec, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.ready = true
	specs = ix.admitReplicas(specs) // budget.go
	want := map[string]Spec{}
	for _, s := range specs {
		if s.ID == "" || s.Model == "" || s.Addr == "" {
			continue
		}
		want[s.ID] = s
	}
	for id, r := range ix.replicas {
		s, ok := want[id]
		if !ok || s.Model != r.spec.Model || s.Addr != r.spec.Addr {
			ix.removeReplica(r)
			continue
		}
		if s != r.spec {
			r.mu.Lock()
			r.spec = s
			r.mu.Unlock()
			r.m.members = true
		}
	}
	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	slices.Sort(ids) // deterministic slot assignment
	for _, id := range ids {
		if _, ok := ix.replicas[id]; !ok {
			ix.addReplica(want[id], now)
		}
	}
	ix.publishIDs()
}

func (ix *Index) addReplica(s Spec, now time.Time) {
	m := ix.models[s.Model]
	if m == nil {
		m = &model{
			name: s.Model, created: true, bptPub: ix.cfg.DefaultBytesPerToken,
			keys: map[uint64][]uint16{}, dirty: map[uint64]struct{}{},
		}
		m.setBytesPerToken(ix.cfg.DefaultBytesPerToken)
		ix.models[s.Model] = m
		ix.goneModels = slices.DeleteFunc(ix.goneModels, func(n string) bool { return n == s.Model })
	}
	var slot uint32
	if n := len(m.free); n > 0 {
		slices.Sort(m.free)
		slot, m.free = m.free[0], m.free[1:]
	} else {
		slot = uint32(len(m.slots))
		m.slots = append(m.slots, nil)
	}
	r := &replica{
		spec: s, m: m, slot: slot, addedAt: now, healthy: true,
		hold: map[uint64]int32{}, head: -1, tail: -1, ranks: map[int]*rank{},
	}
	m.slots[slot] = r
	m.members = true
	ix.replicas[s.ID] = r
}

func (ix *Index) removeReplica(r *replica) {
	r.mu.Lock()
	ix.dropHoldings(r, func(*holding) bool { return true })
	r.gone = true
	ix.unlockReplica(r)
	m := r.m
	m.slots[r.slot] = nil
	// The slot is reused only after a version without it is published, so no delta
	// ever shows a new replica in a slot whose old entries a filter still holds.
	m.freeNext = append(m.freeNext, r.slot)
	m.members = true
	delete(ix.replicas, r.spec.ID)
	empty := true
	for _, x := range m.slots {
		if x != nil {
			empty = false
			break
		}
	}
	if empty {
		delete(ix.models, m.name)
		if !m.created {
			ix.goneModels = append(ix.goneModels, m.name)
		}
	}
}

// ---- holdings ----

func (r *replica) ensure(k uint64) int32 {
	if i, ok := r.hold[k]; ok {
		return i
	}
	var i int32
	if n := len(r.freeIdx); n > 0 {
		i, r.freeIdx = r.freeIdx[n-1], r.freeIdx[:n-1]
		r.slab[i] = holding{key: k, prev: -1, next: -1}
	} else {
		i = int32(len(r.slab))
		r.slab = append(r.slab, holding{key: k, prev: -1, next: -1})
	}
	r.hold[k] = i
	return i
}

// settle publishes a change of whether r holds the key of holding i, and frees the
// holding once nothing refers to it.
func (ix *Index) settle(r *replica, i int32, was bool) {
	h := &r.slab[i]
	now := h.held()
	if now != was {
		r.flips = append(r.flips, flip{h.key, now}) // unlockReplica commits them
	}
	if !now {
		delete(r.hold, h.key)
		r.freeIdx = append(r.freeIdx, i)
	}
}

// setSlot changes whether slot holds k. Caller holds m.mu.
func (m *model) setSlot(k uint64, slot uint32, on bool) {
	s := m.keys[k]
	j, found := slices.BinarySearch(s, uint16(slot))
	switch {
	case on && !found:
		s = slices.Insert(s, j, uint16(slot))
	case !on && found:
		s = slices.Delete(s, j, j+1)
	default:
		return
	}
	if len(s) == 0 {
		delete(m.keys, k)
	} else {
		m.keys[k] = s
	}
	m.dirty[k] = struct{}{}
}

func (r *replica) lruUnlink(i int32) {
	h := &r.slab[i]
	if h.flags&inLRU == 0 {
		return
	}
	if h.prev >= 0 {
		r.slab[h.prev].next = h.next
	} else {
		r.head = h.next
	}
	if h.next >= 0 {
		r.slab[h.next].prev = h.prev
	} else {
		r.tail = h.prev
	}
	if h.flags&lruToken != 0 {
		r.lruTok--
	} else {
		r.lruText--
	}
	h.prev, h.next = -1, -1
	h.flags &^= inLRU | lruToken
}

func (r *replica) lruPushFront(i int32, token bool) {
	r.lruUnlink(i)
	h := &r.slab[i]
	h.flags |= inLRU
	if token {
		h.flags |= lruToken
		r.lruTok++
	} else {
		r.lruText++
	}
	h.prev, h.next = -1, r.head
	if r.head >= 0 {
		r.slab[r.head].prev = i
	}
	r.head = i
	if r.tail < 0 {
		r.tail = i
	}
}

// footprints in tokens of one checkpoint key: it stands for stride blocks.
func (ix *Index) textFootprint(m *model) float64 {
	return float64(ix.cfg.Stride) * float64(ix.cfg.BlockBytes) / m.bytesPerToken()
}

func (ix *Index) tokenFootprint() float64 { return float64(ix.cfg.Stride * ix.cfg.BlockTokens) }

func (ix *Index) lruTokens(r *replica) float64 {
	return float64(r.lruText)*ix.textFootprint(r.m) + float64(r.lruTok)*ix.tokenFootprint()
}

// evictTail drops the least recently used reported key; it returns its footprint.
func (ix *Index) evictTail(r *replica) float64 {
	i := r.tail
	if i < 0 {
		return 0
	}
	fp := ix.textFootprint(r.m)
	if r.slab[i].flags&lruToken != 0 {
		fp = ix.tokenFootprint()
	}
	r.lruUnlink(i)
	ix.lruEvicted.Add(1)
	ix.settle(r, i, true)
	return fp
}

// fitCapacity keeps the reported keys' estimated tokens within the engine's KV capacity
// (num_gpu_blocks x block_size): an engine cannot hold more than that, so the oldest
// reported prefixes must have been evicted by now.
func (ix *Index) fitCapacity(r *replica) {
	capTok := float64(r.sample.CapacityTokens)
	for r.tail >= 0 && ((capTok > 0 && ix.lruTokens(r) > capTok) || r.lruText+r.lruTok > ix.cfg.MaxKeysPerReplica) {
		ix.evictTail(r)
	}
}

// dropHoldings removes every holding for which drop is true, whatever its sources.
func (ix *Index) dropHoldings(r *replica, drop func(*holding) bool) {
	for _, i := range r.hold {
		h := &r.slab[i]
		if !drop(h) {
			continue
		}
		r.lruUnlink(i)
		if h.tokRefs > 0 {
			r.tokenKeys--
		}
		if h.specUntil != 0 {
			r.specN--
		}
		h.tokRefs, h.specUntil = 0, 0
		ix.settle(r, i, true)
	}
}

// clearReplica: the engine's cache is empty (AllBlocksCleared, or its publisher
// restarted): every entry of the replica vanishes, both domains, speculative ones too.
func (ix *Index) clearReplica(r *replica) {
	ix.dropHoldings(r, func(*holding) bool { return true })
	for _, rk := range r.ranks {
		rk.blocks, rk.multi = nil, nil
	}
	r.evictDebt = 0
}

// ---- speculative entries ----

func (ix *Index) setSpec(r *replica, k uint64, until int64) {
	i := r.ensure(k)
	h := &r.slab[i]
	was := h.held()
	if h.specUntil == 0 {
		r.specN++
	}
	h.specUntil = until
	ix.specQ = append(ix.specQ, specItem{r, k, until})
	ix.settle(r, i, was)
}

func (ix *Index) clearSpec(r *replica, k uint64) {
	i, ok := r.hold[k]
	if !ok {
		return
	}
	h := &r.slab[i]
	if h.specUntil == 0 {
		return
	}
	h.specUntil = 0
	r.specN--
	ix.settle(r, i, true)
}

// expire drops speculative entries whose TTL passed. The queue is in TTL order since
// the TTL is fixed; a refreshed entry leaves a stale item, recognised by its time.
func (ix *Index) expire(nowMs int64) {
	for ix.specHead < len(ix.specQ) {
		it := ix.specQ[ix.specHead]
		if it.until > nowMs {
			break
		}
		ix.specQ[ix.specHead] = specItem{}
		ix.specHead++
		if it.r.gone {
			continue
		}
		it.r.mu.Lock()
		if i, ok := it.r.hold[it.key]; ok && it.r.slab[i].specUntil == it.until {
			ix.clearSpec(it.r, it.key)
			ix.stats.SpecExpired++
		}
		ix.unlockReplica(it.r)
	}
	if ix.specHead > 4096 && ix.specHead > len(ix.specQ)/2 {
		ix.specQ = append(ix.specQ[:0], ix.specQ[ix.specHead:]...)
		ix.specHead = 0
	}
}

// ---- token-domain keys from KV events ----

// seed is a token chain's seed, cached per replica (caller holds r.mu).
func (r *replica) seed(model, lora string, salt prefix.Salt) uint64 {
	k := seedKey{model, lora, salt}
	if s, ok := r.seeds[k]; ok {
		return s
	}
	s := prefix.Seed(prefix.Token, model, lora, salt)
	if r.seeds == nil || len(r.seeds) > 4096 {
		r.seeds = map[seedKey]uint64{}
	}
	r.seeds[k] = s
	return s
}

func (ix *Index) tokRef(r *replica, k uint64, delta int32) {
	i := r.ensure(k)
	h := &r.slab[i]
	was := h.held()
	before := h.tokRefs > 0
	h.tokRefs += delta
	if h.tokRefs < 0 {
		h.tokRefs = 0
	}
	if after := h.tokRefs > 0; after != before {
		if after {
			r.tokenKeys++
		} else {
			r.tokenKeys--
		}
	}
	ix.settle(r, i, was)
}

func (ix *Index) unrefBlock(r *replica, rk *rank, hash uint64, ref blockRef) {
	if ks, ok := rk.multi[hash]; ok {
		for _, k := range ks {
			ix.tokRef(r, k, -1)
		}
		delete(rk.multi, hash)
	} else if prefix.IsCheckpoint(int(ref.pos), ix.cfg.Stride) {
		ix.tokRef(r, ref.key, -1)
	}
	delete(rk.blocks, hash)
}

func (ix *Index) dropRank(r *replica, rk *rank) {
	for h, ref := range rk.blocks {
		ix.unrefBlock(r, rk, h, ref)
	}
	rk.blocks, rk.multi = nil, nil
}

func (r *replica) rank(n int) *rank {
	rk := r.ranks[n]
	if rk == nil {
		rk = &rank{lastSeq: -1}
		r.ranks[n] = rk
	}
	return rk
}

// engineBlockSize is the engine's KV block size for eviction accounting.
func (ix *Index) engineBlockSize(r *replica, rk *rank) int {
	if rk != nil && rk.blockSize > 0 {
		return rk.blockSize
	}
	if r.sample.BlockSize > 0 {
		return r.sample.BlockSize
	}
	return ix.cfg.BlockTokens
}

// ageText applies eviction pressure: the engine evicted tokens' worth of blocks, and it
// evicts least recently used blocks first, so the least recently used reported keys of
// the replica go too (reported keys have no events of their own).
func (ix *Index) ageText(r *replica, tokens float64) {
	if r.tail < 0 {
		r.evictDebt = 0
		return
	}
	r.evictDebt += tokens
	for r.tail >= 0 {
		fp := ix.textFootprint(r.m)
		if r.slab[r.tail].flags&lruToken != 0 {
			fp = ix.tokenFootprint()
		}
		if r.evictDebt < fp {
			break
		}
		r.evictDebt -= ix.evictTail(r)
	}
	if r.tail < 0 {
		r.evictDebt = 0
	}
}

func isGPU(medium string) bool {
	return medium == "" || medium == "GPU" || medium == "gpu" || medium == "cuda"
}

// le32 appends token ids as 4 little-endian bytes each, as prefix.TokenKeys hashes them.
func le32(dst []byte, toks []uint32) []byte {
	for _, t := range toks {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// ---- flush: what the next table version carries ----

// ModelUpdate is one model's part of a version: its config and replica list (always
// whole), and the keys whose replica set changed.
type ModelUpdate struct {
	Name     string
	Removed  bool
	Reset    bool // first version with the model: Upserts hold every key
	Config   table.Config
	Replicas []table.Replica
	Upserts  table.Entries
	Removes  []uint64
}

// Flush expires speculative entries and returns the next version's content, or nil
// when nothing changed. Every model is included (replica state is fresh on every
// version); keys only where they changed. force produces a version regardless.
func (ix *Index) Flush(now time.Time, force bool) []ModelUpdate {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	nowMs := now.UnixMilli()
	ix.expire(nowMs)

	changed := force || len(ix.goneModels) > 0
	names := make([]string, 0, len(ix.models))
	for n, m := range ix.models {
		names = append(names, n)
		m.mu.Lock()
		dirty := len(m.dirty) > 0
		m.mu.Unlock()
		if m.created || m.members || dirty || math.Abs(m.bytesPerToken()-m.bptPub) > 0.01*m.bptPub {
			changed = true
		}
	}
	if !changed {
		for _, r := range ix.replicas {
			if !r.published || !sameState(r.pub, ix.replicaState(r, now)) {
				changed = true
				break
			}
		}
	}
	if !changed && ix.scraped && now.Sub(ix.lastFlush) >= ix.cfg.RefreshInterval {
		changed = true
	}
	if !changed {
		return nil
	}
	slices.Sort(names)
	out := make([]ModelUpdate, 0, len(names)+len(ix.goneModels))
	var slots []uint32
	for _, n := range names {
		m := ix.models[n]
		if bpt := m.bytesPerToken(); math.Abs(bpt-m.bptPub) > 0.01*m.bptPub {
			m.bptPub = math.Round(bpt*1000) / 1000
		}
		u := ModelUpdate{Name: n, Reset: m.created, Config: ix.tableConfig(m)}
		for _, r := range m.slots {
			if r == nil {
				continue
			}
			st := ix.replicaState(r, now)
			r.pub, r.published = st, true
			u.Replicas = append(u.Replicas, st)
		}
		m.mu.Lock() // the keys as of whole batches: replicas commit a batch's changes at once
		var keys []uint64
		if m.created {
			keys = make([]uint64, 0, len(m.keys))
			for k := range m.keys {
				keys = append(keys, k)
			}
		} else {
			keys = make([]uint64, 0, len(m.dirty))
			for k := range m.dirty {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			s := m.keys[k]
			if len(s) == 0 {
				if !m.created {
					u.Removes = append(u.Removes, k)
				}
				continue
			}
			slots = slots[:0]
			for _, x := range s {
				slots = append(slots, uint32(x))
			}
			u.Upserts.Add(k, slots...)
		}
		clearDirty(m) // budget.go
		m.mu.Unlock()
		m.created, m.members = false, false
		m.free = append(m.free, m.freeNext...)
		m.freeNext = m.freeNext[:0]
		out = append(out, u)
	}
	for _, n := range ix.goneModels {
		out = append(out, ModelUpdate{Name: n, Removed: true})
	}
	ix.goneModels = ix.goneModels[:0]
	ix.lastFlush, ix.scraped = now, false
	return out
}

func sameState(a, b table.Replica) bool {
	a.StateAgeMs, b.StateAgeMs = 0, 0
	return a == b
}

// replicaState is what the table says about r now.
func (ix *Index) replicaState(r *replica, now time.Time) table.Replica {
	since := r.addedAt
	if r.scrapedOK {
		since = r.lastOK
	}
	age := now.Sub(since).Milliseconds()
	if age < 0 {
		age = 0
	}
	if age > math.MaxUint32 {
		age = math.MaxUint32
	}
	kv := r.sample.KVUsage
	if kv < 0 || math.IsNaN(kv) {
		kv = 0
	}
	if kv > 1 {
		kv = 1
	}
	return table.Replica{
		Slot:       r.slot,
		ID:         r.spec.ID,
		Addr:       r.spec.Addr,
		Speed:      r.spec.Speed,
		Queued:     uint64(math.Round(math.Max(0, ix.queued(r)))),
		KVUsage:    math.Round(kv*1e4) / 1e4,
		StateAgeMs: uint32(age),
		Healthy:    r.healthy,
	}
}

// queued is Q(r): the engine's own count of queued prefill tokens when it exports one,
// else waiting requests x the model's mean uncached prompt (from outcomes, else from the
// engine's lifetime prompt histogram and hit rate, else a default).
func (ix *Index) queued(r *replica) float64 {
	if r.sample.HasQueuedTokens {
		return r.sample.QueuedTokens
	}
	return r.sample.Waiting * ix.meanUncached(r)
}

func (ix *Index) meanUncached(r *replica) float64 {
	if r.m.uncachedN > 0 {
		return r.m.uncached
	}
	if r.sample.PromptTokensMean > 0 {
		return r.sample.PromptTokensMean * (1 - r.sample.HitRate)
	}
	return ix.cfg.DefaultUncachedTokens
}

// ---- scrapes ----

// ApplyScrape records one scrape of replica id: a sample, or err.
func (ix *Index) ApplyScrape(id string, s scrape.Sample, err error, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.replicas[id]
	if r == nil {
		return
	}
	if err != nil {
		r.fails++
		r.scrapeErrs++
		r.lastScrapeErr = err.Error()
		if r.fails >= ix.cfg.UnhealthyAfter {
			r.healthy = false
		}
		return
	}
	r.mu.Lock()
	r.sample, r.scrapedOK, r.lastOK, r.fails, r.healthy = s, true, now, 0, true
	ix.scraped = true
	ix.fitCapacity(r)
	ix.unlockReplica(r)
}

// ewma with a warm-up: a plain mean for the first samples, then weight alpha.
func ewma(cur float64, n int, v, alpha float64) float64 {
	if n < int(1/alpha) {
		return cur + (v-cur)/float64(n+1)
	}
	return cur + alpha*(v-cur)
}

func sortSlots(s []uint32) []uint32 { slices.SortFunc(s, cmp.Compare[uint32]); return s }
