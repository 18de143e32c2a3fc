package admit

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
)

func overload() *api.Overload {
	return &api.Overload{
		Classes: []api.Class{
			{Name: "critical", TTFTBudgetMs: 3000, Critical: true},
			{Name: "standard", TTFTBudgetMs: 10000},
			{Name: "sheddable", TTFTBudgetMs: 60000},
		},
		ClassHeader:            "x-class",
		DefaultClass:           "standard",
		TenantClasses:          map[string]string{"batch": "sheddable"},
		TenantWeights:          map[string]float64{"big": 2},
		PrefillTokensPerSecond: 10000,
	}
}

func TestOffWithoutClasses(t *testing.T) {
	assert.Nil(t, New(&api.Overload{}))
}

func TestLimitsShedTheLowerClassesFirst(t *testing.T) {
	l := Limits(overload())
	assert.True(t, math.IsInf(l[0], 1), "critical: never")
	assert.InDelta(t, 2.0, l[1], 1e-9, "standard: 2/3 of critical's 3 s budget, below its own 10 s")
	assert.InDelta(t, 1.0, l[2], 1e-9, "sheddable: 1/3 of the strictest budget above it")
	o := overload()
	o.Classes[2].ShedAboveMs = 500
	assert.InDelta(t, 0.5, Limits(o)[2], 1e-9, "shed_above_ms overrides")
}

func TestAdmitShedsByClassAndNeverCritical(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name   string
		class  int
		wait   Wait
		reason Reason
		retry  int
	}{
		{"unknown wait (no fresh state): admitted", 2, Wait{-1, -1, -1}, Admitted, 0},
		{"a long queue on the pick alone is not saturation", 2, Wait{5, 6, 0.4}, Admitted, 0},
		{"sheddable within its limit", 2, Wait{0.9, 1.5, 0.9}, Admitted, 0},
		{"sheddable past its limit", 2, Wait{1.5, 2, 1.5}, ShedWait, 1},
		{"standard at the same queue is kept", 1, Wait{1.5, 2, 1.5}, Admitted, 0},
		{"standard past its limit, retry when the queue drains to it", 1, Wait{4.2, 5, 4.2}, ShedWait, 3},
		{"standard whose own prefill misses its budget", 1, Wait{1, 10.5, 1}, ShedWait, 1},
		{"critical is never shed", 0, Wait{100, 100, 100}, Admitted, 0},
		{"retry-after is bounded", 2, Wait{1000, 1000, 1000}, ShedWait, maxRetryAfter},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			c := New(overload())
			v := c.Admit(1, k.class, "acme", k.wait, 1000, now)
			assert.Equal(t, k.reason, v.Reason)
			assert.Equal(t, k.retry, v.RetryAfter)
			assert.Equal(t, k.class, v.Class)
			assert.Equal(t, k.reason != Admitted, v.Shed())
		})
	}
}

// First bytes that come three times later than predicted scale the predictions by three:
// a queue the raw estimate admits is then refused. Early ones do not scale them down
// past minScale.
func TestObservedFirstBytesCalibrateTheWaits(t *testing.T) {
	now := time.Unix(1000, 0)
	within := Wait{0.6, 0.8, 0.6} // sheddable's limit is 1 s
	cases := []struct {
		name     string
		observed float64 // first byte / predicted Total
		scale    float64
		reason   Reason
	}{
		{"as predicted", 1, 1, Admitted},
		{"three times later", 3, 3, ShedWait},
		{"sooner than predicted, bounded", 0.1, minScale, Admitted},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			c := New(overload())
			for i := range 20 * calibrationSamples {
				at := now.Add(time.Duration(i) * time.Second)
				w := Wait{0.1, 0.5, 0.1} // not saturated: admitted
				require.False(t, c.Admit(uint64(i+1), 1, "acme", w, 10, at).Shed())
				c.Started(uint64(i+1), at.Add(time.Duration(k.observed*w.Total*float64(time.Second))))
			}
			assert.InDelta(t, k.scale, c.Scale(), 0.01)
			assert.Equal(t, k.reason, c.Admit(1<<40, 2, "acme", within, 10, now.Add(time.Hour)).Reason)
		})
	}
}

func TestPendingPredictionsAreBounded(t *testing.T) {
	c := New(overload())
	now := time.Unix(1000, 0)
	for i := range 3 * maxPending {
		c.Admit(uint64(i+1), 1, "acme", Wait{0.1, 0.5, 0.1}, 10, now) // never started
	}
	assert.LessOrEqual(t, len(c.cal.pending), maxPending)
}

