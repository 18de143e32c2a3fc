// Package rule is kvroute's routing decision: for a request x and each eligible replica r,
//
//	cost(r) = (Q(r) + U(r, x) + W(r, x) x (1/n + u(r))) / speed(r)
//
// where Q(r) is the prompt work already queued on r (uncached tokens not yet prefilled),
// U(r, x) = prompt tokens of x - tokens of x already cached on r, W(r, x) = U(r, x) -
// the smallest U among the n candidates: the tokens r would prefill again that another
// candidate already holds (0 for the replicas holding the longest prefix), and u(r) r's
// KV-cache usage, 0..1. The minimum wins.
//
// docs/rule.md's worked example: 8,000-token prompts, 6,000 of them a shared prefix,
// 22 replicas. The owner of the prefix costs Q(owner) + 2,000, a cold replica Q(cold) + 8,000
// + 6,000 x (1/22 + u), so the owner keeps the request while its extra queue is under the 6,000
// tokens (428 ms of prefill) it saves plus 273 (and 6,000 x u), and the first request that finds it
// deeper spills to the coldest replica, which becomes a second owner. Hot prefixes gain
// owners in proportion to their load without a separate replication policy; when nothing
// is cached anywhere W is 0 and the rule is plain least-queued-tokens.
//
// # What a spill costs
//
// Q + U is what the request itself waits for. A spill also costs the fleet: the W tokens
// it prefills again are work that would not exist had the request gone to the owner, and
// the requests that queue behind it pay for it. Spread over the n candidates, that work
// raises the mean queue by W/n, and the rule charges the spill that share. Without it the
// rule spilled whenever the owner's queue was deeper than the saving, even when the
// request gained a few milliseconds and the fleet paid a whole prefix for them.
//
// Worked example (SGLang's generated-shared-prefix benchmark): 4 replicas, prompts of
// 2,176 tokens whose 2,048-token system prompt one replica holds. The owner is prefilling
// another group's first request (Q = 2,176), another replica is idle. Without the charge
// the owner costs 2,176 + 128 = 2,304 tokens and the idle replica 2,176: the request
// spilled, gaining 128 tokens (9 ms) for 2,048 tokens (146 ms) of prefill the fleet did
// again. With it the idle replica costs 2,176 + 2,048/4 = 2,688 and the owner keeps the
// request; it spills once the owner's queue is 2,048 x (1 + 1/4) = 2,560 tokens deeper
// than the idle replica's. At 22 replicas the charge moves the worked example's spill point by 5%
// (6,000 to 6,273 tokens).
//
// The copy also takes W tokens of the spill target's cache. An engine keeps cached
// prefixes in the blocks no running request holds and evicts the least recently used
// of them for new ones (vLLM's free-block queue); the fraction of its cache that running
// requests hold, u (vLLM's kv_cache_usage_perc, carried in the table as KVUsage), is how
// little room is left for cached prefixes, so the higher u, the more recently used, and
// likelier to be reused, the prefixes the copy evicts: each of them a miss later, and
// under load a spill of its own. The rule charges the spill W x u for that, so the
// whole charge is W x (1/n + u). With W/n alone the fleet simulator's CPU-tier fleet
// (14 replicas near GPU memory capacity) fell from 33% cached to 7%, and its median
// TTFT from 0.59 s to 29 s, with 10% more load, caches thrashing; with W x u it held
// there (35%, 0.59 s), and with the KV guard off too (MaxKVUsage) up to 30% more (44%,
// 0.52 s), tipping over between 30% and 40% more (wasmtest/fleet/README.md). The other
// workloads did not move, but for burst, whose fresh prefixes spill less (18% -> 41%
// cached, TTFT p50 +10 ms).
//
// # Where Q and the cached tokens come from
//
// Q(r) is the control plane's snapshot of r's queued prefill tokens (scraped from the
// engine, carried in the table) plus what this router sent to r after the snapshot was
// measured, minus what it sent before and saw start (its first response byte) after
// (its ledger, package route: an entry per request from the decision until the first
// response byte, then its start while a snapshot older than it may be in use). The
// snapshot is 100-350 ms old and a 2,000-token prefill takes 150 ms, so without the
// second term a replica that has just finished a prefill still looks busy. Cached(r, x) is the longest prefix of x's block chain that the
// table lists on r, or that this proxy placed on r itself since the table last had the
// chance to learn it (route.Local: the proxy's own recent placements, shared by its
// worker VMs).
//
// # Slower tiers
//
// An engine that offloads KV blocks to a slower medium (vLLM's OffloadingConnector to CPU
// memory, LMCache) can reuse them after loading them back, which costs less than
// prefilling them but not nothing. So U counts such a hit at its load cost:
//
//	U(r, x) = (prompt - Cached(r) - Offloaded(r)) + LoadCost(r)
//
// where Offloaded(r) is the tokens of x past Cached(r) that r holds only in a slower
// tier (contiguous, as the engine loads them) and LoadCost(r) is those tokens weighted by
// each tier's load-cost ratio (api.Guards.OffloadCost; the default for vLLM's "CPU" is
// 0.046: 3.28 us to load a token over PCIe against 71.3 us to prefill it, docs/rule.md).
// Worked example, with the numbers of docs/rule.md: an 8,000-token prompt whose 6,000-token
// prefix replica A holds in GPU memory, B holds only in CPU memory, and C not at all.
// U(A) = 2,000; U(B) = 2,000 + 6,000 x 0.046 = 2,276; U(C) = 8,000, so W(B) = 276 and
// W(C) = 6,000. With queues Q(A) = 1,000, Q(B) = 0, Q(C) = 0 the costs are 3,000, 2,276 +
// 276/3 = 2,368 and 8,000 + 6,000/3 = 10,000 tokens: B wins, since loading the prefix
// (276 token-equivalents, 20 ms) costs less than A's extra queue. Before tiers counted, B
// and C tied and A kept the request while its queue was up to 8,000 tokens deeper; now B,
// not a cold replica, takes A's spill while A's queue is more than 368 tokens deeper than
// B's, and a cold replica only when B is 7,632 tokens deeper still. A replica that holds a
// block in GPU and CPU memory counts it as GPU (Cached).
//
// # What the rule does at each age
//
// A replica's state age is how old its numbers are: the table's age (since the control
// plane built it) plus the replica's own scrape age. Trust in queue depth falls fast with
// age; cache contents change slowly. The youngest healthy replica's age picks the regime:
//
//   - Fresh, age <= MaxStateAge (2 s): the cost above with Q = snapshot + ledger; replicas
//     older than MaxStateAge or above MaxKVUsage are excluded. When every replica is
//     excluded this way (all KV-full), the order is least-queued (Fallback).
//   - Stale, MaxStateAge < age <= MaxCacheAge (10 min): the control plane is unreachable
//     or its tables are late, so the snapshot's queue numbers are not used; the cached
//     tokens still are (the last table's prefix entries plus local placements). The cost
//     is (Pending(r) + U(r, x)) / speed(r), where Pending is everything this router sent
//     to r that has not started (its whole ledger), and load is bounded the way
//     bounded-load consistent hashing bounds it: r is a candidate only while
//     Pending(r) + U(r, x) <= max(LoadBound x (sum of Pending + prompt) / n, prompt),
//     so no replica takes more than LoadBound (1.25) times its share of this router's
//     work, and one whole request always fits. The KV guard is off (KV usage is as old
//     as the queue numbers); unhealthy replicas stay excluded. With one router Pending
//     is the whole queue this fleet gets, and the stale rule decides as the fresh one
//     does; with K routers each bounds its own share. When the bound excludes everyone,
//     the order is least-Pending (Fallback).
//   - Blind, age > MaxCacheAge: caches have turned over; least-queued over every
//     replica, healthy first (Fallback), as before any state arrived.
package rule

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Replica is one candidate as the router sees it.
type Replica struct {
	// Queued is Q(r): uncached prompt tokens waiting for prefill on r, from the control
	// plane's last snapshot plus what this router sent since.
	Queued float64
	// Cached is the number of this request's prompt tokens already cached on r.
	Cached float64
	// Offloaded is the prompt tokens past Cached that r holds only in a slower KV tier
	// (CPU memory, disk), which it loads instead of prefilling them.
	Offloaded float64
	// LoadCost is what loading Offloaded costs, in prefill-token equivalents: Offloaded
	// weighted by each tier's load-cost ratio (see the package doc, "Slower tiers").
	LoadCost float64
	// Speed is r's prefill rate in tokens per second; 0 means "same as the others" (1).
	Speed float64
	// KVUsage is r's KV-cache usage, 0..1.
	KVUsage float64
	// Pending is everything this router sent to r that has not started (its whole
	// ledger for r): the load term once the snapshot is too old to use.
	Pending float64
	// StateAge is how old the router's knowledge of r is.
	StateAge time.Duration
	// Healthy is false for replicas the control plane saw failing.
	Healthy bool
}

