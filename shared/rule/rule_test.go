package rule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func healthy(queued, cached float64) Replica {
	return Replica{Queued: queued, Cached: cached, Healthy: true}
}

func exact() Params {
	p := DefaultParams()
	p.TieEpsilon = 0
	return p
}

// Seed 000: 8,000-token prompts, 6,000 tokens shared. The owner keeps the request while
// its extra queue is under the 6,000 tokens a hit saves, and loses it above.
func TestSeed000SpillPoint(t *testing.T) {
	const prompt, shared = 8000, 6000
	cases := []struct {
		name       string
		extraQueue float64 // owner's queue minus the cold replica's
		ownerWins  bool
	}{
		{"idle fleet", 0, true},
		{"owner 1,000 tokens deeper", 1000, true},
		{"owner 5,999 tokens deeper", 5999, true},
		{"owner 6,001 tokens deeper", 6001, false},
		{"owner 20,000 tokens deeper", 20000, false},
		{"cold replica deeper", -3000, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := 4000.0
			replicas := []Replica{
				healthy(base+c.extraQueue, shared), // the owner
				healthy(base, 0),
				healthy(base+500, 0),
			}
			d := NewPicker(exact(), 1).Pick(prompt, replicas, nil)
			require.NotEmpty(t, d.Order)
			assert.Equal(t, c.ownerWins, d.Order[0] == 0, "order %v", d.Order)
			assert.Equal(t, !c.ownerWins, d.Spill)
			if !c.ownerWins {
				assert.Equal(t, 1, d.Order[0], "spills to the coldest (least queued) replica")
			}
		})
	}
}

// The threshold scales with prefill speed: a replica twice as fast spends half the
// seconds on the same tokens.
func TestSpeedNormalisesCost(t *testing.T) {
	fast := Replica{Queued: 10000, Speed: 2, Healthy: true}
	slow := Replica{Queued: 6000, Speed: 1, Healthy: true}
	d := NewPicker(exact(), 1).Pick(1000, []Replica{slow, fast}, nil)
	assert.Equal(t, []int{1, 0}, d.Order, "fast: 11000/2=5500 < slow: 7000")
	assert.InDelta(t, 5500, d.Cost, 1e-9)
}

