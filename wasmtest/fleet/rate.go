package fleet

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Load is a workload as a function of its offered rate, everything else held: what
// FindRate and Sweep vary.
type Load struct {
	// Rate is the workload as configured, in requests per second: where FindRate starts.
	Rate float64
	// TraceRate is a replayed trace's rate at speedup 1: rate R replays it with its
	// timestamps divided by R / TraceRate. 0 for generated workloads, whose generator
	// draws arrivals at the rate itself.
	TraceRate float64
	// At builds the workload at rate requests per second.
	At func(rate float64) (workload.Workload, error)
}

// Speedup is the time compression that gives a trace rate; 0 for generated workloads.
func (l Load) Speedup(rate float64) float64 {
	if l.TraceRate <= 0 {
		return 0
	}
	return rate / l.TraceRate
}

// Resolution is when a rate search stops: once the highest rate held and the lowest
// missed are at most Step requests per second apart, or Fraction of the rate held.
type Resolution struct{ Step, Fraction float64 }

// ParseResolution reads "0.5" (requests per second) or "2%" (of the rate held).
func ParseResolution(s string) (Resolution, error) {
	num, percent := strings.CutSuffix(strings.TrimSpace(s), "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return Resolution{}, fmt.Errorf("%q: want a positive number of requests per second (0.5) or a percentage of the rate (2%%)", s)
	}
	if percent {
		if v >= 100 {
			return Resolution{}, fmt.Errorf("%q: a percentage below 100%% (2%%)", s)
		}
		return Resolution{Fraction: v / 100}, nil
	}
	return Resolution{Step: v}, nil
}

func (r Resolution) String() string {
	if r.Fraction > 0 {
		return strconv.FormatFloat(100*r.Fraction, 'g', 4, 64) + "%"
	}
	return strconv.FormatFloat(r.Step, 'g', 4, 64) + " req/s"
}

// resolved reports whether the bracket [held, missed] is narrow enough.
func (r Resolution) resolved(held, missed float64) bool {
	w := missed - held
	return (r.Step > 0 && w <= r.Step) || (r.Fraction > 0 && w <= r.Fraction*held)
}

// RateSearch is one policy's highest-rate search.
type RateSearch struct {
	Policy string
	// Rate is the highest rate that held the SLO (0: none did, down to the floor).
	Rate float64
	// Missed is the lowest rate that missed it (0: none did, up to the cap).
	Missed float64
	// Result is the run at Rate; Workload the arrivals there, and Ceiling their reuse
	// ceiling.
	Result   *sim.Result
	Workload workload.Workload
	Ceiling  workload.Ceiling
	// Tried maps every rate run to its TTFT quantile (MaxInt64: stopped early).
	Tried map[float64]time.Duration
}

// rateSteps bounds a rate search: at most this many doublings above its start, or
// halvings below it.
const rateSteps = 10

// FindRate searches, for each named policy, the highest rate the fleet of o.Replicas
// holds with its TTFT quantile q at most slo: from load.Rate, doubling or halving until
// the SLO's outcome changes, then bisecting to res (this assumes TTFT grows with the
// rate). Runs that cannot meet the SLO stop as soon as that is certain, as in
// FindReplicas; policies search in parallel, at most o.Parallel runs at a time.
func FindRate(load Load, names []string, o Options, slo time.Duration, q float64, res Resolution) ([]*RateSearch, error) {
	return findRate(load, names, o, slo, q, res, simulateRun)
}

func findRate(load Load, names []string, o Options, slo time.Duration, q float64, res Resolution, simulate simulateFunc) ([]*RateSearch, error) {
	if load.Rate <= 0 || load.At == nil {
		return nil, fmt.Errorf("rate search: the workload has no rate to start from (%g req/s)", load.Rate)
	}
	out := make([]*RateSearch, len(names))
	err := eachPolicy(names, o, simulate, func(i int, name string, run func(sim.Config) (*sim.Result, error)) error {
		s := &RateSearch{Policy: name, Tried: map[float64]time.Duration{}}
		out[i] = s
		type point struct {
			w   workload.Workload
			res *sim.Result
		}
		runs := map[float64]point{}
		pass := func(rate float64) (bool, error) {
			w, err := load.At(rate)
			if err != nil {
				return false, fmt.Errorf("%s at %g req/s: %w", name, rate, err)
			}
			cfg := o.simConfig(w, o.Replicas)
			cfg.AbortTTFT, cfg.AbortQuantile = slo, q
			r, err := run(cfg)
			if err != nil {
				return false, fmt.Errorf("%s at %g req/s: %w", name, rate, err)
			}
			runs[rate] = point{w, r}
			p := quantileOf(r, q)
			s.Tried[rate] = p
			return !r.Aborted && p <= slo, nil
		}
		var err error
		if s.Rate, s.Missed, err = bisectRate(load.Rate, res, pass); err != nil {
			return err
		}
		if s.Rate > 0 {
			s.Result, s.Workload = runs[s.Rate].res, runs[s.Rate].w
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Each rate's ceiling once, whichever policies held it.
	ceilings := map[float64]workload.Ceiling{}
	for _, s := range out {
		if s.Workload == nil {
			continue
		}
		c, ok := ceilings[s.Rate]
		if !ok {
			c = workload.ReuseCeiling(s.Workload, o.Profile.BlockSize, o.Warmup)
			ceilings[s.Rate] = c
		}
		s.Ceiling = c
	}
	return out, nil
}

// bisectRate finds the highest rate that passes, assuming pass is monotone (it holds
// below some rate and misses above), starting from a guess: it returns that rate and
// the lowest rate that missed, res apart at most. held is 0 when nothing down to
// guess/2^rateSteps passes (or below res.Step), missed is 0 when everything up to
// guess*2^rateSteps does.
func bisectRate(guess float64, res Resolution, pass func(float64) (bool, error)) (held, missed float64, err error) {
	if guess <= 0 || (res.Step <= 0 && res.Fraction <= 0) {
		return 0, 0, errors.New("rate search: the start and the resolution must be positive")
	}
	try := func(r float64) (bool, error) {
		ok, err := pass(r)
		if ok {
			held = r
		} else {
			missed = r
		}
		return ok, err
	}
	up, err := try(guess)
	if err != nil {
		return 0, 0, err
	}
	// From the guess, up while the rates hold or down while they miss, until one does
	// the other; below res.Step every rate is within the resolution of 0.
	factor := 0.5
	if up {
		factor = 2
	}
	for k := 1; k <= rateSteps && (held == 0 || missed == 0); k++ {
		r := guess * math.Pow(factor, float64(k))
		if r < res.Step {
			break
		}
		if _, err = try(r); err != nil {
			return 0, 0, err
		}
	}
	if held == 0 || missed == 0 {
		return held, missed, nil
	}
	for !res.resolved(held, missed) {
		if _, err = try((held + missed) / 2); err != nil {
			return 0, 0, err
		}
	}
	return held, missed, nil
}
