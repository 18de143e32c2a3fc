// How many of a replica's evicted GPU blocks the model's fleet stores again soon after,
// on any replica: what the fleet paid again. A router that sends an evicted prefix's next
// request to another replica (kvroute does) leaves the replica's own share
// (storedagain.go) low while the fleet prefills it again (docs/controlplane.md, "KV
// events: what each replica has cached").

package index

import "sync"

// fleetAgain is a model's evicted blocks, keyed by the index's own block keys (the same
// on every replica of the model, unlike the engines' hashes), waiting to be stored again
// on any of its replicas within againWindow. Each replica's stream adds its evictions,
// marks the ones its stores bring back, and counts its own evictions' outcomes by its
// own engine's clock; the streams run in parallel, so the map has its own lock, taken
// last and held for map operations only. One key in residencyEvery is followed, at most
// maxFleetAgain evictions at a time a model.
type fleetAgain struct {
	mu   sync.Mutex
	gone map[uint64][]fleetEvicted
	n    int
}

type fleetEvicted struct {
	by   *replica
	at   float64 // the evicting engine's Batch.TS, seconds
	back bool
}

const maxFleetAgain = 4 * maxResidencyBlocks

// evicted notes that r's engine evicted the block of key at ts; a block r evicted
// already keeps its first eviction, so a key has at most one eviction waiting a replica
// and a store walks at most the model's replicas, whatever an engine repeats. Like
// stored, called for every block: the test of the sample inlines, the lock is for the
// followed ones.
func (f *fleetAgain) evicted(r *replica, key uint64, ts float64) {
	if followed(key) {
		f.evictedFollowed(r, key, ts)
	}
}

func (f *fleetAgain) evictedFollowed(r *replica, key uint64, ts float64) {
	if !usableTS(ts) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n >= maxFleetAgain {
		return // full: the replicas' sweeps make room as windows pass
	}
	if f.gone == nil {
		f.gone = map[uint64][]fleetEvicted{}
	}
	for _, e := range f.gone[key] {
		if e.by == r {
			return
		}
	}
	f.gone[key] = append(f.gone[key], fleetEvicted{by: r, at: ts})
	f.n++
}

// stored notes that a replica's engine stored the block of key at ts (its clock): the
// evictions of key within their window are back.
func (f *fleetAgain) stored(key uint64, ts float64) {
	if followed(key) {
		f.storedFollowed(key, ts)
	}
}

func (f *fleetAgain) storedFollowed(key uint64, ts float64) {
	if !usableTS(ts) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.gone[key] {
		if e := &f.gone[key][i]; ts >= e.at && ts-e.at <= againWindow {
			e.back = true
		}
	}
}

// sweep counts r's evictions whose window has passed by ts (r's clock) into r's share.
// The caller holds r.mu.
func (f *fleetAgain) sweep(r *replica, ts float64) {
	if !usableTS(ts) || ts < r.fleetSwept+againSweep {
		return
	}
	r.fleetSwept = ts
	f.remove(r, func(e fleetEvicted) bool {
		if ts-e.at <= againWindow {
			return false
		}
		r.fleetBack.addBack(e.back, againOutcomes)
		return true
	})
}

// drop forgets r's evictions waiting (r left, or its cache was cleared). The caller
// holds r.mu.
func (f *fleetAgain) drop(r *replica) {
	f.remove(r, func(fleetEvicted) bool { return true })
	r.fleetSwept = 0
}

// remove takes out the evictions of r that done reports done with.
func (f *fleetAgain) remove(r *replica, done func(fleetEvicted) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, es := range f.gone {
		kept := es[:0]
		for _, e := range es {
			if e.by != r || !done(e) {
				kept = append(kept, e)
			}
		}
		f.n -= len(es) - len(kept)
		if len(kept) == 0 {
			delete(f.gone, key)
		} else {
			f.gone[key] = kept
		}
	}
}
