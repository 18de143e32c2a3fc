package index

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/internal/keymap"
	"github.com/kvroute/kvroute/shared/table"
)

type model struct {
	name    string
	created bool // not yet published: the next version resets it
	// bpt: bytes per token of canonical prompt text, learned from outcomes (float64
	// bits: read by the KV-event path, which does not hold Index.mu).
	bpt    atomic.Uint64
	bptPub float64
	// again: the model's evicted blocks waiting to be stored again on any replica
	// (fleetagain.go).
	again fleetAgain
	// uncached: mean uncached prompt tokens per request, learned from outcomes.
	uncached  float64
	uncachedN int
	// reporters: what each reporter's outcomes taught (learn.go).
	reporters []reporterMeans
	// The model's part of the budget (shares.go): what it holds, its weight (its
	// replicas), when it last asked for room (Unix ns), its speculative queue items.
	use       usage
	weight    atomic.Int64
	wanted    atomic.Int64
	specItems atomic.Int64
	slots     []*replica // by slot; nil = free
	free      []uint32   // reusable slots
	freeNext  []uint32   // freed since the last Flush: reusable once it is published
	keys      modelKeys  // modelkeys.go
	homes     modelHomes // homes.go
	lists     int        // holder lists in keys that have their own array (not oneHolder's)
	// tiers names the slower media seen (table tier i is tiers[i-1], append-only);
	// tierKeys holds, per key, the holders (table.Holder) in those tiers (tiers.go).
	tiers    []string
	tierKeys map[uint64][]uint32
	members  bool // replica list changed
	// mu guards keys (the only model state the KV-event path changes).
	mu    sync.Mutex
	meter meter // the byte budget's measurement (bytes.go)
}

func (m *model) bytesPerToken() float64     { return math.Float64frombits(m.bpt.Load()) }
func (m *model) setBytesPerToken(v float64) { m.bpt.Store(math.Float64bits(v)) }

type replica struct {
	// mu guards the holdings, the LRU, the ranks and the pending slot changes; spec and
	// sample are written under both Index.mu and mu, so either lock reads them.
	mu    sync.Mutex
	flips []flip // slot changes not yet committed to the model (commit)
	// pending: flips holds whole batches left for later because the model's lock was
	// busy (unlockStream); Flush collects them when the replica is idle.
	pending atomic.Bool
	// deferred counts the batch ends that found the model's lock busy (debug.go).
	deferred uint64
	// placed: the placements without an outcome, for Q(r) when the engine exports no
	// queued-prefill gauge (placed.go).
	placed placedWork
	// tierHold counts, per key and slower tier, the tier blocks that hold it;
	// tierFlips are its changes not yet committed to the model (tiers.go).
	tierHold  map[tierKey]int32
	tierFlips []tierFlip
	// off is the LRU of reported keys the GPU evicted into the replica's slower tier
	// offTier (0: the replica has shown none), aged by that tier's removals (tiers.go).
	off     offLRU
	offTier uint8
	// owners: the reporters whose confirmed keys the LRU holds (confirmed.go).
	owners  owners
	scratch []byte
	seeds   map[seedKey]uint64
	size    atomic.Int64 // budget entries at the last unlock (budget.go recount)

	spec    Spec
	m       *model
	slot    uint32
	gone    bool
	addedAt time.Time

	hold    keymap.Map[int32] // key -> its holding in slab
	slab    []holding
	freeIdx []int32
	// LRU of reported keys, most recent at head.
	head, tail       int32
	lruText, lruTok  int
	specN, tokenKeys int
	evictDebt        float64
	// load is the time-weighted averages of recent scrapes (load.go); keyed the share of
	// its computed tokens that were prompt tokens (keyed.go).
	load  Load
	keyed keyedShare

	ranks []*rank // by DP rank, ascending (a few: a slice, walked on the KV-event path)
	// fleetBack is the share of this replica's evictions stored again on any replica of
	// its model, counted by fleetAgain.sweep at fleetSwept (its engine's clock).
	fleetBack  recentMean
	fleetSwept float64
	meter      meter // the byte budget's measurement (bytes.go)

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
			homes: modelHomes{max: ix.cfg.MaxHomes},
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
		head: -1, tail: -1,
	}
	m.slots[slot] = r
	m.members = true
	ix.replicas[s.ID] = r
}

func (ix *Index) removeReplica(r *replica) {
	r.mu.Lock()
	ix.dropHoldings(r, func(*holding) bool { return true })
	r.dropTiers(nil)
	r.m.again.drop(r)
	r.gone = true
	ix.unlockReplica(r)
	m := r.m
	m.slots[r.slot] = nil
	m.mu.Lock()
	m.homes.dropSlot(r.slot)
	m.mu.Unlock()
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

// publishIDs refreshes byID, the model list and the models' weights (shares.go) after
// the replica set changed. Caller holds mu.
func (ix *Index) publishIDs() {
	m := make(map[string]*replica, len(ix.replicas))
	for id, r := range ix.replicas {
		m[id] = r
	}
	ix.byID.Store(&m)
	models := make([]*model, 0, len(ix.models))
	for _, md := range ix.models {
		n := 0
		for _, r := range md.slots {
			if r != nil {
				n++
			}
		}
		md.weight.Store(int64(n))
		models = append(models, md)
	}
	ix.modelList.Store(&models)
	ix.budget.weight.Store(int64(len(ix.replicas)))
}
