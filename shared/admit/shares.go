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
	// FleetFresh is how long the control plane's fleet-wide totals (SetFleet) stand in for
	// this proxy's own: past it (the control plane stopped answering, or predates
	// api.SharesPath) shares are of this proxy's tokens alone.
	FleetFresh = ShareWindow / 4
)

type tenantShare struct {
	tokens float64 // decayed to at
	at     time.Time
}

type shares struct {
	weights map[string]float64
	tenants map[string]*tenantShare
	total   tenantShare

	// The fleet's view: the control plane's totals by api.TenantKey as of fleetAt, and
	// this proxy's tokens admitted since its last post (pending, at most api.MaxSharePost
	// tenants; a tenant past them is counted in pendingDropped).
	keyWeights     map[uint64]float64
	fleet          map[uint64]float64
	fleetTotal     float64
	fleetAt        time.Time
	pending        map[uint64]float64
	pendingTotal   float64
	pendingDropped uint64
}

func (s *shares) init(o *api.Overload) {
	s.weights = o.TenantWeights
	s.tenants = make(map[string]*tenantShare)
	s.keyWeights = make(map[uint64]float64, len(o.TenantWeights))
	for name, w := range o.TenantWeights {
		s.keyWeights[api.TenantKey(name)] = w
	}
	s.fleet = make(map[uint64]float64)
	s.pending = make(map[uint64]float64)
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
	if dt := now.Sub(s.fleetAt); !s.fleetAt.IsZero() && dt <= FleetFresh {
		return s.overFleet(tenant, now)
	}
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

// overFleet is over with the fleet's totals and this proxy's tokens since it posted.
func (s *shares) overFleet(tenant string, now time.Time) bool {
	k := math.Exp(-float64(max(now.Sub(s.fleetAt), 0)) / float64(ShareWindow))
	total := s.fleetTotal*k + s.pendingTotal
	if total <= 0 {
		return false
	}
	key := api.TenantKey(tenant)
	mine := s.fleet[key]*k + s.pending[key]
	w := s.weight(tenant)
	weights := w
	for other, tokens := range s.fleet {
		if other != key && tokens*k+s.pending[other] >= activeShare*total {
			weights += s.keyWeight(other)
		}
	}
	return mine/total > w/weights
}

func (s *shares) keyWeight(key uint64) float64 {
	if w, ok := s.keyWeights[key]; ok {
		return w
	}
	return api.DefaultWeight
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
	key := api.TenantKey(tenant)
	if _, ok := s.pending[key]; !ok && len(s.pending) >= api.MaxSharePost {
		s.pendingDropped++
		return
	}
	s.pending[key] += tokens
	s.pendingTotal += tokens
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

// Pending appends to dst the prefill tokens admitted per tenant since the last call, and
// starts counting anew: what the leader posts to the control plane (api.SharesPath).
func (c *Controller) Pending(dst []api.ShareEntry) []api.ShareEntry {
	s := &c.shares
	for key, tokens := range s.pending {
		dst = append(dst, api.ShareEntry{Key: key, Tokens: float32(tokens)})
	}
	clear(s.pending)
	s.pendingTotal = 0
	return dst
}

// PendingDropped is how many tenants' admitted tokens were left out of the posts: past
// api.MaxSharePost tenants in one interval.
func (c *Controller) PendingDropped() uint64 { return c.shares.pendingDropped }

// SetFleet takes the control plane's answer to a post (the fleet's totals, this proxy's
// posted tokens included) at now: for FleetFresh, a tenant is held to its weight's share
// of the fleet's tokens rather than of this proxy's.
func (c *Controller) SetFleet(es []api.ShareEntry, now time.Time) {
	s := &c.shares
	clear(s.fleet)
	s.fleetTotal = 0
	for _, e := range es {
		s.fleet[e.Key] += float64(e.Tokens)
		s.fleetTotal += float64(e.Tokens)
	}
	s.fleetAt = now
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
