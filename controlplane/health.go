package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// What the control plane says about its replicas: a WARN line when one turns unhealthy
// (its scrapes fail) or its KV-event stream drops, an INFO line when it recovers, and
// /readyz's answer. Lines are rate-limited per replica and kind, so a flapping engine
// cannot flood the log: healthLogBurst lines at once, then one per healthLogEvery, and
// the next line counts the changes that were not logged.

const (
	// healthLogBurst lines per replica and kind may be written back to back ...
	healthLogBurst = 4
	// ... and one more each healthLogEvery after that.
	healthLogEvery = 30 * time.Second
	// eventsGrace is how long a new replica's KV-event stream may take to connect
	// before it counts as down.
	eventsGrace = 3 * time.Second
	// maxNamedDown replicas are named in /readyz's answer; the rest are counted.
	maxNamedDown = 8
)

// health follows the replicas' states between ticks of healthLoop.
type health struct {
	mu        sync.Mutex
	replicas  map[string]*replicaHealth
	notReady  error             // nil: some model has a healthy replica (or there is no replica)
	scrapeErr map[string]string // replica ID -> its last scrape error, while scrapes fail
}

type replicaHealth struct {
	seen           time.Time // first tick that saw the replica
	scrape, events healthLine
}

// healthLine is what was last logged about one kind of state of a replica, and the
// rate limit of its lines.
type healthLine struct {
	down     bool      // the state last logged (initially up: nothing logged)
	observed bool      // the state at the last check
	downAt   time.Time // when observed last turned down
	unlogged int       // changes observed since the last line
	tokens   float64
	refilled time.Time
}

// observe records the state down at now and says whether a line is due: the state
// differs from the last line's and the rate limit allows one. It returns how many
// changes went unlogged before this one, and since when the replica has been down
// (for a line saying it is up again).
func (l *healthLine) observe(down bool, now time.Time) (due bool, unlogged int, downSince time.Time) {
	if l.refilled.IsZero() {
		l.tokens, l.refilled = healthLogBurst, now
	}
	if down != l.observed {
		l.observed = down
		l.unlogged++
		if down {
			l.downAt = now
		}
	}
	l.tokens = min(healthLogBurst, l.tokens+float64(now.Sub(l.refilled))/float64(healthLogEvery))
	l.refilled = now
	if down == l.down || l.tokens < 1 {
		return false, 0, l.downAt
	}
	l.tokens--
	l.down = down
	unlogged, l.unlogged = l.unlogged-1, 0
	return true, unlogged, l.downAt
}

// scraped records the outcome of one scrape of replica id (its error's text, or "").
func (h *health) scraped(id string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.scrapeErr == nil {
		h.scrapeErr = map[string]string{}
	}
	if err != nil {
		h.scrapeErr[id] = err.Error()
	} else {
		delete(h.scrapeErr, id)
	}
}

// ready is /readyz's extra condition: an error naming the models and replicas when the
// control plane knows replicas but none of them is healthy. One model without a healthy
// replica does not make it unready: its filters fall back on their own, and the other
// models' filters still need the table.
func (h *health) ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.notReady
}

// healthLoop checks the replicas every interval until ctx ends.
func (c *ControlPlane) healthLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.checkHealth(c.o.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkHealth logs what changed since the last check and updates the readiness answer.
func (c *ControlPlane) checkHealth(now time.Time) {
	states := c.Index.DebugState(now)
	c.mu.Lock()
	events := make(map[string]bool, len(c.replicas))
	for id, r := range c.replicas {
		for _, s := range r.Streams {
			events[id] = events[id] || s.Endpoint != ""
		}
	}
	c.mu.Unlock()

	h := &c.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.replicas == nil {
		h.replicas = map[string]*replicaHealth{}
	}
	healthy := map[string]bool{} // model -> some replica is healthy
	var down []string            // unhealthy replicas, with why
	present := map[string]bool{}
	for _, st := range states {
		present[st.ID] = true
		rh := h.replicas[st.ID]
		if rh == nil {
			rh = &replicaHealth{seen: now}
			h.replicas[st.ID] = rh
		}
		attrs := []any{"replica", st.ID, "model", st.Model, "addr", st.Address}
		why := h.scrapeErr[st.ID]
		if due, unlogged, since := rh.scrape.observe(!st.Healthy, now); due {
			a := attrs
			if !st.Healthy {
				a = append(a[:len(a):len(a)], "scrape_error", why)
			}
			c.logHealth(!st.Healthy, "replica unhealthy: its /metrics scrapes fail, requests route around it",
				"replica healthy again", unlogged, since, now, a)
		}
		if events[st.ID] {
			disconnected := !st.KVEvents.Connected && now.Sub(rh.seen) >= eventsGrace
			if due, unlogged, since := rh.events.observe(disconnected, now); due {
				c.logHealth(disconnected, "replica KV-event stream disconnected: its cache contents go stale until it reconnects",
					"replica KV-event stream connected again", unlogged, since, now, attrs)
			}
		}
		healthy[st.Model] = healthy[st.Model] || st.Healthy
		if !st.Healthy {
			if why == "" {
				why = "scrapes failing"
			}
			down = append(down, fmt.Sprintf("%s (%s, model %s): %s", st.ID, st.Address, st.Model, why))
		}
	}
	// Replicas discovery dropped (a scrape may end just after their last check).
	maps.DeleteFunc(h.replicas, func(id string, _ *replicaHealth) bool { return !present[id] })
	maps.DeleteFunc(h.scrapeErr, func(id string, _ string) bool { return !present[id] })
	h.notReady = nil
	if len(states) > 0 && !slices.Contains(slices.Collect(maps.Values(healthy)), true) {
		slices.Sort(down)
		if n := len(down); n > maxNamedDown {
			down = append(down[:maxNamedDown], fmt.Sprintf("and %d more", n-maxNamedDown))
		}
		h.notReady = errors.New("no healthy replica for any model: " + strings.Join(down, "; "))
	}
}

// logHealth writes one health line: WARN for down, INFO (with how long it was down) for up.
func (c *ControlPlane) logHealth(down bool, downMsg, upMsg string, unlogged int, downSince, now time.Time, attrs []any) {
	if unlogged > 0 {
		attrs = append(attrs, "changes_not_logged", unlogged)
	}
	if down {
		c.log.Warn(downMsg, attrs...)
		return
	}
	c.log.Info(upMsg, append(attrs, "down_for", now.Sub(downSince).Round(time.Millisecond).String())...)
}