// A tenant sending ten times the others' tokens is held to its weight's share of the
// admitted tokens while the fleet is saturated, and not at all while it is not.
func TestFairnessHoldsATenantToItsWeightInTokens(t *testing.T) {
	now := time.Unix(1000, 0)
	// Standard's limit is 2 s, the lowest 1 s: saturated past a mean queue of 0.5 s.
	saturated, calm := Wait{1.5, 1.5, 1.5}, Wait{0.4, 0.4, 0.4}
	// run returns each tenant's share of the tokens admitted over the last 20 s of 30.
	run := func(wait Wait) map[string]float64 {
		c := New(overload())
		admitted := map[string]float64{}
		total := 0.0
		send := func(tenant string, at time.Time, measure bool) {
			if v := c.Admit(0, 1, tenant, wait, 100_000, at); !v.Shed() && measure {
				admitted[tenant] += 100_000 // few huge prompts count as many tokens
				total += 100_000
			}
		}
		for i := range 3000 {
			at, measure := now.Add(time.Duration(i)*10*time.Millisecond), i >= 1000
			for range 10 {
				send("noisy", at, measure)
			}
			send("quiet", at, measure)
			send("big", at, measure)
			send("big", at, measure)
		}
		for k := range admitted {
			admitted[k] /= total
		}
		return admitted
	}
	share := run(saturated)
	assert.InDelta(t, 0.25, share["noisy"], 0.025, "weights noisy 1, quiet 1, big 2: noisy's share is a quarter")
	assert.InDelta(t, 0.5, share["big"], 0.05)
	share = run(calm)
	assert.InDelta(t, 10.0/13, share["noisy"], 0.01, "below saturation nobody is held back")
}

// Shedding keeps the fleet at the edge of saturation: with fairness_hold_ms, fairness
// holds that long after the last saturated request, or a tenant admitted freely between
// those moments takes what it sends; without it, only while saturated.
func TestFairnessHoldsBetweenSaturatedMoments(t *testing.T) {
	now := time.Unix(1000, 0)
	saturated, calm := Wait{1.5, 1.5, 1.5}, Wait{0.4, 0.4, 0.4}
	o := overload()
	o.FairnessHoldMs = 3000
	c := New(o)
	for i := range 100 { // noisy takes every token for 10 s: far above its share
		at := now.Add(time.Duration(i) * 100 * time.Millisecond)
		require.False(t, c.Admit(0, 1, "noisy", calm, 100_000, at).Shed(), "calm: nobody is held back")
		require.False(t, c.Admit(0, 1, "quiet", calm, 10_000, at).Shed())
	}
	now = now.Add(10 * time.Second)
	v := c.Admit(0, 1, "noisy", saturated, 100_000, now)
	assert.Equal(t, ShedFairness, v.Reason, "saturated: held to its share")
	v = c.Admit(0, 1, "noisy", calm, 100_000, now.Add(2*time.Second))
	assert.Equal(t, ShedFairness, v.Reason, "2 s after the fleet was saturated: still held")
	assert.False(t, c.Admit(0, 1, "quiet", calm, 10_000, now.Add(2*time.Second)).Shed(), "a tenant under its share is not")
	v = c.Admit(0, 1, "noisy", calm, 100_000, now.Add(4*time.Second))
	assert.Equal(t, Admitted, v.Reason, "past the hold: admitted")

	c = New(overload())
	for i := range 100 {
		at := now.Add(time.Duration(i) * 100 * time.Millisecond)
		c.Admit(0, 1, "noisy", calm, 100_000, at)
		c.Admit(0, 1, "quiet", calm, 10_000, at)
	}
	now = now.Add(10 * time.Second)
	assert.Equal(t, ShedFairness, c.Admit(0, 1, "noisy", saturated, 100_000, now).Reason)
	assert.Equal(t, Admitted, c.Admit(0, 1, "noisy", calm, 100_000, now.Add(100*time.Millisecond)).Reason,
		"without a hold: admitted as soon as the fleet is not saturated")
}

func TestSharesKeepAtMostMaxTenants(t *testing.T) {
	c := New(overload())
	now := time.Unix(1000, 0)
	for i := range 3 * maxTenants {
		c.Admit(0, 1, string(rune('a'+i%26))+string(rune(i)), Wait{1, 1, 1}, 10, now)
	}
	require.Len(t, c.shares.tenants, maxTenants)
}
