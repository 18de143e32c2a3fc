package kvroute_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Replicas with a CPU tier, prefixes that do not fit their GPU memory: kvroute, whose
// table carries the CPU tier, routes more of them to where they can be loaded than
// kvroute reading GPU holders only (table format 1).
func TestCPUTierHitsCountWhenTheTableCarriesThem(t *testing.T) {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = 300, 20, 60*time.Second
	c.PromptTokens, c.PrefixTokens, c.OutputTokens = 800, 600, 50
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	runTier := func(gpuOnly bool) *sim.Result {
		cfg := kvroute.DefaultConfig()
		cfg.GPUOnly = gpuOnly
		res, err := sim.Run(sim.Config{Replicas: 2, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1,
			Warmup: 20 * time.Second, CPUTierTokens: 400_000, CPULoadPerToken: time.Microsecond},
			func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
				return kvroute.New(f, routerOf, cfg)
			})
		require.NoError(t, err)
		return res
	}
	tiered, gpuOnly := runTier(false), runTier(true)
	t.Logf("tiered: cached %.3f (CPU %.3f); GPU only: cached %.3f (CPU %.3f)", tiered.CachedTokenRate, tiered.CPUTokenRate,
		gpuOnly.CachedTokenRate, gpuOnly.CPUTokenRate)
	assert.Positive(t, tiered.CPUTokenRate, "hits loaded from CPU memory")
	assert.Greater(t, tiered.CachedTokenRate, gpuOnly.CachedTokenRate)
	assert.Greater(t, tiered.CPUTokenRate, gpuOnly.CPUTokenRate)
}
