// Package index is the control plane's live view of the fleet: per model, which replicas
// hold which prefix keys, and each replica's queue, KV usage and health. It is fed by the
// KV-event subscriptions (exact token-domain keys; eviction pressure and clears), the
// filters' reports (speculative and confirmed keys, mostly text domain) and the metrics
// scrapes, and it hands the publisher only what changed since the last table version.
//
// Only checkpoint keys (chain positions stride-1, 2*stride-1, ...) are stored: that is
// all the table carries. Nothing here ever sees prompt text: keys are hashes.
//
// Files:
//   - index.go: Config, Spec, the Index type and its lock order, New, unlockReplica.
//   - replicas.go: the model and replica types; discovery's list (SetReplicas) and
//     slot assignment.
//   - modelkeys.go: a model's key set (which slots hold each key) and the keys changed
//     since the last table build.
//   - holdings.go: which keys a replica holds (holdings, the LRU of reported keys,
//     capacity and eviction of reported keys), and the slot changes they publish.
//   - homes.go: the keys the table stopped listing, with the replica that held each
//     last (table format 4).
//   - speculative.go: placements' speculative entries and their expiry.
//   - events.go: KV events (kvevents.Handler): engine blocks to token-domain keys,
//     gaps, restarts, clears, eviction pressure on reported keys.
//   - recentmean.go: the windowed mean the block measures report.
//   - residency.go: how long a replica's GPU blocks stay cached before eviction.
//   - storedagain.go: how many of a replica's evicted GPU blocks it stores again soon after.
//   - fleetagain.go: how many of them the model's fleet stores again, on any replica.
//   - sglang.go: SGLang's KV events (pages instead of blocks).
//   - tiers.go: blocks held in slower media (vLLM's CPU offloading, LMCache), per
//     replica and medium.
//   - reports.go: the filters' reports (placements, outcomes); learn.go: what outcomes
//     teach (bytes per token, uncached tokens), a median over the reporting proxies;
//     confirmed.go: confirmed keys' expiry and the proxies' fair shares of a replica's LRU.
//   - scrape.go: metrics scrapes and replica health; load.go: the load each replica's
//     table entry carries (requests running, busy fraction, mean uncached prompt);
//     keyed.go: the share of an engine's eviction volume that ages reported keys;
//     placed.go: the queued prefill of engines that do not export it, from placements.
//   - flush.go: what the next table version carries (Flush) and each replica's state.
//   - budget.go: the memory budget (admission, drops); shares.go: each model's share of
//     it; bytes.go: what each kind of entry costs in bytes, for --max-index-bytes;
//     reclaim.go: giving memory back after a flood.
//   - debug.go: GET /debug/state and Prometheus.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package index

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/shared/prefix"
)