// Params are the guards and knobs of the rule.
type Params struct {
	// MaxKVUsage excludes replicas above this KV usage; 1, the default, excludes none.
	// Excluding the replica that holds a request's prefix forces a copy elsewhere, which
	// evicts another replica's prefixes: at 0.95 the fleet simulator's CPU-tier fleet fell
	// into thrashing at 24 requests/s (6.4% cached, TTFT median 65 s, 2,493 preemptions)
	// where without the guard it held (39.9%, 0.59 s, none), and the oracle at 13
	// replicas kept 26.6% instead of 73.1%. A busy cache is priced instead: the spill
	// charge's W x u (docs/rule.md).
	MaxKVUsage float64
	// MaxStateAge excludes replicas whose state is older than this; queue depth is the
	// term that goes wrong fastest. A few hundred milliseconds would do, but ages
	// here are honest (measured from when the control plane built the numbers), normal
	// operation runs at 100-350 ms, and when every replica is excluded the fallback is
	// cache-blind: in the fleet simulation 500 ms turned a 500 ms table delay into
	// least-queued routing (23% cached), 2 s kept affinity (wasmtest/fleet/README.md).
	MaxStateAge time.Duration
	// TieEpsilon: costs within this fraction of the best are a near tie, broken at
	// random so that many routers holding the same snapshot do not herd onto one replica.
	TieEpsilon float64
	// MaxEndpoints is the length of the result: the pick plus retry targets.
	MaxEndpoints int
	// MaxCacheAge ends the stale regime: beyond it the cached tokens are not trusted
	// either and the order is least-queued. 0 means no stale regime (fresh, then blind).
	MaxCacheAge time.Duration
	// LoadBound is the stale regime's bound on a replica's share of this router's
	// pending work, as a multiple of the mean (bounded-load consistent hashing's c);
	// 0 means 1.25.
	LoadBound float64
}

