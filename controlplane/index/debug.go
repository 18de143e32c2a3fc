package index

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReplicaState is one replica in GET /debug/state. It holds hashes' counts only.
type ReplicaState struct {
	ID             string  `json:"id"`
	Model          string  `json:"model"`
	Address        string  `json:"address"`
	Healthy        bool    `json:"healthy"`
	StateAgeMs     int64   `json:"state_age_ms"`
	QueueTokens    float64 `json:"queue_tokens"` // Q(r) as the table carries it
	Running        float64 `json:"running"`
	Waiting        float64 `json:"waiting"`
	KVUsage        float64 `json:"kv_usage"`
	CapacityTokens int64   `json:"capacity_tokens"`
	TextKeys       int     `json:"text_keys"`
	TokenKeys      int     `json:"token_keys"`
	// Homes are the keys the table lists nowhere whose home is this replica (homes.go).
	Homes    int      `json:"homes"`
	KVEvents KVEvents `json:"kv_events"`
	// Budget (budget.go): keys held (all sources), the replica's limit, speculative ones.
	Keys            int `json:"keys"`
	KeyLimit        int `json:"key_limit"`
	SpeculativeKeys int `json:"speculative_keys"`

	spec       int
	scrapeErrs uint64
	orphans    uint64
	skipped    uint64
	restarts   uint64
	hasEvents  bool
}

// KVEvents sums a replica's event streams (one per DP rank); last_seq is rank 0's.
type KVEvents struct {
	Connected bool `json:"connected"`
	// LastEventAgeMs is the time since the stalest stream's last batch, -1 before
	// every stream had one.
	LastEventAgeMs int64  `json:"last_event_age_ms"`
	LastSeq        int64  `json:"last_seq"`
	Batches        uint64 `json:"batches"`
	StoredBlocks   uint64 `json:"stored_blocks"`
	RemovedBlocks  uint64 `json:"removed_blocks"`
	Clears         uint64 `json:"clears"`
	Gaps           uint64 `json:"gaps"`
	DecodeErrors   uint64 `json:"decode_errors"`
	// EvictedResidencyS is how long the replica's GPU blocks stayed cached before their
	// eviction, in seconds on the engine's clock: the mean over its ranks' last few
	// hundred measured evictions (one block in 64 followed), -1 before any. vLLM does
	// not publish hits, so it is the whole stay, not the time since the last use; the
	// shorter, the faster the cache turns over.
	EvictedResidencyS float64 `json:"evicted_block_residency_s"`
	// EvictedStoredAgain is the share of the replica's evicted GPU blocks that it stored
	// again within 5 minutes of their eviction (prefilled again, or loaded back from a
	// slower tier), over its ranks' last thousand or so followed evictions, each counted
	// 5 minutes after it; -1 before any. High, the cache is too small for what is asked
	// of it.
	EvictedStoredAgain float64 `json:"evicted_blocks_stored_again"`
	// EvictedStoredAgainFleet is the share of the same evictions stored again on any
	// replica of the model (the index's own block keys, alike on every replica): what
	// the fleet paid again, which a router that moves evicted prefixes keeps off the
	// replica's own share; -1 before any.
	EvictedStoredAgainFleet float64 `json:"evicted_blocks_stored_again_fleet"`
	// DeferredCommits counts the batches whose end found the model's lock busy (another
	// replica of the model committing, or a table build) and left their changes for
	// later. Growing with Batches, it says the model's lock is what limits ingest.
	DeferredCommits uint64 `json:"deferred_commits"`
}

