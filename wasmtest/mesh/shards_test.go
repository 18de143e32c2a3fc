package mesh_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// Sharded by model: engines for two models, one control plane per model
// watching only its model's engines, and the proxy's filter polling both (one shard per
// model). Each model's requests route on its own shard's table, and one control plane
// going down leaves the other model's routing as it was.

// shardState is what the control plane of model lists: its version and replicas.
func shardState(t *testing.T, m *mesh.Mesh, model string) (int64, map[string]debugReplica) {
	return stateAt(t, m.ShardURL(model))
}

// knownTo waits until model's control plane lists addr as holding text keys and the
// filter has that version of the model's shard, read by every proxy VM.
func knownTo(t *testing.T, m *mesh.Mesh, model, addr string) {
	t.Helper()
	var v int64
	waitFor(t, model+"'s control plane learns where the prefix is", func() bool {
		version, rs := shardState(t, m, model)
		v = version
		return rs[addr].TextKeys > 0
	})
	waitFor(t, "the filter has that version of the "+model+" shard", func() bool {
		return metric(m, "kvroute_shard_"+model+"_table_version") >= v
	})
	nextTicks(t, m)
}

func TestTwoControlPlanesEachModelRoutesOnItsOwnShard(t *testing.T) {
	const perModel = 3
	models := []string{"llama", "qwen"}
	m := start(t, mesh.Options{Models: models, Replicas: perModel})
	enginesOf := map[string]map[string]bool{}
	for i, e := range m.Engines {
		model := models[i/perModel]
		if enginesOf[model] == nil {
			enginesOf[model] = map[string]bool{}
		}
		enginesOf[model][e.Addr()] = true
	}
	// Each control plane is given only its model's engines.
	for _, model := range models {
		_, rs := shardState(t, m, model)
		addrs := map[string]bool{}
		for a := range rs {
			addrs[a] = true
		}
		assert.Equal(t, enginesOf[model], addrs, "%s's control plane watches %s's engines alone", model, model)
	}

	// Three prefixes per model, each placed once and learnt by its model's control plane.
	prompt := func(model string, c int) string { return mesh.SystemPrompt(c, 1500) + " (" + model + ")" }
	owners := map[string]map[int]string{}
	for _, model := range models {
		owners[model] = map[int]string{}
		for c := 60; c < 63; c++ {
			r := sendModel(t, m, model, prompt(model, c), "warm up")
			require.True(t, enginesOf[model][r.addr], "%s request served by %s, not one of its engines", model, r.addr)
			owners[model][c] = r.addr
		}
		for _, addr := range owners[model] {
			knownTo(t, m, model, addr)
		}
	}
	// hits sends a round of each prefix of model and counts the requests that went to
	// the prefix's owner and found it cached.
	hits := func(model, question string) (hit, total int) {
		for c, owner := range owners[model] {
			r := sendModel(t, m, model, prompt(model, c), question)
			require.True(t, enginesOf[model][r.addr], "%s request served by %s", model, r.addr)
			total++
			if r.addr == owner && r.CachedTokens > r.PromptTokens/2 {
				hit++
			}
		}
		return hit, total
	}
	for _, model := range models {
		h, n := hits(model, "first question")
		assert.Equal(t, n, h, "%s: every repeat on its prefix's owner", model)
	}
	assert.Zero(t, metric(m, "kvroute_unserved_model_total"))

	// The qwen control plane goes down: its shard goes stale, llama's does not.
	pollErrors := metric(m, "kvroute_shard_qwen_table_poll_errors_total")
	m.StopShard("qwen")
	t.Cleanup(func() { _ = m.StartShard("qwen") })
	waitFor(t, "the qwen shard's polls fail", func() bool {
		return metric(m, "kvroute_shard_qwen_table_poll_errors_total") > pollErrors
	})
	waitFor(t, "the qwen table goes stale (2 s guard)", func() bool {
		return metric(m, "kvroute_shard_qwen_table_age_ms") > 2200
	})
	assert.Less(t, metric(m, "kvroute_shard_llama_table_age_ms"), int64(1000), "llama's table is still confirmed current")
	assert.Zero(t, metric(m, "kvroute_shard_llama_table_poll_errors_total"))

	// llama: routed as before, on a fresh table that still learns new prefixes.
	stale := metric(m, "kvroute_stale_decisions_total")
	h, n := hits("llama", "during the qwen outage")
	assert.Equal(t, n, h, "llama's routing is untouched")
	assert.Equal(t, stale, metric(m, "kvroute_stale_decisions_total"), "llama is decided on a fresh table")
	r := sendModel(t, m, "llama", prompt("llama", 70), "a prefix new during the qwen outage")
	knownTo(t, m, "llama", r.addr)

	// qwen: still answered, on its last table (the stale regime keeps the prefix owners).
	h, n = hits("qwen", "during its own outage")
	assert.Equal(t, n, h, "qwen routes on its last table")
	assert.GreaterOrEqual(t, metric(m, "kvroute_stale_decisions_total")-stale, int64(n), "qwen is decided stale")
	t.Logf("qwen shard down %d ms: llama table age %d ms, %d poll errors on qwen, %d on llama", metric(m, "kvroute_shard_qwen_table_age_ms"),
		metric(m, "kvroute_shard_llama_table_age_ms"), metric(m, "kvroute_shard_qwen_table_poll_errors_total"),
		metric(m, "kvroute_shard_llama_table_poll_errors_total"))
}
