// Package fleet compares routing policies on a simulated fleet: it builds each policy
// (package policy for the peers, package kvroute for kvroute's own code), runs them on
// the same arrivals (package sim) in parallel, searches the fewest replicas that meet a
// TTFT SLO, and writes the comparison table (text or JSON). bin/kvroute-bench is its
// command line.
package fleet

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Policies are every policy's name, in table order: the peers (yardstick.go), then
// kvroute and the oracle.
var Policies = append(slices.Clone(Peers), "kvroute", "oracle")

// Options configure runs.
type Options struct {
	Replicas int
	Profile  timing.Profile
	Seed     uint64
	// PolicySeed, when not 0, seeds the policies' own random sources (tie breaks,
	// kvroute's timer phases) instead of Seed, so that the same arrivals can be routed
	// with another draw of them: whether a figure is the arrivals' or the ties'.
	PolicySeed uint64
	Routers    int
	// PinTenants: each tenant's requests reach one proxy (sim.Config.PinTenants).
	PinTenants bool
	Stream     bool
	Faults     []sim.Fault
	Warmup     time.Duration
	HotGroup   int // -1: none
	// Phases are reported apart (sim.Config.Phases).
	Phases []sim.Phase
	// KVRoute configures kvroute (its Routers, Stale and Seed are set from the above);
	// Rule also drives the oracle.
	KVRoute kvroute.Config
	SGLang  policy.SGLangConfig
	Scorers policy.ScorersConfig
	// CHWBLFactor is c; LeastQueuedScrape the least-queued router's scrape interval.
	CHWBLFactor       float64
	LeastQueuedScrape time.Duration
	// Parallel bounds concurrent runs (default GOMAXPROCS).
	Parallel int
	// WasmPath is the filter module kvroute-wasm loads ("": built from this checkout).
	WasmPath string
	// OracleUncachedWeight > 1 makes the oracle score Q + w U (an experiment).
	OracleUncachedWeight float64
	// CPUTierTokens > 0 gives every replica vLLM's CPU offloading tier (sim.Config);
	// policy kvroute-gpu-only is kvroute reading GPU holders only (tiers.go).
	CPUTierTokens   int
	CPULoadPerToken time.Duration
	// ClassBudgets, when set, reports requests by class and tenant (sim.Config).
	ClassBudgets map[string]time.Duration
	// Outcomes keeps every request's outcome in the results (sim.Config).
	Outcomes bool
	// Evictions measures the share of evicted blocks stored again (sim.Config).
	Evictions bool
}

// DefaultOptions are docs/rule.md's fleet.
func DefaultOptions() Options {
	return Options{
		Replicas: 22, Profile: timing.Seed000(), Seed: 1, Routers: 1, Stream: true, HotGroup: -1,
		KVRoute: kvroute.DefaultConfig(), SGLang: policy.DefaultSGLang(), Scorers: policy.DefaultScorers(),
		CHWBLFactor: policy.DefaultCHWBLFactor, LeastQueuedScrape: 100 * time.Millisecond,
	}
}

