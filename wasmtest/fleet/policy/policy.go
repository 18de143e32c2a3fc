// Package policy holds the routing policies a fleet simulation compares, each written
// from its published description: round robin, random, least queued prompt tokens,
// consistent hashing with bounded loads, SGLang's cache-aware router, the Gateway API
// inference extension's weighted scorers, and the oracle (kvroute's rule with perfect,
// instant knowledge). kvroute's own policy, the real routing code, is in package
// fleet/kvroute.
//
// A policy sees the fleet only through [Fleet] and only what its real counterpart
// could see: router-local counters, its own scrapes on its own schedule, or (the
// oracle alone) the engines' exact state.
package policy

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Never is a wake time that never comes.
const Never = time.Duration(math.MaxInt64)

// Fleet is the simulated fleet as policies may observe it.
type Fleet interface {
	// Len is the number of replicas (dead ones included; indices are stable).
	Len() int
	// Addr is replica i's "ip:port".
	Addr(i int) string
	// Up reports whether discovery lists replica i (false once a kill was detected).
	Up(i int) bool
	// Reachable reports whether replica i's process answers now (what a scrape sees).
	Reachable(i int) bool
	// State is replica i's engine state right now: what a /metrics scrape would read.
	// Policies that scrape must read it on their own scrape schedule only.
	State(i int) sched.State
	// Stats is replica i's cumulative counters (the Prometheus counters).
	Stats(i int) sched.Stats
	// CapacityTokens is replica i's KV pool (num_gpu_blocks x block_size).
	CapacityTokens(i int) int
	// BlockSize is the engines' KV block size in tokens.
	BlockSize() int
	// CachedPrefix is how many tokens of r replica i would serve from its cache now.
	// Only the oracle may use it.
	CachedPrefix(i int, r *workload.Request) int
}

// Choice is a policy's answer: replicas best first. The first reachable one gets the
// request (the rest are retry targets, as in the endpoint header).
type Choice struct {
	Order []int
	// Rule: the policy applied kvroute's rule, and Spill is the rule's own view that
	// the pick is not a replica holding the longest cached prefix.
	Rule, Spill bool
	// Shed: the proxy refused the request past capacity (429); it goes nowhere.
	Shed bool
	// Retry, when positive: the proxy holds the request (its stream paused, as kvroute's
	// filter holds one that arrives before its first table) and the simulator calls Route
	// for it again Retry later; Order is unused.
	Retry time.Duration
}

// Outcome is what the proxy learns when a response ends.
type Outcome struct {
	// Status is the HTTP status the proxy saw (0: no response headers).
	Status int
	// PromptTokens and CachedTokens are the response's usage (CachedTokens -1: none).
	PromptTokens, CachedTokens int
	// Completed is false for aborted or rejected requests.
	Completed bool
}

// Policy routes requests. The simulator calls it from one goroutine.
type Policy interface {
	Name() string
	// Route orders replicas for r, arriving at now.
	Route(r *workload.Request, now time.Duration) Choice
	// Sent: r went to replica i at now.
	Sent(r *workload.Request, i int, now time.Duration)
	// Started: r's response headers arrived at the proxy (stream: at once).
	Started(r *workload.Request, i int, at time.Duration)
	// FirstByte: r's first response body bytes arrived (stream: the first token's
	// chunk; otherwise the whole response, right after Started).
	FirstByte(r *workload.Request, i int, at time.Duration)
	// Finished: r's response ended.
	Finished(r *workload.Request, i int, at time.Duration, o Outcome)
	// Events delivers replica i's KV events (only when WantsEvents).
	Events(i int, at time.Duration, evs []kvevents.Event)
	WantsEvents() bool
	// Membership: Fleet.Up changed for some replica.
	Membership(now time.Duration)
	// NextWake is when the policy's next timer (scrape, publish, poll) is due; Wake runs
	// every timer due at now. The simulator advances the engines to now first.
	NextWake() time.Duration
	Wake(now time.Duration)
}

