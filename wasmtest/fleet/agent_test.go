package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// On the agent workload every policy runs; those that cannot see which replica stored a
// Responses answer send its follow-ups where vLLM's in-memory store lacks it (not
// found), while kvroute, which learns each answer's replica, loses none and keeps the
// cached rate of the oracle, which sees the engines' caches.
func TestAgentFollowUpsNeedTheReplicaThatStoredTheResponse(t *testing.T) {
	w := tinyAgent(t)
	res, err := Compare(w, Policies, tinyOptions())
	require.NoError(t, err)
	byName := map[string]int{}
	for i, r := range res {
		byName[r.Policy] = i
		assert.Positive(t, r.FollowUps, r.Policy)
	}
	for _, name := range []string{"round-robin", "random", "chwbl", "weighted-scorers"} {
		assert.Positive(t, res[byName[name]].NotFound, "%s cannot see where the response is stored", name)
	}
	kv, oracle := res[byName["kvroute"]], res[byName["oracle"]]
	assert.Zero(t, kv.NotFound)
	assert.Zero(t, kv.Failed)
	assert.Equal(t, w.Len(), kv.Requests)
	assert.GreaterOrEqual(t, kv.CachedTokenRate, 0.97*oracle.CachedTokenRate)
	row := JSONRow(kv)
	assert.Equal(t, kv.FollowUps, row.FollowUps)
	require.NotNil(t, row.NotFound, "0 not found is written")
	assert.Zero(t, *row.NotFound)
}

func tinyAgent(t *testing.T) workload.Workload {
	c := workload.DefaultAgent()
	c.Rate, c.Duration, c.Think, c.Turns = 8, 40*time.Second, 5*time.Second, 5
	c.SystemTokens, c.FirstUserTokens, c.UserTokens, c.OutputTokens = 400, 200, 100, 20
	w, err := workload.NewAgent(c)
	require.NoError(t, err)
	return w
}

// With several proxies, a follow-up mostly reaches a proxy that did not forward the
// answer it names: the replica that stored it reaches that proxy through the control
// plane (the outcome report, then the other proxies' affinity polls), so none is lost,
// in the Go mirror and with the compiled filter polling the real control-plane server.
func TestAgentFollowUpsFindTheirReplicaThroughAnyProxy(t *testing.T) {
	w := tinyAgent(t)
	for _, routers := range []int{2, 8} {
		o := tinyOptions()
		o.Routers = routers
		names := []string{"kvroute"}
		if routers == 2 {
			names = append(names, kvroute.WasmName)
		}
		res, err := Compare(w, names, o)
		require.NoError(t, err)
		for _, r := range res {
			assert.Positive(t, r.FollowUps, "%s, %d proxies", r.Policy, routers)
			assert.Zero(t, r.NotFound, "%s, %d proxies", r.Policy, routers)
			assert.Equal(t, w.Len(), r.Requests, "%s, %d proxies", r.Policy, routers)
		}
	}
}
