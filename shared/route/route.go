// Package route is one routing decision from start to end: the request's prompt becomes
// a chain of block keys, the table says how much of that chain each replica holds, the
// router's own ledger adds what it sent since the table's snapshot, and the rule picks.
// The filter runs it for every request; the fleet simulator runs the same code.
package route

import (
	"strings"
	"time"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
)

// Chain is a request's prefix identity.
type Chain struct {
	Domain prefix.Domain
	// Keys of every complete block, in order.
	Keys []uint64
	// BlockSize is in bytes (text) or tokens (token).
	BlockSize int
	// PromptTokens is exact for token prompts, estimated from bytes for text.
	PromptTokens float64
	// PromptBytes is the canonical text's length (text domain).
	PromptBytes int
	// BytesPerToken converts text blocks to tokens (text domain).
	BytesPerToken float64
}

// Identity is who a chain belongs to: the seed's inputs.
type Identity struct {
	Model string // the table's (base) model
	LoRA  string // the adapter, "" for none
	Salt  prefix.Salt
}

// NewChain computes the chain of pr under mc (the table model's block sizes). keys is
// reused for the result when it has room.
func NewChain(mc table.ModelConfig, id Identity, pr *prompt.Parsed, keys []uint64) Chain {
	return newChain(mc, id, pr, keys, nil)
}

// newChain is NewChain, through memo when not nil: the keys of a prefix shared with a
// prompt the memo remembers are reused, not hashed again (prefix.Memo).
func newChain(mc table.ModelConfig, id Identity, pr *prompt.Parsed, keys []uint64, memo *prefix.Memo) Chain {
	textKeys, tokenKeys := prefix.TextKeys, prefix.TokenKeys
	if memo != nil {
		textKeys, tokenKeys = memo.TextKeys, memo.TokenKeys
	}
	if pr.IsTokens() {
		bt := int(mc.BlockTokens)
		if bt <= 0 {
			bt = prefix.DefaultBlockTokens
		}
		seed := prefix.Seed(prefix.Token, id.Model, id.LoRA, id.Salt)
		return Chain{
			Domain:       prefix.Token,
			Keys:         tokenKeys(keys[:0], seed, pr.Tokens, bt),
			BlockSize:    bt,
			PromptTokens: float64(len(pr.Tokens)),
		}
	}
	bb := int(mc.BlockBytes)
	if bb <= 0 {
		bb = prefix.DefaultBlockBytes
	}
	bpt := mc.BytesPerToken
	if bpt <= 0 {
		bpt = 4 // the usual ratio for English text until the control plane learns better
	}
	seed := prefix.Seed(prefix.Text, id.Model, id.LoRA, id.Salt)
	return Chain{
		Domain:        prefix.Text,
		Keys:          textKeys(keys[:0], seed, pr.Text, bb),
		BlockSize:     bb,
		PromptTokens:  float64(len(pr.Text)) / bpt,
		PromptBytes:   len(pr.Text),
		BytesPerToken: bpt,
	}
}

// Tokens converts a number of matched blocks of c to tokens.
func (c *Chain) Tokens(blocks int) float64 {
	if c.Domain == prefix.Token {
		return float64(blocks * c.BlockSize)
	}
	return float64(blocks*c.BlockSize) / c.BytesPerToken
}

// Decision is the router's answer for one request.
type Decision struct {
	rule.Decision
	// Addrs are the chosen replicas' "ip:port", best first.
	Addrs []string
	// PredictedCached is the tokens of the prompt expected cached on the pick.
	PredictedCached float64
	// Uncached is the prefill work the pick gets: prompt - predicted cached tokens, with
	// tokens it loads from a slower tier at their load cost (rule.Uncached).
	Uncached float64
	// Blocks is the prompt's complete blocks: what a session remembers of it
	// (Request.SessionBlocks), the same for the same text at any bytes per token.
	Blocks int
}

// Header joins the addresses as the endpoint header value: "ip:port,ip:port".
func (d *Decision) Header() string { return strings.Join(d.Addrs, ",") }

// Router holds one router's configuration, scratch space, picker and ledger. Not safe
// for concurrent use: each proxy-wasm VM (one thread) has its own.
type Router struct {
	Picker *rule.Picker
	Ledger *Ledger
	// Local is this proxy's own recent placements, matched with the table's entries.
	Local *Local
	// HomeCredit is the share of a prefix the table lists nowhere that its home is
	// counted as holding (homes.go); 0 credits no home.
	HomeCredit float64
	// Config is the filter's configuration as far as Route reads it: body limits,
	// adapters, tenants. The zero value has no limits, adapters or isolated tenants.
	Config api.Config
	// Reuse lets a Decision's Addrs and a Result's Placement.Keys live in the router's
	// buffers, valid until its next Route, Decide or LeastQueued: the filter's request
	// path then allocates nothing, and copies what it keeps. Off, each result is the
	// caller's to keep.
	Reuse bool
	// Tables, when set, gives the table that serves a base model ("" when the request
	// names none) and its age, in place of Route's: a filter sharded by model (one
	// control plane per model, api.Shard) routes each request on its model's shard. A
	// nil table leaves the request unrouted.
	Tables func(model string) (*table.Table, time.Duration)
	// Admit, when set (api.Overload with classes), refuses placed requests past capacity
	// (package admit); nil admits every request.
	Admit *admit.Controller
	// Follows, when set, gives the replica that answered the response a Responses body
	// continues (its previous_response_id, for tenant), "" when unknown: the request goes
	// there first while the table lists it healthy (affinity.go).
	Follows func(previousResponseID []byte, tenant string) string

	aff     affinity // the request being routed's (affinity.go)
	parser  prompt.Parser
	memo    prefix.Memo // the last prompts' keys: a shared prefix is compared, not hashed
	mm      matchMemo   // the last chain's hits in the table
	keys    []uint64
	matched []int
	// inTable[i] is matched[i] as the table alone gives it, before Local raises it:
	// Route records in Local only the placement's keys past it (Result.LocalKeys).
	inTable []int
	cands   []rule.Candidate
	order   []int
	addrs   []string
	ckpts   []uint64
	tiers   tierScratch
}

