// Package sim is the fleet simulation: N replicas of the engine simulator's
// deterministic core (package wasmtest/engine/sched, the same scheduler, prefix cache and
// timing model as the engine binary, on a virtual clock) serving a workload under one
// routing policy, in virtual time.
//
// The loop jumps from event to event: the next arrival, the policy's next timer
// (scrapes, table publishes, polls), a queue sample, a fault. Before each, every
// engine is advanced to that instant, so the hooks (KV events, first tokens, finished
// requests) reach the policy before it decides anything later. One run is one
// goroutine and is deterministic: same seed, same workload, same result.
package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Config configures a run.
type Config struct {
	Replicas int
	Profile  timing.Profile
	Workload workload.Workload
	Seed     uint64
	// Routers is the number of proxies; request i goes to RouterOf(i).
	Routers int
	// PinTenants sends each tenant's requests to one proxy instead, the tenants dealt to
	// the proxies in the order of their first requests: each tenant's clients come
	// through their own ingress, and no proxy sees the tenants' fleet-wide shares.
	PinTenants bool
	// Stream: clients stream, so response headers reach the proxy as soon as the engine
	// accepted the request (vLLM's StreamingResponse sends them at once); otherwise
	// they arrive with the whole response.
	Stream      bool
	Faults      []Fault
	DetectDelay time.Duration // discovery drops a killed replica after this (default 1 s)
	// Warmup: requests arriving before it are run but not measured.
	Warmup time.Duration
	// SampleEvery is the queue-depth sampling period (default 100 ms).
	SampleEvery time.Duration
	// AbortTTFT, when positive, stops the run as soon as the AbortQuantile of TTFT
	// over the measured requests is certain to exceed it (replica searches).
	AbortTTFT     time.Duration
	AbortQuantile float64
	// HotGroup, when >= 0, is reported apart from the other groups.
	HotGroup int
	// CPUTierTokens > 0 gives every engine vLLM's CPU offloading tier of that many
	// tokens, loading at CPULoadPerToken a token (sched.Config).
	CPUTierTokens   int
	CPULoadPerToken time.Duration
	// Phases, when set, are also reported apart (by arrival time): before, during and
	// after a fault, for example.
	Phases []Phase
	// ClassBudgets, when set, reports the requests by class (workload.Request.Class)
	// and tenant: a class's goodput counts its requests that met its TTFT budget.
	ClassBudgets map[string]time.Duration
	// Outcomes keeps every request's Outcome in Result.Outcomes.
	Outcomes bool
	// Evictions measures FleetState.StoredAgain from the engines' KV events (which the
	// engines then build for every policy, not only those that read them).
	Evictions bool
}

// Phase is a span of arrival times reported on its own.
type Phase struct {
	Name     string
	From, To time.Duration
}

// RouterOf assigns request i to one of k proxies, uniformly and deterministically.
func RouterOf(seed uint64, i, k int) int {
	if k <= 1 {
		return 0
	}
	return policy.NewRand(seed, uint64(i)+1000).IntN(k)
}

// NewPolicy builds the policy of a run over the fleet; routerOf tells each request's
// proxy.
type NewPolicy func(f policy.Fleet, routerOf func(r *workload.Request) int) (policy.Policy, error)

type reqState uint8

const (
	pending reqState = iota
	inflight
	done
	failed
	shed // refused by the proxy past capacity (429)
)

type record struct {
	req              *workload.Request
	replica          int32
	state            reqState
	routed, rule     bool
	spill, ruleSpill bool
	at, first, end   time.Duration
	prompt, cached   int32
	// routeCached: the target's GPU-cached prefix of the prompt at decision time.
	routeCached           int32
	loaded                int32 // of cached, loaded from the CPU tier
	preempts              int32
	measured, hasFirst    bool
	rejected, lateCounted bool
	class, tenant         string // with Config.ClassBudgets
	// followUp: a Responses follow-up (workload.Request.Previous); notFound: its
	// replica's store lacked the previous response.
	followUp, notFound bool
}

// fleet implements policy.Fleet.
type fleet struct {
	engines   []*sched.Engine
	addrs     []string
	alive     []bool // the process answers
	up        []bool // discovery lists it
	inflight  []int
	blockSize int
	capacity  int
}

