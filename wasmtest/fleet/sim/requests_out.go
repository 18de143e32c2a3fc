package sim

import "time"

// Outcome is one request of a run as the fleet saw it: sizes, times and places only,
// never its text. Result.Outcomes holds one per request the run finished, failed or
// shed, in arrival order (kvroute-bench --requests-csv writes them).
type Outcome struct {
	// Index is the request's place in the workload (Workload.Arrival's i).
	Index   int
	Arrival time.Duration
	// Replica is the one that served it; -1 when it never reached one.
	Replica int
	// Prompt, Cached and Loaded are its prompt tokens, those the engine found cached
	// (Loaded of them from the CPU tier); RouteCached is the chosen replica's GPU-cached
	// prefix of the prompt when it was routed (more than Cached: evicted while waiting).
	Prompt, Cached, Loaded, RouteCached int
	// TTFT and E2E are from arrival to the first and the last token (0 unless Done).
	TTFT, E2E time.Duration
	// Spill: not sent to a replica holding the longest cached prefix.
	Spill       bool
	Preemptions int
	// Measured: it arrived after the warm-up and counts in the figures.
	Measured bool
	// State is "done", "failed" or "shed".
	State string
}

// outcome is rec's Outcome, false while it is pending or in flight (an aborted run).
func (r *runner) outcome(i int, rec *record) (Outcome, bool) {
	o := Outcome{Index: i, Arrival: rec.at, Replica: -1, Prompt: int(rec.prompt), Cached: int(rec.cached),
		Loaded: int(rec.loaded), RouteCached: int(rec.routeCached), Spill: rec.spill,
		Preemptions: int(rec.preempts), Measured: rec.measured}
	if rec.routed {
		o.Replica = int(rec.replica)
	}
	switch rec.state {
	case done:
		o.State, o.TTFT, o.E2E = "done", rec.first-rec.at, rec.end-rec.at
	case failed:
		o.State = "failed"
	case shed:
		o.State = "shed"
	default:
		return Outcome{}, false
	}
	return o, true
}