// DefaultParams are the values docs/rule.md gives, and the stale regime's (10 min, 1.25).
func DefaultParams() Params {
	return Params{MaxKVUsage: 1, MaxStateAge: 2 * time.Second, TieEpsilon: 0.02, MaxEndpoints: 3,
		MaxCacheAge: 10 * time.Minute, LoadBound: 1.25}
}

// Decision is the outcome of Pick.
type Decision struct {
	// Order lists replica indices, best first, at most MaxEndpoints long.
	Order []int
	// Fallback is true when no replica passed the guards and Order is least-queued
	// over every replica (healthy ones first): a request never fails for lack of state.
	Fallback bool
	// Stale is true when the state was too old for queue numbers and the stale regime
	// decided (see the package doc).
	Stale bool
	// Spill is true when the pick is not a replica holding the longest cached prefix
	// (the owner was too deep, or excluded by a guard).
	Spill bool
	// BestCached is the longest cached prefix, in tokens, among all replicas.
	BestCached float64
	// Cost is the pick's cost in seconds of prefill, its spill charge included (0 on
	// fallback).
	Cost float64
}

// Cost is (Q + U) / speed for a prompt of promptTokens tokens: what the request waits for
// on r. Pick adds a spill's charge, W x (1/n + u), which depends on the other candidates.
func Cost(promptTokens float64, r Replica) float64 {
	return (r.Queued + uncached(promptTokens, &r)) / speed(&r)
}

// Uncached is U(r, x): the prompt tokens r must prefill, plus the prefill-token
// equivalent of loading those it holds in a slower tier.
func Uncached(promptTokens float64, r Replica) float64 { return uncached(promptTokens, &r) }

// uncached is Uncached through a pointer. A Replica is nine fields: too many for Go to
// keep in registers, so each copy of one is a copy in memory, which the wasm guest paid
// for in every loop over the replicas (BenchmarkPick22Replicas).
func uncached(promptTokens float64, r *Replica) float64 {
	rest := max(promptTokens-r.Cached, 0)
	off := min(max(r.Offloaded, 0), rest)
	load := 0.0
	if off > 0 && r.LoadCost > 0 {
		load = min(r.LoadCost*off/r.Offloaded, off) // never dearer than prefilling them
	}
	return rest - off + load
}

