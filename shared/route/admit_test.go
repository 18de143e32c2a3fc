package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
)

// admitRouter is a router with three classes: critical (2 s), standard (6 s) and
// sheddable (60 s), whose shed limits are 2/3 x 2 s and 1/3 x 2 s, at 10,000 tokens/s.
func admitRouter() *Router {
	r := exactRouter()
	r.Config.Overload = api.Overload{
		Classes: []api.Class{
			{Name: "critical", TTFTBudgetMs: 2000, Critical: true},
			{Name: "standard", TTFTBudgetMs: 6000},
			{Name: "sheddable", TTFTBudgetMs: 60000},
		},
		ClassHeader: "x-class", DefaultClass: "standard", PrefillTokensPerSecond: 10_000,
	}
	r.Admit = admit.New(&r.Config.Overload)
	return r
}

// Route refuses a placed request whose predicted wait on the pick, (Q + U) at the
// table's speed or the configured rate, is past its class's limit; a refused request
// leaves nothing in the ledger or in the local placements, and critical requests and
// requests without fresh state are never refused.
func TestRouteShedsByThePredictedWait(t *testing.T) {
	body := chatBody(strings.Repeat("You are a careful assistant. ", 100), "hi") // ~760 tokens
	cases := []struct {
		name     string
		class    string
		queued   uint64 // on every replica
		speed    uint32
		tableAge time.Duration
		want     admit.Reason
	}{
		{"an empty fleet admits the lowest class", "sheddable", 0, 0, 0, admit.Admitted},
		{"sheddable past 0.67 s of queue on the pick at 10,000 tokens/s", "sheddable", 8_000, 0, 0, admit.ShedWait},
		{"standard is kept at the same queue", "standard", 8_000, 0, 0, admit.Admitted},
		{"standard past 1.33 s of queue", "standard", 14_000, 0, 0, admit.ShedWait},
		{"the table's speed wins over the configured rate", "standard", 14_000, 20_000, 0, admit.Admitted},
		{"critical is never shed", "critical", 1_000_000, 0, 0, admit.Admitted},
		{"stale state (no queue numbers) is never shed", "sheddable", 1_000_000, 0, 5 * time.Second, admit.Admitted},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := model(t, 3)
			for i := range m.Replicas {
				m.Replicas[i].Queued, m.Replicas[i].Speed = c.queued, c.speed
			}
			r := admitRouter()
			now := time.Now()
			d, res := r.Route(tableOf(m), &Request{ID: 1, Schema: prompt.Chat, Body: body, Class: c.class}, c.tableAge, now)
			assert.Equal(t, c.want, res.Verdict.Reason)
			assert.Equal(t, r.Config.Overload.ClassIndex(c.class), res.Verdict.Class)
			if c.want == admit.Admitted {
				require.Equal(t, Placed, res.Action)
				return
			}
			assert.Empty(t, d.Addrs, "a refused request goes nowhere")
			assert.GreaterOrEqual(t, res.Verdict.RetryAfter, 1)
			for i := range m.Replicas {
				_, pending := r.Ledger.Sums(m.Replicas[i].Addr, now.Add(-time.Second))
				assert.Zero(t, pending, "nothing in the ledger")
			}
			assert.Zero(t, r.Local.Len(), "nothing in the local placements")
		})
	}
}

// A request that cannot be placed is never refused for it: no table, or no prompt.
func TestRouteAdmitsWhatItCannotPlace(t *testing.T) {
	r := admitRouter()
	_, res := r.Route(nil, &Request{ID: 1, Schema: prompt.Chat, Body: chatBody("s", "q"), Class: "sheddable"}, 0, time.Now())
	assert.Equal(t, Unrouted, res.Action)
	assert.False(t, res.Verdict.Shed())

	m := model(t, 3)
	for i := range m.Replicas {
		m.Replicas[i].Queued = 1_000_000
	}
	_, res = r.Route(tableOf(m), &Request{ID: 2, Schema: prompt.Chat, Body: []byte(`{"model":"llama"}`), Class: "sheddable"}, 0, time.Now())
	assert.Equal(t, NoPrompt, res.Action)
	assert.False(t, res.Verdict.Shed())

}

// A placed request's first byte (Router.Started) calibrates the admission's waits.
func TestStartedCalibratesTheAdmission(t *testing.T) {
	m := model(t, 3)
	r := admitRouter()
	now := time.Now()
	for i := range 200 {
		at := now.Add(time.Duration(i) * time.Second)
		_, res := r.Route(tableOf(m), &Request{ID: uint64(i + 1), Schema: prompt.Chat, Body: chatBody("s", fmt.Sprint("q", i))}, 0, at)
		require.Equal(t, Placed, res.Action)
		r.Started(uint64(i+1), at.Add(2*time.Second)) // far later than a prompt of a few tokens on an idle fleet
	}
	assert.Greater(t, r.Admit.Scale(), 10.0)
}