// ParsePolicies checks a comma-separated list; "all" (or "") stands for Policies.
func ParsePolicies(s string) ([]string, error) {
	if s == "" || s == "all" {
		return Policies, nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "all" {
			for _, p := range Policies {
				if !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
			continue
		}
		if !slices.Contains(Policies, n) && n != kvroute.WasmName && n != GPUOnlyName {
			return nil, fmt.Errorf("unknown policy %q (known: %s)", n, strings.Join(Policies, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// NewPolicy returns the constructor of the named policy.
func NewPolicy(name string, o Options) sim.NewPolicy {
	seed := o.policySeed()
	return func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
		perRouter := func(mk func(k int) policy.Policy) policy.Policy {
			return policy.Split(o.Routers, routerOf, mk)
		}
		switch name {
		case "round-robin":
			return perRouter(func(int) policy.Policy { return policy.NewRoundRobin(f) }), nil
		case "random":
			return perRouter(func(k int) policy.Policy { return policy.NewRandom(f, seed+uint64(k)) }), nil
		case "least-queued":
			return perRouter(func(k int) policy.Policy {
				return policy.NewLeastQueued(f, o.LeastQueuedScrape, seed+uint64(k))
			}), nil
		case "chwbl":
			return perRouter(func(int) policy.Policy { return policy.NewCHWBL(f, o.CHWBLFactor) }), nil
		case "sglang-cache-aware":
			return perRouter(func(k int) policy.Policy {
				c := o.SGLang
				c.Seed = seed + uint64(k)
				return policy.NewSGLang(f, c)
			}), nil
		case "weighted-scorers":
			// One picker for every router: the inference extension runs its endpoint
			// pickers active-passive, so one index serves the whole gateway.
			return policy.NewScorers(f, o.Scorers, seed), nil
		case "oracle":
			p := policy.NewOracle(f, o.KVRoute.Rule, seed)
			p.UncachedWeight = o.OracleUncachedWeight
			return p, nil
		case "kvroute":
			c := o.KVRoute
			c.Routers, c.Seed = o.Routers, seed
			return kvroute.New(f, routerOf, c)
		case GPUOnlyName:
			return newGPUOnly(f, routerOf, o, seed) // tiers.go
		case kvroute.WasmName:
			c := o.KVRoute
			c.Routers, c.Seed = o.Routers, seed
			return kvroute.NewWasm(f, routerOf, c, kvroute.WasmOptions{Path: o.WasmPath})
		}
		return nil, fmt.Errorf("unknown policy %q", name)
	}
}

// policySeed seeds the policies' random sources: PolicySeed, else Seed.
func (o Options) policySeed() uint64 {
	if o.PolicySeed != 0 {
		return o.PolicySeed
	}
	return o.Seed
}

func (o Options) simConfig(w workload.Workload, replicas int) sim.Config {
	return sim.Config{
		Replicas: replicas, Profile: o.Profile, Workload: w, Seed: o.Seed, Routers: o.Routers, PinTenants: o.PinTenants,
		Stream: o.Stream, Faults: o.Faults, Warmup: o.Warmup, HotGroup: o.HotGroup, Phases: o.Phases,
		CPUTierTokens: o.CPUTierTokens, CPULoadPerToken: o.CPULoadPerToken, ClassBudgets: o.ClassBudgets,
		Outcomes: o.Outcomes, Evictions: o.Evictions,
	}
}

// job is one simulation run.
type job struct {
	cfg  sim.Config
	name string
	o    Options
	res  *sim.Result
	err  error
}

// runAll runs jobs on at most o.Parallel goroutines.
func runAll(jobs []*job, parallel int) {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			j.res, j.err = sim.Run(j.cfg, NewPolicy(j.name, j.o))
			if j.err != nil {
				j.err = fmt.Errorf("%s: %w", j.name, j.err)
			}
		}()
	}
	wg.Wait()
}

// Compare runs every named policy on w with o.Replicas replicas, in parallel; results
// are in the order of names.
func Compare(w workload.Workload, names []string, o Options) ([]*sim.Result, error) {
	jobs := make([]*job, len(names))
	for i, n := range names {
		jobs[i] = &job{cfg: o.simConfig(w, o.Replicas), name: n, o: o}
	}
	// The slowest policies first, so the last ones to finish are short.
	order := slices.Clone(jobs)
	slices.SortStableFunc(order, func(a, b *job) int { return cost(b.name) - cost(a.name) })
	runAll(order, o.Parallel)
	out := make([]*sim.Result, len(jobs))
	for i, j := range jobs {
		if j.err != nil {
			return nil, j.err
		}
		out[i] = j.res
	}
	return out, nil
}

// cost ranks policies by simulation cost (kvroute runs the control plane; cache-blind
// policies overload small fleets, which makes long queues).
func cost(name string) int {
	switch name {
	case kvroute.WasmName:
		return 4
	case "kvroute":
		return 3
	case "round-robin", "random", "least-queued":
		return 2
	}
	return 1
}

// Rule returns the rule parameters the options give kvroute and the oracle.
func (o Options) Rule() rule.Params { return o.KVRoute.Rule }