// Base implements every hook as a no-op; policies embed it.
type Base struct{}

func (Base) Sent(*workload.Request, int, time.Duration)              {}
func (Base) Started(*workload.Request, int, time.Duration)           {}
func (Base) FirstByte(*workload.Request, int, time.Duration)         {}
func (Base) Finished(*workload.Request, int, time.Duration, Outcome) {}
func (Base) Events(int, time.Duration, []kvevents.Event)             {}
func (Base) WantsEvents() bool                                       { return false }
func (Base) Membership(time.Duration)                                {}
func (Base) NextWake() time.Duration                                 { return Never }
func (Base) Wake(time.Duration)                                      {}

// Timer is a periodic timer with a phase.
type Timer struct {
	Next, Every time.Duration
}

// Due reports whether the timer fires at now, and re-arms it.
func (t *Timer) Due(now time.Duration) bool {
	if t.Every <= 0 || now < t.Next {
		return false
	}
	for t.Next <= now {
		t.Next += t.Every
	}
	return true
}

// At is the next firing time (Never when disabled).
func (t *Timer) At() time.Duration {
	if t.Every <= 0 {
		return Never
	}
	return t.Next
}

// Split runs k independent instances of a router-local policy, one per proxy: request
// r goes to instance r's router (routerOf), as each Envoy holds its own state.
func Split(k int, routerOf func(r *workload.Request) int, mk func(router int) Policy) Policy {
	if k <= 1 {
		return mk(0)
	}
	s := &split{routerOf: routerOf}
	for i := range k {
		s.ps = append(s.ps, mk(i))
	}
	return s
}

type split struct {
	ps       []Policy
	routerOf func(r *workload.Request) int
}

func (s *split) p(r *workload.Request) Policy { return s.ps[s.routerOf(r)] }
func (s *split) Name() string                 { return s.ps[0].Name() }
func (s *split) Route(r *workload.Request, now time.Duration) Choice {
	return s.p(r).Route(r, now)
}
func (s *split) Sent(r *workload.Request, i int, now time.Duration) { s.p(r).Sent(r, i, now) }
func (s *split) Started(r *workload.Request, i int, at time.Duration) {
	s.p(r).Started(r, i, at)
}
func (s *split) FirstByte(r *workload.Request, i int, at time.Duration) {
	s.p(r).FirstByte(r, i, at)
}
func (s *split) Finished(r *workload.Request, i int, at time.Duration, o Outcome) {
	s.p(r).Finished(r, i, at, o)
}
func (s *split) Events(i int, at time.Duration, evs []kvevents.Event) {
	for _, p := range s.ps {
		p.Events(i, at, evs)
	}
}
func (s *split) WantsEvents() bool { return s.ps[0].WantsEvents() }
func (s *split) Membership(now time.Duration) {
	for _, p := range s.ps {
		p.Membership(now)
	}
}
func (s *split) NextWake() time.Duration {
	w := Never
	for _, p := range s.ps {
		w = min(w, p.NextWake())
	}
	return w
}
func (s *split) Wake(now time.Duration) {
	for _, p := range s.ps {
		if p.NextWake() <= now {
			p.Wake(now)
		}
	}
}

// Rand is splitmix64, the policies' deterministic random source.
type Rand struct{ s uint64 }

// NewRand seeds a source; stream separates sources drawn from one seed.
func NewRand(seed, stream uint64) *Rand {
	return &Rand{s: seed*0x9e3779b97f4a7c15 ^ (stream+1)*0xd1b54a32d192ed03}
}

// Uint64 returns the next value.
func (r *Rand) Uint64() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// mix64 is splitmix64's finalizer.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// IntN returns a value in [0, n).
func (r *Rand) IntN(n int) int { return int(r.Uint64() % uint64(n)) }

// up lists the replicas discovery lists.
func up(f Fleet, dst []int) []int {
	dst = dst[:0]
	for i := range f.Len() {
		if f.Up(i) {
			dst = append(dst, i)
		}
	}
	return dst
}