func TestGuards(t *testing.T) {
	p := exact()
	cases := []struct {
		name     string
		replicas []Replica
		want     []int
		fallback bool
	}{
		{
			name: "KV usage above 0.95 is excluded even when it owns the prefix",
			replicas: []Replica{
				{Cached: 6000, KVUsage: 0.96, Healthy: true},
				{Queued: 3000, KVUsage: 0.5, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "KV usage of exactly 0.95 is allowed",
			replicas: []Replica{
				{Cached: 6000, KVUsage: 0.95, Healthy: true},
				{Queued: 3000, Healthy: true},
			},
			want: []int{0, 1},
		},
		{
			name: "stale state is excluded",
			replicas: []Replica{
				{Cached: 6000, StateAge: 2001 * time.Millisecond, Healthy: true},
				{Queued: 3000, StateAge: 100 * time.Millisecond, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "unhealthy is excluded",
			replicas: []Replica{
				{Cached: 6000},
				{Queued: 3000, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "all excluded: least queued among all, healthy first",
			replicas: []Replica{
				{Queued: 100, KVUsage: 0.99, Healthy: true},
				{Queued: 50},
				{Queued: 70, StateAge: time.Hour, Healthy: true},
				{Queued: 10, KVUsage: 0.97, Healthy: true},
			},
			want:     []int{3, 2, 0},
			fallback: true,
		},
		{
			name: "all unhealthy: still an answer, least queued",
			replicas: []Replica{
				{Queued: 100},
				{Queued: 50},
			},
			want:     []int{1, 0},
			fallback: true,
		},
		{
			name:     "no replicas: empty order",
			replicas: nil,
			want:     []int{},
			fallback: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewPicker(p, 1).Pick(8000, c.replicas, nil)
			assert.Equal(t, c.want, append([]int{}, d.Order...))
			assert.Equal(t, c.fallback, d.Fallback)
		})
	}
}

func TestOrderIsCappedAndSortedByCost(t *testing.T) {
	replicas := []Replica{
		healthy(5000, 0), healthy(100, 0), healthy(3000, 0), healthy(2000, 0), healthy(4000, 0),
	}
	d := NewPicker(exact(), 1).Pick(1000, replicas, nil)
	assert.Equal(t, []int{1, 3, 2}, d.Order)

	p := exact()
	p.MaxEndpoints = 5
	d = NewPicker(p, 1).Pick(1000, replicas, make([]int, 0, 8))
	assert.Equal(t, []int{1, 3, 2, 4, 0}, d.Order)
}

// Routers holding the same snapshot must not all pick the same replica: near ties are
// broken at random, and every tied replica gets a share.
func TestNearTiesAreSpreadAtRandom(t *testing.T) {
	replicas := []Replica{
		healthy(1000, 0), healthy(1010, 0), healthy(1005, 0), // within 2% of 1000+8000
		healthy(2000, 0), // 11% worse: never first
	}
	counts := make([]int, len(replicas))
	pk := NewPicker(DefaultParams(), 42)
	for i := 0; i < 3000; i++ {
		d := pk.Pick(8000, replicas, nil)
		counts[d.Order[0]]++
	}
	assert.Zero(t, counts[3])
	for i := 0; i < 3; i++ {
		assert.Greater(t, counts[i], 700, "tied replica %d picked %d of 3000", i, counts[i])
	}
}

func TestSeededPickerIsReproducible(t *testing.T) {
	replicas := []Replica{healthy(0, 0), healthy(0, 0), healthy(0, 0), healthy(0, 0)}
	run := func(seed uint64) []int {
		pk := NewPicker(DefaultParams(), seed)
		var firsts []int
		for i := 0; i < 20; i++ {
			firsts = append(firsts, pk.Pick(100, replicas, nil).Order[0])
		}
		return firsts
	}
	assert.Equal(t, run(7), run(7))
	assert.NotEqual(t, run(7), run(8))
}

// Reversal condition: when nothing is cached anywhere the rule is least-queued tokens.
func TestNoCacheMeansLeastQueued(t *testing.T) {
	replicas := []Replica{healthy(900, 0), healthy(300, 0), healthy(600, 0)}
	d := NewPicker(exact(), 1).Pick(8000, replicas, nil)
	assert.Equal(t, []int{1, 2, 0}, d.Order)
	assert.False(t, d.Spill)
}

func TestCachedBeyondPromptCostsNoNegativeWork(t *testing.T) {
	assert.Equal(t, 100.0, Cost(50, Replica{Queued: 100, Cached: 80}))
}

func BenchmarkPick22Replicas(b *testing.B) {
	replicas := make([]Replica, 22)
	for i := range replicas {
		replicas[i] = healthy(float64(i*731%5000), float64(i%3*2000))
	}
	pk := NewPicker(DefaultParams(), 1)
	order := make([]int, 0, 3)
	b.ReportAllocs()
	for b.Loop() {
		pk.Pick(8000, replicas, order)
	}
}

// The stale regime (table older than MaxStateAge): the snapshot's queue numbers are not
// used, the cached tokens are, and this router's own pending work is the load term under
// a bounded-load cap. Before issue 13 every replica was excluded and the order was
// least-queued (the owner lost the request).
func TestStaleRegimeKeepsAffinityWithBoundedLoad(t *testing.T) {
	const prompt, shared = 8000, 6000
	age := 30 * time.Second
	stale := func(queued, pending, cached float64) Replica {
		return Replica{Queued: queued, Pending: pending, Cached: cached, StateAge: age, Healthy: true}
	}
	pk := NewPicker(exact(), 1)

	// The snapshot says the owner is deep (an old number); its pending work is small.
	d := pk.Pick(prompt, []Replica{stale(50000, 2000, shared), stale(0, 0, 0), stale(100, 0, 0)}, nil)
	assert.Equal(t, 0, d.Order[0], "the owner keeps the request")
	assert.True(t, d.Stale)
	assert.False(t, d.Fallback)

	// Its pending work outweighs the saving: the rule spills as the fresh rule would.
	d = pk.Pick(prompt, []Replica{stale(0, 7000, shared), stale(0, 0, 0), stale(0, 500, 0)}, nil)
	assert.Equal(t, 1, d.Order[0])
	assert.True(t, d.Spill)

	// The bound: with this router busy everywhere, the owner may hold at most 1.25x its
	// share; here its share is (4 x 20,000 + 8,000) / 4 x 1.25 = 27,500 tokens.
	owner := stale(0, 26000, shared) // 26,000 + 2,000 > 27,500
	others := []Replica{owner, stale(0, 18000, 0), stale(0, 18000, 0), stale(0, 18000, 0)}
	d = pk.Pick(prompt, others, nil)
	assert.NotEqual(t, 0, d.Order[0], "over the bound")
	others[0].Pending = 25000 // 27,000 <= 27,500; cost 27,000 vs 26,000: still spills by cost
	d = pk.Pick(prompt, others, nil)
	assert.NotEqual(t, 0, d.Order[0])
	others[0].Pending = 23000 // 25,000 < 26,000
	d = pk.Pick(prompt, others, nil)
	assert.Equal(t, 0, d.Order[0])

	// Unhealthy replicas stay out; the KV guard is off (usage is as old as the queue).
	r := stale(0, 0, shared)
	r.KVUsage = 0.99
	d = pk.Pick(prompt, []Replica{r, {Pending: 0, Cached: shared, StateAge: age}, stale(0, 0, 0)}, nil)
	assert.Equal(t, 0, d.Order[0])
	assert.NotContains(t, d.Order, 1)

	// Past MaxCacheAge: cache-blind least-queued.
	old := []Replica{stale(5000, 0, shared), stale(100, 0, 0)}
	for i := range old {
		old[i].StateAge = 11 * time.Minute
	}
	d = pk.Pick(prompt, old, nil)
	assert.True(t, d.Fallback)
	assert.Equal(t, 1, d.Order[0])
}
