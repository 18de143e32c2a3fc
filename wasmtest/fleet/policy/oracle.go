package policy

import (
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Oracle is kvroute's rule (package shared/rule, the same Picker) with perfect,
// instant knowledge: every engine's exact GPU cached prefix for the request and its
// queued prefill tokens, read at decision time, and its load averages (index.Load) fed
// the engines' exact state at every decision rather than scrapes. kvroute's distance
// from it measures kvroute's information pipeline, not the rule; it is no upper bound on
// routing.
type Oracle struct {
	Base
	// UncachedWeight, when above 1, scores (Q + w U) instead of (Q + U) by feeding the
	// rule Q / w: an experiment on the rule's spill threshold (w x the saved prefill),
	// not kvroute's rule.
	UncachedWeight float64
	f              Fleet
	picker         *rule.Picker
	load           []index.Load
	// uncached is the mean uncached prompt tokens of the requests routed so far
	// (rule.Candidate.MeanUncached), exact at each decision; n counts them.
	uncached float64
	n        int
	cands    []rule.Candidate
	idx      []int
	order    []int
}

// NewOracle returns the oracle with the rule's parameters p.
func NewOracle(f Fleet, p rule.Params, seed uint64) *Oracle {
	return &Oracle{f: f, picker: rule.NewPicker(p, seed)}
}

func (p *Oracle) Name() string { return "oracle" }

func (p *Oracle) Route(r *workload.Request, now time.Duration) Choice {
	p.cands, p.idx = p.cands[:0], p.idx[:0]
	if len(p.load) < p.f.Len() {
		p.load = append(p.load, make([]index.Load, p.f.Len()-len(p.load))...)
	}
	at := time.Unix(0, 0).Add(now)
	for i := range p.f.Len() {
		if !p.f.Up(i) {
			continue
		}
		st := p.f.State(i)
		p.load[i].Note(at, st.QueuedPrefillTokens > 0, float64(st.Running))
		running, busy := p.load[i].Values()
		q := float64(st.QueuedPrefillTokens)
		if p.UncachedWeight > 1 {
			q /= p.UncachedWeight
		}
		p.cands = append(p.cands, rule.Candidate{
			Queued:  q,
			Cached:  float64(p.f.CachedPrefix(i, r)),
			KVUsage: st.KVUsage,
			Healthy: p.f.Reachable(i),
			Running: running,
			Busy:    busy,
			// 0 before the first decision: the rule without load values.
			MeanUncached: p.uncached,
		})
		p.idx = append(p.idx, i)
	}
	if len(p.cands) == 0 {
		return Choice{}
	}
	prompt := float64(len(r.Tokens))
	d := p.picker.Pick(prompt, p.cands, p.order)
	p.order = d.Order
	if len(d.Order) > 0 {
		p.uncached = index.LearnedMean(p.uncached, p.n, prompt-p.cands[d.Order[0]].Cached)
		p.n++
	}
	out := make([]int, len(d.Order))
	for k, j := range d.Order {
		out[k] = p.idx[j]
	}
	return Choice{Order: out, Rule: true, Spill: d.Spill}
}
