// How often a replica's evicted GPU blocks come back to it soon after: the share of its
// evictions that a larger cache would have saved there. High, the working set does not
// fit; low can also mean the router sends evicted prefixes elsewhere, which the fleet's
// share (fleetagain.go) counts (docs/controlplane.md, "KV events: what each replica has
// cached").

package index

import "math"

// storedAgain measures, on one KV-event stream, the share of evicted GPU blocks (the
// BlockRemoved of a block's last copy) that the engine stores again within againWindow
// of their eviction, on the engine's clock: prefilled again, or loaded back from a
// slower tier. It follows the hashes residency follows, at most maxResidencyBlocks
// evicted ones at a time, so memory stays bounded whatever the engine sends. Each
// eviction's outcome is counted once its window has passed (swept at a batch's end, every
// againSweep seconds of the engine's clock), whether the block came back or not: counted
// when it came back, the share would read 1 for the first window of every stream.
type storedAgain struct {
	gone  map[uint64]evicted // followed evicted hash -> its eviction
	back  recentMean         // the share back, over about the last againOutcomes outcomes
	swept float64            // the engine time of the last sweep
}

type evicted struct {
	at   float64 // Batch.TS, seconds
	back bool    // stored again within the window
}

const (
	// againWindow is how soon a block must come back to count: five minutes, within
	// which a conversation's next turn or an agent's next step usually arrives.
	againWindow = 300.0
	againSweep  = 10.0
	// againOutcomes is how many outcomes the share averages: more than residency's,
	// since a prompt's blocks are evicted and come back together, so that it averages
	// over dozens of prompts, not a handful.
	againOutcomes = 1024
)

// usableTS reports whether a batch's timestamp can date anything (a hostile or broken
// publisher can send any float; 0 is a batch without one).
func usableTS(ts float64) bool { return ts > 0 && !math.IsInf(ts, 1) }

// removed notes that the last copy of block h was evicted at ts. A block followed
// already keeps its first eviction. Like stored, called for every block: the test of
// the sample inlines.
func (s *storedAgain) removed(h uint64, ts float64) {
	if followed(h) {
		s.removedFollowed(h, ts)
	}
}

func (s *storedAgain) removedFollowed(h uint64, ts float64) {
	if !usableTS(ts) {
		return
	}
	if s.gone == nil {
		s.gone = map[uint64]evicted{}
	}
	if _, ok := s.gone[h]; ok || len(s.gone) >= maxResidencyBlocks {
		return // full: the sweep makes room as windows pass
	}
	s.gone[h] = evicted{at: ts}
}

// stored notes that block h was stored at ts.
func (s *storedAgain) stored(h uint64, ts float64) {
	if followed(h) {
		s.storedFollowed(h, ts)
	}
}

func (s *storedAgain) storedFollowed(h uint64, ts float64) {
	if !usableTS(ts) {
		return
	}
	if e, ok := s.gone[h]; ok && ts >= e.at && ts-e.at <= againWindow { // else the engine's clock went back, or too late
		e.back = true
		s.gone[h] = e
	}
}

// sweep counts the evictions whose window has passed by ts, at the end of each batch
// and at most once in againSweep seconds of the latest engine time seen, so that a
// publisher whose timestamps jump back and forth does not make every batch walk the
// blocks followed.
func (s *storedAgain) sweep(ts float64) {
	if !usableTS(ts) || ts < s.swept+againSweep {
		return
	}
	s.swept = ts
	for h, e := range s.gone {
		if ts-e.at > againWindow {
			delete(s.gone, h)
			s.back.addBack(e.back, againOutcomes)
		}
	}
}

// reset forgets the evicted blocks (the engine's cache was cleared, events were lost,
// or its publisher restarted and may hash anew); the measured share stays.
func (s *storedAgain) reset() { clear(s.gone); s.swept = 0 }

// storedAgainOf is a replica's share over its ranks; -1 before any.
func storedAgainOf(ranks []*rank) float64 {
	return meanOverRanks(ranks, againOutcomes, func(rk *rank) *recentMean { return &rk.again.back })
}
