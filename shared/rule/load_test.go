package rule

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loaded is a healthy replica with load values: busy fraction rho, ubar uncached tokens a
// request, running requests.
func loaded(queued, cached, rho, ubar, running float64) Candidate {
	return Candidate{Queued: queued, Cached: cached, Healthy: true, Busy: rho, MeanUncached: ubar, Running: running}
}

// The package doc's worked example, to the token: the owner costs 40,000, the idle
// replica 80,000, and the owner keeps the request.
func TestWorkedExampleOfTheOthersShare(t *testing.T) {
	owner := loaded(8000, 6000, 0.5, 2000, 20)
	cold := loaded(0, 0, 0.5, 2000, 10)
	assert.InDelta(t, 40000, Cost(8000, owner), 1e-6)
	assert.InDelta(t, 80000, Cost(8000, cold), 1e-6)
	d := NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil)
	assert.Equal(t, []int{0, 1}, d.Order)
	assert.False(t, d.Spill)
}

// 22 replicas, the owner of a 6,000-token prefix prefilling another customer's first
// request (8,000 tokens deeper than the others). Charging a copy its share of the extra
// prefill (W/n, all the rule had without load values) sends the request to an idle
// replica, 6,000 tokens prefilled again; on a fleet that is busy half the time, with ten
// requests running everywhere, that copy costs the others more than the request saves.
func TestABusyFleetKeepsTheOwner(t *testing.T) {
	replicas := []Candidate{healthy(8000, 6000)}
	for range 21 {
		replicas = append(replicas, healthy(0, 0))
	}
	d := NewPicker(exact(), 1).Pick(8000, replicas, nil)
	require.True(t, d.Spill, "without load values the copy charge alone lets it spill")

	for i := range replicas {
		replicas[i].Busy, replicas[i].MeanUncached, replicas[i].Running = 0.5, 2000, 10
	}
	d = NewPicker(exact(), 1).Pick(8000, replicas, nil)
	assert.Equal(t, 0, d.Order[0], "the owner keeps it")
	assert.False(t, d.Spill)
}

// On an idle fleet (nothing running, never busy) the others' share is zero and a request
// goes where it is served first, a copy included: the spill point is the saved prefill
// alone.
func TestAnIdleFleetSpillsAtTheSavedPrefill(t *testing.T) {
	for _, c := range []struct {
		extra float64
		owner bool
	}{{5999, true}, {6001, false}} {
		owner := loaded(1000+c.extra, 6000, 0, 2000, 0)
		cold := loaded(1000, 0, 0, 2000, 0)
		d := NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil)
		assert.Equal(t, c.owner, d.Order[0] == 0, "owner %v tokens deeper", c.extra)
	}
}

// A hot prefix gains owners: as the owner's queue grows, the point comes where a copy
// costs everyone less than waiting there, and it comes later the busier the fleet
// (below capacity: past it, TestPastCapacityTheLaterArrivalsAreTheFleets).
func TestAHotPrefixGainsOwnersLaterOnABusierFleet(t *testing.T) {
	spillPoint := func(rho, running float64) float64 {
		for q := 0.0; q < 1e7; q += 100 {
			owner := loaded(q, 6000, rho, 2000, running)
			cold := loaded(0, 0, rho, 2000, running)
			if NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil).Order[0] == 1 {
				return q
			}
		}
		return math.Inf(1)
	}
	idle, half, busy := spillPoint(0, 0), spillPoint(0.5, 10), spillPoint(0.85, 30)
	t.Logf("owner's queue at which a copy wins: idle %v, half busy %v, busy %v tokens", idle, half, busy)
	assert.Less(t, idle, half)
	assert.Less(t, half, busy)
	assert.False(t, math.IsInf(busy, 1), "even a busy fleet copies a prefix whose owner is far behind")
}

// Load values from a torn or hostile table cannot make a cost negative, infinite or NaN.
func TestHostileLoadValuesStayFinite(t *testing.T) {
	for _, r := range []Candidate{
		loaded(100, 0, math.NaN(), 2000, 5),
		loaded(100, 0, 2, 2000, 5),
		loaded(100, 0, -1, 2000, -5),
		loaded(100, 0, 1, 2000, math.NaN()),
		loaded(100, 0, 0.5, math.Inf(1), 5),
		withUsage(loaded(100, 0, 0.5, 2000, 5), math.NaN()),
		withUsage(loaded(100, 0, 0.5, 2000, 5), -1),
		withUsage(loaded(100, 0, 0.5, 2000, 5), math.Inf(1)),
	} {
		c := Cost(1000, r)
		assert.False(t, math.IsNaN(c) || math.IsInf(c, 0) || c < 0, "%+v: cost %v", r, c)
	}
	// Past capacity every replica's N counts the fleet's mean queue: the largest queue a
	// table carries leaves the others' costs finite, and last.
	past := []Candidate{loaded(math.MaxUint64, 0, 1, 2000, 5), loaded(100, 0, 1, 2000, 5)}
	d := NewPicker(exact(), 1).Pick(1000, past, nil)
	assert.Equal(t, []int{1, 0}, d.Order)
	assert.False(t, math.IsNaN(d.Cost) || math.IsInf(d.Cost, 0), "cost %v", d.Cost)
}

