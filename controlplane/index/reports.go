package index

import (
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/prometheus/client_golang/prometheus"
)

// ReportMetrics are observed per outcome report; nil fields are skipped.
type ReportMetrics struct {
	// Reports counts reports by kind and result (accepted, unknown_model,
	// unknown_replica, config_mismatch; kind "any", result "invalid" for reports that
	// failed validation).
	Reports *prometheus.CounterVec
	// FalseHits counts outcomes where the engine had less cached than predicted.
	FalseHits prometheus.Counter
	// CachedError observes predicted - actual cached tokens per outcome.
	CachedError prometheus.Observer
}

// ApplyReports applies a validated batch (api.ParseReportBatch) and returns how many
// reports were applied.
func (ix *Index) ApplyReports(b *api.ReportBatch, now time.Time, met *ReportMetrics) int {
	applied := 0
	from := ix.reporterID(b.Proxy)
	ix.clock.Store(uint32(stampOf(now)))
	for start, end := 0, 0; start < len(b.Reports); start = end {
		end = start + 1 // a lock holds one report at least, and the next ones while they are small
		for keys := len(b.Reports[start].Keys); end < len(b.Reports) && end-start < reportsPerLock; end++ {
			if keys += len(b.Reports[end].Keys); keys > keysPerLock {
				break
			}
		}
		ix.mu.Lock()
		for i := start; i < end; i++ {
			res := ix.report(&b.Reports[i], now, met, from)
			if met != nil && met.Reports != nil {
				met.Reports.WithLabelValues(b.Reports[i].Kind, res).Inc()
			}
			if res == "accepted" {
				applied++
				ix.stats.ReportsAccepted++
			} else {
				ix.stats.ReportsSkipped++
			}
		}
		ix.mu.Unlock()
	}
	return applied
}

// reportsPerLock bounds how long one report batch holds the index. Reports are
// independent, so a batch need not apply at once; holding the lock for a whole batch of
// long chains (10,000 reports, a few hundred keys each) would keep every table build,
// and so every filter's poll, waiting for it (TestReportFlood).
// keysPerLock bounds it by keys too: 64 reports of 16,384 keys each (the flood's
// longest chains) could hold it long enough for the versions filters are served to age
// past the rule's 2 s state-age guard (TestReportFlood).
const (
	reportsPerLock = 64
	keysPerLock    = 4096
)

func (ix *Index) findReplica(m *model, addr string) *replica {
	for _, r := range m.slots {
		if r != nil && r.spec.Addr == addr {
			return r
		}
	}
	return nil
}

// sentAt is when rep's event happened by its sender's clock, at most now (a sender's
// clock ahead of ours).
func sentAt(rep *api.Report, now time.Time) time.Time {
	if at := time.UnixMilli(rep.AtMs); at.Before(now) {
		return at
	}
	return now
}

// report applies one report of reporter from (reporterID).
func (ix *Index) report(rep *api.Report, now time.Time, met *ReportMetrics, from uint64) string {
	m := ix.models[rep.Model]
	if m == nil {
		return "unknown_model"
	}
	r := ix.findReplica(m, rep.Replica)
	if r == nil {
		return "unknown_replica"
	}
	r.mu.Lock()
	defer ix.unlockReplica(r)
	size := ix.cfg.BlockBytes
	if rep.Domain == prefix.Token {
		size = ix.cfg.BlockTokens
	}
	if rep.BlockSize != size || rep.Stride != ix.cfg.Stride {
		// Keys hashed with other block sizes (a filter still on an older table) name
		// blocks this table does not have.
		return "config_mismatch"
	}
	// Token-domain keys of a replica with KV events are the events' business: they are
	// exact, so reports only add short-lived speculative entries for those.
	eventsOwn := rep.Domain == prefix.Token && r.spec.Events
	switch rep.Kind {
	case api.KindStart:
		r.placed.started(rep.Placement, sentAt(rep, now)) // placed.go
		return "accepted"
	case api.KindPlacement:
		// The request is on its way: until the engine has it, another request with the
		// same prefix should still go there (it will share the prefill). Speculative
		// entries expire after SpecTTL unless an outcome confirms them.
		ix.stats.Placements++
		r.placed.add(rep.PlacementID(), sentAt(rep, now), ix.placedTokens(m, r, rep), rep.Starts) // placed.go
		until, at := now.Add(ix.cfg.SpecTTL).UnixMilli(), stampOf(now)
		keys, why := ix.admitKeys(r, rep, nil) // budget.go: what does not fit is counted and dropped
		for _, k := range keys {
			r.slab[ix.setSpec(r, k, until)].place(at)
		}
		if res := overBudget(rep, keys, why); res != "" {
			return res
		}
	case api.KindOutcome:
		r.placed.done(rep.PlacementID())
		for _, k := range rep.Keys { // whatever the status, the request is over
			if i, ok := r.hold.Get(k); ok {
				r.slab[i].answered()
			}
		}
		if met != nil && rep.CachedTokens >= 0 && rep.PromptTokens > 0 {
			if rep.CachedTokens < rep.PredictedCachedTokens && met.FalseHits != nil {
				met.FalseHits.Inc()
			}
			if met.CachedError != nil {
				met.CachedError.Observe(float64(rep.PredictedCachedTokens - rep.CachedTokens))
			}
		}
		if rep.CachedTokens >= 0 && rep.CachedTokens < rep.PredictedCachedTokens {
			ix.stats.FalseHits++
		}
		if rep.Status < 200 || rep.Status > 299 {
			// The engine did not run the request (or we cannot tell): whatever this
			// chain's placement claimed is not there. Confirmed keys stay: an earlier
			// request put them there.
			ix.stats.Refutes++
			for _, k := range rep.Keys {
				ix.clearSpec(r, k)
			}
			return "accepted"
		}
		// A successful response means the engine prefilled the whole prompt, so every
		// block of the chain is in its cache now, whatever cached_tokens said about
		// the state before (that number only measures the prediction). Confirmed keys
		// live in the replica's LRU until engine evictions or capacity age them out.
		ix.stats.Confirms++
		ix.learn(m, rep, from, now) // learn.go
		keys, why := rep.Keys, ""
		owner := r.owners.slot(from)
		ev := newEvictor(r, owner) // confirmed.go: whose keys make room
		if !eventsOwn {
			keys, why = ix.admitKeys(r, rep, ev) // budget.go
		}
		at := stampOf(now)
		for j := len(keys) - 1; j >= 0; j-- {
			k := keys[j]
			if eventsOwn {
				ix.clearSpec(r, k)
				continue
			}
			// Touch from the last key to the first: vLLM frees a request's blocks in
			// reverse, so its tail is evicted first, and the chain's root ends up the
			// most recently used.
			i := r.ensure(k)
			h := &r.slab[i]
			was := h.held()
			if h.specUntil != 0 {
				h.specUntil = 0
				r.specN--
			}
			r.lruPushFront(i, rep.Domain == prefix.Token, owner, at)
			ix.settle(r, i, was)
		}
		ix.fitCapacity(r, ev)
		if res := overBudget(rep, keys, why); res != "" {
			return res
		}
	}
	return "accepted"
}
