package index

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/shared/table"
)

// ModelUpdate is one model's part of a version: its config and replica list (always
// whole), and the keys whose replica set changed.
type ModelUpdate struct {
	Name     string
	Removed  bool
	Reset    bool // first version with the model: Upserts hold every key
	Config   table.ModelConfig
	Replicas []table.Replica
	// Tiers names the slower KV tiers the upserts' holders refer to (table.Model.Tiers).
	Tiers   []string
	Upserts table.Entries
	Removes []uint64
	// Homes are the keys the table stopped listing, with the replica that held each
	// last, and those forgotten (homes.go).
	Homes table.HomeChanges
}

// Flush expires speculative entries and returns the next version's content, or nil
// when nothing changed. Every model is included (replica state is fresh on every
// version); keys only where they changed. force produces a version regardless.
func (ix *Index) Flush(now time.Time, force bool) []ModelUpdate {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	nowMs := now.UnixMilli()
	ix.clock.Store(uint32(stampOf(now)))
	ix.expire(nowMs)
	ix.expireConfirmed(now) // confirmed.go

	changed := force || len(ix.goneModels) > 0
	names := make([]string, 0, len(ix.models))
	for n, m := range ix.models {
		names = append(names, n)
		m.mu.Lock()
		m.collectPending()
		dirty := len(m.keys.dirty) > 0 || len(m.homes.changed) > 0 // homes dropped alone (tiers.go)
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
		u.Tiers = slices.Clone(m.tiers)
		var keys []uint64
		if m.created {
			keys = make([]uint64, 0, m.keys.Len()+len(m.tierKeys))
			for k := range m.keys.held() {
				keys = append(keys, k)
			}
			for k := range m.tierKeys {
				if m.keys.get(k) == nil {
					keys = append(keys, k)
				}
			}
		} else {
			keys = m.keys.dirty // sorted in place: built() below only walks it
		}
		slices.Sort(keys)
		for _, k := range keys {
			slots = m.holders(k, slots[:0]) // tiers.go: GPU slots, then slower tiers
			if len(slots) == 0 {
				if !m.created {
					u.Removes = append(u.Removes, k)
				}
				continue
			}
			m.homes.listed(k) // homes.go
			u.Upserts.Add(k, slots...)
		}
		u.Homes = m.homes.build(m.created, m.slots, func(k uint64) bool { return len(m.holders(k, slots[:0])) == 0 })
		m.keys.built()
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
	q, since := ix.queued(r, now)
	if !r.scrapedOK {
		since = r.addedAt
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
	running, busy, meanUncached := ix.loadOf(r)
	return table.Replica{
		Slot:         r.slot,
		ID:           r.spec.ID,
		Addr:         r.spec.Addr,
		Speed:        r.spec.Speed,
		Queued:       uint64(math.Round(math.Max(0, q))),
		KVUsage:      math.Round(kv*1e4) / 1e4,
		StateAgeMs:   uint32(age),
		Healthy:      r.healthy,
		Running:      running,
		Busy:         busy,
		MeanUncached: meanUncached,
	}
}

// queued is Q(r) and when it was measured: the engine's own count of queued prefill
// tokens at the last scrape when it exports one (dated by its timestamp if it has one,
// else when the scrape was sent), else the proxies' placements its engine
// has not started (placed.go), with the model's mean uncached prompt (from outcomes, else
// from the engine's lifetime prompt histogram and hit rate, else a default) for waiting
// requests the placements do not cover.
func (ix *Index) queued(r *replica, now time.Time) (float64, time.Time) {
	if r.sample.HasQueuedTokens {
		if !r.sample.QueuedAt.IsZero() {
			return r.sample.QueuedTokens, r.sample.QueuedAt // the engine's stamp, within the scrape's round trip
		}
		return r.sample.QueuedTokens, r.lastOK
	}
	return r.placed.queued(r.sample.Waiting, r.sample.Running, r.lastOK, now.Add(-ix.cfg.ReportLag), ix.meanUncached(r)) // placed.go
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

func (ix *Index) tableConfig(m *model) table.ModelConfig {
	return table.ModelConfig{
		BlockBytes:    uint32(ix.cfg.BlockBytes),
		BlockTokens:   uint32(ix.cfg.BlockTokens),
		Stride:        uint32(ix.cfg.Stride),
		BytesPerToken: m.bptPub,
	}
}
