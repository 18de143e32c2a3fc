// How long a replica's GPU blocks stay cached before the engine evicts them: the
// shorter, the faster its cache turns over, and the likelier a prefix is gone when its
// next request arrives (docs/performance.md, "The trace at 4 replicas: a feedback loop").

package index

import "math"

// residency measures, on one KV-event stream, the time from a GPU block's BlockStored to
// the BlockRemoved of its last copy, on the engine's clock (the batches' timestamps, so
// the control plane's own delays do not count). vLLM publishes no event when a cached
// block is hit, so this is the block's whole stay, not the time since its last use: an
// upper bound on how long an unused prefix survives. One block hash in residencyEvery
// is followed, at most maxResidencyBlocks at a time, so memory stays bounded whatever
// the engine sends.
type residency struct {
	since map[uint64]float64 // followed hash -> when it was stored (Batch.TS, seconds)
	mean  recentMean         // seconds, over about the last residencyWindow evictions
}

const (
	residencyEvery     = 64
	maxResidencyBlocks = 4096
	residencyWindow    = 256
)

// followed picks a hash in residencyEvery by its mixed top bits, so a publisher's choice
// of hash function (vLLM's builtin or sha256 hashes; for SGLang, pageID) does not bias
// the sample.
func followed(h uint64) bool { return h*0x9e3779b97f4a7c15 < 1<<64/residencyEvery }

// stored notes that block h was stored at ts (0: the batch carried no timestamp). It
// is called for every block, so the test of the sample inlines (the rest does not).
func (s *residency) stored(h uint64, ts float64) {
	if followed(h) {
		s.storedFollowed(h, ts)
	}
}

func (s *residency) storedFollowed(h uint64, ts float64) {
	if !usableTS(ts) {
		return
	}
	if s.since == nil {
		s.since = map[uint64]float64{}
	}
	if _, ok := s.since[h]; !ok && len(s.since) >= maxResidencyBlocks {
		return // full: the blocks already followed are evicted in time and make room
	}
	s.since[h] = ts
}

// removed notes that the last copy of block h was evicted at ts.
func (s *residency) removed(h uint64, ts float64) {
	if followed(h) {
		s.removedFollowed(h, ts)
	}
}

func (s *residency) removedFollowed(h uint64, ts float64) {
	at, ok := s.since[h]
	if !ok {
		return
	}
	delete(s.since, h)
	d := ts - at
	if !(d >= 0) || math.IsInf(d, 1) {
		return // no timestamp, or the engine's clock went back
	}
	s.mean.add(d, residencyWindow)
}

// reset forgets the followed blocks (the engine's cache was cleared or events were
// lost); the measured mean stays, as it describes the evictions already seen.
func (s *residency) reset() { clear(s.since) }

// residencyOf is a replica's mean residency over its ranks; -1 before any.
func residencyOf(ranks []*rank) float64 {
	return meanOverRanks(ranks, residencyWindow, func(rk *rank) *recentMean { return &rk.stay.mean })
}
