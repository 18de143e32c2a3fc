// Package rule is kvroute's routing decision. For a request x and each eligible replica r,
//
//	cost(r) = (Q + U + U x (N + B/2) + U x E) / speed(r)
//
// where Q is the prompt work already queued on r (uncached tokens not yet prefilled), U =
// U(r, x) the prompt tokens of x that r would prefill (prompt - tokens cached on r), and U
// x (N + B/2) what prefilling them on r costs the other requests there: N = rho/(1 - rho) x
// (Q + U)/Ubar the requests expected to arrive at r before its prefill work clears, whose
// time to first token each grows by U (an M/G/1 busy period: rho is r's busy fraction,
// Ubar its mean uncached tokens a request), and B the requests r is running, each of whose
// next tokens waits U (they share r's steps with the prefill). U x E is what the placement
// evicts: E = k/(1 - k) at r's KV usage k (capped at 0.99), at a slower tier's load cost
// where one keeps what r evicts ("Slower tiers", below). The minimum wins.
//
// Why these terms. Q + U is the request's own wait. The rest makes a placement pay for the
// waiting it causes, in the same unit, so that the rule minimises the sum, over every
// request it affects, of time to first token and end-to-end time: a later arrival's delay
// counts in both, hence with weight 1 like the request's own (all are halved), a running
// request's in its end-to-end time only, hence B/2. rho, Ubar and B are measured per
// replica by the control plane and carried in the table (format 3).
//
// What a placement evicts. The U tokens' blocks come from r's free blocks, the only room
// where a prefix outlives its requests, least recently used first; they are a share 1 - k
// of r's pool (the running requests hold k). The fuller the pool, the more recently used
// the prefixes an allocation evicts, and the likelier one of them is asked for again and
// prefilled a second time: E prices that at k/(1 - k) tokens a token, nothing on an idle
// replica, 1 at half full, 9 at 90%. Where replicas are otherwise alike (a prefix nobody
// holds, on a loaded fleet), new prefixes go where they evict least. This term's form and
// weight are measured, not derived: past capacity, where a fleet's queues and caches both
// bind, kvroute-bench over seeds found k/(1 - k) better than half or twice it
// (docs/performance.md, "What a placement evicts").
//
// docs/rule.md's worked example: 8,000-token prompts, 6,000 of them a customer's prefix.
// Its owner o (busy half the time, rho = 0.5, Ubar = 2,000, running 20, Q = 8,000: another
// customer's first request) and an idle replica c (rho = 0.5, running 10, Q = 0):
//
//	cost(o) = 8,000 + 2,000 + 2,000 x (1 x 10,000/2,000 + 10) = 40,000
//	cost(c) = 0 + 8,000 + 8,000 x (1 x 8,000/2,000 + 5) = 80,000
//
// The owner keeps the request; without the other requests' share (Q + U alone) the copy
// would have looked cheaper (8,000 against 10,000), though it prefills 6,000 tokens again
// and stalls c's ten running requests for them. On an idle fleet (rho and B near 0) the
// terms vanish and a request goes wherever it is served first, copies included; on a busy
// one extra prefill is dear and owners keep their prefixes: the rule needs no mode for
// either, and no separate replication policy: a hot prefix gains owners once its owner's
// queue outweighs what a copy costs everyone.
//
// # Past capacity
//
// N above counts the arrivals of r's own busy period: below capacity each replica drains
// apart, and work placed on r delays only what comes to r. Past capacity (PastCapacity:
// the healthy replicas busy at least 0.9 of the time on average) the rule sends each
// arrival where its cost is least, which evens the queues, and the fleet drains as one:
// work placed anywhere delays the later arrivals everywhere. So there N counts the busy
// period of the fleet's mean queue, Qbar, instead of r's own:
//
//	N = rho/(1 - rho) x (Qbar + U)/Ubar
//
// A deep owner's later arrivals are then sent elsewhere rather than counted against it,
// and it keeps its prefix unless its own wait (Q, counted whole) outweighs what a copy
// costs the fleet. With N alike for all, E is the term that can outweigh the queues, and
// past capacity running requests hold nearly every pool, where k/(1 - k) turns a few
// points of usage into tens of seconds of queue: E reads usage at most 0.9 there
// (pastCapacityUsage). On the Mooncake trace at 4 replicas, counted on each replica's own
// queue, every cold prompt went to the shortest queue, prefill reached every replica, and
// decodes slowed everywhere and held the blocks that keep prefixes; counted on the
// fleet's, kvroute caches more than every peer (docs/performance.md, "Past capacity: the
// fleet drains as one"). Counted so at every load as well, the trace's TTFT p95 and p99
// lost what its cache gained.
//
// Without load values (a table older than format 3: every MeanUncached 0) the rule falls
// back to charging a copy its share of the extra prefill, W x (1/n + u), W = U - the
// smallest U among the n candidates, u the copy target's KV-cache usage.
//
// # Where Q and the cached tokens come from
//
// Q(r) is the control plane's snapshot of r's queued prefill tokens (scraped from the
// engine, carried in the table) plus what this router sent to r after the snapshot was
// measured, minus what it sent before and saw start (its first response byte) after
// (its ledger, package route). The snapshot is 100-350 ms old and a 2,000-token prefill
// takes 150 ms, so without the second term a replica that has just finished a prefill
// still looks busy. Cached(r, x) is the longest prefix of x's block chain that the table
// lists on r, or that this proxy placed on r itself since the table last had the chance
// to learn it (route.Local).
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
// Worked example: an 8,000-token prompt whose 6,000-token prefix replica A holds in GPU
// memory, B holds only in CPU memory, and C not at all: U(A) = 2,000, U(B) = 2,000 +
// 6,000 x 0.046 = 2,276, U(C) = 8,000. A replica that holds a block in GPU and CPU memory
// counts it as GPU (Cached).
//
// Such a tier also keeps what GPU memory evicts: vLLM's OffloadingConnector writes each
// block to CPU memory as it computes it, so a block the GPU's LRU drops is loaded back,
// not prefilled again, when asked for. E is then priced at the tier's ratio: E = k/(1 -
// k) x EvictCost, EvictCost the smallest load-cost ratio of the model's tiers (0.046 for
// "CPU"). Priced as a prefill, an owner whose pool was 99% full paid 99 a token for the
// 2,048 tokens it would prefill and a replica 93% full 13 a token for 8,000, and the
// rule copied the prefix away from its owner for what it would have cost to load back
// (docs/performance.md, "What the GPU evicts into the CPU tier").
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
//     or its tables are late, so the snapshot's numbers are not used; the cached tokens
//     still are (the last table's prefix entries plus local placements). The cost is
//     (Pending(r) + U(r, x)) / speed(r), Pending everything this router sent to r that
//     has not started (its whole ledger), plus the copy charge above, and load is bounded
//     the way bounded-load consistent hashing bounds it: r is a candidate only while
//     Pending(r) + U(r, x) <= max(LoadBound x (sum of Pending + prompt) / n, prompt), so
//     no replica takes more than LoadBound (1.25) times its share of this router's work,
//     and one whole request always fits. The KV guard is off; unhealthy replicas stay
//     excluded. When the bound excludes everyone, the order is least-Pending (Fallback).
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

