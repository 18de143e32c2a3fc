package kvroute

import (
	"time"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
)

// Proxy is what one Envoy's kvroute filter holds in the simulation: the router, its
// table and when that table was last confirmed current. Policy drives one per proxy;
// filter/'s parity test drives one beside the filter itself.
type Proxy struct {
	rt        *route.Router
	t         *table.Table
	confirmed time.Time
	stats     *Stats
}

// NewProxy returns a proxy with filter configuration cfg, rule parameters rp and
// tie-breaking seed; it counts into stats (its own when nil).
func NewProxy(cfg api.Config, rp rule.Params, seed uint64, stats *Stats) *Proxy {
	if stats == nil {
		stats = &Stats{}
	}
	rt := route.NewRouter(rp, seed)
	rt.Config = cfg
	rt.Admit = admit.New(&rt.Config.Overload) // as filter/main.go: nil without classes
	return &Proxy{rt: rt, t: table.New(), stats: stats}
}

// Load replaces the proxy's table, confirmed current at confirmed.
func (x *Proxy) Load(t *table.Table, confirmed time.Time) { x.t, x.confirmed = t, confirmed }

// Router is the proxy's router (its ledger, for responses).
func (x *Proxy) Router() *route.Router { return x.rt }

// Stats are what the proxy counted.
func (x *Proxy) Stats() *Stats { return x.stats }

// Route is the filter's request path (filter/request.go decide): route.Router.Route on
// the proxy's table, counted as the filter counts it.
func (x *Proxy) Route(req *route.Request, now time.Time) (route.Decision, route.Result) {
	d, res := x.rt.Route(x.t, req, now.Sub(x.confirmed), now)
	st := x.stats
	if res.Oversized {
		st.Oversized++
	}
	if res.ParseError != nil {
		st.ParseErrors++
	}
	if res.Verdict.Shed() {
		st.Shed++ // the filter's kvroute_shed_<class>_<reason>_total
		return d, res
	}
	if res.Body != nil {
		st.SaltInjected++
	}
	switch res.Follow {
	case route.Followed:
		st.Followed++
	case route.FollowLost:
		st.FollowLost++
	}
	switch res.Action {
	case route.Unrouted:
		st.Unrouted++
	case route.NoPrompt:
		st.Fallbacks++
	case route.Placed:
		st.Decisions++
		if d.PredictedCached > 0 {
			st.PredictedHits++
		}
		if d.Spill {
			st.Spills++
		}
		if d.Fallback {
			st.Fallbacks++
		}
		if d.Stale {
			st.StaleDecisions++
		}
	}
	return d, res
}
