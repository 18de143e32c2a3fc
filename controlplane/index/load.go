package index

import (
	"math"
	"time"
)

// loadTau is how fast a replica's load averages forget: long enough to average over many
// requests' prefills (a few hundred milliseconds each), short enough to follow a change
// of load within a minute.
const loadTau = 10 * time.Second

// scrapeGap is the interval the first scrape of a replica stands for.
const scrapeGap = 100 * time.Millisecond

// noteLoad folds one scrape into r's load averages: the share of recent scrapes at which
// r had prefill work waiting, and the requests it ran, weighted by time (caller holds r.mu
// and Index.mu).
func (ix *Index) noteLoad(r *replica, now time.Time) {
	b := 0.0
	if ix.queued(r) > 0 {
		b = 1
	}
	run := 0.0
	if v := r.sample.Running; v > 0 && !math.IsInf(v, 1) {
		run = v
	}
	if r.loadAt.IsZero() {
		// Before its first scrape a replica counts as idle, so that one busy moment at
		// discovery does not keep new prefixes away from it for the whole average.
		r.loadAt = now.Add(-scrapeGap)
	}
	dt := now.Sub(r.loadAt)
	if dt <= 0 {
		return
	}
	w := math.Exp(-float64(dt) / float64(loadTau))
	r.busy = w*r.busy + (1-w)*b
	r.running = w*r.running + (1-w)*run
	r.loadAt = now
}

// loadOf fills the table entry's load values (table.Replica.Running, Busy,
// MeanUncached): the requests r ran and its busy fraction, recently (to 0.1 and 0.01, so
// that an average that barely moved does not make every replica part of every delta),
// and the mean prompt tokens it prefills for a request.
func (ix *Index) loadOf(r *replica) (running, busy float64, meanUncached uint32) {
	running = math.Round(min(max(r.running, 0), math.MaxUint32/100)*10) / 10
	busy = math.Round(min(max(r.busy, 0), 1)*100) / 100
	if u := ix.meanUncached(r); u > 0 && u < math.MaxUint32 {
		meanUncached = uint32(math.Round(u))
	}
	return running, busy, meanUncached
}
