package controlplane

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/server"
	"github.com/prometheus/client_golang/prometheus"
)

// warmup is how complete the index of a starting control plane is, and whether it may
// publish its first table. Filters hold the table of another replica, or of this process
// before a restart: a first table built before the engines' KV events are read would
// list less than that, and every filter would route on it. So the first version waits
// until every KV-event stream the control plane dials has connected and applied what the
// engine's replay buffer holds (kvevents.Handler's Connected) and every replica's metrics
// were scraped once (its queue), or Options.WarmUp passes.
// Later versions are never held: a stream lost later is the index's business.
type warmup struct {
	mu        sync.Mutex
	limit     time.Duration // Options.WarmUp; 0: the first table is not held
	started   time.Time     // wall clock: a test's Now does not stretch the hold
	streams   map[kvevents.StreamID]bool
	scrapes   map[string]bool // by replica id: scraped once
	published time.Time       // when the first version was published; zero before
	gauge     prometheus.Gauge
	held      prometheus.Gauge
}

func newWarmup(limit time.Duration, reg prometheus.Registerer) *warmup {
	w := &warmup{limit: limit, streams: map[kvevents.StreamID]bool{}, scrapes: map[string]bool{},
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_controlplane_warmup_completeness",
			Help: "Fraction of the KV-event streams the control plane dials that have connected and applied the engine's replay buffer, and of the replicas scraped once (1 with none)."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_controlplane_warmup_held_seconds",
			Help: "How long the first table was held for the KV-event streams to be read (so far, while it is held)."}),
	}
	w.gauge.Set(1)
	reg.MustRegister(w.gauge, w.held)
	return w
}

// start begins the warm-up clock.
func (w *warmup) start(now time.Time) {
	w.mu.Lock()
	w.started = now
	w.mu.Unlock()
}

// expect sets the streams the control plane dials and the replicas it scrapes; the
// ones already read stay read.
func (w *warmup) expect(ids []kvevents.StreamID, replicas []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	next := make(map[kvevents.StreamID]bool, len(ids))
	for _, id := range ids {
		next[id] = w.streams[id]
	}
	scrapes := make(map[string]bool, len(replicas))
	for _, id := range replicas {
		scrapes[id] = w.scrapes[id]
	}
	w.streams, w.scrapes = next, scrapes
	w.gauge.Set(w.completeLocked())
}

// scraped records a replica whose metrics were read.
func (w *warmup) scraped(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if done, ok := w.scrapes[id]; ok && !done {
		w.scrapes[id] = true
		w.gauge.Set(w.completeLocked())
	}
}

// connected records a stream that has applied its replay and reads live batches.
func (w *warmup) connected(id kvevents.StreamID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.streams[id]; ok {
		w.streams[id] = true
		w.gauge.Set(w.completeLocked())
	}
}

func (w *warmup) completeLocked() float64 {
	all := len(w.streams) + len(w.scrapes)
	if all == 0 {
		return 1
	}
	return float64(count(w.streams)+count(w.scrapes)) / float64(all)
}

// count is how many of m's values are true.
func count[K comparable](m map[K]bool) int {
	n := 0
	for _, ok := range m {
		if ok {
			n++
		}
	}
	return n
}

// mayPublish says whether a table may be published now: always once one has been;
// before, when every stream has been read or the warm-up limit has passed.
func (w *warmup) mayPublish(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.published.IsZero() {
		return true
	}
	waited := now.Sub(w.started)
	ok := w.limit <= 0 || w.completeLocked() >= 1 || waited >= w.limit
	w.held.Set(waited.Seconds())
	return ok
}

// publishedFirst records that the first version is out.
func (w *warmup) publishedFirst(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.published.IsZero() {
		w.published = now
		w.held.Set(now.Sub(w.started).Seconds())
	}
}

// state is /debug/state's warmup.
func (w *warmup) state() server.WarmupState {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := server.WarmupState{Streams: len(w.streams), StreamsRead: count(w.streams), Replicas: len(w.scrapes),
		ReplicasScraped: count(w.scrapes), Complete: w.completeLocked(), LimitMs: w.limit.Milliseconds(),
		Held: w.published.IsZero()}
	if !w.published.IsZero() {
		st.HeldMs = w.published.Sub(w.started).Milliseconds()
	}
	return st
}
