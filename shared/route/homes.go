package route

import (
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
)

// Homes: where the fleet's KV caches cannot hold its working set (the usual case in
// production), a conversation's or a document's prefix is often evicted everywhere
// between two of its requests, and the table then lists it nowhere. Placed as new, the
// request goes wherever the cost is lowest at that moment, so such prefixes wander from
// replica to replica; sent back to the replica that last had it, its home, each stays on
// one, and the fleet's caches keep more (docs/performance.md, "Homes").
//
// The control plane remembers, for the keys the table stopped listing, the replica that
// held each last, and serves them in the table (format 4, shared/table/homes.go): one
// memory for every proxy and worker VM, since the control plane sees all their
// placements. So, while the fleet is past capacity (rule.PastCapacity: its replicas'
// mean busy fraction at least 0.9), for a model without a slower tier, where the table
// (with this proxy's own recent placements, Local) lists less of a request's prompt on
// the home of its longest prefix with one than HomeCredit of that prefix, the rule counts
// that replica as holding HomeCredit of it: enough to keep the prefix there over a
// somewhat shorter queue elsewhere, not enough to beat a replica the table lists holding
// it (docs/rule.md, "Homes"). Less, not none: a system prompt every request starts with
// is listed on every replica, and a conversation after it that every cache let go still
// has its home.

// DefaultHomeCredit is three quarters of the prefix, as measured (docs/performance.md,
// "Homes").
const DefaultHomeCredit = 0.75

// creditHome counts the home of c's longest prefix with one (r.cands, indexed like
// m.Replicas) as holding HomeCredit of it, where less than that is listed there, and
// returns the home's index and the tokens listed there (-1 for none credited). The
// credit is a preference, not a prediction: Decide puts the listed value back once the
// rule has picked, so what the decision predicts and queues (the ledger's tokens, the
// placement report's predicted cached tokens) and whether it spilled are what the table
// lists.
func (r *Router) creditHome(m *table.Model, c *Chain) (int, float64) {
	if r.HomeCredit <= 0 || r.tiers.on {
		// A slower tier keeps what GPU memory evicts, and the table lists it there:
		// its listings return prefixes already, and a prefix listed nowhere has left
		// its home's tier too (docs/rule.md, "Homes").
		return -1, 0
	}
	if !rule.PastCapacity(r.cands) {
		// Going home costs queue. Below capacity that is latency every request pays,
		// and what stickiness gives the fleet's caches does not make up for it
		// (docs/rule.md, "Homes").
		return -1, 0
	}
	i, blocks := m.Home(c.Keys)
	if i < 0 {
		return -1, 0
	}
	cd := &r.cands[i]
	credit := min(c.Tokens(blocks), c.PromptTokens) * r.HomeCredit
	if cd.Cached >= credit { // Offloaded is 0: the model has no slower tier (above)
		return -1, 0
	}
	listed := cd.Cached
	cd.Cached = credit
	return i, listed
}