// A placement pays for what it evicts: U x k/(1 - k) at KV usage k. A prefix nobody holds
// goes to the replica whose pool has room, though its queue is a little deeper: before
// the eviction term the fuller replica won on queue alone (85,000 against 87,500).
func TestAPlacementPaysForWhatItEvicts(t *testing.T) {
	full := loaded(1000, 0, 0.5, 2000, 10)
	full.KVUsage = 0.9
	roomy := loaded(1500, 0, 0.5, 2000, 10)
	roomy.KVUsage = 0.3
	assert.InDelta(t, 85000+8000*9, Cost(8000, full), 1e-6)
	assert.InDelta(t, 87500+8000*0.3/0.7, Cost(8000, roomy), 1e-6)
	for seed := range uint64(20) {
		d := NewPicker(exact(), seed).Pick(8000, []Candidate{full, roomy}, nil)
		assert.Equal(t, 1, d.Order[0], "seed %d", seed)
	}

	// Half full, a token evicts a token; an idle pool evicts nothing; a full one is
	// priced at 99 a token, not infinity.
	half := loaded(0, 0, 0, 2000, 0)
	half.KVUsage = 0.5
	assert.InDelta(t, 2*8000, Cost(8000, half), 1e-6)
	idle := loaded(0, 0, 0, 2000, 0)
	assert.InDelta(t, 8000, Cost(8000, idle), 1e-6)
	for _, k := range []float64{1, 2, math.Inf(1)} {
		full := loaded(0, 0, 0, 2000, 0)
		full.KVUsage = k
		assert.InDelta(t, 100*8000, Cost(8000, full), 1e-6, "usage %v", k)
	}

	// The owner of the prefix pays only for the tokens it prefills: its fuller pool does
	// not send the request to an emptier cold replica.
	owner := loaded(0, 6000, 0.5, 2000, 10)
	owner.KVUsage = 0.9
	cold := loaded(0, 0, 0.5, 2000, 10)
	cold.KVUsage = 0.3
	assert.Equal(t, 0, NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil).Order[0])

	// Without load values (an older table) nothing changes: the copy charge prices usage.
	old := Candidate{Queued: 0, Healthy: true, KVUsage: 0.9}
	assert.InDelta(t, 8000, Cost(8000, old), 1e-6)
}

func withUsage(c Candidate, k float64) Candidate {
	c.KVUsage = k
	return c
}

// Past capacity (every replica busy more than 80% of the time) the busy fractions no
// longer decide: an owner that holds a quarter of the prompt keeps it though it was busy
// all of the time and the other replica 85% of it. With rho capped at 0.95 the copy won
// (cost 426,000 against 928,000), on a difference the rule cannot act on: the later
// arrivals it counted would be sent elsewhere too.
func TestPastCapacityBusyFractionsDoNotDecide(t *testing.T) {
	owner := loaded(10000, 2000, 1, 2000, 0)
	cold := loaded(10000, 0, 0.85, 2000, 0)
	// owner: 10,000 + 6,000 + 6,000 x 4 x 16,000/2,000 = 208,000;
	// cold: 10,000 + 8,000 + 8,000 x 4 x 18,000/2,000 = 306,000.
	assert.InDelta(t, 208000, Cost(8000, owner), 1e-6)
	assert.InDelta(t, 306000, Cost(8000, cold), 1e-6)
	d := NewPicker(exact(), 1).Pick(8000, []Candidate{owner, cold}, nil)
	assert.Equal(t, 0, d.Order[0], "the owner keeps the request")
	// Below the cap the busy fraction still counts: at 0.5 against 0.8 the copy to the
	// less busy replica wins.
	lighter := loaded(10000, 0, 0.5, 2000, 0)
	owner.Busy = 0.8
	d = NewPicker(exact(), 1).Pick(8000, []Candidate{owner, lighter}, nil)
	assert.Equal(t, 1, d.Order[0], "the less busy replica takes the copy")
}

