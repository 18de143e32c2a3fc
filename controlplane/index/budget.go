package index

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/prometheus/client_golang/prometheus"
)

// The memory budget (issue 12). Every input that creates state is admitted against two
// limits before anything is stored:
//
//   - per replica: a replica cannot cache more than num_gpu_blocks x block_size tokens
//     (vLLM's vllm:cache_config_info; DefaultCapacityTokens until a scrape says), so it
//     holds at most Slack x capacity / (stride x block_tokens) checkpoint keys of all
//     sources (speculative, confirmed, KV events: the same prefix can be held in both
//     domains and be speculative meanwhile, hence the slack), and its KV-event streams
//     track at most Slack x capacity / block_size engine blocks;
//   - globally: MaxKeys entries (keys held by replicas plus engine blocks tracked), the
//     --max-keys flag, and MaxBytes bytes of the index's structures, --max-index-bytes
//     (bytes.go prices each kind of entry). Both apply: whichever binds first. Without
//     MaxBytes, MaxKeys defaults to DefaultMaxKeys; with it, to no entry limit.
//
// A report whose chain is longer than the replica's whole KV cache is dropped whole
// (oversized); otherwise a chain is admitted up to the first key that does not fit (its
// root is what routing needs) and the rest is dropped. Discovery is capped at
// MaxReplicas. Every drop is counted (BudgetState, kvroute_controlplane_budget_dropped_total).
//
// What a flood leaves allocated is given back by Reclaim (reclaim.go).

// Budget configures the limits; zero values take the defaults.
type Budget struct {
	// MaxKeys caps the index's entries over all replicas. At the default the control
	// plane stays under about 300 MB RSS whatever its inputs (TestReportFlood).
	MaxKeys int
	// MaxBytes caps the index's structures in bytes as bytes.go prices them; 0: no
	// byte limit.
	MaxBytes int64
	// DefaultCapacityTokens is a replica's KV capacity until its metrics give one.
	DefaultCapacityTokens int64
	// Slack multiplies the per-replica limits derived from the capacity.
	Slack float64
	// MaxReplicas caps the replicas discovery may list.
	MaxReplicas int
}

// Defaults of the budget.
const (
	DefaultMaxKeys               = 1 << 18
	DefaultCapacityTokens        = 1 << 21
	DefaultSlack                 = 4
	DefaultMaxReplicas           = 4096
	minReplicaKeys               = 1024 // a replica's limit is never below this
	recountEvery                 = 10 * time.Millisecond
	inputReportKeys, inputBlocks = "report_keys", "kv_blocks"
	inputReplicas                = "replicas"
	reasonOversized              = "oversized"
	reasonReplica                = "replica_budget"
	reasonGlobal                 = "global_budget"
	reasonMaxReplicas            = "max_replicas"
	noKeyLimit                   = 1 << 50 // MaxKeys when only MaxBytes is given
)

func (b Budget) withDefaults() Budget {
	switch {
	case b.MaxKeys > 0:
	case b.MaxBytes > 0:
		b.MaxKeys = noKeyLimit
	default:
		b.MaxKeys = DefaultMaxKeys
	}
	if b.DefaultCapacityTokens <= 0 {
		b.DefaultCapacityTokens = DefaultCapacityTokens
	}
	if b.Slack <= 0 {
		b.Slack = DefaultSlack
	}
	if b.MaxReplicas <= 0 {
		b.MaxReplicas = DefaultMaxReplicas
	}
	return b
}

// budgetState is the index's accounting. The KV-event path admits without Index.mu:
// used, bytes, countedN, extra and spec are safe for concurrent use, and mu (taken last,
// after any replica or model lock) guards counted, dropped and hwm; reclaims is
// guarded by Index.mu.
type budgetState struct {
	used     atomic.Int64 // entries at the last recount plus those admitted since
	bytes    atomic.Int64 // bytes at the last recount (bytes.go)
	countedN atomic.Int64 // entries at the last recount
	extra    atomic.Int64 // bytes of expiry items, the queue's growth (admitSpec) and keymap growth admitted since
	spec     atomic.Int64 // the speculative queue's bytes (measured under Index.mu: meterSpec)
	mu       sync.Mutex
	counted  time.Time
	dropped  map[dropKey]uint64
	hwm      map[hwmKey]int
	reclaims uint64
}

type dropKey struct{ input, reason string }

