package sim

import (
	"math"
	"slices"
	"time"
)

// Result is one policy's numbers for one run, over the measured requests (those that
// arrived after the warm-up).
type Result struct {
	Policy   string
	Replicas int
	GPUs     int // Replicas x the profile's tensor-parallel degree

	Requests int // completed
	Failed   int // aborted by a fault, refused everywhere, rejected (Rejected) or not found (NotFound)
	Rejected int // the engine refused them (too long)
	Shed     int // refused by the proxy past capacity (429), not counted in Failed
	// FollowUps are the Responses requests continuing a stored response; NotFound those
	// of them sent to a replica whose store lacked it (vLLM's 404).
	FollowUps, NotFound int

	// CachedTokenRate is cached prompt tokens / prompt tokens, as the engines counted
	// them at admission (usage.prompt_tokens_details.cached_tokens).
	CachedTokenRate float64
	// CPUTokenRate is the part of CachedTokenRate loaded from the engines' CPU tier
	// (Config.CPUTierTokens); the rest was a GPU prefix-cache hit.
	CPUTokenRate float64
	TTFTp50      time.Duration
	TTFTp95      time.Duration
	TTFTp99      time.Duration
	E2Ep50       time.Duration
	// TTFT holds every completed measured request's time to first token, sorted (the
	// distribution kvroute-bench --plot draws; partial when Aborted).
	TTFT []time.Duration
	// MaxMeanQueue is the time-averaged largest queued-prefill-token count over the
	// time-averaged mean, sampled every 100 ms while requests arrive: 1 is perfectly
	// even; herding shows as a large value.
	MaxMeanQueue float64
	// SpillRate is the share of requests not sent to a replica holding the longest
	// cached prefix of the prompt (the engines' real caches at decision time).
	SpillRate float64
	// RuleSpillRate is the same by the policy's own view (kvroute and oracle: the rule's
	// Spill flag); NaN for policies without one.
	RuleSpillRate float64
	Preemptions   int
	// Memory is the replicas' KV memory and queues, time-averaged: what a policy leaves
	// room for in the prefix caches.
	Memory FleetState
	// Outcomes is every finished, failed or shed request, warm-up included, in arrival
	// order: what the figures above are made of (with Config.Outcomes, else nil).
	Outcomes []Outcome

	// Hot and Others split the requests by HotGroup.
	Hot, Others *GroupStats
	// Phases are Config.Phases' numbers, in order.
	Phases []PhaseStats
	// Classes and Tenants are the requests by class and by tenant (Config.ClassBudgets),
	// in the order of their first measured request.
	Classes []ClassStats
	Tenants []TenantStats

	// Aborted: the run stopped early because the TTFT bound could not be met.
	Aborted bool
	SimTime time.Duration
	Wall    time.Duration
}

// FleetState is how a policy leaves the replicas' KV memory, sampled every
// Config.SampleEvery over the measured arrivals and averaged over live replicas.
type FleetState struct {
	// KVUsage is vLLM's kv_cache_usage_perc: the share of blocks running requests hold.
	KVUsage float64
	// Free is the share of blocks no request holds: the room prefixes stay cached in
	// (vLLM evicts them from there, least recently used first).
	Free float64
	// Running and Waiting are the requests a replica runs and queues.
	Running, Waiting float64
	// LostWaiting is the prompt tokens that the replica a request was sent to held
	// cached when the policy decided, and had evicted by the time the request was
	// admitted, over all prompt tokens: the cache a queue costs while it waits.
	LostWaiting float64
	// StoredAgain is the share of the GPU blocks the replicas evicted that they stored
	// again within 5 minutes, the control plane's measure counted from the engines;
	// StoredAgainFleet the share stored again on any replica, what the fleet paid
	// again; Evicted how many GPU blocks a replica evicted a second over the same span,
	// the volume the shares are of (Config.Evictions: 0 without it, NaN when no
	// eviction's window closed within the run).
	StoredAgain, StoredAgainFleet, Evicted float64
}

// PhaseStats describes the measured requests that arrived within a phase.
type PhaseStats struct {
	Name            string
	Requests        int // completed
	Failed          int
	CachedTokenRate float64
	TTFTp50         time.Duration
	TTFTp95         time.Duration
	TTFTp99         time.Duration
}

type phaseAcc struct {
	ttft           []time.Duration
	prompt, cached int64
	failed         int
}

// GroupStats describes one set of requests.
type GroupStats struct {
	Requests int
	TTFTp95  time.Duration
	// Replicas is how many replicas served at least 1% of them; Effective is the
	// inverse Simpson index of their spread, (sum n)^2 / sum n^2.
	Replicas  int
	Effective float64
}

// Quantile returns the q-quantile (nearest rank) of sorted durations.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(k, len(sorted)-1))]
}

