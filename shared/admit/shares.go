package admit

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/shared/api"
)

// Tenant shares: each tenant's prefill tokens this proxy admitted, decayed with a time
// constant of ShareWindow, so a share is of the last several seconds' work. Only tenant
// names are kept (never prompt text), at most maxTenants of them.
const (
	ShareWindow = 10 * time.Second
	maxTenants  = 256
	// activeShare: a tenant with less than this share of the recent tokens is idle and
	// leaves its weight to the others.
	activeShare = 0.01
)

type tenantShare struct {
	tokens float64 // decayed to at
	at     time.Time
}

type shares struct {
	weights map[string]float64
	tenants map[string]*tenantShare
	total   tenantShare
}

func (s *shares) init(o *api.Overload) {
	s.weights = o.TenantWeights
	s.tenants = make(map[string]*tenantShare)
}

func (s *shares) weight(tenant string) float64 {
	if w, ok := s.weights[tenant]; ok {
		return w
	}
	return api.DefaultWeight
}

// decayed is ts's tokens as of now.
func decayed(ts *tenantShare, now time.Time) float64 {
	dt := now.Sub(ts.at)
	if dt <= 0 {
		return ts.tokens
	}
	return ts.tokens * math.Exp(-float64(dt)/float64(ShareWindow))
}

func (ts *tenantShare) add(tokens float64, now time.Time) {
	ts.tokens = decayed(ts, now) + tokens
	if now.After(ts.at) {
		ts.at = now
	}
}

// over reports whether tenant's share of the recent admitted tokens is above its
// weight's share among the active tenants (itself included). A tenant at or below its
// share is admitted whatever the size of the request, so no one waits for the others.
func (s *shares) over(tenant string, now time.Time) bool {
	total := decayed(&s.total, now)
	if total <= 0 {
		return false
	}
	mine := 0.0
	if ts := s.tenants[tenant]; ts != nil {
		mine = decayed(ts, now)
	}
	w := s.weight(tenant)
	weights := w
	for name, ts := range s.tenants {
		if name != tenant && decayed(ts, now) >= activeShare*total {
			weights += s.weight(name)
		}
	}
	return mine/total > w/weights
}

// add counts tokens admitted for tenant. A new tenant past maxTenants takes the place of
// the one with the fewest recent tokens.
func (s *shares) add(tenant string, tokens float64, now time.Time) {
	s.total.add(tokens, now)
	ts := s.tenants[tenant]
	if ts == nil {
		if len(s.tenants) >= maxTenants {
			s.evict(now)
		}
		ts = &tenantShare{at: now}
		s.tenants[tenant] = ts
	}
	ts.add(tokens, now)
}

func (s *shares) evict(now time.Time) {
	victim, least := "", math.Inf(1)
	for name, ts := range s.tenants {
		if d := decayed(ts, now); d < least {
			victim, least = name, d
		}
	}
	delete(s.tenants, victim)
}

// Share is tenant's share of the recent admitted tokens (for tests and the simulator).
func (c *Controller) Share(tenant string, now time.Time) float64 {
	total := decayed(&c.shares.total, now)
	ts := c.shares.tenants[tenant]
	if total <= 0 || ts == nil {
		return 0
	}
	return decayed(ts, now) / total
}
