package admit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/controlplane/shares"
	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
)

// A noisy tenant that spreads its requests over two proxies, each of which also serves one
// quiet tenant, has half of each proxy's tokens by its local view: held to a third of the
// fleet's (three tenants of weight 1) only when the proxies exchange their shares through
// the control plane.
func TestFleetSharesHoldATenantSpreadOverProxies(t *testing.T) {
	o := &api.Overload{Classes: []api.Class{{Name: "standard", TTFTBudgetMs: 10000}}, DefaultClass: "standard"}
	saturated := admit.Wait{Queue: 9, Total: 9, Fleet: 9}
	t0 := time.Unix(1000, 0)
	// run returns the noisy tenant's share of the tokens admitted over the last 20 s of 30.
	run := func(exchange bool) float64 {
		proxies := []*admit.Controller{admit.New(o), admit.New(o)}
		quiet := []string{"quiet-a", "quiet-b"}
		fleet := shares.New(shares.Counts{})
		var noisy, total float64
		for i := range 3000 {
			now := t0.Add(time.Duration(i) * 10 * time.Millisecond)
			for p, c := range proxies {
				if exchange && i%10 == 0 { // every 100 ms, as the leader polls
					fleet.Add(c.Pending(nil), now)
					es, err := api.ParseShares(nil, fleet.Answer(nil, now), api.MaxSharesAnswer)
					require.NoError(t, err)
					c.SetFleet(es, now)
				}
				for _, tenant := range []string{"noisy", "noisy", "noisy", "noisy", quiet[p]} {
					if v := c.Admit(0, 0, tenant, saturated, 8000, now); !v.Shed() && i >= 1000 {
						total += 8000
						if tenant == "noisy" {
							noisy += 8000
						}
					}
				}
			}
		}
		return noisy / total
	}
	assert.InDelta(t, 0.5, run(false), 0.03, "each proxy alone: half of its tokens")
	assert.InDelta(t, 1.0/3, run(true), 0.033, "with the fleet's shares: a third of the fleet's")
}

// Without an answer for admit.FleetFresh (a control plane that stopped answering, or one
// without api.SharesPath), a proxy judges by its own tokens again.
func TestStaleFleetSharesFallBackToTheLocalView(t *testing.T) {
	o := &api.Overload{Classes: []api.Class{{Name: "standard", TTFTBudgetMs: 10000}}, DefaultClass: "standard"}
	saturated := admit.Wait{Queue: 9, Total: 9, Fleet: 9}
	now := time.Unix(1000, 0)
	c := admit.New(o)
	c.Admit(0, 0, "noisy", saturated, 8000, now)
	c.Admit(0, 0, "quiet", saturated, 8000, now)
	// The fleet saw noisy take nearly everything elsewhere.
	c.SetFleet([]api.ShareEntry{{Key: api.TenantKey("noisy"), Tokens: 1e6}, {Key: api.TenantKey("quiet"), Tokens: 8000}}, now)
	assert.Equal(t, admit.ShedFairness, c.Admit(0, 0, "noisy", saturated, 8000, now).Reason, "fresh fleet view: over its share")
	later := now.Add(admit.FleetFresh + time.Millisecond)
	assert.Equal(t, admit.Admitted, c.Admit(0, 0, "noisy", saturated, 8000, later).Reason, "stale: this proxy's equal shares")
}
