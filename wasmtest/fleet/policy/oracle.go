package policy

import (
	"time"

	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Oracle is kvroute's rule (package shared/rule, the same Picker) with perfect,
// instant knowledge: every engine's exact GPU cached prefix for the request and its
// queued prefill tokens, read at decision time. kvroute's distance from it measures
// kvroute's information pipeline, not the rule; it is no upper bound on routing.
type Oracle struct {
	Base
	// UncachedWeight, when above 1, scores (Q + w U) instead of (Q + U) by feeding the
	// rule Q / w: an experiment on the rule's spill threshold (w x the saved prefill),
	// not kvroute's rule.
	UncachedWeight float64
	f              Fleet
	picker         *rule.Picker
	cands          []rule.Candidate
	idx            []int
	order          []int
}

// NewOracle returns the oracle with the rule's parameters p.
func NewOracle(f Fleet, p rule.Params, seed uint64) *Oracle {
	return &Oracle{f: f, picker: rule.NewPicker(p, seed)}
}

func (p *Oracle) Name() string { return "oracle" }

func (p *Oracle) Route(r *workload.Request, _ time.Duration) Choice {
	p.cands, p.idx = p.cands[:0], p.idx[:0]
	for i := range p.f.Len() {
		if !p.f.Up(i) {
			continue
		}
		st := p.f.State(i)
		q := float64(st.QueuedPrefillTokens)
		if p.UncachedWeight > 1 {
			q /= p.UncachedWeight
		}
		p.cands = append(p.cands, rule.Candidate{
			Queued:  q,
			Cached:  float64(p.f.CachedPrefix(i, r)),
			KVUsage: st.KVUsage,
			Healthy: p.f.Reachable(i),
		})
		p.idx = append(p.idx, i)
	}
	if len(p.cands) == 0 {
		return Choice{}
	}
	d := p.picker.Pick(float64(len(r.Tokens)), p.cands, p.order)
	p.order = d.Order
	out := make([]int, len(d.Order))
	for k, j := range d.Order {
		out[k] = p.idx[j]
	}
	return Choice{Order: out, Rule: true, Spill: d.Spill}
}