// Eligible reports whether r passes the guards.
func Eligible(r Replica, p Params) bool { return eligible(&r, &p) }

func eligible(r *Replica, p *Params) bool {
	if !r.Healthy {
		return false
	}
	if p.MaxKVUsage > 0 && r.KVUsage > p.MaxKVUsage {
		return false
	}
	if p.MaxStateAge > 0 && r.StateAge > p.MaxStateAge {
		return false
	}
	return true
}

// Picker applies the rule. It owns a scratch buffer and a random source, so it is not
// safe for concurrent use; each proxy-wasm VM (one thread) holds its own.
type Picker struct {
	Params Params
	rng    *rand.Rand
	scored []scored
}

type scored struct {
	idx  int
	cost float64
	u    float64 // U(r, x), for the spill charge
}

// NewPicker returns a Picker whose near-tie breaking is driven by seed (fixed in tests,
// random in production).
func NewPicker(p Params, seed uint64) *Picker {
	return &Picker{Params: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Pick orders replicas for a request of promptTokens tokens. order is reused for the
// result when it has capacity.
func (pk *Picker) Pick(promptTokens float64, replicas []Replica, order []int) Decision {
	p := pk.Params
	max := p.MaxEndpoints
	if max <= 0 {
		max = 3
	}
	d := Decision{Order: order[:0]}
	for i := range replicas {
		d.BestCached = math.Max(d.BestCached, replicas[i].Cached)
	}

	switch pk.regime(replicas) {
	case stale:
		return pk.pickStale(promptTokens, replicas, d, max)
	case blind:
		return pk.LeastQueued(replicas, order)
	}
	pk.scored = pk.scored[:0]
	for i := range replicas {
		if r := &replicas[i]; eligible(r, &p) {
			u := uncached(promptTokens, r)
			pk.scored = append(pk.scored, scored{i, (r.Queued + u) / speed(r), u})
		}
	}
	if len(pk.scored) == 0 {
		return pk.LeastQueued(replicas, order)
	}
	pk.chargeSpills(replicas, len(pk.scored))
	return pk.finish(replicas, d, max)
}

type regime uint8

const (
	fresh regime = iota
	stale
	blind
)

// regime is the age regime of a decision: the youngest healthy replica's state age
// against MaxStateAge and MaxCacheAge (see the package doc).
func (pk *Picker) regime(replicas []Replica) regime {
	p := pk.Params
	if p.MaxStateAge <= 0 {
		return fresh
	}
	youngest := time.Duration(math.MaxInt64)
	for i := range replicas {
		if r := &replicas[i]; r.Healthy {
			youngest = min(youngest, r.StateAge)
		}
	}
	switch {
	case youngest <= p.MaxStateAge:
		return fresh
	case youngest <= p.MaxCacheAge:
		return stale
	}
	return blind
}

// pickStale is the stale regime: the cost with the router's own pending work for Q,
// under a bounded-load cap (see the package doc).
func (pk *Picker) pickStale(promptTokens float64, replicas []Replica, d Decision, max int) Decision {
	p := pk.Params
	c := p.LoadBound
	if c <= 0 {
		c = 1.25
	}
	var total float64
	n := 0
	for i := range replicas {
		if r := &replicas[i]; r.Healthy && r.StateAge <= p.MaxCacheAge {
			total += r.Pending
			n++
		}
	}
	bound := math.Max(c*(total+promptTokens)/float64(n), promptTokens)
	pk.scored = pk.scored[:0]
	for i := range replicas {
		r := &replicas[i]
		if !r.Healthy || r.StateAge > p.MaxCacheAge {
			continue
		}
		u := uncached(promptTokens, r)
		load := r.Pending + u
		if load > bound {
			continue
		}
		pk.scored = append(pk.scored, scored{i, load / speed(r), u})
	}
	if len(pk.scored) == 0 {
		// Everyone is over the bound: the least pending first.
		for i := range replicas {
			if r := &replicas[i]; r.Healthy && r.StateAge <= p.MaxCacheAge {
				pk.scored = append(pk.scored, scored{i, r.Pending, 0})
			}
		}
		d.Fallback = true
	} else {
		pk.chargeSpills(replicas, n)
	}
	d.Stale = true
	d = pk.finish(replicas, d, max)
	if d.Fallback {
		d.Cost = 0
	}
	return d
}

// chargeSpills adds to each scored candidate what its spill costs the fleet: W(r) x
// (1/n + u(r)), W(r) = U(r) - the smallest U among the candidates, n the replicas that
// share the work, u(r) r's KV-cache usage (see the package doc, "What a spill costs").
func (pk *Picker) chargeSpills(replicas []Replica, n int) {
	if len(pk.scored) < 2 || n < 1 {
		return
	}
	least := pk.scored[0].u
	for _, s := range pk.scored[1:] {
		least = math.Min(least, s.u)
	}
	for k := range pk.scored {
		s := &pk.scored[k]
		r := &replicas[s.idx]
		s.cost += (s.u - least) * (1/float64(n) + usage(r)) / speed(r)
	}
}

// usage is r's KV-cache usage within 0..1 (a torn or hostile table's value counts as
// the nearest bound; NaN as 0).
func usage(r *Replica) float64 {
	if !(r.KVUsage > 0) {
		return 0
	}
	return min(r.KVUsage, 1)
}

// speed is r's prefill rate, 1 when unset.
func speed(r *Replica) float64 {
	if r.Speed <= 0 {
		return 1
	}
	return r.Speed
}

// finish sorts the scored candidates, breaks near ties at random and fills the order.
func (pk *Picker) finish(replicas []Replica, d Decision, max int) Decision {
	p := pk.Params
	sortByCost(pk.scored)

	// Near ties: every candidate within TieEpsilon of the best is equally good; put a
	// random one of them first.
	best := pk.scored[0].cost
	ties := 1
	for ties < len(pk.scored) && pk.scored[ties].cost <= best+p.TieEpsilon*best {
		ties++
	}
	if ties > 1 {
		j := pk.rng.IntN(ties)
		pk.scored[0], pk.scored[j] = pk.scored[j], pk.scored[0]
	}

	for _, s := range pk.scored {
		if len(d.Order) == max {
			break
		}
		d.Order = append(d.Order, s.idx)
	}
	pick := &replicas[d.Order[0]]
	d.Cost = pk.scored[0].cost
	d.Spill = pick.Cached < d.BestCached
	return d
}

// sortByCost sorts candidates by cost, stably, as slices.SortStableFunc with cmp.Compare
// does. A model's few replicas are sorted in place by insertion, without a call per
// comparison: in the wasm guest the comparator's calls were most of Pick's 22 us for 22
// replicas (BenchmarkPick22Replicas).
func sortByCost(s []scored) {
	if len(s) > 32 {
		slices.SortStableFunc(s, func(a, b scored) int { return cmp.Compare(a.cost, b.cost) })
		return
	}
	for i := 1; i < len(s); i++ {
		x := s[i]
		j := i
		for ; j > 0 && cmp.Compare(s[j-1].cost, x.cost) > 0; j-- {
			s[j] = s[j-1]
		}
		s[j] = x
	}
}

// LeastQueued orders replicas by queued tokens alone, healthy replicas first, ignoring
// the KV and staleness guards: with no trustworthy state, or no prefix to match, the
// least-queued replica is the safest. Pick falls back to it when every replica is
// excluded; the result is marked Fallback.
func (pk *Picker) LeastQueued(replicas []Replica, order []int) Decision {
	max := pk.Params.MaxEndpoints
	if max <= 0 {
		max = 3
	}
	d := Decision{Order: order[:0]}
	for i := range replicas {
		d.BestCached = math.Max(d.BestCached, replicas[i].Cached)
	}
	d.Fallback = true
	pk.scored = pk.scored[:0]
	for i := range replicas {
		r := &replicas[i]
		q := r.Queued
		if !r.Healthy {
			q = math.Inf(1)
		}
		pk.scored = append(pk.scored, scored{i, q, 0})
	}
	slices.SortStableFunc(pk.scored, func(x, y scored) int {
		if c := cmp.Compare(x.cost, y.cost); c != 0 {
			return c
		}
		return cmp.Compare(replicas[x.idx].Queued, replicas[y.idx].Queued)
	})
	for _, s := range pk.scored {
		if len(d.Order) == max {
			break
		}
		d.Order = append(d.Order, s.idx)
	}
	if len(d.Order) > 0 {
		d.Spill = replicas[d.Order[0]].Cached < d.BestCached
	}
	return d
}
