package sim

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// storedAgainWindow is how soon an evicted block must be stored again to count, as the
// control plane's measure counts it (controlplane/index/storedagain.go: 5 minutes).
const storedAgainWindow = 5 * time.Minute

// evictions counts, from the engines' own KV events, the GPU blocks the replicas evict
// from the warm-up on and how many of them are stored again within storedAgainWindow
// (prefilled again, or loaded back from a CPU tier), for any policy, one block hash in
// evictionsEvery (the control plane follows one in 64 of a stream): on the replica that
// evicted them, as the control plane sees it, and on any replica, which the control
// plane cannot see (engines hash alike here; a real fleet's engines need not) and which
// is what the fleet paid again. An eviction counts once its window has passed within
// the run.
type evictions struct {
	from     time.Duration // the warm-up's end
	replicas []map[uint64]evicted
	swept    time.Duration
	// Outcomes of the evictions whose window has passed.
	total, back, backFleet int64
}

const evictionsEvery = 8

func followedEviction(h uint64) bool { return h*0x9e3779b97f4a7c15 < 1<<64/evictionsEvery }

type evicted struct {
	at              time.Duration
	back, backFleet bool // stored again on its replica, on any
}

func newEvictions(replicas int, from time.Duration) *evictions {
	e := &evictions{from: from, replicas: make([]map[uint64]evicted, replicas)}
	for i := range e.replicas {
		e.replicas[i] = map[uint64]evicted{}
	}
	return e
}

// note applies one batch of replica i's events at engine time at.
func (e *evictions) note(i int, at time.Duration, evs []kvevents.Event) {
	for k := range evs {
		ev := &evs[k]
		switch ev.Kind {
		case kvevents.BlockRemoved:
			if at < e.from || ev.Medium != kvevents.MediumGPU {
				continue
			}
			for _, h := range ev.BlockHashes {
				if _, ok := e.replicas[i][h]; !ok && followedEviction(h) {
					e.replicas[i][h] = evicted{at: at}
				}
			}
		case kvevents.BlockStored:
			if ev.Medium != kvevents.MediumGPU {
				continue
			}
			for _, h := range ev.BlockHashes {
				if followedEviction(h) {
					e.stored(i, h, at)
				}
			}
		case kvevents.AllBlocksCleared:
			clear(e.replicas[i])
		}
	}
	// Blocks whose window has passed are counted and forgotten, every 10 s of engine
	// time, so the maps hold about five minutes of evictions.
	if at-e.swept >= 10*time.Second {
		e.sweep(at)
	}
}

// stored marks the pending evictions of h within their window: back on replica i, and
// back in the fleet on every replica.
func (e *evictions) stored(i int, h uint64, at time.Duration) {
	for j, gone := range e.replicas {
		g, ok := gone[h]
		if !ok || at-g.at > storedAgainWindow {
			continue
		}
		g.backFleet = true
		g.back = g.back || j == i
		gone[h] = g
	}
}

func (e *evictions) sweep(now time.Duration) {
	e.swept = now
	for _, gone := range e.replicas {
		for h, g := range gone {
			if now-g.at > storedAgainWindow {
				e.total++
				if g.back {
					e.back++
				}
				if g.backFleet {
					e.backFleet++
				}
				delete(gone, h)
			}
		}
	}
}

// summary counts the evictions whose window passed by now (the run's end): the shares
// stored again on their replica and on any, and the blocks a replica evicted a second
// over the span they were evicted in (from the warm-up's end to the window before now).
// All NaN without any (a run shorter than the window past its warm-up).
func (e *evictions) summary(now time.Duration) (own, fleet, rate float64) {
	e.sweep(now)
	span := now - storedAgainWindow - e.from
	if e.total == 0 || span <= 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	total := float64(e.total)
	return float64(e.back) / total, float64(e.backFleet) / total,
		total * evictionsEvery / span.Seconds() / float64(len(e.replicas))
}
