package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// The reuse ceiling against the engines' own counts: no policy caches more, and one
// replica whose cache never evicts, serving one request at a time, caches exactly it.

func TestNoPolicyBeatsTheReuseCeiling(t *testing.T) {
	w := tinySeed(t)
	o := tinyOptions()
	o.Warmup = 2 * time.Second
	ceiling := workload.ReuseCeiling(w, o.Profile.BlockSize, o.Warmup)
	res, err := Compare(w, Policies, o)
	require.NoError(t, err)
	for _, r := range res {
		require.Zero(t, r.Failed, r.Policy)
		assert.LessOrEqual(t, r.CachedTokenRate, ceiling.Rate+1e-12, r.Policy)
		assert.Equal(t, ceiling.Requests, r.Requests, "%s: the same measured requests", r.Policy)
	}
}

func TestOneReplicaThatKeepsEverythingReachesTheCeiling(t *testing.T) {
	w, o := oneAtATime(t)
	res, err := Compare(w, []string{"round-robin"}, o)
	require.NoError(t, err)
	ceiling := workload.ReuseCeiling(w, o.Profile.BlockSize, 0)
	assert.Positive(t, ceiling.Rate)
	assert.InDelta(t, ceiling.Rate, res[0].CachedTokenRate, 1e-12)
}

// TestOneReplicaCachesAtMostThePooledLRU: one replica serving one request at a time is
// the pooled LRU with less room (its outputs' blocks take some, and block 0 is vLLM's
// null block), so whatever its pool it caches no more than the pooled LRU of its usable
// blocks, and with room for everything both reach the ceiling.
func TestOneReplicaCachesAtMostThePooledLRU(t *testing.T) {
	w, o := oneAtATime(t)
	ceiling := workload.ReuseCeiling(w, o.Profile.BlockSize, 0)
	for _, blocks := range []int{12, 20, 30, 4096} {
		o.Profile.PoolTokens = blocks * o.Profile.BlockSize
		res, err := Compare(w, []string{"round-robin"}, o)
		require.NoError(t, err)
		pooled := workload.PooledLRU(w, o.Profile.BlockSize, 0, blocks-1)
		assert.LessOrEqual(t, res[0].CachedTokenRate, pooled.Rate+1e-12, "%d blocks", blocks)
		if blocks == 12 {
			assert.Less(t, pooled.Rate, ceiling.Rate, "12 blocks do not hold every group's prompt")
			assert.Positive(t, pooled.Rate)
		}
		if blocks == 4096 {
			assert.Equal(t, ceiling, pooled)
			assert.InDelta(t, ceiling.Rate, res[0].CachedTokenRate, 1e-12)
		}
	}
}

// oneAtATime is the tiny GSP workload at a request every half second, each done before
// the next, for one replica.
func oneAtATime(t *testing.T) (workload.Workload, Options) {
	load, _ := tinyGSPLoad(t)
	w, err := load.At(2)
	require.NoError(t, err)
	o := tinyOptions()
	o.Replicas = 1
	return w, o
}