// Past capacity the router evens the queues and the fleet drains as one, so what a
// placement's work delays is the fleet's backlog, not the replica's: N counts the fleet's
// mean queue. A customer's owner 180,000 tokens deeper than three other replicas keeps
// its request there (cost 480,000 against 1,236,000 for a copy); counted on each
// replica's own queue, as below capacity, the deep owner's later arrivals made the copy
// win (1,020,000 against 516,000), and on the Mooncake trace at 4 replicas those copies
// cost the fleet its cache (docs/performance.md, "Past capacity: the fleet drains as
// one"). Below capacity the replicas drain apart and the copy still wins.
func TestPastCapacityTheLaterArrivalsAreTheFleets(t *testing.T) {
	fleet := func(busy float64) []Candidate {
		c := []Candidate{loaded(200000, 6000, busy, 2000, 10)}
		for range 3 {
			c = append(c, loaded(20000, 0, busy, 2000, 10))
		}
		return c
	}
	past := fleet(0.95)
	require.True(t, PastCapacity(past))
	// owner: 200,000 + 2,000 x (1 + 4 x (65,000 + 2,000)/2,000 + 5);
	// copy: 20,000 + 8,000 x (1 + 4 x (65,000 + 8,000)/2,000 + 5).
	assert.InDelta(t, 480000, cost(8000, &past[0], 65000, pastCapacityUsage), 1e-6)
	assert.InDelta(t, 1236000, cost(8000, &past[1], 65000, pastCapacityUsage), 1e-6)
	d := NewPicker(exact(), 1).Pick(8000, past, nil)
	assert.Equal(t, 0, d.Order[0], "past capacity the owner keeps the request")
	assert.InDelta(t, 480000, d.Cost, 1e-6)
	assert.InDelta(t, 1020000, Cost(8000, past[0]), 1e-6, "on its own queue")
	assert.InDelta(t, 516000, Cost(8000, past[1]), 1e-6, "on its own queue")

	below := fleet(0.85)
	require.False(t, PastCapacity(below))
	d = NewPicker(exact(), 1).Pick(8000, below, nil)
	assert.NotEqual(t, 0, d.Order[0], "below capacity the copy wins")
	assert.True(t, d.Spill)
}

// Past capacity the running requests hold nearly every pool, and E reads KV usage at
// most 0.9: a replica 99% full and one 95% full both charge 9 a token, and the cold
// prompt goes to the shorter queue. Read up to 0.99 (99 against 19 a token), four points
// of room weighed 640,000 tokens of queue (45 s of prefill), and on the GPU-only
// workload at 30 req/s cold prompts piled onto whichever replica had them. Below
// capacity usage still reads up to 0.99 and the pool with room takes the prompt.
func TestPastCapacityAFewPointsOfUsageDoNotOutweighTheQueue(t *testing.T) {
	full := withUsage(loaded(100000, 0, 0.95, 2000, 10), 0.99)
	roomy := withUsage(loaded(120000, 0, 0.95, 2000, 10), 0.95)
	d := NewPicker(exact(), 1).Pick(8000, []Candidate{full, roomy}, nil)
	assert.Equal(t, 0, d.Order[0], "past capacity: the shorter queue")
	full.Busy, roomy.Busy = 0.5, 0.5
	d = NewPicker(exact(), 1).Pick(8000, []Candidate{full, roomy}, nil)
	assert.Equal(t, 1, d.Order[0], "below capacity: the pool with room")
}

// The fleet is past capacity from its healthy replicas' mean busy fraction of 0.9: an
// unhealthy replica (whose numbers are stale) does not count, a missing or NaN value
// counts as idle, and a value above 1 as 1.
func TestMeanBusy(t *testing.T) {
	c := func(busy float64, healthy bool) Candidate { return Candidate{Busy: busy, Healthy: healthy} }
	assert.InDelta(t, 0.6, MeanBusy([]Candidate{c(0.9, true), c(0.9, true), c(math.NaN(), true), c(0, false)}), 1e-9)
	assert.InDelta(t, 1.0, MeanBusy([]Candidate{c(3, true), c(0.2, false)}), 1e-9)
	assert.Zero(t, MeanBusy([]Candidate{c(0.9, false)}))
	assert.Zero(t, MeanBusy(nil))
	assert.True(t, PastCapacity([]Candidate{c(0.9, true), c(0.95, true), c(0, false)}))
	assert.False(t, PastCapacity([]Candidate{c(0.9, true), c(0.85, true)}))
}
