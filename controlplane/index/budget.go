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

// The memory budget. Every input that creates state is admitted against two
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
//     either, the limit is DefaultMaxBytes and no entry count.
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
	DefaultMaxBytes              = 256 << 20 // with Go's heap at twice its live size, half the manifests' 1 GiB
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
	reasonShare                  = "model_share" // past the model's share, the others active (shares.go)
	reasonMaxReplicas            = "max_replicas"
	noKeyLimit                   = 1 << 50 // MaxKeys when only MaxBytes is given
)

// withDefaults fills the limits. Without either, the budget is DefaultMaxBytes of index and
// no entry count: what a fleet needs grows with its replicas and their tiers, an entry
// count does not (TestDefaultBudgetHoldsAFleet), and bytes are what a pod has.
func (b Budget) withDefaults() Budget {
	switch {
	case b.MaxKeys > 0:
	case b.MaxBytes > 0:
		b.MaxKeys = noKeyLimit
	default:
		b.MaxKeys, b.MaxBytes = noKeyLimit, DefaultMaxBytes
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
// usage, spec and weight are safe for concurrent use, and mu (taken last, after any
// replica or model lock) guards counted, dropped, hwm and shareReclaimed; reclaims is
// guarded by Index.mu.
type budgetState struct {
	usage               // the whole index's (shares.go); each model has its own
	spec   atomic.Int64 // the speculative queue's bytes (measured under Index.mu: meterSpec)
	weight atomic.Int64 // all models' replicas: the shares' denominator (shares.go)
	mu     sync.Mutex
	// counted is when the last recount was.
	counted        time.Time
	dropped        map[dropKey]uint64
	hwm            map[hwmKey]int
	reclaims       uint64
	shareReclaimed uint64 // entries taken back from models past their share (shares.go)
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
// them (bytes.go), for the whole index and each model. Caller holds budget.mu.
func (ix *Index) recount(now time.Time) {
	n, b := ix.count(*ix.byID.Load())
	ix.budget.set(n, b)
	ix.budget.counted = now
}

// recountSoon recounts unless the last recount is less than recountEvery old.
func (ix *Index) recountSoon() {
	ix.budget.mu.Lock()
	if now := time.Now(); now.Sub(ix.budget.counted) >= recountEvery {
		ix.recount(now)
	}
	ix.budget.mu.Unlock()
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
// ev, for confirmed keys, may make room in the replica's own LRU of reported keys
// (confirmed.go: whose keys go); nil for placements.
func (ix *Index) admitKeys(r *replica, rep *api.Report, ev *evictor) (kept []uint64, why string) {
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
	for ev != nil && r.hold.Len()+fresh > limit {
		if !ev.evict(ix, false) {
			break
		}
	}
	room := limit - r.hold.Len()
	reason := reasonReplica
	grow := keymapGrowth(&r.hold, fresh)
	now := time.Now()
	if g, why := ix.roomFor(r.m, fresh, grow, now); g < room {
		room, reason = g, why
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
	ix.charge(r.m, int64(fresh), keymapGrowth(&r.hold, fresh))
	if ev == nil {
		keys, why = ix.admitSpec(r.m, keys, why, now)
		ix.meterSpec(len(keys)) // bytes.go
	}
	ix.meterReplica(r, fresh, nil, 0)
	ix.noteHWM(hwmKey{r: r, what: hwmHold}, r.hold.Len()+fresh)
	r.m.mu.Lock()
	mk := r.m.keys.Len()
	ix.meterModel(r.m, fresh, now)
	r.m.mu.Unlock()
	ix.noteHWM(hwmKey{m: r.m, what: hwmKeys}, mk+fresh)
	return keys, why
}

// admitSpec cuts a placement's chain to the expiry items the byte budget (and model
// m's share of it: shares.go) has room for: a placement queues one for each of its keys
// (speculative.go), held already or not, so placements that refresh held keys grow the
// queue without adding entries.
func (ix *Index) admitSpec(m *model, keys []uint64, why string, now time.Time) ([]uint64, string) {
	maxB := ix.cfg.Budget.MaxBytes
	if maxB <= 0 {
		return keys, why
	}
	// Items that make the queue's array grow are charged its new array too (the
	// queue's items are charged twice each, but that covers a growth only on average).
	free := int64(cap(ix.specQ) - len(ix.specQ))
	grow := ix.specGrowth(len(keys))
	room := func() (int64, string) {
		left := maxB - ix.budget.bytesNow()
		n := max((left-grow)/specCharge, min(left/specCharge, free))
		if l, limited := ix.modelLeft(m, now.UnixNano()); limited && (l.bytes-grow)/specCharge < n {
			return (l.bytes - grow) / specCharge, reasonShare
		}
		return n, reasonGlobal
	}
	if n, _ := room(); n < int64(len(keys)) {
		ix.recountSoon()
	}
	if n, reason := room(); n < int64(len(keys)) {
		n = max(n, 0)
		ix.drop(inputReportKeys, reason, len(keys)-int(n))
		keys, why = keys[:n], reason
	}
	ix.charge(m, 0, int64(len(keys))*specCharge+ix.specGrowth(len(keys)))
	return keys, why
}

// admitBlocks says whether a BlockStored event's blocks fit the budget; when they do
// not, they are counted as dropped and not indexed (their children become orphans).
func (ix *Index) admitBlocks(r *replica, rk *rank, ev *kvevents.Event) bool {
	n := len(ev.Hashes)
	bt := max(ix.cfg.BlockTokens, 1)
	keys := (n*max(ev.BlockSize, bt)/bt)/max(ix.cfg.Stride, 1) + 1 // checkpoint keys it can add
	grow := keymapGrowth(&rk.blocks, n) + keymapGrowth(&r.hold, keys)
	if rk.blocks.Len()+n > ix.blockLimit(r, rk) || r.hold.Len()+keys > ix.keyLimit(r) {
		ix.drop(inputBlocks, reasonReplica, n)
		return false
	}
	if room, why := ix.roomFor(r.m, n+keys, grow, rk.lastEvent); room < n+keys {
		ix.drop(inputBlocks, why, n)
		return false
	}
	ix.charge(r.m, int64(n+keys), grow)
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
	// Models: each model's part (shares.go); ShareReclaimed: entries taken back from
	// models past their share for active ones. Exported as metrics, not in /debug/state
	// (whose fields controlplane/server's tests pin).
	Models         map[string]ModelBudget `json:"-"`
	ShareReclaimed uint64                 `json:"-"`
}

// ModelBudget is one model's use of the budget and its share of the limits.
type ModelBudget struct {
	Keys       int   `json:"keys"`
	ShareKeys  int64 `json:"share_keys"` // 0: no entry limit
	Bytes      int64 `json:"bytes"`
	ShareBytes int64 `json:"share_bytes"` // 0: no byte limit
	// Active: it asked for room within the last minute, so what it does not use of its
	// share is kept for it rather than lent.
	Active bool `json:"active"`
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
		Reclaims: ix.budget.reclaims, Dropped: map[string]map[string]uint64{},
		Models: map[string]ModelBudget{}, ShareReclaimed: ix.budget.shareReclaimed}
	nowNs := time.Now().UnixNano()
	for name, m := range ix.models {
		share := ix.shareOf(m)
		if maxKeys == 0 {
			share.keys = 0
		}
		st.Models[name] = ModelBudget{Keys: int(m.use.used.Load()), ShareKeys: share.keys, Bytes: m.use.bytes.Load(),
			ShareBytes: share.bytes, Active: m.active(nowNs)}
	}
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
		"Inputs dropped by the memory budget, never stored: input report_keys|kv_blocks|replicas|outcome_samples, reason oversized|replica_budget|global_budget|model_share|max_replicas|max_reporters.",
		[]string{"input", "reason"}, nil)
	dBudgetKeys = prometheus.NewDesc("kvroute_controlplane_budget_keys",
		"Entries the budget covers (keys held by replicas plus engine blocks tracked).", nil, nil)
	dBudgetMax   = prometheus.NewDesc("kvroute_controlplane_budget_max_keys", "The global limit on those entries (--max-keys; 0: none).", nil, nil)
	dBudgetBytes = prometheus.NewDesc("kvroute_controlplane_budget_bytes",
		"The index's structures in bytes, priced by kind of entry (keys held, engine blocks, pages, speculative entries, replicas).", nil, nil)
	dBudgetMaxBytes = prometheus.NewDesc("kvroute_controlplane_budget_max_bytes", "The global limit on those bytes (--max-index-bytes; 0: none).", nil, nil)
	dModelKeys      = prometheus.NewDesc("kvroute_controlplane_budget_model_keys", "Entries the budget covers, per model.", []string{"model"}, nil)
	dModelShare     = prometheus.NewDesc("kvroute_controlplane_budget_model_share_keys",
		"The model's share of --max-keys (its replicas' part of all replicas'; 0: no entry limit): past it, it borrows only what idle models do not use.", []string{"model"}, nil)
	dShareReclaimed = prometheus.NewDesc("kvroute_controlplane_budget_share_reclaimed_total",
		"Entries (reported keys) taken back from models past their share for models that need theirs.", nil, nil)
)

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dBudgetDropped
	ch <- dBudgetKeys
	ch <- dBudgetMax
	ch <- dBudgetBytes
	ch <- dBudgetMaxBytes
	ch <- dModelKeys
	ch <- dModelShare
	ch <- dShareReclaimed
}

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	st := (*Index)(c).BudgetState()
	// Every reason is exported from the start, so rates work before the first drop.
	for _, in := range []string{inputReportKeys, inputBlocks} {
		for _, why := range []string{reasonOversized, reasonReplica, reasonGlobal, reasonShare} {
			if in == inputBlocks && why == reasonOversized {
				continue
			}
			ch <- prometheus.MustNewConstMetric(dBudgetDropped, prometheus.CounterValue, float64(st.Dropped[in][why]), in, why)
		}
	}
	ch <- prometheus.MustNewConstMetric(dBudgetDropped, prometheus.CounterValue, float64(st.Dropped[inputReplicas][reasonMaxReplicas]), inputReplicas, reasonMaxReplicas)
	ch <- prometheus.MustNewConstMetric(dBudgetDropped, prometheus.CounterValue, float64(st.Dropped[inputSamples][reasonMaxReporters]), inputSamples, reasonMaxReporters)
	for name, mb := range st.Models {
		ch <- prometheus.MustNewConstMetric(dModelKeys, prometheus.GaugeValue, float64(mb.Keys), name)
		ch <- prometheus.MustNewConstMetric(dModelShare, prometheus.GaugeValue, float64(mb.ShareKeys), name)
	}
	ch <- prometheus.MustNewConstMetric(dShareReclaimed, prometheus.CounterValue, float64(st.ShareReclaimed))
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
