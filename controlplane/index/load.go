package index

import (
	"math"
	"time"
)

// loadTau is how fast a replica's load averages forget: long enough to average over many
// requests' prefills (a few hundred milliseconds each), short enough to follow a change
// of load within a minute.
const loadTau = 10 * time.Second

// scrapeGap is the interval the first sample of a replica stands for.
const scrapeGap = 100 * time.Millisecond

// Load is one replica's recent load, the averages table format 3 carries: the share of
// time it had prefill work waiting (rule.Candidate.Busy) and the requests it ran
// (rule.Candidate.Running), each weighted by time with time constant loadTau. The index
// feeds it every scrape; the fleet simulator's oracle feeds it the engines' exact state.
// The zero value is an idle replica.
type Load struct {
	busy, running float64
	at            time.Time
}

// Note folds one observation at now into the averages: whether prefill work was waiting
// and how many requests ran. Observations out of order are ignored.
func (l *Load) Note(now time.Time, waiting bool, running float64) {
	b := 0.0
	if waiting {
		b = 1
	}
	run := 0.0
	if running > 0 && !math.IsInf(running, 1) {
		run = running
	}
	if l.at.IsZero() {
		// Before its first sample a replica counts as idle, so that one busy moment at
		// discovery does not keep new prefixes away from it for the whole average.
		l.at = now.Add(-scrapeGap)
	}
	dt := now.Sub(l.at)
	if dt <= 0 {
		return
	}
	w := math.Exp(-float64(dt) / float64(loadTau))
	l.busy = w*l.busy + (1-w)*b
	l.running = w*l.running + (1-w)*run
	l.at = now
}

// Values are the averages as published: running to 0.1 and busy to 0.01, so that an
// average that barely moved does not make every replica part of every delta.
func (l *Load) Values() (running, busy float64) {
	running = math.Round(min(max(l.running, 0), math.MaxUint32/100)*10) / 10
	busy = math.Round(min(max(l.busy, 0), 1)*100) / 100
	return running, busy
}

// noteLoad folds one scrape into r's load (caller holds r.mu and Index.mu).
func (ix *Index) noteLoad(r *replica, now time.Time) {
	q, _ := ix.queued(r, now)
	r.load.Note(now, q > 0, r.sample.Running)
}

// loadOf fills the table entry's load values (table.Replica.Running, Busy,
// MeanUncached): r's Load and the mean prompt tokens it prefills for a request.
func (ix *Index) loadOf(r *replica) (running, busy float64, meanUncached uint32) {
	running, busy = r.load.Values()
	if u := ix.meanUncached(r); u > 0 && u < math.MaxUint32 {
		meanUncached = uint32(math.Round(u))
	}
	return running, busy, meanUncached
}