func (ix *Index) drop(input, reason string, n int) {
	if n <= 0 {
		return
	}
	ix.budget.mu.Lock()
	defer ix.budget.mu.Unlock()
	if ix.budget.dropped == nil {
		ix.budget.dropped = map[dropKey]uint64{}
	}
	ix.budget.dropped[dropKey{input, reason}] += uint64(n)
}

// recount sums the entries the budget covers, every replica's size as of its last
// unlock (unlockReplica: holdings plus engine blocks and pages tracked), and prices
// them (bytes.go). Caller holds budget.mu.
func (ix *Index) recount(now time.Time) {
	n, b := ix.count(*ix.byID.Load())
	ix.budget.used.Store(n)
	ix.budget.countedN.Store(n)
	ix.budget.bytes.Store(b)
	ix.budget.extra.Store(0)
	ix.budget.counted = now
}

// globalRoom is how many new entries the global limits admit when admitting them also
// allocates grow bytes at once (keymaps that double: bytes.go keymapGrowth). The
// running counts only grow between recounts (removals are not tracked), so a shortfall
// triggers a recount, at most every recountEvery.
func (ix *Index) globalRoom(want int, grow int64) int {
	if ix.room(grow) < int64(want) {
		ix.recountSoon()
	}
	return int(ix.room(grow))
}

// recountSoon recounts unless the last recount is less than recountEvery old.
func (ix *Index) recountSoon() {
	ix.budget.mu.Lock()
	if now := time.Now(); now.Sub(ix.budget.counted) >= recountEvery {
		ix.recount(now)
	}
	ix.budget.mu.Unlock()
}

// room is how many new entries both limits admit now: MaxKeys less the entries, and
// the bytes MaxBytes leaves, less grow, at worstEntry an entry.
func (ix *Index) room(grow int64) int64 {
	used := ix.budget.used.Load()
	room := int64(ix.cfg.Budget.MaxKeys) - used
	if maxB := ix.cfg.Budget.MaxBytes; maxB > 0 {
		room = min(room, (maxB-ix.bytesNow(used)-grow)/worstEntry)
	}
	return room
}

// bytesNow is the bytes at the last recount plus worstEntry for each entry admitted
// since, plus the expiry items, the queue's growth and keymap growth admitted since.
func (ix *Index) bytesNow(used int64) int64 {
	return ix.budget.bytes.Load() + max(used-ix.budget.countedN.Load(), 0)*worstEntry + ix.budget.extra.Load()
}

func (ix *Index) capacityTokens(r *replica) int64 {
	if r.sample.CapacityTokens > 0 {
		return r.sample.CapacityTokens
	}
	return ix.cfg.Budget.DefaultCapacityTokens
}

// keyLimit is how many keys replica r may hold, all sources together.
func (ix *Index) keyLimit(r *replica) int {
	n := int(float64(ix.capacityTokens(r)) / ix.tokenFootprint() * ix.cfg.Budget.Slack)
	return min(max(n, minReplicaKeys), ix.cfg.MaxKeysPerReplica)
}

// blockLimit is how many engine blocks the KV-event streams of replica r may track.
func (ix *Index) blockLimit(r *replica, rk *rank) int {
	n := int(float64(ix.capacityTokens(r)) / float64(ix.engineBlockSize(r, rk)) * ix.cfg.Budget.Slack)
	return min(max(n, minReplicaKeys), ix.cfg.Budget.MaxKeys)
}

// admitKeys returns the prefix of a report's keys that the budget lets replica r hold,
// counting the rest as dropped (why says for what reason, "" when nothing was).
// evict, for confirmed keys, may make room in the replica's own LRU of reported keys.
func (ix *Index) admitKeys(r *replica, rep *api.Report, evict bool) (kept []uint64, why string) {
	keys := rep.Keys
	fp := ix.tokenFootprint()
	if rep.Domain == prefix.Text {
		fp = ix.textFootprint(r.m)
	}
	if float64(len(keys))*fp > float64(ix.capacityTokens(r)) {
		ix.drop(inputReportKeys, reasonOversized, len(keys))
		return nil, reasonOversized
	}
	fresh := 0
	for _, k := range keys {
		if _, ok := r.hold.Get(k); !ok {
			fresh++
		}
	}
	limit := ix.keyLimit(r)
	for evict && r.hold.Len()+fresh > limit && r.tail >= 0 {
		ix.evictTail(r)
	}
	room := limit - r.hold.Len()
	reason := reasonReplica
	grow := keymapGrowth(&r.hold, fresh)
	if g := ix.globalRoom(fresh, grow); g < room {
		room, reason = g, reasonGlobal
	}
	if fresh > room {
		n := 0
		for i, k := range keys {
			if _, ok := r.hold.Get(k); ok {
				continue
			}
			if n == max(room, 0) {
				ix.drop(inputReportKeys, reason, len(keys)-i)
				keys, why = keys[:i], reason
				break
			}
			n++
		}
		fresh = n
	}
	ix.budget.used.Add(int64(fresh))
	ix.budget.extra.Add(keymapGrowth(&r.hold, fresh))
	if !evict {
		keys, why = ix.admitSpec(keys, why)
		ix.meterSpec(len(keys)) // bytes.go
	}
	ix.meterReplica(r, fresh, nil, 0)
	ix.noteHWM(hwmKey{r: r, what: hwmHold}, r.hold.Len()+fresh)
	r.m.mu.Lock()
	mk := r.m.keys.Len()
	ix.meterModel(r.m, fresh, time.Now())
	r.m.mu.Unlock()
	ix.noteHWM(hwmKey{m: r.m, what: hwmKeys}, mk+fresh)
	return keys, why
}

