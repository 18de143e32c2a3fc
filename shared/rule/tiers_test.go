package rule

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offloaded is a replica holding off prompt tokens only in a slower tier at ratio.
func offloaded(queued, cached, off, ratio float64) Candidate {
	r := healthy(queued, cached)
	r.Offloaded, r.LoadCost = off, off*ratio
	return r
}

// The package doc's worked example: A holds the 6,000-token prefix in GPU memory with
// 1,000 tokens queued, B holds it only in CPU memory (ratio 0.046), C not at all.
func TestOffloadedHitCountsAtItsLoadCost(t *testing.T) {
	const prompt = 8000
	a, b, c := healthy(1000, 6000), offloaded(0, 0, 6000, 0.046), healthy(0, 0)
	assert.InDelta(t, 2000, Uncached(prompt, a), 1e-9)
	assert.InDelta(t, 2276, Uncached(prompt, b), 1e-9)
	assert.InDelta(t, 8000, Uncached(prompt, c), 1e-9)

	pk := NewPicker(exact(), 1)
	d := pk.Pick(prompt, []Candidate{a, b, c}, nil)
	require.False(t, d.Fallback)
	assert.Equal(t, []int{1, 0, 2}, d.Order, "B loads the prefix for less than A's extra queue")
	assert.InDelta(t, 2276+276.0/3, d.Cost, 1e-9, "with the spill's charge, 276/3")
	assert.True(t, d.Spill, "B does not hold the prefix in GPU memory")

	// A keeps it while its queue is under 276 x 4/3 = 368 tokens deeper than B's ...
	a.Queued = 367
	assert.Equal(t, 0, pk.Pick(prompt, []Candidate{a, b, c}, nil).Order[0])
	a.Queued = 369
	assert.Equal(t, 1, pk.Pick(prompt, []Candidate{a, b, c}, nil).Order[0])
	// ... and B, not the cold replica, takes A's spill until B is 5,724 x 4/3 = 7,632
	// tokens deeper.
	a.Queued = 20000
	b.Queued = 7631
	assert.Equal(t, 1, pk.Pick(prompt, []Candidate{a, b, c}, nil).Order[0])
	b.Queued = 7633
	assert.Equal(t, 2, pk.Pick(prompt, []Candidate{a, b, c}, nil).Order[0])
}

// Before tiers counted (Offloaded 0), B and the cold replica tied: a CPU-tier hit was
// worth nothing.
func TestOffloadedZeroIsTheGPUOnlyRule(t *testing.T) {
	r := healthy(500, 3000)
	assert.Equal(t, Cost(8000, r), Cost(8000, Candidate{Queued: 500, Cached: 3000}))
	assert.InDelta(t, 5500, Cost(8000, r), 1e-9)
}

func TestUncachedClampsOffloadedAndLoadCost(t *testing.T) {
	// Offloaded beyond the prompt is cut to what is left, its cost in proportion.
	r := offloaded(0, 6000, 4000, 0.1) // only 2,000 tokens are left to cover
	assert.InDelta(t, 2000*0.1, Uncached(8000, r), 1e-9)
	// A ratio above 1 is never dearer than prefilling.
	r = offloaded(0, 0, 1000, 3)
	assert.InDelta(t, 8000, Uncached(8000, r), 1e-9)
	// Negative inputs count as none.
	r = Candidate{Cached: 0, Offloaded: -5, LoadCost: -1, Healthy: true}
	assert.InDelta(t, 8000, Uncached(8000, r), 1e-9)
}

// The stale regime's cost and load bound use the same U.
func TestStaleRegimeCountsOffloadedHits(t *testing.T) {
	p := exact()
	old := 5 * time.Second
	b := offloaded(0, 0, 6000, 0.046)
	b.StateAge = old
	c := healthy(0, 0)
	c.StateAge = old
	b.Pending, c.Pending = 1000, 0
	d := NewPicker(p, 1).Pick(8000, []Candidate{b, c}, nil)
	require.True(t, d.Stale)
	assert.Equal(t, 0, d.Order[0], "1,000 pending + 2,276 beats 8,000")
	assert.InDelta(t, 3276, d.Cost, 1e-9)
}

// A replica whose slower tier keeps what its GPU memory evicts pays for an eviction what
// loading the block back costs, not a prefill (E x EvictCost). The case is one the
// CPU-tier workload at 34 req/s met while its cold start drained: the owner's pool 99%
// full, its queue six times another's 93% full. Priced as prefills, the 2,048 tokens
// the owner would prefill evicted 99 a token and the copy's 8,000 13 a token, and the
// prefix went to the copy; at the CPU tier's 0.046 the owner keeps it. (Both were busy
// all the time, which is past capacity for a fleet of two, where the fleet's mean queue
// keeps the owner either way; at 0.8, below it, N is what it is at 1.)
func TestAnEvictionATierKeepsCostsItsLoad(t *testing.T) {
	owner := loaded(153888, 5952, 0.8, 2700, 77.9)
	owner.KVUsage = 0.99
	other := loaded(25517, 0, 0.8, 2700, 80.1)
	other.KVUsage = 0.93
	pick := func(evictCost float64) int {
		o, c := owner, other
		o.EvictCost, c.EvictCost = evictCost, evictCost
		return NewPicker(exact(), 1).Pick(8000, []Candidate{o, c}, nil).Order[0]
	}
	assert.Equal(t, 1, pick(0), "every eviction a prefill: the copy")
	assert.Equal(t, 0, pick(0.046), "evictions loaded back from CPU memory: the owner")

	// E scales by EvictCost and nothing else does.
	half := loaded(0, 0, 0, 2000, 0)
	half.KVUsage = 0.5
	half.EvictCost = 0.25
	assert.InDelta(t, 8000+8000*0.25, Cost(8000, half), 1e-6)
	// Unset, NaN, negative or above 1: a prefill, as without a tier.
	for _, c := range []float64{0, math.NaN(), -1, 1, 3, math.Inf(1)} {
		half.EvictCost = c
		assert.InDelta(t, 2*8000, Cost(8000, half), 1e-6, "EvictCost %v", c)
	}
}
