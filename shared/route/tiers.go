package route

import "github.com/kvroute/kvroute/shared/table"

// tierScratch is a router's scratch space for slower KV tiers (docs/rule.md, "Slower
// tiers"): per replica of the model being decided, where the loadable run ends and what
// loading it costs, in blocks.
type tierScratch struct {
	on       bool      // the model has slower tiers
	ratios   []float64 // per tier of the model, api.Guards.OffloadCost's
	loadable []int
	end      []int // blocks: the GPU match plus the loadable run
	cost     []float64
}

// matchTiers sets r.matched as Model.Match does and, when m names slower tiers, what
// each replica could load from them at the configured cost (api.Guards.OffloadCost).
func (r *Router) matchTiers(m *table.Model, c *Chain) {
	t := &r.tiers
	t.on = len(m.Tiers) > 0
	if !t.on {
		r.match(m, c.Keys) // through the memo (matchmemo.go)
		return
	}
	t.ratios = r.Config.OffloadRatios(m.Tiers, t.ratios)
	r.matched, t.loadable, t.cost = m.MatchTiers(c.Keys, t.ratios, r.matched, t.loadable, t.cost)
	t.end = t.end[:0]
	for i, n := range t.loadable {
		t.end = append(t.end, r.matched[i]+n)
	}
}

// offloaded is replica i's rule.Candidate Offloaded and LoadCost in tokens: the part of
// its loadable run past r.matched[i] (which this proxy's own placements may have
// raised), its cost in proportion.
func (r *Router) offloaded(c *Chain, i int) (tokens, cost float64) {
	t := &r.tiers
	if !t.on || t.loadable[i] == 0 {
		return 0, 0
	}
	rest := t.end[i] - r.matched[i]
	if rest <= 0 {
		return 0, 0
	}
	frac := float64(rest) / float64(t.loadable[i])
	return c.Tokens(rest), t.cost[i] * frac * c.Tokens(1)
}

// evictCost is every replica's rule.Candidate EvictCost for the model being decided: the
// smallest load-cost ratio of its slower tiers, where a block GPU memory evicts is still
// held (vLLM's OffloadingConnector writes every block to CPU memory as it computes it);
// 0, a block prefilled again, when the model has none. The table names a model's tiers,
// not each replica's: a fleet of one model is configured alike, and a replica without the
// tier is charged less for what it evicts until it has one.
func (r *Router) evictCost() float64 {
	t := &r.tiers
	if !t.on || len(t.ratios) == 0 {
		return 0
	}
	least := 1.0
	for _, ratio := range t.ratios {
		least = min(least, max(ratio, minEvictCost))
	}
	return least
}

// minEvictCost stands for a configured ratio of 0 (loads that cost nothing): EvictCost's
// 0 means a prefill.
const minEvictCost = 1e-3