// admitSpec cuts a placement's chain to the expiry items the byte budget has room for:
// a placement queues one for each of its keys (speculative.go), held already or not, so
// placements that refresh held keys grow the queue without adding entries.
func (ix *Index) admitSpec(keys []uint64, why string) ([]uint64, string) {
	maxB := ix.cfg.Budget.MaxBytes
	if maxB <= 0 {
		return keys, why
	}
	// Items that make the queue's array grow are charged its new array too (the
	// queue's items are charged twice each, but that covers a growth only on average).
	free := int64(cap(ix.specQ) - len(ix.specQ))
	grow := ix.specGrowth(len(keys))
	room := func() int64 {
		left := maxB - ix.bytesNow(ix.budget.used.Load())
		return max((left-grow)/specCharge, min(left/specCharge, free))
	}
	if room() < int64(len(keys)) {
		ix.recountSoon()
	}
	if n := int(max(room(), 0)); n < len(keys) {
		ix.drop(inputReportKeys, reasonGlobal, len(keys)-n)
		keys, why = keys[:n], reasonGlobal
	}
	ix.budget.extra.Add(int64(len(keys))*specCharge + ix.specGrowth(len(keys)))
	return keys, why
}

// admitBlocks says whether a BlockStored event's blocks fit the budget; when they do
// not, they are counted as dropped and not indexed (their children become orphans).
func (ix *Index) admitBlocks(r *replica, rk *rank, ev *kvevents.Event) bool {
	n := len(ev.Hashes)
	bt := max(ix.cfg.BlockTokens, 1)
	keys := (n*max(ev.BlockSize, bt)/bt)/max(ix.cfg.Stride, 1) + 1 // checkpoint keys it can add
	grow := keymapGrowth(&rk.blocks, n) + keymapGrowth(&r.hold, keys)
	switch {
	case rk.blocks.Len()+n > ix.blockLimit(r, rk) || r.hold.Len()+keys > ix.keyLimit(r):
		ix.drop(inputBlocks, reasonReplica, n)
		return false
	case ix.globalRoom(n+keys, grow) < n+keys:
		ix.drop(inputBlocks, reasonGlobal, n)
		return false
	}
	ix.budget.used.Add(int64(n + keys))
	ix.budget.extra.Add(grow)
	ix.meterReplica(r, keys, rk, n)                   // bytes.go
	ix.meterModelSoon(r.m, keys, rk.lastEvent)        // the batch's arrival: no clock read per event
	if nb := rk.blocks.Len() + n; nb > rk.peakNoted { // noteHWM takes budget.mu
		rk.peakNoted = nb
		ix.noteHWM(hwmKey{r: r, rank: rk.num, what: hwmBlocks}, nb)
	}
	return true
}