func (r *runner) result() *Result {
	res := &Result{Policy: r.pol.Name(), Replicas: r.cfg.Replicas, GPUs: r.cfg.Replicas * r.cfg.Profile.GPUs,
		Aborted: r.aborted, SimTime: r.now, RuleSpillRate: math.NaN()}
	var ttft, e2e []time.Duration
	var prompt, cached, loaded, lost int64
	routed, spills, ruled, ruleSpills := 0, 0, 0, 0
	hot, others := &groupAcc{per: map[int32]int{}}, &groupAcc{per: map[int32]int{}}
	phases := make([]phaseAcc, len(r.cfg.Phases))
	for i := range r.recs {
		rec := &r.recs[i]
		if r.cfg.Outcomes {
			if o, ok := r.outcome(i, rec); ok {
				res.Outcomes = append(res.Outcomes, o)
			}
		}
		if !rec.measured {
			continue
		}
		for k, ph := range r.cfg.Phases {
			if rec.at < ph.From || rec.at >= ph.To {
				continue
			}
			switch rec.state {
			case done:
				phases[k].ttft = append(phases[k].ttft, rec.first-rec.at)
				phases[k].prompt += int64(rec.prompt)
				phases[k].cached += int64(rec.cached)
			case failed:
				phases[k].failed++
			}
		}
		if rec.routed {
			routed++
			if rec.spill {
				spills++
			}
			if rec.rule {
				ruled++
				if rec.ruleSpill {
					ruleSpills++
				}
			}
		}
		res.Preemptions += int(rec.preempts)
		if rec.followUp {
			res.FollowUps++
			if rec.notFound {
				res.NotFound++
			}
		}
		switch rec.state {
		case done:
			res.Requests++
			ttft = append(ttft, rec.first-rec.at)
			e2e = append(e2e, rec.end-rec.at)
			prompt += int64(rec.prompt)
			cached += int64(rec.cached)
			lost += int64(max(rec.routeCached-rec.cached, 0))
			loaded += int64(rec.loaded)
			if r.cfg.HotGroup >= 0 {
				_, g := r.w.Arrival(i)
				acc := others
				if g == r.cfg.HotGroup {
					acc = hot
				}
				acc.ttft = append(acc.ttft, rec.first-rec.at)
				acc.per[rec.replica]++
			}
		case shed:
			res.Shed++
		case failed:
			res.Failed++
			if rec.rejected {
				res.Rejected++
			}
		}
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	res.TTFT = ttft
	if r.aborted {
		inf := time.Duration(math.MaxInt64)
		res.TTFTp50, res.TTFTp95, res.TTFTp99, res.E2Ep50 = inf, inf, inf, inf
	} else {
		res.TTFTp50, res.TTFTp95, res.TTFTp99 = Quantile(ttft, 0.50), Quantile(ttft, 0.95), Quantile(ttft, 0.99)
		res.E2Ep50 = Quantile(e2e, 0.50)
	}
	if prompt > 0 {
		res.CachedTokenRate = float64(cached) / float64(prompt)
		res.CPUTokenRate = float64(loaded) / float64(prompt)
		res.Memory.LostWaiting = float64(lost) / float64(prompt)
	}
	if r.ev != nil {
		res.Memory.StoredAgain, res.Memory.StoredAgainFleet, res.Memory.Evicted = r.ev.summary(r.now)
	}
	if r.samples > 0 {
		n := float64(r.samples)
		res.Memory.KVUsage, res.Memory.Free = r.sumKV/n, r.sumFree/n
		res.Memory.Running, res.Memory.Waiting = r.sumRunning/n, r.sumWaiting/n
	}
	if r.sumMean > 0 {
		res.MaxMeanQueue = r.sumMax / r.sumMean
	} else if r.samples > 0 {
		res.MaxMeanQueue = 1
	}
	if routed > 0 {
		res.SpillRate = float64(spills) / float64(routed)
		if ruled > 0 {
			res.RuleSpillRate = float64(ruleSpills) / float64(ruled)
		}
	}
	if r.cfg.HotGroup >= 0 {
		res.Hot, res.Others = hot.stats(), others.stats()
	}
	for k, ph := range r.cfg.Phases {
		a := &phases[k]
		slices.Sort(a.ttft)
		ps := PhaseStats{Name: ph.Name, Requests: len(a.ttft), Failed: a.failed,
			TTFTp50: Quantile(a.ttft, 0.50), TTFTp95: Quantile(a.ttft, 0.95), TTFTp99: Quantile(a.ttft, 0.99)}
		if a.prompt > 0 {
			ps.CachedTokenRate = float64(a.cached) / float64(a.prompt)
		}
		res.Phases = append(res.Phases, ps)
	}
	if r.cfg.ClassBudgets != nil {
		res.Classes, res.Tenants = r.byClass()
	}
	return res
}

type groupAcc struct {
	ttft []time.Duration
	per  map[int32]int
}

func (a *groupAcc) stats() *GroupStats {
	slices.Sort(a.ttft)
	g := &GroupStats{Requests: len(a.ttft), TTFTp95: Quantile(a.ttft, 0.95)}
	var sq float64
	for _, k := range a.per {
		if float64(k) >= 0.01*float64(g.Requests) {
			g.Replicas++
		}
		sq += float64(k) * float64(k)
	}
	if sq > 0 {
		g.Effective = float64(g.Requests) * float64(g.Requests) / sq
	}
	return g
}
