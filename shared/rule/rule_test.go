package rule

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func healthy(queued, cached float64) Candidate {
	return Candidate{Queued: queued, Cached: cached, Healthy: true}
}

func exact() Params {
	p := DefaultParams()
	p.TieEpsilon = 0
	return p
}

// docs/rule.md's worked example: 8,000-token prompts, 6,000 tokens shared, 22 replicas. The owner keeps the
// request while its extra queue is under the 6,000 tokens a hit saves plus the spill's
// charge, 6,000/22 (273 tokens), and loses it above.
func TestSeed000SpillPoint(t *testing.T) {
	const prompt, shared = 8000, 6000
	cases := []struct {
		name       string
		extraQueue float64 // owner's queue minus the cold replica's
		ownerWins  bool
	}{
		{"idle fleet", 0, true},
		{"owner 1,000 tokens deeper", 1000, true},
		{"owner 6,001 tokens deeper (the spill point without the charge)", 6001, true},
		{"owner 6,272 tokens deeper", 6272, true},
		{"owner 6,274 tokens deeper", 6274, false},
		{"owner 20,000 tokens deeper", 20000, false},
		{"cold replica deeper", -3000, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := 4000.0
			replicas := []Candidate{
				healthy(base+c.extraQueue, shared), // the owner
				healthy(base, 0),
			}
			for len(replicas) < 22 {
				replicas = append(replicas, healthy(base+500, 0))
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

// The package doc's worked example (SGLang's generated-shared-prefix benchmark): 4
// replicas, 2,176-token prompts whose 2,048-token system prompt replica 0 holds while it
// prefills another group's first request. The rule without the spill charge sent the
// request to the idle replica (2,176 < 2,304 tokens), gaining 128 tokens of wait for
// 2,048 tokens of repeated prefill (kvroute-bench --workload gsp --replicas 4 --rate 16:
// 3.6% of requests spilled, 84.8% cached against 88.2% for a router that never spills).
// With the charge the idle replica costs 2,176 + 2,048/4 = 2,688 and the owner keeps it
// until its queue is 2,048 x 5/4 = 2,560 tokens deeper.
func TestSpillPaysForTheCopy(t *testing.T) {
	const prompt, system = 2176, 2048
	replicas := []Candidate{healthy(2176, system), healthy(0, 0), healthy(2176, 0), healthy(2304, 0)}
	d := NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.Equal(t, 0, d.Order[0], "order %v", d.Order)
	assert.False(t, d.Spill)
	assert.InDelta(t, 2304, d.Cost, 1e-9, "an owner pays no charge")
	assert.Equal(t, []int{0, 1, 2}, d.Order)

	replicas[0].Queued = 2559 // + 128 = 2,687 < 2,688
	assert.Equal(t, 0, NewPicker(exact(), 1).Pick(prompt, replicas, nil).Order[0])
	replicas[0].Queued = 2561
	d = NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.Equal(t, 1, d.Order[0])
	assert.True(t, d.Spill)
	assert.InDelta(t, 2688, d.Cost, 1e-9, "the spill's cost includes its charge")

	// Nothing cached anywhere: no charge, least queued.
	for i := range replicas {
		replicas[i].Cached = 0
	}
	d = NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.Equal(t, 1, d.Order[0])
	assert.InDelta(t, 2176, d.Cost, 1e-9)
}

// A spill's copy also evicts cached prefixes from the target, the more reusable the more
// of its cache running requests hold: the charge is W x (1/n + u). The package doc's
// worked example again, the idle replica at KV usage 0.5: it costs 2,176 + 2,048 x
// (1/4 + 0.5) = 3,712, and the owner keeps the request until its queue is 3,584 tokens
// deep, not 2,560. With W/n alone (before) the same fleet spilled at 2,561.
func TestSpillChargeGrowsWithTheTargetsKVUsage(t *testing.T) {
	const prompt, system = 2176, 2048
	replicas := []Candidate{healthy(2561, system), healthy(0, 0), healthy(2176, 0), healthy(2304, 0)}
	for i := range replicas {
		replicas[i].KVUsage = 0.5
	}
	d := NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.Equal(t, 0, d.Order[0], "order %v", d.Order)
	assert.False(t, d.Spill)

	replicas[0].Queued = 3583 // + 128 = 3,711 < 3,712
	assert.Equal(t, 0, NewPicker(exact(), 1).Pick(prompt, replicas, nil).Order[0])
	replicas[0].Queued = 3585
	d = NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.Equal(t, 1, d.Order[0])
	assert.True(t, d.Spill)
	assert.InDelta(t, 3712, d.Cost, 1e-9)

	// An owner's own usage costs it nothing (W = 0), and a usage outside 0..1 (a torn
	// table) counts as its bound.
	replicas[0].KVUsage, replicas[1].KVUsage = 0.9, math.NaN()
	d = NewPicker(exact(), 1).Pick(prompt, replicas, nil)
	assert.InDelta(t, 2176+2048/4.0, d.Cost, 1e-9, "NaN usage: no eviction charge")
	noGuard := exact()
	noGuard.MaxKVUsage = 0 // the default guard, 1, excludes a usage above 1
	replicas[1].KVUsage = 7
	d = NewPicker(noGuard, 1).Pick(prompt, replicas, nil)
	assert.Equal(t, []int{0, 1, 2}, d.Order, "usage 7 counts 1: the spill costs 2,176 + 2,048 x 1.25 = 4,736 against the owner's 3,713")
}

// The charge is relative to the candidates: an owner excluded by a guard does not make
// the others pay for a copy that has to be made anyway.
func TestSpillChargeCountsCandidatesOnly(t *testing.T) {
	const prompt, shared = 8000, 6000
	full := healthy(0, shared)
	full.KVUsage = 0.99
	partial := healthy(4200, 3000) // U 5,000: 9,200
	cold := healthy(0, 0)          // U 8,000, 3,000 more than the partial holder: 8,000 + 3,000/2
	p := exact()
	p.MaxKVUsage = 0.95 // excludes the owner
	d := NewPicker(p, 1).Pick(prompt, []Candidate{full, partial, cold}, nil)
	assert.Equal(t, []int{1, 2}, d.Order, "9,200 against 9,500 (charged against the excluded owner: 10,200 against 10,000)")
	assert.InDelta(t, 9200, d.Cost, 1e-9)
}

// Speed divides the charge as it divides the rest of the cost: a spill's copy is
// prefilled on the spill target.
func TestSpillChargeIsInTheTargetsSeconds(t *testing.T) {
	owner := Candidate{Queued: 9000, Cached: 6000, Speed: 1, Healthy: true} // 11,000
	cold := Candidate{Queued: 6000, Speed: 2, Healthy: true}                // (6,000 + 8,000 + 3,000) / 2 = 8,500
	d := NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil)
	assert.Equal(t, []int{1, 0}, d.Order)
	assert.InDelta(t, 8500, d.Cost, 1e-9)
}

// The threshold scales with prefill speed: a replica twice as fast spends half the
// seconds on the same tokens.
func TestSpeedNormalisesCost(t *testing.T) {
	fast := Candidate{Queued: 10000, Speed: 2, Healthy: true}
	slow := Candidate{Queued: 6000, Speed: 1, Healthy: true}
	d := NewPicker(exact(), 1).Pick(1000, []Candidate{slow, fast}, nil)
	assert.Equal(t, []int{1, 0}, d.Order, "fast: 11000/2=5500 < slow: 7000")
	assert.InDelta(t, 5500, d.Cost, 1e-9)
}

func TestGuards(t *testing.T) {
	p := exact()
	p.MaxKVUsage = 0.95 // off by default (1); a configuration may set it
	cases := []struct {
		name     string
		replicas []Candidate
		want     []int
		fallback bool
	}{
		{
			name: "KV usage above 0.95 is excluded even when it owns the prefix",
			replicas: []Candidate{
				{Cached: 6000, KVUsage: 0.96, Healthy: true},
				{Queued: 3000, KVUsage: 0.5, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "KV usage of exactly 0.95 is allowed",
			replicas: []Candidate{
				{Cached: 6000, KVUsage: 0.95, Healthy: true},
				{Queued: 3000, Healthy: true},
			},
			want: []int{0, 1},
		},
		{
			name: "stale state is excluded",
			replicas: []Candidate{
				{Cached: 6000, StateAge: 2001 * time.Millisecond, Healthy: true},
				{Queued: 3000, StateAge: 100 * time.Millisecond, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "unhealthy is excluded",
			replicas: []Candidate{
				{Cached: 6000},
				{Queued: 3000, Healthy: true},
			},
			want: []int{1},
		},
		{
			name: "all excluded: least queued among all, healthy first",
			replicas: []Candidate{
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
			replicas: []Candidate{
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

// By default no replica is excluded for its KV usage: the owner of the prefix at 99%
// keeps the request (excluding it forced a copy that evicted another replica's
// prefixes), and a spill onto a busy cache pays for what it evicts.
func TestDefaultKeepsAnOwnerWhoseCacheIsBusy(t *testing.T) {
	const prompt, shared = 8000, 6000
	owner := Candidate{Queued: 1000, Cached: shared, KVUsage: 0.99, Healthy: true} // 3,000
	cold := Candidate{Queued: 0, KVUsage: 0.9, Healthy: true}                      // 8,000 + 6,000 x (1/2 + 0.9)
	d := NewPicker(exact(), 1).Pick(prompt, []Candidate{owner, cold}, nil)
	assert.Equal(t, []int{0, 1}, d.Order)
	assert.False(t, d.Fallback)
	assert.InDelta(t, 3000, d.Cost, 1e-9)
}

func TestOrderIsCappedAndSortedByCost(t *testing.T) {
	replicas := []Candidate{
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
	replicas := []Candidate{
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

// A near tie between the replica holding the prompt and replicas that would prefill it
// goes to the holder: the session's replica of TestSessionHeaderOnlyWhenTrusted
// (wasmtest/mesh), its previous request still counted as queued by a worker VM that had
// not seen it start, cost 551 against 552 on the idle replicas and lost three times in
// four. Among holders alike, ties are still spread.
func TestNearTiesGoToTheReplicaHoldingThePrompt(t *testing.T) {
	holder := loaded(551, 552, 0, 537, 0) // the table's load values, an idle fleet
	cold := loaded(0, 0, 0, 537, 0)
	replicas := []Candidate{cold, holder, cold, holder, cold}
	counts := make([]int, len(replicas))
	pk := NewPicker(DefaultParams(), 7)
	for range 2000 {
		counts[pk.Pick(552, replicas, nil).Order[0]]++
	}
	assert.Zero(t, counts[0]+counts[2]+counts[4], "%v", counts)
	assert.Greater(t, counts[1], 700, "%v", counts)
	assert.Greater(t, counts[3], 700, "%v", counts)
}

func TestSeededPickerIsReproducible(t *testing.T) {
	replicas := []Candidate{healthy(0, 0), healthy(0, 0), healthy(0, 0), healthy(0, 0)}
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
	replicas := []Candidate{healthy(900, 0), healthy(300, 0), healthy(600, 0)}
	d := NewPicker(exact(), 1).Pick(8000, replicas, nil)
	assert.Equal(t, []int{1, 2, 0}, d.Order)
	assert.False(t, d.Spill)
}

func TestCachedBeyondPromptCostsNoNegativeWork(t *testing.T) {
	assert.Equal(t, 100.0, Cost(50, Candidate{Queued: 100, Cached: 80}))
}

func BenchmarkPick22Replicas(b *testing.B) {
	replicas := make([]Candidate, 22)
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
// a bounded-load cap, so the owner keeps the request rather than the order falling back
// to least-queued.
func TestStaleRegimeKeepsAffinityWithBoundedLoad(t *testing.T) {
	const prompt, shared = 8000, 6000
	age := 30 * time.Second
	stale := func(queued, pending, cached float64) Candidate {
		return Candidate{Queued: queued, Pending: pending, Cached: cached, StateAge: age, Healthy: true}
	}
	pk := NewPicker(exact(), 1)

	// The snapshot says the owner is deep (an old number); its pending work is small.
	d := pk.Pick(prompt, []Candidate{stale(50000, 2000, shared), stale(0, 0, 0), stale(100, 0, 0)}, nil)
	assert.Equal(t, 0, d.Order[0], "the owner keeps the request")
	assert.True(t, d.Stale)
	assert.False(t, d.Fallback)

	// Its pending work outweighs the saving: the rule spills as the fresh rule would.
	d = pk.Pick(prompt, []Candidate{stale(0, 7000, shared), stale(0, 0, 0), stale(0, 500, 0)}, nil)
	assert.Equal(t, 1, d.Order[0])
	assert.True(t, d.Spill)
	// Within the bound the spill pays its charge as in the fresh regime: 6,000/3.
	d = pk.Pick(prompt, []Candidate{stale(0, 7000, shared), stale(0, 0, 0), stale(0, 20000, 0)}, nil)
	assert.Equal(t, 0, d.Order[0], "9,000 against 8,000 + 2,000")
	d = pk.Pick(prompt, []Candidate{stale(0, 8500, shared), stale(0, 0, 0), stale(0, 20000, 0)}, nil)
	assert.Equal(t, 1, d.Order[0], "10,500 against 10,000")
	assert.True(t, d.Spill)

	// The bound: with this router busy everywhere, the owner may hold at most 1.25x its
	// share; here its share is (4 x 20,000 + 8,000) / 4 x 1.25 = 27,500 tokens.
	owner := stale(0, 26000, shared) // 26,000 + 2,000 > 27,500
	others := []Candidate{owner, stale(0, 18000, 0), stale(0, 18000, 0), stale(0, 18000, 0)}
	d = pk.Pick(prompt, others, nil)
	assert.NotEqual(t, 0, d.Order[0], "over the bound")
	// Under the bound (27,000 <= 27,187.5) the cost decides: 27,000 against 18,000 +
	// 8,000 + the spill's charge 6,000/4.
	others[0].Pending = 25000
	d = pk.Pick(prompt, others, nil)
	assert.Equal(t, 0, d.Order[0])
	assert.InDelta(t, 27000, d.Cost, 1e-9)

	// Unhealthy replicas stay out; the KV guard is off (usage is as old as the queue).
	r := stale(0, 0, shared)
	r.KVUsage = 0.99
	d = pk.Pick(prompt, []Candidate{r, {Pending: 0, Cached: shared, StateAge: age}, stale(0, 0, 0)}, nil)
	assert.Equal(t, 0, d.Order[0])
	assert.NotContains(t, d.Order, 1)

	// Past MaxCacheAge: cache-blind least-queued.
	old := []Candidate{stale(5000, 0, shared), stale(100, 0, 0)}
	for i := range old {
		old[i].StateAge = 11 * time.Minute
	}
	d = pk.Pick(prompt, old, nil)
	assert.True(t, d.Fallback)
	assert.Equal(t, 1, d.Order[0])
}

// sortByCost orders as slices.SortStableFunc with cmp.Compare does, ties and NaN
// included, below and above its insertion-sort threshold.
func TestSortByCostIsTheStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	costs := []float64{0, 1, 1, 2, math.NaN(), math.Inf(1), -1, 3.5}
	for n := 0; n <= 40; n++ {
		for range 50 {
			s := make([]scored, n)
			for i := range s {
				s[i] = scored{idx: i, cost: costs[rng.IntN(len(costs))]}
			}
			want := slices.Clone(s)
			slices.SortStableFunc(want, func(a, b scored) int { return cmp.Compare(a.cost, b.cost) })
			sortByCost(s)
			for i := range s {
				if s[i].idx != want[i].idx {
					t.Fatalf("n %d: order %v, want %v", n, s, want)
				}
			}
		}
	}
}
