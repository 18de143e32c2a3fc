package fleet

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// MaxSweepRates bounds the rates of one sweep: each is a run of every policy.
const MaxSweepRates = 100

// ParseSweep reads A:B:STEP, requests per second: A, A+STEP, ... up to B (B itself when
// STEP divides B-A).
func ParseSweep(s string) ([]float64, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%q: want A:B:STEP in requests per second, e.g. 10:60:5", s)
	}
	var v [3]float64
	for i, name := range []string{"A", "B", "STEP"} {
		f, err := strconv.ParseFloat(strings.TrimSpace(parts[i]), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%q: %s %q is not a number", s, name, parts[i])
		}
		v[i] = f
	}
	a, b, step := v[0], v[1], v[2]
	switch {
	case a <= 0:
		return nil, fmt.Errorf("%q: the first rate A must be positive", s)
	case b < a:
		return nil, fmt.Errorf("%q: the last rate B must not be below A", s)
	case step <= 0:
		return nil, fmt.Errorf("%q: STEP must be positive", s)
	}
	// A small tolerance keeps B when STEP divides B-A but floating point says otherwise.
	n := int(math.Floor((b-a)/step+1e-9)) + 1
	if n > MaxSweepRates {
		return nil, fmt.Errorf("%q: %d rates, at most %d (a larger STEP)", s, n, MaxSweepRates)
	}
	rates := make([]float64, n)
	for k := range rates {
		// Rounded to 1e-9 so that 0.1 steps read 0.3, not 0.30000000000000004.
		rates[k] = math.Round((a+float64(k)*step)*1e9) / 1e9
	}
	return rates, nil
}

// SweepPoint is every policy at one rate.
type SweepPoint struct {
	Rate     float64
	Workload workload.Workload
	Ceiling  workload.Ceiling
	Results  []*sim.Result // in the order of the names
}

// Sweep runs every named policy at every rate, with o.Replicas replicas and the full
// workload (no early stop: past capacity the collapse is the measurement), at most
// o.Parallel simulations at a time.
func Sweep(load Load, names []string, o Options, rates []float64) ([]*SweepPoint, error) {
	points := make([]*SweepPoint, len(rates))
	var jobs []*job
	for k, rate := range rates {
		w, err := load.At(rate)
		if err != nil {
			return nil, fmt.Errorf("at %g req/s: %w", rate, err)
		}
		points[k] = &SweepPoint{Rate: rate, Workload: w}
		for _, n := range names {
			jobs = append(jobs, &job{cfg: o.simConfig(w, o.Replicas), name: n, o: o})
		}
	}
	// The costliest first: slow policies, and among them the highest rates (more
	// requests, longer queues).
	order := slices.Clone(jobs)
	slices.Reverse(order)
	slices.SortStableFunc(order, func(a, b *job) int { return cost(b.name) - cost(a.name) })
	runAll(order, o.Parallel)
	for k, p := range points {
		for _, j := range jobs[k*len(names) : (k+1)*len(names)] {
			if j.err != nil {
				return nil, fmt.Errorf("at %g req/s: %w", p.Rate, j.err)
			}
			p.Results = append(p.Results, j.res)
		}
		p.Ceiling = workload.ReuseCeiling(p.Workload, o.Profile.BlockSize, o.Warmup)
	}
	return points, nil
}
