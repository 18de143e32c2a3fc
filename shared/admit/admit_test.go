package admit

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

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
		wait   float64
		reason Reason
		retry  int
	}{
		{"unknown wait (no fresh state): admitted", 2, -1, Admitted, 0},
		{"sheddable within its limit", 2, 0.9, Admitted, 0},
		{"sheddable past its limit", 2, 1.5, ShedWait, 1},
		{"standard at the same wait is kept", 1, 1.5, Admitted, 0},
		{"standard past its limit, retry when the queue drains to it", 1, 4.2, ShedWait, 3},
		{"critical is never shed", 0, 100, Admitted, 0},
		{"retry-after is bounded", 2, 1000, ShedWait, maxRetryAfter},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			c := New(overload())
			v := c.Admit(k.class, "acme", k.wait, 1000, now)
			assert.Equal(t, k.reason, v.Reason)
			assert.Equal(t, k.retry, v.RetryAfter)
			assert.Equal(t, k.class, v.Class)
			assert.Equal(t, k.reason != Admitted, v.Shed())
		})
	}
}