// Candidate is one replica as the rule weighs it for a request: what the router knows of
// its queue, cache and load (table.Replica is the replica as the table lists it).
type Candidate struct {
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
	// EvictCost is what a block r evicts from GPU memory costs when it is asked for
	// again, in prefill tokens a token: the load-cost ratio of the slower tier that keeps
	// r's blocks, or 0 (counted as 1, prefilled again) without one.
	EvictCost float64
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
	// Running is the requests r runs, prefilling or decoding: each token prefilled on r
	// delays the next token of every one of them (B in the package doc).
	Running float64
	// Busy is the share of recent time r had prefill work waiting, 0..1 (rho).
	Busy float64
	// MeanUncached is the mean prompt tokens r prefills for a request (Ubar); 0 when
	// the table carries no load values, and the rule then charges copies instead.
	MeanUncached float64
}

// Params are the guards and knobs of the rule.
type Params struct {
	// MaxKVUsage excludes replicas above this KV usage; 1, the default, excludes none:
	// excluding the replica that holds a request's prefix forces a copy elsewhere, which
	// evicts another replica's prefixes (docs/rule.md, "Guards").
	MaxKVUsage float64
	// MaxStateAge excludes replicas whose state is older than this; queue depth is the
	// term that goes wrong fastest. Ages are honest (from when the control plane built
	// the numbers), so the guard leaves room for a late table (docs/rule.md, "Guards").
	MaxStateAge time.Duration
	// TieEpsilon: costs within this fraction of the best are a near tie, broken at
	// random among the tied replicas holding the most of the prompt, so that many
	// routers holding the same snapshot do not herd onto one replica and a replica that
	// holds the prompt does not lose it to one that would prefill it on the snapshot's
	// noise.
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
	// Cost is the pick's cost in seconds of prefill, the others' share or the copy
	// charge included (0 on fallback).
	Cost float64
}

