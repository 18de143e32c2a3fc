package route

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdIn records that slot holds the chain's checkpoints in tier (0: GPU).
func holdIn(t *testing.T, m *table.Model, c Chain, slot uint32, tier int) {
	for _, k := range prefix.Checkpoints(nil, c.Keys, int(cfg.Stride)) {
		s := append([]uint32{table.Holder(slot, tier)}, m.Lookup(k)...)
		require.NoError(t, m.Set(k, s...))
	}
}

func TestCPUTierHitRoutesAtItsLoadCost(t *testing.T) {
	system := strings.Repeat("You are the ACME support assistant. ", 700) // ~6,300 tokens
	id := Identity{Model: "llama"}
	first := chainOf(t, chatBody(system, "Where is order 1?"), id)
	second := chainOf(t, chatBody(system, "Cancel order 2, please."), id)

	m := model(t, 3)
	require.NoError(t, m.SetTiers([]string{"CPU"}))
	holdIn(t, m, first, 0, 0) // replica 0: GPU, but 2,000 tokens deeper
	holdIn(t, m, first, 1, 1) // replica 1: CPU only; replica 2 cold
	m.Replicas[0].Queued = 2000
	now := time.Now()

	conf, err := api.ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"}}`))
	require.NoError(t, err)
	r := exactRouter()
	r.Config = conf
	d := r.Decide(m, &second, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.1:8000", d.Addrs[0], "the CPU holder loads for less than the owner's extra queue")
	assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.0:8000", "10.0.0.2:8000"}, d.Addrs)
	assert.Zero(t, d.PredictedCached, "nothing in GPU memory")
	offTokens := r.cands[1].Offloaded
	assert.Greater(t, offTokens, 5000.0)
	assert.InDelta(t, offTokens*api.DefaultCPULoadCost, r.cands[1].LoadCost, 1e-6)
	assert.InDelta(t, second.PromptTokens-offTokens+offTokens*api.DefaultCPULoadCost, d.Uncached, 1e-6)

	// A filter configured to ignore the tier (ratio 1), like one reading format 1, keeps
	// the request on the GPU owner, and the CPU holder ties with the cold replica.
	conf.Guards.OffloadCost["CPU"] = 1
	r = exactRouter()
	r.Config = conf
	d = r.Decide(m, &second, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0])

	// This proxy's own placement on the CPU holder covers the run: nothing left to load.
	conf.Guards.OffloadCost["CPU"] = api.DefaultCPULoadCost
	r = exactRouter()
	r.Config = conf
	r.Local.Add("llama", prefix.Checkpoints(nil, first.Keys, int(cfg.Stride)), "10.0.0.1:8000", now)
	r.Decide(m, &second, 50*time.Millisecond, now)
	assert.Zero(t, r.cands[1].Offloaded)
	assert.Greater(t, r.cands[1].Cached, 5000.0)
}

// Every replica of a model with a slower tier has its evictions priced at the tier's
// load cost (rule.Candidate.EvictCost); a model without one, or a filter that ignores
// the tier, prices them as prefills.
func TestEvictionsArePricedAtTheModelsTier(t *testing.T) {
	id := Identity{Model: "llama"}
	c := chainOf(t, chatBody(strings.Repeat("You are a careful assistant. ", 300), "Hello."), id)
	conf, err := api.ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"}}`))
	require.NoError(t, err)
	costs := func(m *table.Model) []float64 {
		r := exactRouter()
		r.Config = conf
		r.Decide(m, &c, 50*time.Millisecond, time.Now())
		var out []float64
		for _, cand := range r.cands {
			out = append(out, cand.EvictCost)
		}
		return out
	}

	m := model(t, 3)
	assert.Equal(t, []float64{0, 0, 0}, costs(m), "no tier: a prefill")
	require.NoError(t, m.SetTiers([]string{"disk", "CPU"}))
	conf.Guards.OffloadCost["disk"] = 0.2
	assert.Equal(t, []float64{api.DefaultCPULoadCost, api.DefaultCPULoadCost, api.DefaultCPULoadCost}, costs(m),
		"the cheapest tier, which the GPU's evictions reach first")
	conf.Guards.OffloadCost["CPU"] = 1
	conf.Guards.OffloadCost["disk"] = 1
	assert.Equal(t, []float64{1, 1, 1}, costs(m), "a filter that ignores the tiers")
	conf.Guards.OffloadCost["CPU"] = 0
	assert.Equal(t, []float64{minEvictCost, minEvictCost, minEvictCost}, costs(m), "loads that cost nothing, not a prefill")
}