func (f *fleet) Len() int                { return len(f.engines) }
func (f *fleet) Addr(i int) string       { return f.addrs[i] }
func (f *fleet) Up(i int) bool           { return f.up[i] }
func (f *fleet) Reachable(i int) bool    { return f.alive[i] }
func (f *fleet) State(i int) sched.State { return f.engines[i].State() }
func (f *fleet) Stats(i int) sched.Stats { return f.engines[i].Stats() }
func (f *fleet) CapacityTokens(int) int  { return f.capacity }
func (f *fleet) BlockSize() int          { return f.blockSize }
func (f *fleet) CachedPrefix(i int, r *workload.Request) int {
	if !f.alive[i] {
		return 0
	}
	return f.engines[i].CachedPrefixChain(r.Chain, len(r.Tokens))
}

// Addr is replica i's address in every simulation.
func Addr(i int) string { return fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1) }

type runner struct {
	cfg   Config
	w     workload.Workload
	f     *fleet
	pol   policy.Policy
	recs  []record
	store responseStore
	rng   *policy.Rand
	inflt int
	now   time.Duration
	held  []heldRequest // held by their proxy (policy.Choice.Retry), in no order
	ev    *evictions    // with Config.Evictions

	// queue samples
	sumMax, sumMean float64
	samples         int
	// memory samples (FleetState): sums over samples of the mean over live replicas
	sumKV, sumRunning, sumWaiting, sumFree float64
	lastArrival                            time.Duration

	// early stop
	measuredN, lateN, scan int
	aborted                bool
}

// Run simulates the workload under the policy mk builds.
func Run(cfg Config, mk NewPolicy) (*Result, error) {
	start := time.Now()
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("sim: %d replicas", cfg.Replicas)
	}
	if cfg.Workload == nil || cfg.Workload.Len() == 0 {
		return nil, errors.New("sim: empty workload")
	}
	if cfg.DetectDelay <= 0 {
		cfg.DetectDelay = time.Second
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = 100 * time.Millisecond
	}
	if cfg.Routers < 1 {
		cfg.Routers = 1
	}
	r := &runner{cfg: cfg, w: cfg.Workload, rng: policy.NewRand(cfg.Seed, 7), store: newResponseStore(cfg.Replicas)}
	f := &fleet{blockSize: cfg.Profile.BlockSize, capacity: cfg.Profile.NumGPUBlocks() * cfg.Profile.BlockSize}
	r.f = f
	routerOf := func(q *workload.Request) int { return RouterOf(cfg.Seed, q.Index, cfg.Routers) }
	if cfg.PinTenants && cfg.Routers > 1 {
		pinned := map[string]int{}
		routerOf = func(q *workload.Request) int {
			k, ok := pinned[q.Tenant]
			if !ok {
				k = len(pinned) % cfg.Routers
				pinned[q.Tenant] = k
			}
			return k
		}
	}
	for i := range cfg.Replicas {
		f.addrs = append(f.addrs, Addr(i))
		f.alive = append(f.alive, true)
		f.up = append(f.up, true)
		f.inflight = append(f.inflight, 0)
	}
	var err error
	// The policy is built first (it must not look at engine state while constructed):
	// the engines' hooks depend on whether it wants KV events.
	f.engines = make([]*sched.Engine, cfg.Replicas)
	if r.pol, err = mk(f, routerOf); err != nil {
		return nil, err
	}
	if cfg.Evictions {
		r.ev = newEvictions(cfg.Replicas, cfg.Warmup)
	}
	for i := range cfg.Replicas {
		ec := sched.Config{Profile: cfg.Profile, OnFinish: r.onFinish,
			CPUTierTokens: cfg.CPUTierTokens, CPULoadPerToken: cfg.CPULoadPerToken}
		if wants := r.pol.WantsEvents(); wants || r.ev != nil {
			ec.OnEvents = func(at time.Duration, evs []kvevents.Event) {
				if !f.alive[i] {
					return
				}
				if r.ev != nil {
					r.ev.note(i, at, evs)
				}
				if wants {
					r.pol.Events(i, at, evs)
				}
			}
		}
		ec.OnToken = r.onToken
		if f.engines[i], err = sched.New(ec); err != nil {
			return nil, err
		}
	}
	n := r.w.Len()
	r.recs = make([]record, n)
	for i := range n {
		at, _ := r.w.Arrival(i)
		r.recs[i].at = at
		if at >= cfg.Warmup {
			r.recs[i].measured = true
			r.measuredN++
		}
	}
	r.lastArrival = r.recs[n-1].at
	err = r.loop()
	if c, ok := r.pol.(interface{ Close() }); ok {
		c.Close() // policies holding resources (the wasm hosts)
	}
	if err != nil {
		return nil, err
	}
	res := r.result()
	res.Wall = time.Since(start)
	return res, nil
}