// Cost is the package doc's cost of placing a request of promptTokens tokens on r: its
// own wait, Q + U, and what it costs the other requests on r when r carries load values.
// Without them Pick charges a copy instead (chargeSpills), which depends on the other
// candidates.
// It is the cost below capacity; past capacity Pick counts the fleet's mean queue in N
// and reads KV usage at most 0.9 in E (see the package doc, "Past capacity").
func Cost(promptTokens float64, r Candidate) float64 {
	return cost(promptTokens, &r, r.Queued, maxEvictUsage)
}

// cost is Cost with backlog, the queued work whose busy period N counts arrivals over,
// and maxUsage, the KV usage E reads at most: r's own queue and maxEvictUsage below
// capacity, the fleet's mean queue and pastCapacityUsage past it.
func cost(promptTokens float64, r *Candidate, backlog, maxUsage float64) float64 {
	u := uncached(promptTokens, r)
	return (r.Queued + u + u*others(r, u, backlog) + u*evicts(r, maxUsage)) / speed(r)
}

// maxEvictUsage caps the KV usage evicts reads, so that a full replica's charge stays
// finite (99 a token).
const maxEvictUsage = 0.99

// pastCapacityUsage caps it past capacity (9 a token). There the running requests hold
// nearly every replica's pool, and between 95% and 99% E runs from 19 to 99 a token: a
// cold 8,000-token prompt's cost moved by 640,000 tokens, 45 s of prefill, on a few
// points of usage, and with N no longer weighing the queues (the fleet's mean for all)
// cold prompts piled onto whichever replica had a point more room. Measured, like E's
// form: the GPU-only workload at 30 req/s, TTFT p99 1.18x weighted-scorers' uncapped and
// 1.03x capped; the Mooncake trace at 4 replicas alike either way (docs/performance.md,
// "Past capacity: the fleet drains as one").
const pastCapacityUsage = 0.9

// evicts is E: what each token prefilled on r evicts from its prefix cache, priced in
// tokens to prefill again, k / (1 - k) at KV usage k (at most maxUsage), times what
// reading an evicted block back costs (EvictCost; see the package doc). 0 without load
// values: the copy charge prices usage there.
func evicts(r *Candidate, maxUsage float64) float64 {
	if !(r.MeanUncached > 0) {
		return 0
	}
	k := min(usage(r), maxUsage)
	return k / (1 - k) * evictCost(r)
}

// evictCost is r's EvictCost within (0, 1]: unset, NaN or out of range counts as 1, a
// block prefilled again.
func evictCost(r *Candidate) float64 {
	if c := r.EvictCost; c > 0 && c < 1 {
		return c
	}
	return 1
}

// maxBusy caps rho, so that N stays finite and counts at most 4 times the work's
// requests. Past it a replica is past capacity, where the busy period's arrivals are not
// all its own: the rule sends later arrivals where the work is shorter, so replicas
// busy 80% and 100% of the time weigh their later arrivals alike and their queues and
// caches decide. The value is measured, not derived, as E's form is: at 0.95 the rule
// spread every placement by busy fraction alone past capacity, prefill reached every
// replica and slowed the decodes of all of them, and the Mooncake trace at 4 replicas
// lost its cache (docs/performance.md, "Past capacity: the later arrivals' cap").
const maxBusy = 0.8

