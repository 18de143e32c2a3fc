package policy

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// SGLangConfig are the cache-aware policy's knobs.
type SGLangConfig struct {
	// CacheThreshold: route to the matched worker when matched/total chars exceeds it.
	CacheThreshold float64
	// The pool is imbalanced when max-min load > BalanceAbs and max > BalanceRel x min;
	// every request then goes to the least loaded worker.
	BalanceAbs int
	BalanceRel float64
	// EvictionInterval and MaxTreeSize (characters per worker) trim the tree.
	EvictionInterval time.Duration
	MaxTreeSize      int
}

// DefaultSGLang: the thresholds of sgl-router's CacheAwareConfig::default() (0.5, 32,
// 1.1); the tree's eviction follows the mid-2025 Python defaults (60 s, 2^24 chars per
// worker), since the Rust default of 10,000 characters would cut each worker's tree to
// less than one seed prompt every 30 s.
func DefaultSGLang() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.5, BalanceAbs: 32, BalanceRel: 1.1,
		EvictionInterval: 60 * time.Second, MaxTreeSize: 1 << 24}
}

// SGLang is SGLang's cache-aware router (sgl-router / SMG, approximate mode), from its
// description: a radix tree of raw routing text (the messages' text joined by spaces),
// one for all workers, fed only by its own routing decisions; load is the router's own
// count of in-flight requests. Per request: if the pool is imbalanced (both thresholds),
// go to the least loaded worker; else route to the tenant of the deepest match if the
// match covers more than CacheThreshold of the text, else to the least loaded worker
// (ties by requests processed, then index, as SMG). Either way, insert the text for the
// chosen worker.
type SGLang struct {
	Base
	f         Fleet
	cfg       SGLangConfig
	tree      *textTree
	load      []int
	processed []int
	text      []byte
	evict     Timer
	order     []int
	gone      []bool
	// Decisions counts requests per branch (imbalanced, cache hit, cache miss).
	Imbalanced, Hits, Misses int
}

// NewSGLang returns the cache-aware router.
func NewSGLang(f Fleet, cfg SGLangConfig) *SGLang {
	return &SGLang{f: f, cfg: cfg, tree: newTextTree(f.Len()), load: make([]int, f.Len()),
		processed: make([]int, f.Len()), gone: make([]bool, f.Len()),
		evict: Timer{Next: cfg.EvictionInterval, Every: cfg.EvictionInterval}}
}

func (p *SGLang) Name() string { return "sglang-cache-aware" }

func (p *SGLang) NextWake() time.Duration { return p.evict.At() }

func (p *SGLang) Wake(now time.Duration) {
	if p.evict.Due(now) {
		p.tree.evict(p.cfg.MaxTreeSize)
	}
}

// Membership removes workers discovery dropped from the tree (v1's remove_tenant).
func (p *SGLang) Membership(time.Duration) {
	for i := range p.f.Len() {
		if !p.f.Up(i) && !p.gone[i] {
			p.gone[i] = true
			p.tree.removeTenant(int32(i))
		} else if p.f.Up(i) {
			p.gone[i] = false
		}
	}
}

func (p *SGLang) leastLoaded() int {
	best := -1
	for i := range p.f.Len() {
		if !p.f.Up(i) {
			continue
		}
		if best < 0 || p.load[i] < p.load[best] || (p.load[i] == p.load[best] && p.processed[i] < p.processed[best]) {
			best = i
		}
	}
	return best
}

func (p *SGLang) Route(r *workload.Request, now time.Duration) Choice {
	minL, maxL, n := 0, 0, 0
	for i := range p.f.Len() {
		if !p.f.Up(i) {
			continue
		}
		if n == 0 || p.load[i] < minL {
			minL = p.load[i]
		}
		if n == 0 || p.load[i] > maxL {
			maxL = p.load[i]
		}
		n++
	}
	if n == 0 {
		return Choice{}
	}
	p.text = r.RoutingText(p.text[:0])
	var pick int
	if maxL-minL > p.cfg.BalanceAbs && float64(maxL) > p.cfg.BalanceRel*float64(minL) {
		p.Imbalanced++
		pick = p.leastLoaded()
	} else {
		matched, tenant := p.tree.match(p.text)
		rate := 0.0
		if len(p.text) > 0 {
			rate = float64(matched) / float64(len(p.text))
		}
		if rate > p.cfg.CacheThreshold && tenant >= 0 && p.f.Up(int(tenant)) {
			p.Hits++
			pick = int(tenant)
		} else {
			p.Misses++
			pick = p.leastLoaded()
		}
	}
	p.tree.insert(p.text, int32(pick), int64(now))
	p.order = append(p.order[:0], pick)
	return Choice{Order: p.order}
}

func (p *SGLang) Sent(_ *workload.Request, i int, _ time.Duration) {
	p.load[i]++
}

func (p *SGLang) Finished(_ *workload.Request, i int, _ time.Duration, _ Outcome) {
	p.load[i]--
	p.processed[i]++
}