// DebugState lists every replica, sorted by model and id.
func (ix *Index) DebugState(now time.Time) []ReplicaState {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]ReplicaState, 0, len(ix.replicas))
	for _, r := range ix.replicas {
		r.mu.Lock()
		st := ix.replicaState(r, now)
		rs := ReplicaState{
			ID: r.spec.ID, Model: r.spec.Model, Address: r.spec.Addr, Healthy: r.healthy,
			StateAgeMs: int64(st.StateAgeMs), QueueTokens: float64(st.Queued),
			Running: r.sample.Running, Waiting: r.sample.Waiting, KVUsage: r.sample.KVUsage,
			CapacityTokens: r.sample.CapacityTokens,
			TextKeys:       r.lruText, TokenKeys: r.tokenKeys + r.lruTok,
			Homes:      r.m.homesOf(r.slot),
			KVEvents:   KVEvents{LastSeq: -1, LastEventAgeMs: -1, DeferredCommits: r.deferred},
			spec:       r.specN,
			scrapeErrs: r.scrapeErrs,
			hasEvents:  r.spec.Events,
		}
		ix.replicaBudget(r, &rs)
		rs.KVEvents.Connected = len(r.ranks) > 0
		rs.KVEvents.EvictedResidencyS = residencyOf(r.ranks)
		rs.KVEvents.EvictedStoredAgain = storedAgainOf(r.ranks)
		rs.KVEvents.EvictedStoredAgainFleet = r.fleetBack.or(-1)
		for i, rk := range r.ranks { // ascending: the first is the lowest rank
			switch age := now.Sub(rk.lastEvent).Milliseconds(); {
			case rk.lastEvent.IsZero():
				rs.KVEvents.LastEventAgeMs = -1
			case i == 0 || (rs.KVEvents.LastEventAgeMs >= 0 && age > rs.KVEvents.LastEventAgeMs):
				rs.KVEvents.LastEventAgeMs = max(age, 0)
			}
			if i == 0 {
				rs.KVEvents.LastSeq = rk.lastSeq
			}
			rs.KVEvents.Connected = rs.KVEvents.Connected && rk.connected
			rs.KVEvents.Batches += rk.batches
			rs.KVEvents.StoredBlocks += rk.stored
			rs.KVEvents.RemovedBlocks += rk.removed
			rs.KVEvents.Clears += rk.clears
			rs.KVEvents.Gaps += rk.gaps
			rs.KVEvents.DecodeErrors += rk.decodeErrors
			rs.orphans += rk.orphans
			rs.skipped += rk.skipped
			rs.restarts += rk.restarts
		}
		r.mu.Unlock()
		out = append(out, rs)
	}
	slices.SortFunc(out, func(a, b ReplicaState) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Collector exports the index's per-replica state to Prometheus at scrape time.
func (ix *Index) Collector() prometheus.Collector { return (*collector)(ix) }

type collector Index

var (
	lbl  = []string{"model", "replica"}
	desc = func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvroute_controlplane_"+name, help, lbl, nil)
	}
	dQueue     = desc("replica_queue_tokens", "Q(r): uncached prompt tokens queued on the replica, as published.")
	dKV        = desc("replica_kv_usage", "KV-cache usage of the replica, 0..1.")
	dHealthy   = desc("replica_healthy", "1 when the replica's scrapes succeed.")
	dAge       = desc("replica_state_age_seconds", "Time since the replica's last successful scrape.")
	dCap       = desc("replica_capacity_tokens", "KV-cache capacity in tokens (num_gpu_blocks x block_size).")
	dText      = desc("replica_text_keys", "Confirmed text-domain checkpoint keys held by the replica.")
	dToken     = desc("replica_token_keys", "Token-domain checkpoint keys held by the replica.")
	dSpec      = desc("replica_speculative_keys", "Speculative checkpoint keys (placements not yet confirmed).")
	dConn      = desc("kv_events_connected", "1 when every KV-event stream of the replica is connected (the subscription's own connection, not a probe).")
	dEventAge  = desc("kv_event_last_age_seconds", "Time since the replica's stalest KV-event stream delivered a batch (absent before every stream had one).")
	dBatches   = desc("kv_event_batches_total", "KV-event batches applied.")
	dStored    = desc("kv_event_stored_blocks_total", "Blocks stored by KV events.")
	dRemoved   = desc("kv_event_removed_blocks_total", "Blocks removed by KV events.")
	dClears    = desc("kv_event_clears_total", "AllBlocksCleared events.")
	dGaps      = desc("kv_event_gaps_total", "Sequence gaps seen.")
	dDecode    = desc("kv_event_decode_errors_total", "Malformed KV-event messages skipped.")
	dRestarts  = desc("kv_event_restarts_total", "Publisher restarts (sequence went backwards).")
	dOrphans   = desc("kv_event_orphan_blocks_total", "Stored blocks skipped because their parent was unknown.")
	dSkipped   = desc("kv_event_skipped_blocks_total", "Blocks skipped: other medium or KV group, unnamed LoRA, incompatible block size.")
	dResidency = desc("kv_evicted_block_residency_seconds", "How long the replica's GPU blocks stayed cached before their eviction, on the engine's clock: the mean over its last few hundred measured evictions (one block in 64 followed). Absent before any; the whole stay, since engines do not publish hits.")
	dAgain     = desc("kv_evicted_blocks_stored_again_ratio", "Share of the replica's evicted GPU blocks it stored again within 5 minutes of their eviction (prefilled again, or loaded back from a slower tier), over its last thousand or so followed evictions (one block in 64 followed), each counted 5 minutes after it. Absent before any; high, the cache is too small for what is asked of it.")
	dAgainAll  = desc("kv_evicted_blocks_stored_again_fleet_ratio", "Share of the replica's evicted GPU blocks stored again within 5 minutes on any replica of its model, over its last thousand or so followed evictions, each counted 5 minutes after it: what the fleet paid again. Absent before any.")
	dDeferred  = desc("kv_event_deferred_commits_total", "KV-event batches whose end found the model's lock busy and left their changes to the replica's next batch or the next table build; growing with the batches, the model's lock limits ingest.")
	dScrape    = desc("scrape_errors_total", "Failed metrics scrapes.")
	dHomes     = desc("homes", "Keys the table lists nowhere whose home is the replica, the last that held them (table format 4): where their prefixes are sent back when they return while the fleet is past capacity.")
	allDescs   = []*prometheus.Desc{dQueue, dKV, dHealthy, dAge, dCap, dText, dToken, dSpec, dHomes, dConn, dEventAge, dBatches, dStored, dRemoved, dClears, dGaps, dDecode, dRestarts, dOrphans, dSkipped, dResidency, dAgain, dAgainAll, dDeferred, dScrape}
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, r := range (*Index)(c).DebugState(time.Now()) {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, r.Model, r.ID)
		}
		n := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), r.Model, r.ID)
		}
		g(dQueue, r.QueueTokens)
		g(dKV, r.KVUsage)
		g(dHealthy, b2f(r.Healthy))
		g(dAge, float64(r.StateAgeMs)/1000)
		g(dCap, float64(r.CapacityTokens))
		g(dText, float64(r.TextKeys))
		g(dToken, float64(r.TokenKeys))
		g(dSpec, float64(r.spec))
		g(dHomes, float64(r.Homes))
		n(dScrape, r.scrapeErrs)
		if r.hasEvents {
			g(dConn, b2f(r.KVEvents.Connected))
			if r.KVEvents.LastEventAgeMs >= 0 {
				g(dEventAge, float64(r.KVEvents.LastEventAgeMs)/1000)
			}
			n(dBatches, r.KVEvents.Batches)
			n(dStored, r.KVEvents.StoredBlocks)
			n(dRemoved, r.KVEvents.RemovedBlocks)
			n(dClears, r.KVEvents.Clears)
			n(dGaps, r.KVEvents.Gaps)
			n(dDecode, r.KVEvents.DecodeErrors)
			n(dRestarts, r.restarts)
			n(dOrphans, r.orphans)
			n(dSkipped, r.skipped)
			n(dDeferred, r.KVEvents.DeferredCommits)
			if r.KVEvents.EvictedResidencyS >= 0 {
				g(dResidency, r.KVEvents.EvictedResidencyS)
			}
			if r.KVEvents.EvictedStoredAgain >= 0 {
				g(dAgain, r.KVEvents.EvictedStoredAgain)
			}
			if r.KVEvents.EvictedStoredAgainFleet >= 0 {
				g(dAgainAll, r.KVEvents.EvictedStoredAgainFleet)
			}
		}
	}
}
