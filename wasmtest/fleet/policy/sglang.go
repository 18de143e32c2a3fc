package policy

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// SGLangConfig are the cache-aware policy's knobs.
type SGLangConfig struct {
	// CacheThreshold: a match covering more than this share of the text's characters
	// is a cache hit.
	CacheThreshold float64
	// The spill gate: a hit's chosen holder whose in-flight load exceeds both
	// BalanceRel x the mean load of the Up workers and that mean + BalanceAbs gives
	// the request to the least loaded worker instead.
	BalanceAbs int
	BalanceRel float64
	// EvictionInterval and MaxTreeSize (characters in the whole tree, every worker's
	// summed) trim the tree.
	EvictionInterval time.Duration
	MaxTreeSize      int
	// Seed seeds the draw among equally loaded holders.
	Seed uint64
}

// DefaultSGLang is what smg's Rust CLI runs with (model_gateway/src/main.rs@f8daa88,
// the cache_aware arguments): threshold 0.3, spill gate 64 and 1.5, eviction every
// 120 s down to 2^26 characters for the model's tree. The Python launcher has the
// same but for eviction every 60 s; CacheAwareConfig::default() (0.5, 32, 1.1, 30 s,
// 10,000) is used only when the policy is built in code.
func DefaultSGLang() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5,
		EvictionInterval: 120 * time.Second, MaxTreeSize: 1 << 26}
}

// SGLang is SGLang's cache-aware router in its approximate (HTTP) mode as smg
// (smg-project/smg, formerly sgl-router) has it at f8daa88, 2026-08-22
// (model_gateway/src/policies/cache_aware.rs@f8daa88, select_worker and
// select_worker_with_text): a radix tree of raw routing text (the messages' text
// joined by spaces), one for all workers, fed only by its own routing decisions;
// load is the router's own count of in-flight requests. Per request, over the Up
// workers: if the text's match covers more than CacheThreshold of it, the least
// loaded of the matched node's tenants (at most 8 of them), unless the spill gate
// sends the request to the least loaded worker; else the least loaded worker (ties
// by requests processed, then index). Either way the text is inserted for the
// chosen worker, in the same descent. There is no fleet-wide imbalance switch: smg
// dropped it (#2161, e19055424, 2026-08-16) and its KV-usage triggers are off by
// default.
type SGLang struct {
	Base
	f         Fleet
	cfg       SGLangConfig
	tree      *textTree
	rng       *Rand
	load      []int // in flight, from Sent to Finished (Worker::load)
	processed []int // selections (Worker::increment_processed)
	text      []byte
	evict     Timer
	order     []int
	gone      []bool
	held      []bool  // scratch: a match's holders
	hold      []int32 // scratch
	ties      []int   // scratch
	// Decisions counts requests per branch: cache hits, those of them the gate
	// spilled to the least loaded worker, hits with no Up holder, and misses.
	Hits, Spills, Fallbacks, Misses int
}

// NewSGLang returns the cache-aware router.
func NewSGLang(f Fleet, cfg SGLangConfig) *SGLang {
	p := &SGLang{f: f, cfg: cfg, tree: newTextTree(), rng: NewRand(cfg.Seed, 0x5c1a),
		load: make([]int, f.Len()), processed: make([]int, f.Len()), gone: make([]bool, f.Len()),
		held: make([]bool, f.Len()), evict: Timer{Next: cfg.EvictionInterval, Every: cfg.EvictionInterval}}
	for i := range f.Len() {
		p.gone[i] = !f.Up(i)
	}
	p.tree.register(p.upCount())
	return p
}

func (p *SGLang) Name() string { return "sglang-cache-aware" }

// NextWake is the eviction task's next run: a PeriodicTask sleeps the interval
// before each run (model_gateway/src/policies/utils.rs@f8daa88).
func (p *SGLang) NextWake() time.Duration { return p.evict.At() }

func (p *SGLang) Wake(now time.Duration) {
	if p.evict.Due(now) {
		p.tree.evict(p.cfg.MaxTreeSize)
	}
}