func (r *runner) advanceEngines(t time.Duration) {
	for i, e := range r.f.engines {
		if !r.f.alive[i] {
			continue
		}
		for at, ok := e.NextStepAt(); ok && at <= t; at, ok = e.NextStepAt() {
			e.Advance(at)
		}
		e.Advance(t)
	}
}

func (r *runner) loop() error {
	src := r.w.NewSource()
	faults := slices.Clone(r.cfg.Faults)
	slices.SortStableFunc(faults, func(a, b Fault) int { return int(a.At - b.At) })
	type detection struct {
		at      time.Duration
		replica int
	}
	var detections []detection
	next := 0
	n := len(r.recs)
	sample := time.Duration(0)
	checkEvery := time.Second
	nextCheck := checkEvery
	limit := r.lastArrival + 6*time.Hour
	last, same := time.Duration(-1), 0
	for next < n || r.inflt > 0 || len(r.held) > 0 {
		t := policy.Never
		if next < n {
			t = r.recs[next].at
		}
		t = min(t, r.pol.NextWake(), sample, r.nextHeld())
		if len(faults) > 0 {
			t = min(t, faults[0].At)
		}
		if len(detections) > 0 {
			t = min(t, detections[0].at)
		}
		if t > limit {
			return fmt.Errorf("sim: requests still in flight %v after the last arrival", limit-r.lastArrival)
		}
		if t == last {
			if same++; same > 1_000_000 {
				return fmt.Errorf("sim: stuck at %v (policy %s wakes without progress)", t, r.pol.Name())
			}
		} else {
			last, same = t, 0
		}
		r.advanceEngines(t)
		r.now = t
		for len(faults) > 0 && faults[0].At <= t {
			ft := faults[0]
			faults = faults[1:]
			if ft.Replica < 0 || ft.Replica >= len(r.f.engines) || !r.f.alive[ft.Replica] {
				continue
			}
			switch ft.Kind {
			case Kill:
				r.f.alive[ft.Replica] = false
				r.f.engines[ft.Replica].Restart(t) // aborts everything it holds
				detections = append(detections, detection{t + r.cfg.DetectDelay, ft.Replica})
			case Restart:
				r.f.engines[ft.Replica].Restart(t)
			}
			r.store.restarted(ft.Replica)
		}
		for len(detections) > 0 && detections[0].at <= t {
			r.f.up[detections[0].replica] = false
			detections = detections[1:]
			r.pol.Membership(t)
		}
		if sample <= t {
			r.sampleQueues(t)
			sample += r.cfg.SampleEvery
		}
		if r.pol.NextWake() <= t {
			r.pol.Wake(t)
		}
		r.retryHeld(t)
		for next < n && r.recs[next].at <= t {
			r.arrive(src, next, t)
			next++
		}
		if r.cfg.AbortTTFT > 0 && t >= nextCheck {
			nextCheck = t + checkEvery
			if r.hopeless(t) {
				r.aborted = true
				return nil
			}
		}
	}
	return nil
}

func (r *runner) sampleQueues(t time.Duration) {
	if t < r.cfg.Warmup || t > r.lastArrival {
		return
	}
	mx, sum, k := 0.0, 0.0, 0
	var kv, running, waiting, free float64
	for i, e := range r.f.engines {
		if !r.f.alive[i] {
			continue
		}
		st := e.State()
		q := float64(st.QueuedPrefillTokens)
		mx = max(mx, q)
		sum += q
		kv += st.KVUsage
		running += float64(st.Running)
		waiting += float64(st.Waiting)
		free += float64(st.FreeBlocks) / float64(e.NumGPUBlocks())
		k++
	}
	if k == 0 {
		return
	}
	n := float64(k)
	r.sumMax += mx
	r.sumMean += sum / n
	r.sumKV += kv / n
	r.sumRunning += running / n
	r.sumWaiting += waiting / n
	r.sumFree += free / n
	r.samples++
}
