package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Past capacity (two replicas of docs/rule.md's seed-000 at 1.5x the rate they hold),
// kvroute with classes refuses sheddable and standard requests and never critical ones,
// and the critical class's TTFT p95 stays within its budget, far below where it goes
// when every request is admitted.
func TestSheddingKeepsCriticalWithinItsBudgetPastCapacity(t *testing.T) {
	w, o, ov := pastCapacity(t)
	admitAll, err := Compare(w, []string{"kvroute"}, o)
	require.NoError(t, err)
	o.KVRoute.Filter.Overload = ov
	shedding, err := Compare(w, []string{"kvroute"}, o)
	require.NoError(t, err)
	all, shed := admitAll[0], shedding[0]
	assert.Zero(t, all.Shed, "without classes nothing is shed")
	assert.Zero(t, class(t, shed, "critical").Shed, "critical is never shed")
	assert.Positive(t, class(t, shed, "sheddable").Shed)
	assert.Positive(t, class(t, shed, "standard").Shed)
	assert.Equal(t, shed.Shed, class(t, shed, "sheddable").Shed+class(t, shed, "standard").Shed)
	critical := class(t, shed, "critical")
	assert.LessOrEqual(t, critical.TTFTp95, critical.Budget, "critical within its budget")
	assert.Greater(t, class(t, all, "critical").TTFTp95, 2*critical.Budget, "which it is not when everything is admitted")
	t.Logf("critical p95 %v shedding, %v admitting all; shed %d of %d", critical.TTFTp95, class(t, all, "critical").TTFTp95,
		shed.Shed, w.Len())
}

// The compiled filter (kvroute-wasm, the classes in its plugin configuration, each
// request's class and tenant in headers) sheds as the Go mirror does.
func TestCompiledFilterShedsPastCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the filter for wasip1")
	}
	w, o, ov := pastCapacity(t)
	o.KVRoute.Filter.Overload = ov
	res, err := Compare(w, []string{kvroute.WasmName}, o)
	require.NoError(t, err)
	r := res[0]
	assert.Zero(t, class(t, r, "critical").Shed, "critical is never shed")
	assert.Positive(t, class(t, r, "sheddable").Shed)
	critical := class(t, r, "critical")
	assert.LessOrEqual(t, critical.TTFTp95, critical.Budget, "critical within its budget")
	t.Logf("critical p95 %v; shed %d of %d", critical.TTFTp95, r.Shed, w.Len())
}

// pastCapacity is two replicas of docs/rule.md's seed-000 at 1.5x the rate they hold,
// the mixed senders, and their classes.
func pastCapacity(t *testing.T) (workload.Workload, Options, api.Overload) {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = 40, 10, 90*time.Second
	base, err := workload.NewSeed(c)
	require.NoError(t, err)
	w, err := workload.NewMixed(base, workload.DefaultParts(), 1)
	require.NoError(t, err)
	o := DefaultOptions()
	o.Replicas, o.Warmup = 2, 30*time.Second
	ov := MixedOverload(o.Profile.PrefillSecondsPerToken())
	o.ClassBudgets = Budgets(&ov)
	return w, o, ov
}

func class(t *testing.T, r *sim.Result, name string) sim.ClassStats {
	for _, c := range r.Classes {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no class %q in %+v", name, r.Classes)
	return sim.ClassStats{}
}

// With each tenant's requests reaching its own proxy, no proxy sees the noisy tenant's
// share of the fleet (alone on its proxy, it is always within its share there): held to
// its weight only with the shares the proxies post to the control plane (api.SharesPath).
func TestFleetSharesHoldANoisyTenantAcrossProxies(t *testing.T) {
	w, o, ov := pastCapacity(t)
	o.KVRoute.Filter.Overload = ov
	o.Routers, o.PinTenants = 4, true
	noisy := func(perProxy bool) float64 {
		o.KVRoute.SharesPerProxy = perProxy
		res, err := Compare(w, []string{"kvroute"}, o)
		require.NoError(t, err)
		for _, ts := range res[0].Tenants {
			if ts.Name == "noisy" {
				return ts.Share
			}
		}
		t.Fatalf("no noisy tenant in %+v", res[0].Tenants)
		return 0
	}
	local, fleet := noisy(true), noisy(false)
	t.Logf("noisy's share of prefill: %.1f%% per proxy, %.1f%% with the fleet's shares", 100*local, 100*fleet)
	assert.Greater(t, local, 0.38, "per proxy: what it sends (40%%), less its wait refusals")
	assert.Less(t, fleet, local-0.05, "with the fleet's shares: held toward its weight (25%%)")
}
