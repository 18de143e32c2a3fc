package sim

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// followedEvictions returns n block hashes the measure follows.
func followedEvictions(n int) []uint64 {
	var out []uint64
	for h := uint64(1); len(out) < n; h++ {
		if followedEviction(h) {
			out = append(out, h)
		}
	}
	return out
}

func gpu(kind kvevents.Kind, hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kind, BlockHashes: hashes, Medium: kvevents.MediumGPU}
}

// The share counts the blocks evicted after the warm-up whose window closed within the
// run: stored again within 5 minutes, or not; a clear forgets the blocks waiting, and a
// CPU tier's events are not the GPU's.
func TestEvictionsStoredAgain(t *testing.T) {
	hs := followedEvictions(6)
	e := newEvictions(2, 10*time.Second)
	at := func(s int) time.Duration { return time.Duration(s) * time.Second }
	e.note(0, at(5), []kvevents.Event{gpu(kvevents.BlockRemoved, hs[5])}) // before the warm-up's end
	e.note(0, at(20), []kvevents.Event{gpu(kvevents.BlockRemoved, hs[0], hs[1], hs[2])})
	e.note(1, at(20), []kvevents.Event{gpu(kvevents.BlockRemoved, hs[3]), {Kind: kvevents.AllBlocksCleared}})
	e.note(0, at(30), []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{hs[4]}, Medium: kvevents.MediumCPU}})
	e.note(0, at(100), []kvevents.Event{gpu(kvevents.BlockStored, hs[0], hs[5])})                       // back in 80 s
	e.note(1, at(100), []kvevents.Event{gpu(kvevents.BlockStored, hs[3])})                              // cleared: not followed
	e.note(1, at(200), []kvevents.Event{gpu(kvevents.BlockStored, hs[2])})                              // on another replica
	e.note(0, at(20)+storedAgainWindow+time.Second, []kvevents.Event{gpu(kvevents.BlockStored, hs[1])}) // too late
	own, fleet, rate := e.summary(at(400))
	assert.InDelta(t, 1.0/3, own, 1e-12, "one of the three evicted on replica 0 after the warm-up, back there")
	assert.InDelta(t, 2.0/3, fleet, 1e-12, "two of the three back anywhere (replica 1's eviction was cleared)")
	span := at(400) - storedAgainWindow - at(10)
	assert.InDelta(t, 3*evictionsEvery/span.Seconds()/2, rate, 1e-12, "three followed blocks, each one in evictionsEvery")

	short := newEvictions(1, 0)
	short.note(0, at(1), []kvevents.Event{gpu(kvevents.BlockRemoved, hs[0])})
	own, fleet, rate = short.summary(at(60))
	assert.True(t, math.IsNaN(own) && math.IsNaN(fleet) && math.IsNaN(rate), "no window closed within the run")
}

// With Config.Evictions a run reports the share and the eviction rate of a workload that
// outgrows the pools, for a policy that reads no KV events; without it, nothing.
func TestRunMeasuresEvictions(t *testing.T) {
	w := seedOf(t, 200, 2000, 1500, 50, 8*time.Minute)
	run := func(evictions bool) *Result {
		res, err := Run(Config{Replicas: 3, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1, Evictions: evictions},
			func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
				return policy.NewRoundRobin(f), nil
			})
		require.NoError(t, err)
		return res
	}
	m := run(true).Memory
	assert.Positive(t, m.Evicted, "the pools overflow")
	assert.True(t, m.StoredAgain > 0 && m.StoredAgain < 1, "some evicted prefixes come back, not all: %v", m.StoredAgain)
	assert.GreaterOrEqual(t, m.StoredAgainFleet, m.StoredAgain, "back anywhere includes back on their replica")
	assert.Zero(t, run(false).Memory.StoredAgain)
}