// Membership purges a worker discovery dropped from the tree. Upstream purges a
// tenant when the worker leaves the registry (remove_worker_by_url, then
// init_workers over the rest: cache_aware.rs@f8daa88 and
// workflow/steps/local/remove_from_policy_registry.rs, update_remaining_policies.rs),
// not when its health check fails. Here Up turns false only when discovery drops a
// killed replica, which is that removal; a restarted replica stays listed and keeps
// its tenant, as upstream. A worker listed again is registered again (init_workers).
func (p *SGLang) Membership(time.Duration) {
	for i := range p.f.Len() {
		switch up := p.f.Up(i); {
		case !up && !p.gone[i]:
			p.gone[i] = true
			p.tree.removeTenant(int32(i))
			p.tree.register(p.upCount())
		case up && p.gone[i]:
			p.gone[i] = false
			p.tree.register(p.upCount())
		}
	}
}

func (p *SGLang) upCount() int {
	n := 0
	for i := range p.f.Len() {
		if p.f.Up(i) {
			n++
		}
	}
	return n
}

func (p *SGLang) Route(r *workload.Request, _ time.Duration) Choice {
	// select_worker's single gather over the eligible workers: their mean load, and
	// the least loaded by (load, processed, index) (#1714, 823cbbf98).
	n, sum, least := 0, 0, -1
	for i := range p.f.Len() {
		if !p.f.Up(i) {
			continue
		}
		n++
		sum += p.load[i]
		if least < 0 || p.load[i] < p.load[least] || (p.load[i] == p.load[least] && p.processed[i] < p.processed[least]) {
			least = i
		}
	}
	if n == 0 {
		return Choice{}
	}
	mean := float64(sum) / float64(n)
	p.text = r.RoutingText(p.text[:0])
	m := p.tree.match(p.text)
	pick := least
	// The hit test is in f32, as upstream's match_rate and cache_threshold.
	if len(p.text) > 0 && float32(m.matched)/float32(len(p.text)) > float32(p.cfg.CacheThreshold) {
		p.Hits++
		if pick = p.holder(m.node, mean, least); pick < 0 {
			// No Up holder: the first Up worker, with neither insert nor count
			// (select_worker_with_text's fallback).
			p.Fallbacks++
			for i := range p.f.Len() {
				if p.f.Up(i) {
					pick = i
					break
				}
			}
			p.order = append(p.order[:0], pick)
			return Choice{Order: p.order}
		}
	} else {
		p.Misses++
	}
	p.tree.insert(m, p.text, int32(pick))
	p.processed[pick]++
	p.order = append(p.order[:0], pick)
	return Choice{Order: p.order}
}

// holder picks among the Up tenants a match on n reports: the least loaded, at
// random among equals (select_matched_candidate and argmax_with_random_ties,
// cache_aware.rs@f8daa88, with overlap decay and temperature off as by default);
// then the spill gate (gate_selected_candidate) hands a holder loaded above both
// BalanceRel x mean and mean + BalanceAbs over to the least loaded worker. -1: no Up
// holder.
func (p *SGLang) holder(n *tnode, mean float64, least int) int {
	p.hold = p.tree.holders(n, p.hold[:0])
	for _, t := range p.hold {
		p.held[t] = true
	}
	p.ties = p.ties[:0]
	for i := range p.f.Len() { // in index order, as upstream's healthy indices
		if !p.held[i] || !p.f.Up(i) {
			continue
		}
		if len(p.ties) == 0 || p.load[i] < p.load[p.ties[0]] {
			p.ties = append(p.ties[:0], i)
		} else if p.load[i] == p.load[p.ties[0]] {
			p.ties = append(p.ties, i)
		}
	}
	for _, t := range p.hold {
		p.held[t] = false
	}
	if len(p.ties) == 0 {
		return -1
	}
	pick := p.ties[0]
	if len(p.ties) > 1 {
		pick = p.ties[p.rng.IntN(len(p.ties))]
	}
	l := float64(p.load[pick])
	if l > mean*float64(float32(p.cfg.BalanceRel)) && l > mean+float64(p.cfg.BalanceAbs) {
		p.Spills++
		return least
	}
	return pick
}

func (p *SGLang) Sent(_ *workload.Request, i int, _ time.Duration) {
	p.load[i]++
}

func (p *SGLang) Finished(_ *workload.Request, i int, _ time.Duration, _ Outcome) {
	p.load[i]--
}
