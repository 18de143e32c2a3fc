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
	load, _ := tinyGSPLoad(t)
	w, err := load.At(2) // a request every half second: each is done before the next
	require.NoError(t, err)
	o := tinyOptions()
	o.Replicas = 1
	res, err := Compare(w, []string{"round-robin"}, o)
	require.NoError(t, err)
	ceiling := workload.ReuseCeiling(w, o.Profile.BlockSize, 0)
	assert.Positive(t, ceiling.Rate)
	assert.InDelta(t, ceiling.Rate, res[0].CachedTokenRate, 1e-12)
}
