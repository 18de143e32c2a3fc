package policy

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// RoundRobin cycles through the replicas discovery lists.
type RoundRobin struct {
	Base
	f    Fleet
	next int
	buf  []int
}

// NewRoundRobin returns a round-robin router over f.
func NewRoundRobin(f Fleet) *RoundRobin { return &RoundRobin{f: f} }

func (p *RoundRobin) Name() string { return "round-robin" }

func (p *RoundRobin) Route(_ *workload.Request, _ time.Duration) Choice {
	n := p.f.Len()
	for k := range n {
		i := (p.next + k) % n
		if p.f.Up(i) {
			p.next = i + 1
			p.buf = append(p.buf[:0], i)
			return Choice{Order: p.buf}
		}
	}
	return Choice{}
}

// Random picks a uniformly random listed replica.
type Random struct {
	Base
	f   Fleet
	rng *Rand
	ups []int
}

// NewRandom returns a random router over f.
func NewRandom(f Fleet, seed uint64) *Random { return &Random{f: f, rng: NewRand(seed, 11)} }

func (p *Random) Name() string { return "random" }

func (p *Random) Route(_ *workload.Request, _ time.Duration) Choice {
	p.ups = up(p.f, p.ups)
	if len(p.ups) == 0 {
		return Choice{}
	}
	i := p.ups[p.rng.IntN(len(p.ups))]
	p.ups = append(p.ups[:0], i)
	return Choice{Order: p.ups}
}

// LeastQueued sends each request to the replica with the fewest queued prompt tokens:
// the engines' queued-prefill gauge, scraped every Scrape, plus the prompt tokens this
// router sent each replica since that scrape (so a burst between scrapes spreads out).
// It is kvroute's rule without the cache term, with the same view of the queues.
type LeastQueued struct {
	Base
	f       Fleet
	rng     *Rand
	scrape  Timer
	queued  []float64
	pending []float64
	order   []int
	scores  []float64
}

// NewLeastQueued returns a least-queued-tokens router that scrapes every interval.
func NewLeastQueued(f Fleet, scrape time.Duration, seed uint64) *LeastQueued {
	p := &LeastQueued{f: f, rng: NewRand(seed, 12), scrape: Timer{Every: scrape},
		queued: make([]float64, f.Len()), pending: make([]float64, f.Len()), scores: make([]float64, f.Len())}
	p.scrape.Next = time.Duration(p.rng.Uint64() % uint64(scrape))
	return p
}

func (p *LeastQueued) Name() string { return "least-queued" }

func (p *LeastQueued) NextWake() time.Duration { return p.scrape.At() }

func (p *LeastQueued) Wake(now time.Duration) {
	if !p.scrape.Due(now) {
		return
	}
	for i := range p.queued {
		if p.f.Reachable(i) {
			p.queued[i] = float64(p.f.State(i).QueuedPrefillTokens)
		}
		p.pending[i] = 0 // the scrape counts everything sent before it
	}
}

func (p *LeastQueued) Sent(r *workload.Request, i int, _ time.Duration) {
	p.pending[i] += float64(len(r.Tokens))
}

func (p *LeastQueued) Route(_ *workload.Request, _ time.Duration) Choice {
	p.order = up(p.f, p.order)
	for _, i := range p.order {
		p.scores[i] = p.queued[i] + p.pending[i]
	}
	sortByScore(p.order, p.scores, p.rng, false)
	return Choice{Order: p.order[:min(3, len(p.order))]}
}

// sortByScore orders idx by scores[idx] (descending when desc), equal scores in random
// order: a shuffle, then a stable insertion sort (fleets are small).
func sortByScore(idx []int, scores []float64, rng *Rand, desc bool) {
	for i := len(idx) - 1; i > 0; i-- {
		j := rng.IntN(i + 1)
		idx[i], idx[j] = idx[j], idx[i]
	}
	less := func(a, b int) bool {
		if desc {
			return scores[a] > scores[b]
		}
		return scores[a] < scores[b]
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && less(idx[j], idx[j-1]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}