// others is N + B/2 for a placement of u tokens on r: how many other requests each of
// its tokens delays, a later arrival's first token counting twice a running request's
// next one (see the package doc), the later arrivals those of the busy period that
// backlog + u starts. 0 without load values.
func others(r *Candidate, u, backlog float64) float64 {
	if !(r.MeanUncached > 0) {
		return 0
	}
	rho := 0.0
	if r.Busy > 0 { // NaN compares false
		rho = min(r.Busy, maxBusy)
	}
	later := rho / (1 - rho) * (backlog + u) / r.MeanUncached
	running := 0.0
	if r.Running > 0 && !math.IsInf(r.Running, 1) {
		running = r.Running
	}
	return later + running/2
}

// PastCapacityBusy is the healthy replicas' mean busy fraction from which the fleet is
// past capacity: every replica has prefill waiting almost all the time. There the rule
// counts the fleet's mean queue in N (see the package doc, "Past capacity") and
// shared/route credits homes. Measured, not derived: docs/performance.md, "Homes" and
// "Past capacity: the fleet drains as one".
const PastCapacityBusy = 0.9

// PastCapacity reports whether replicas' healthy ones are busy PastCapacityBusy of the
// time on average.
func PastCapacity(replicas []Candidate) bool { return MeanBusy(replicas) >= PastCapacityBusy }