// Config are the index's knobs; zero values take the defaults.
type Config struct {
	// BlockBytes and BlockTokens are the text and token block sizes; Stride the table's
	// checkpoint stride. They are published in every model's table.ModelConfig.
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
	// ConfirmedTTL: a confirmed key vanishes this long after the last outcome that
	// confirmed it (confirmed.go), so keys nobody confirms again give their budget back
	// even where no engine eviction ages them. A hot prefix is confirmed every few
	// seconds, and a busy engine evicts a prefix unused for minutes; at most 8 h.
	ConfirmedTTL time.Duration
	// UnhealthyAfter consecutive failed scrapes mark a replica unhealthy.
	UnhealthyAfter int
	// DefaultUncachedTokens is the mean uncached prompt assumed per waiting request
	// before outcomes or the engine's histograms say better.
	DefaultUncachedTokens float64
	// ReportLag is how long after an event its report is taken to have arrived (the
	// filters' report interval and a tick: 100 ms each by default). A queue counted from
	// start reports is dated this long ago, or at the scrape when that is older
	// (placed.go), so that it misses no start and the proxies' ledgers count what came
	// after.
	ReportLag time.Duration
	// MaxKeysPerReplica caps the reported (LRU) keys of one replica whatever its
	// capacity, so a misbehaving reporter cannot grow memory without bound.
	MaxKeysPerReplica int
	// MaxHomes bounds each model's homes (homes.go): 0 takes DefaultMaxHomes, a
	// negative value keeps none.
	MaxHomes int
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
	if c.MaxHomes == 0 {
		c.MaxHomes = DefaultMaxHomes
	}
	if c.DefaultBytesPerToken <= 0 {
		c.DefaultBytesPerToken = 4
	}
	if c.SpecTTL <= 0 {
		c.SpecTTL = 60 * time.Second
	}
	if c.ConfirmedTTL <= 0 {
		c.ConfirmedTTL = 10 * time.Minute
	}
	c.ConfirmedTTL = min(c.ConfirmedTTL, maxConfirmedTTL)
	if c.DefaultUncachedTokens <= 0 {
		c.DefaultUncachedTokens = 512
	}
	if c.ReportLag <= 0 {
		c.ReportLag = 200 * time.Millisecond
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
// Locking, so that ingest scales with cores. mu guards the index's structure
// (replicas, models, slots, the speculative queue, scrape and learned values); every
// replica's mu guards its holdings, LRU and KV-event state; every model's mu guards its
// key -> slots map and changed keys. Order: Index.mu, then replica.mu, then model.mu
// (budgetMu last). KV events take no Index lock: a stream finds its replica in byID,
// applies a whole batch under the replica's lock, and commits the batch's slot changes
// to the model under the model's lock at once (or, when that lock is busy, with its next
// batch or at the next build: unlockStream), so different replicas ingest in parallel
// while each replica's batches stay in order (one subscription goroutine per stream),
// and a table build (Flush, under the model's lock) sees whole batches only.
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
	// modelList is models for the KV-event path's admissions (shares.go).
	modelList atomic.Pointer[[]*model]
	// seed names reporters (confirmed.go reporterID); swept is the Unix second of the
	// last expiry of confirmed keys.
	seed  maphash.Seed
	swept int64
	// byID is replicas for the KV-event path's lookup (it takes no mu); counters it
	// updates.
	byID                       atomic.Pointer[map[string]*replica]
	unknownStreams, lruEvicted atomic.Uint64
	// clock is the stamp of the latest time a build or a report batch was applied at,
	// for the KV-event path, which has no time of its own (ageText).
	clock atomic.Uint32
}

// Stats are global counters (the per-replica ones are in DebugState).
type Stats struct {
	ReportsAccepted, ReportsSkipped uint64
	Placements, Confirms, Refutes   uint64
	FalseHits                       uint64
	SpecExpired, ConfirmedExpired   uint64
	UnknownStreams                  uint64
	LRUEvicted                      uint64
}

// New returns an empty index.
func New(cfg Config) *Index {
	ix := &Index{
		cfg:      cfg.withDefaults(),
		models:   map[string]*model{},
		replicas: map[string]*replica{},
		seed:     maphash.MakeSeed(),
	}
	ix.byID.Store(&map[string]*replica{})
	ix.modelList.Store(&[]*model{})
	return ix
}

// unlockReplica commits r's pending slot changes to its model, records its budget
// size and releases r.mu. Every section that locks a replica ends with it or, at the end
// of a KV-event batch, with unlockStream.
func (ix *Index) unlockReplica(r *replica) {
	if r.hasFlips() {
		r.m.mu.Lock()
		r.m.commit(r)
		r.m.mu.Unlock()
	}
	ix.release(r)
}

// unlockStream is unlockReplica at the end of a KV-event batch, except that when the
// model's lock is taken (another replica of the model committing, or a table build) the
// batch's changes stay pending, up to maxPendingFlips, instead of waiting for it: the
// replica's next batch commits them, or the next Flush does (collectPending). With
// every stream waiting for the lock at the end of each batch, a one-model fleet's
// streams would queue on it (BenchmarkIngestEndToEnd -cpu 2, its mutex profile).
// Pending changes are whole batches, in order, so a build still sees whole batches.
func (ix *Index) unlockStream(r *replica) {
	if r.hasFlips() {
		m := r.m
		if len(r.flips)+len(r.tierFlips) > maxPendingFlips {
			m.mu.Lock()
		} else if !m.mu.TryLock() {
			r.pending.Store(true)
			r.deferred++
			ix.release(r)
			return
		}
		m.commit(r)
		m.mu.Unlock()
	}
	ix.release(r)
}

// maxPendingFlips bounds the slot changes a replica keeps pending (16 bytes each): past
// it, the end of a batch waits for the model's lock.
const maxPendingFlips = 1 << 14

func (r *replica) hasFlips() bool { return len(r.flips) > 0 || len(r.tierFlips) > 0 }

// commit applies r's pending slot changes to m. Caller holds r.mu and m.mu.
func (m *model) commit(r *replica) {
	for _, f := range r.flips {
		m.setSlot(f.key, r.slot, f.on, f.placed)
	}
	for _, f := range r.tierFlips {
		m.setTier(f.key, f.tier, r.slot, f.on)
	}
	r.flips = r.flips[:0]
	r.tierFlips = r.tierFlips[:0]
	r.pending.Store(false)
}

// collectPending commits the changes m's replicas left pending (unlockStream) when the
// replica's lock is free; a replica applying a batch now commits them at its end. Caller
// holds Index.mu and m.mu, so it only tries the replicas' locks (their order is before
// the model's).
func (m *model) collectPending() {
	for _, r := range m.slots {
		if r != nil && r.pending.Load() && r.mu.TryLock() {
			m.commit(r)
			r.mu.Unlock()
		}
	}
}

// release records r's budget size and releases r.mu.
func (ix *Index) release(r *replica) {
	n := r.hold.Len() + len(r.tierHold)
	for _, rk := range r.ranks {
		n += rk.blocks.Len() + len(rk.tier)
		if rk.sg != nil {
			n += rk.sg.live // SGLang pages are tracked apart from rk.blocks (sglang.go)
		}
	}
	r.size.Store(int64(n))
	r.mu.Unlock()
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

// LearnedMean folds sample v into mean cur of n earlier samples the way the index learns
// a reporter's means (a plain mean for the first 20, then a weight of 0.05); the fleet
// simulator's oracle learns its mean uncached tokens with it.
func LearnedMean(cur float64, n int, v float64) float64 { return ewma(cur, n, v, learnAlpha) }

// ewma with a warm-up: a plain mean for the first samples, then weight alpha.
func ewma(cur float64, n int, v, alpha float64) float64 {
	if n < int(1/alpha) {
		return cur + (v-cur)/float64(n+1)
	}
	return cur + alpha*(v-cur)
}