// NewRouter returns a router with the given rule parameters and tie-breaking seed.
func NewRouter(p rule.Params, seed uint64) *Router {
	return &Router{Picker: rule.NewPicker(p, seed), Ledger: NewLedger(), Local: NewLocal(), HomeCredit: DefaultHomeCredit}
}

// Decide picks replicas of m for chain c. tableAge is how long ago the table was last
// confirmed current; each replica's state age adds to it.
func (r *Router) Decide(m *table.Model, c *Chain, tableAge time.Duration, now time.Time) Decision {
	r.matchTiers(m, c) // tiers.go: Match, plus the slower tiers when m has any
	r.inTable = append(r.inTable[:0], r.matched...)
	longest := 0 // slices.Max panics on a model without replicas
	for _, n := range r.inTable {
		longest = max(longest, n)
	}
	r.Local.match(m, c, r.matched, longest)
	r.dropStarts(now)
	r.cands = r.cands[:0]
	evictCost := r.evictCost() // tiers.go
	for i, rep := range m.Replicas {
		age := tableAge + time.Duration(rep.StateAgeMs)*time.Millisecond
		correction, pending := r.Ledger.Sums(rep.Addr, now.Add(-age))
		off, load := r.offloaded(c, i)
		r.cands = append(r.cands, rule.Candidate{
			Queued:    queued(rep.Queued, correction),
			Pending:   pending,
			Cached:    min(c.Tokens(r.matched[i]), c.PromptTokens),
			Offloaded: off,
			LoadCost:  load,
			EvictCost: evictCost,
			Speed:     float64(rep.Speed),
			KVUsage:   rep.KVUsage,
			StateAge:  age,
			Healthy:   rep.Healthy,
			// The replica's load (table format 3; zero in older tables).
			Running:      rep.Running,
			Busy:         rep.Busy,
			MeanUncached: float64(rep.MeanUncached),
		})
	}
	r.creditSession(m, c)
	home, listed := r.creditHome(m, c)
	rd := r.Picker.Pick(c.PromptTokens, r.cands, r.order)
	if home >= 0 {
		// The credit was a preference (homes.go): the decision reports, predicts and
		// queues what the table lists there.
		r.cands[home].Cached = listed
		rd.Holdings(r.cands)
	}
	d := r.decision(m, r.pin(m, rd, r.aff.follow))
	d.Blocks = len(c.Keys)
	if len(d.Order) > 0 {
		pick := r.cands[d.Order[0]]
		d.PredictedCached = pick.Cached
		d.Uncached = rule.Uncached(c.PromptTokens, pick)
	}
	return d
}

// LeastQueued orders m's replicas by queued tokens alone (snapshot plus ledger), healthy
// first: the route for a request that cannot be parsed, which has no prefix to match.
func (r *Router) LeastQueued(m *table.Model, tableAge time.Duration, now time.Time) Decision {
	r.dropStarts(now)
	r.cands = r.cands[:0]
	for _, rep := range m.Replicas {
		age := tableAge + time.Duration(rep.StateAgeMs)*time.Millisecond
		correction, _ := r.Ledger.Sums(rep.Addr, now.Add(-age))
		r.cands = append(r.cands, rule.Candidate{Queued: queued(rep.Queued, correction), Healthy: rep.Healthy})
	}
	pin := r.aff.follow
	if replicaIndex(m, pin) < 0 {
		pin = r.aff.session // no prompt to match: the session's replica while healthy
	}
	return r.decision(m, r.pin(m, r.Picker.LeastQueued(r.cands, r.order), pin))
}

// pin puts the healthy replica addr first in rd's order (affinity.go); rd as it is when
// addr is "" or not a healthy replica of m.
func (r *Router) pin(m *table.Model, rd rule.Decision, addr string) rule.Decision {
	if i := replicaIndex(m, addr); i >= 0 {
		rd.Order = pinFirst(rd.Order, i, max(r.Picker.Params.MaxEndpoints, 1))
	}
	return rd
}

// queued is Q(r): the snapshot's queued tokens with the ledger's correction (never below
// zero: the ledger's tokens are predictions, the engine's cache may have served more).
func queued(snapshot uint64, correction float64) float64 {
	return max(float64(snapshot)+correction, 0)
}

// dropStarts forgets the ledger's starts that only a snapshot older than MaxStateAge
// could need: the rule does not use such a snapshot's queue numbers. With the guard off
// they are kept for the default's 2 s.
func (r *Router) dropStarts(now time.Time) {
	keep := r.Picker.Params.MaxStateAge
	if keep <= 0 {
		keep = rule.DefaultParams().MaxStateAge
	}
	r.Ledger.DropStarts(now.Add(-keep))
}

// decision names the ordered replicas by address.
func (r *Router) decision(m *table.Model, rd rule.Decision) Decision {
	d := Decision{Decision: rd}
	r.order = d.Order
	if r.Reuse {
		d.Addrs = r.addrs[:0]
	}
	for _, i := range d.Order {
		d.Addrs = append(d.Addrs, m.Replicas[i].Addr)
	}
	if r.Reuse {
		r.addrs = d.Addrs
	}
	return d
}