// MeanBusy is the healthy replicas' mean busy fraction: an unhealthy replica (whose
// numbers are stale) does not count, a missing or NaN value counts as idle and one above
// 1 as 1; 0 when none is healthy or the table carries no load.
func MeanBusy(replicas []Candidate) float64 {
	var sum float64
	n := 0
	for i := range replicas {
		if r := &replicas[i]; r.Healthy {
			if r.Busy > 0 { // NaN compares false
				sum += min(r.Busy, 1)
			}
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// hasLoad reports whether any replica carries load values (a format-3 table).
func hasLoad(replicas []Candidate) bool {
	for i := range replicas {
		if replicas[i].MeanUncached > 0 {
			return true
		}
	}
	return false
}

// Uncached is U(r, x): the prompt tokens r must prefill, plus the prefill-token
// equivalent of loading those it holds in a slower tier.
func Uncached(promptTokens float64, r Candidate) float64 { return uncached(promptTokens, &r) }

// uncached is Uncached through a pointer: a Candidate is too large for Go to keep in
// registers, and a copy per loop over the replicas shows in BenchmarkPick22Replicas.
func uncached(promptTokens float64, r *Candidate) float64 {
	rest := max(promptTokens-r.Cached, 0)
	off := min(max(r.Offloaded, 0), rest)
	load := 0.0
	if off > 0 && r.LoadCost > 0 {
		load = min(r.LoadCost*off/r.Offloaded, off) // never dearer than prefilling them
	}
	return rest - off + load
}

// Eligible reports whether r passes the guards.
func Eligible(r Candidate, p Params) bool { return eligible(&r, &p) }

func eligible(r *Candidate, p *Params) bool {
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
	u    float64 // U(r, x), for the copy charge
}

// NewPicker returns a Picker whose near-tie breaking is driven by seed (fixed in tests,
// random in production).
func NewPicker(p Params, seed uint64) *Picker {
	return &Picker{Params: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Pick orders replicas for a request of promptTokens tokens. order is reused for the
// result when it has capacity.
func (pk *Picker) Pick(promptTokens float64, replicas []Candidate, order []int) Decision {
	p := pk.Params
	max := p.MaxEndpoints
	if max <= 0 {
		max = 3
	}
	d := Decision{Order: order[:0]}
	switch pk.regime(replicas) {
	case stale:
		return pk.pickStale(promptTokens, replicas, d, max)
	case blind:
		return pk.LeastQueued(replicas, order)
	}
	pk.scored = pk.scored[:0]
	queued := 0.0
	for i := range replicas {
		if r := &replicas[i]; eligible(r, &p) {
			pk.scored = append(pk.scored, scored{idx: i, u: uncached(promptTokens, r)})
			queued += r.Queued
		}
	}
	if len(pk.scored) == 0 {
		return pk.LeastQueued(replicas, order)
	}
	// Below capacity N counts each replica's own queue; past it, the fleet's mean.
	past, maxUsage, mean := PastCapacity(replicas), maxEvictUsage, queued/float64(len(pk.scored))
	if past {
		maxUsage = pastCapacityUsage
	}
	for k := range pk.scored {
		s := &pk.scored[k]
		r := &replicas[s.idx]
		backlog := r.Queued
		if past {
			backlog = mean
		}
		s.cost = cost(promptTokens, r, backlog, maxUsage)
	}
	if !hasLoad(replicas) {
		pk.chargeSpills(replicas, len(pk.scored))
	}
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
func (pk *Picker) regime(replicas []Candidate) regime {
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
func (pk *Picker) pickStale(promptTokens float64, replicas []Candidate, d Decision, max int) Decision {
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

// chargeSpills adds to each scored candidate what its copy costs the fleet when the table
// carries no load values (and in the stale regime, whose load values are as old as its
// queues): W(r) x (1/n + u(r)), W(r) = U(r) - the smallest U among the candidates, n the
// replicas that share the work, u(r) r's KV-cache usage.
func (pk *Picker) chargeSpills(replicas []Candidate, n int) {
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
func usage(r *Candidate) float64 {
	if !(r.KVUsage > 0) {
		return 0
	}
	return min(r.KVUsage, 1)
}

// speed is r's prefill rate, 1 when unset.
func speed(r *Candidate) float64 {
	if r.Speed <= 0 {
		return 1
	}
	return r.Speed
}

// finish sorts the scored candidates, breaks near ties at random and fills the order.
func (pk *Picker) finish(replicas []Candidate, d Decision, max int) Decision {
	p := pk.Params
	sortByCost(pk.scored)

	// Near ties: every candidate within TieEpsilon of the best is equally good; put a
	// random one of those holding the most of the prompt first.
	best := pk.scored[0].cost
	ties := 1
	for ties < len(pk.scored) && pk.scored[ties].cost <= best+p.TieEpsilon*best {
		ties++
	}
	if ties > 1 {
		// A near tie between a replica that has the prompt and one that would prefill
		// it is the snapshot's noise.
		most := 0.0
		for _, s := range pk.scored[:ties] {
			most = math.Max(most, replicas[s.idx].Cached)
		}
		k := 0
		for i := range ties {
			if replicas[pk.scored[i].idx].Cached == most {
				pk.scored[k], pk.scored[i] = pk.scored[i], pk.scored[k]
				k++
			}
		}
		j := pk.rng.IntN(k)
		pk.scored[0], pk.scored[j] = pk.scored[j], pk.scored[0]
	}

	for _, s := range pk.scored {
		if len(d.Order) == max {
			break
		}
		d.Order = append(d.Order, s.idx)
	}
	d.Cost = pk.scored[0].cost
	d.Holdings(replicas)
	return d
}

// Holdings sets d's BestCached, the longest cached prefix among replicas, and Spill,
// whether its pick holds less: what Pick and LeastQueued report, and what a caller that
// raised a candidate's Cached for the choice alone (shared/route's homes) reports once
// it has put the listed value back.
func (d *Decision) Holdings(replicas []Candidate) {
	d.BestCached = 0
	for i := range replicas {
		d.BestCached = math.Max(d.BestCached, replicas[i].Cached)
	}
	d.Spill = len(d.Order) > 0 && replicas[d.Order[0]].Cached < d.BestCached
}

// sortByCost sorts candidates by cost, stably, as slices.SortStableFunc with cmp.Compare
// does. A model's few replicas are sorted in place by insertion, without a call per
// comparison, which costs the wasm guest most of Pick (BenchmarkPick22Replicas).
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
func (pk *Picker) LeastQueued(replicas []Candidate, order []int) Decision {
	max := pk.Params.MaxEndpoints
	if max <= 0 {
		max = 3
	}
	d := Decision{Order: order[:0]}
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
	d.Holdings(replicas)
	return d
}
