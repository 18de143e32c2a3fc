package fleet

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Search is one policy's fewest-replicas search.
type Search struct {
	Policy   string
	Replicas int // fewest replicas that met the SLO; 0 when none up to the limit did
	GPUs     int
	Result   *sim.Result // the run at Replicas
	// Tried maps every replica count run to its TTFT quantile (MaxInt64: gave up early).
	Tried map[int]time.Duration
}

// SearchLimit caps the replicas tried.
const SearchLimit = 1024

// FindReplicas searches, for each named policy, the fewest replicas whose TTFT
// quantile q meets slo (a bisection: TTFT falls as replicas are added), starting from
// o.Replicas. Runs that cannot meet the SLO stop as soon as that is certain. Policies
// search in parallel, at most o.Parallel runs at a time.
func FindReplicas(w workload.Workload, names []string, o Options, slo time.Duration, q float64) ([]*Search, error) {
	out := make([]*Search, len(names))
	err := eachPolicy(names, o, simulateRun, func(i int, name string, run func(sim.Config) (*sim.Result, error)) error {
		s := &Search{Policy: name, Tried: map[int]time.Duration{}}
		out[i] = s
		results := map[int]*sim.Result{}
		pass := func(n int) (bool, error) {
			cfg := o.simConfig(w, n)
			cfg.AbortTTFT, cfg.AbortQuantile = slo, q
			res, err := run(cfg)
			if err != nil {
				return false, fmt.Errorf("%s at %d replicas: %w", name, n, err)
			}
			results[n] = res
			p := quantileOf(res, q)
			s.Tried[n] = p
			return !res.Aborted && p <= slo, nil
		}
		return bisect(o.Replicas, pass, func(n int) {
			s.Replicas, s.GPUs, s.Result = n, n*o.Profile.GPUs, results[n]
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// simulateFunc runs one configuration of the named policy: sim.Run in a search, a
// stand-in in tests of the search itself.
type simulateFunc func(cfg sim.Config, name string, o Options) (*sim.Result, error)

func simulateRun(cfg sim.Config, name string, o Options) (*sim.Result, error) {
	return sim.Run(cfg, NewPolicy(name, o))
}

// eachPolicy runs search for every named policy at once, each in its own goroutine;
// the run it is handed simulates one configuration of that policy (with simulate), at most o.Parallel
// at a time across all of them. It returns the first policy's error, in names' order.
func eachPolicy(names []string, o Options, simulate simulateFunc, search func(i int, name string, run func(sim.Config) (*sim.Result, error)) error) error {
	parallel := o.Parallel
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, parallel)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = search(i, name, func(cfg sim.Config) (*sim.Result, error) {
				sem <- struct{}{}
				defer func() { <-sem }()
				return simulate(cfg, name, o)
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// bisect finds the smallest n >= 1 with pass(n), assuming pass is monotone, starting
// from a guess; found is called with it (not at all when nothing up to SearchLimit
// passes).
func bisect(guess int, pass func(int) (bool, error), found func(int)) error {
	guess = max(1, min(guess, SearchLimit))
	lo, hi := 0, 0 // lo fails (0: nothing below 1), hi passes (0: not found yet)
	ok, err := pass(guess)
	if err != nil {
		return err
	}
	if ok {
		hi = guess
	} else {
		lo = guess
		for n := guess * 2; ; n *= 2 {
			n = min(n, SearchLimit)
			if ok, err = pass(n); err != nil {
				return err
			}
			if ok {
				hi = n
				break
			}
			lo = n
			if n == SearchLimit {
				return nil
			}
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if ok, err = pass(mid); err != nil {
			return err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	found(hi)
	return nil
}

func quantileOf(r *sim.Result, q float64) time.Duration {
	switch q {
	case 0.5:
		return r.TTFTp50
	case 0.99:
		return r.TTFTp99
	}
	return r.TTFTp95
}
