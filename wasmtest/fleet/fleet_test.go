package fleet

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

func tinyOptions() Options {
	o := DefaultOptions()
	o.Profile = timing.Fast()
	o.Replicas = 3
	return o
}

func tinySeed(t *testing.T) workload.Workload {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = 10, 20, 10*time.Second
	c.PromptTokens, c.PrefixTokens, c.OutputTokens = 800, 600, 30
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	return w
}

func TestCompareRunsEveryPolicyOnTheSameArrivals(t *testing.T) {
	w := tinySeed(t)
	res, err := Compare(w, Policies, tinyOptions())
	require.NoError(t, err)
	require.Len(t, res, len(Policies))
	for i, r := range res {
		assert.Equal(t, Policies[i], r.Policy, "results in the order asked")
		assert.Equal(t, w.Len(), r.Requests, "%s served every request", r.Policy)
		assert.Equal(t, 3, r.Replicas)
	}
	// Cache-aware policies find the prefixes; round robin over 3 replicas with 10
	// customers keeps most of them too (they fit), so only check the aware ones.
	for _, name := range []string{"chwbl", "sglang-cache-aware", "weighted-scorers", "kvroute", "oracle"} {
		r := res[slices.Index(Policies, name)]
		assert.Greater(t, r.CachedTokenRate, 0.6, name)
	}
}

func TestCompareIsDeterministic(t *testing.T) {
	w := tinySeed(t)
	o := tinyOptions()
	a, err := Compare(w, []string{"kvroute", "random"}, o)
	require.NoError(t, err)
	o.Parallel = 1
	b, err := Compare(w, []string{"kvroute", "random"}, o)
	require.NoError(t, err)
	for i := range a {
		a[i].Wall, b[i].Wall = 0, 0
		a[i].RuleSpillRate, b[i].RuleSpillRate = 0, 0
		assert.Equal(t, a[i], b[i], "same seed, same numbers, whatever the parallelism")
	}
}

// TestPolicySeedDrawsOnlyTheTies: --policy-seed routes the same arrivals with another
// draw of the policies' random sources; a policy without one is untouched, and the
// arrivals' own seed as the policy seed is the default run.
func TestPolicySeedDrawsOnlyTheTies(t *testing.T) {
	w := tinySeed(t)
	names := []string{"random", "round-robin"}
	o := tinyOptions()
	base, err := Compare(w, names, o)
	require.NoError(t, err)
	o.PolicySeed = o.Seed
	same, err := Compare(w, names, o)
	require.NoError(t, err)
	o.PolicySeed = o.Seed + 1
	other, err := Compare(w, names, o)
	require.NoError(t, err)
	for _, rs := range [][]*sim.Result{base, same, other} {
		for _, r := range rs {
			r.Wall, r.RuleSpillRate = 0, 0 // NaN for a policy without the rule
		}
	}
	assert.Equal(t, base, same, "the arrivals' seed as the policy seed is the default")
	assert.Equal(t, base[1], other[1], "round robin draws nothing: the arrivals and engines are the same")
	assert.Equal(t, base[0].Requests, other[0].Requests)
	assert.NotEqual(t, base[0].TTFT, other[0].TTFT, "random placement is drawn again")
}

func TestBisect(t *testing.T) {
	cases := []struct {
		name          string
		guess, answer int
		want          int
	}{
		{"guess above", 22, 14, 14},
		{"guess below", 22, 45, 45},
		{"guess exact", 17, 17, 17},
		{"one replica", 8, 1, 1},
		{"never", 8, SearchLimit + 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, runs := 0, 0
			err := bisect(c.guess, func(n int) (bool, error) { runs++; return n >= c.answer, nil }, func(n int) { got = n })
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			assert.LessOrEqual(t, runs, 22)
		})
	}
}

func TestJSONSchema(t *testing.T) {
	w := tinySeed(t)
	res, err := Compare(w, []string{"oracle"}, tinyOptions())
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, "seed", 3, res))
	var doc map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &doc))
	assert.Equal(t, "seed", doc["workload"])
	assert.Equal(t, 3.0, doc["replicas"])
	row := doc["policies"].([]any)[0].(map[string]any)
	var keys []string
	for k := range row {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	assert.Equal(t, []string{"cached_token_rate", "e2e_p50_s", "max_mean_queue", "name", "preemptions", "requests",
		"spill_rate", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s"}, keys, "the issue's schema")
	assert.Equal(t, "oracle", row["name"])
}

func TestWriteTable(t *testing.T) {
	w := tinySeed(t)
	res, err := Compare(w, []string{"round-robin", "kvroute"}, tinyOptions())
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteTable(&buf, res))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	for _, col := range []string{"requests", "cached", "TTFT p50 s", "p95 s", "p99 s", "e2e p50 s", "max/mean Q", "spill", "preempt"} {
		assert.Contains(t, lines[0], col)
	}
	assert.Contains(t, lines[2], "kvroute")
}

func TestParsePolicies(t *testing.T) {
	all, err := ParsePolicies("all")
	require.NoError(t, err)
	assert.Equal(t, Policies, all)
	two, err := ParsePolicies("kvroute, oracle,kvroute")
	require.NoError(t, err)
	assert.Equal(t, []string{"kvroute", "oracle"}, two)
	more, err := ParsePolicies("all," + kvroute.WasmName)
	require.NoError(t, err)
	assert.Equal(t, append(slices.Clone(Policies), kvroute.WasmName), more)
	_, err = ParsePolicies("kvroute,nope")
	assert.ErrorContains(t, err, "nope")
}