// admitReplicas caps discovery's list at MaxReplicas (in ID order, so the same ones
// stay), counting the rest.
func (ix *Index) admitReplicas(specs []Spec) []Spec {
	max := ix.cfg.Budget.MaxReplicas
	if len(specs) <= max {
		return specs
	}
	specs = slices.Clone(specs)
	slices.SortFunc(specs, func(a, b Spec) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	ix.drop(inputReplicas, reasonMaxReplicas, len(specs)-max)
	return specs[:max]
}

// BudgetState is the budget part of GET /debug/state.
type BudgetState struct {
	MaxKeys int `json:"max_keys"` // 0: none (only MaxBytes was given)
	Keys    int `json:"keys"`
	// MaxBytes and Bytes: the byte limit (0: none) and the index's bytes (bytes.go).
	MaxBytes    int64                        `json:"max_bytes"`
	Bytes       int64                        `json:"bytes"`
	MaxReplicas int                          `json:"max_replicas"`
	Reclaims    uint64                       `json:"reclaims"`
	Dropped     map[string]map[string]uint64 `json:"dropped"`
}

// BudgetState returns the budget's limits, use and drops (input -> reason -> count),
// every replica and model measured afresh.
func (ix *Index) BudgetState() BudgetState {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.meterAll() // bytes.go
	ix.budget.mu.Lock()
	defer ix.budget.mu.Unlock()
	ix.recount(time.Now())
	maxKeys := ix.cfg.Budget.MaxKeys
	if maxKeys == noKeyLimit {
		maxKeys = 0
	}
	st := BudgetState{MaxKeys: maxKeys, Keys: int(ix.budget.used.Load()), MaxReplicas: ix.cfg.Budget.MaxReplicas,
		MaxBytes: ix.cfg.Budget.MaxBytes, Bytes: ix.budget.bytes.Load(),
		Reclaims: ix.budget.reclaims, Dropped: map[string]map[string]uint64{}}
	for k, n := range ix.budget.dropped {
		if st.Dropped[k.input] == nil {
			st.Dropped[k.input] = map[string]uint64{}
		}
		st.Dropped[k.input][k.reason] = n
	}
	return st
}

// replicaBudget fills a replica's budget fields of /debug/state.
func (ix *Index) replicaBudget(r *replica, rs *ReplicaState) {
	rs.Keys, rs.KeyLimit, rs.SpeculativeKeys = r.hold.Len(), ix.keyLimit(r), r.specN
}

// BudgetCollector exports the budget to Prometheus.
func (ix *Index) BudgetCollector() prometheus.Collector { return (*budgetCollector)(ix) }

type budgetCollector Index

var (
	dBudgetDropped = prometheus.NewDesc("kvroute_controlplane_budget_dropped_total",
		"Inputs dropped by the memory budget, never stored: input report_keys|kv_blocks|replicas, reason oversized|replica_budget|global_budget|max_replicas.",
		[]string{"input", "reason"}, nil)
	dBudgetKeys = prometheus.NewDesc("kvroute_controlplane_budget_keys",
		"Entries the budget covers (keys held by replicas plus engine blocks tracked).", nil, nil)
	dBudgetMax   = prometheus.NewDesc("kvroute_controlplane_budget_max_keys", "The global limit on those entries (--max-keys; 0: none).", nil, nil)
	dBudgetBytes = prometheus.NewDesc("kvroute_controlplane_budget_bytes",
		"The index's structures in bytes, priced by kind of entry (keys held, engine blocks, pages, speculative entries, replicas).", nil, nil)
	dBudgetMaxBytes = prometheus.NewDesc("kvroute_controlplane_budget_max_bytes", "The global limit on those bytes (--max-index-bytes; 0: none).", nil, nil)
)

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dBudgetDropped
	ch <- dBudgetKeys
	ch <- dBudgetMax
	ch <- dBudgetBytes
	ch <- dBudgetMaxBytes
}

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	st := (*Index)(c).BudgetState()
	// Every reason is exported from the start, so rates work before the first drop.
	for _, in := range []string{inputReportKeys, inputBlocks} {
		for _, why := range []string{reasonOversized, reasonReplica, reasonGlobal} {
			if in == inputBlocks && why == reasonOversized {
				continue
			}
			ch <- prometheus.MustNewConstMetric(dBudgetDropped, prometheus.CounterValue, float64(st.Dropped[in][why]), in, why)
		}
	}
	ch <- prometheus.MustNewConstMetric(dBudgetDropped, prometheus.CounterValue, float64(st.Dropped[inputReplicas][reasonMaxReplicas]), inputReplicas, reasonMaxReplicas)
	ch <- prometheus.MustNewConstMetric(dBudgetKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(dBudgetMax, prometheus.GaugeValue, float64(st.MaxKeys))
	ch <- prometheus.MustNewConstMetric(dBudgetBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(dBudgetMaxBytes, prometheus.GaugeValue, float64(st.MaxBytes))
}

// overBudget is a report's result when the budget dropped all of its keys, else "".
func overBudget(rep *api.Report, kept []uint64, why string) string {
	switch {
	case len(rep.Keys) == 0 || len(kept) > 0 || why == "":
		return ""
	case why == reasonOversized:
		return reasonOversized
	}
	return "over_budget"
}
