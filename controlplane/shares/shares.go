// Package shares is the control plane's fleet-wide view of the tenants' shares of
// admitted prefill: each proxy's leader posts the tokens its admission (shared/admit)
// admitted per tenant since its last post (api.SharesPath), Fleet adds them to decayed
// per-tenant totals (the time constant of admit.ShareWindow) and answers the totals, so
// every proxy holds a tenant to its weight's share of the whole fleet's tokens.
//
// Fleet is bounded whatever the proxies send: at most MaxTenants tenants (a new one takes
// the place of the one with the fewest recent tokens, counted as evicted), and a tenant
// whose total decayed below one token is dropped (counted as expired). A tenant is its
// api.TenantKey and a number: hashes and counts only.
package shares

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/prometheus/client_golang/prometheus"
)

// MaxTenants is the most tenants held: what one answer carries.
const MaxTenants = api.MaxSharesAnswer

// Counts are Fleet's counters by what happened to a tenant; nil ones are skipped.
type Counts struct {
	Added, Evicted, Expired prometheus.Counter
}

// Fleet is the fleet's decayed per-tenant totals. Its methods are safe for concurrent use.
type Fleet struct {
	counts  Counts
	mu      sync.Mutex
	tenants map[uint64]*total
}

type total struct {
	tokens float64 // decayed to at
	at     time.Time
}

// New makes an empty Fleet.
func New(c Counts) *Fleet { return &Fleet{counts: c, tenants: map[uint64]*total{}} }

func (t *total) decayed(now time.Time) float64 {
	dt := now.Sub(t.at)
	if dt <= 0 {
		return t.tokens
	}
	return t.tokens * math.Exp(-float64(dt)/float64(admit.ShareWindow))
}

// Add adds one post's entries (api.ParseShares) at now.
func (f *Fleet) Add(es []api.ShareEntry, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range es {
		t := f.tenants[e.Key]
		if t == nil {
			if len(f.tenants) >= MaxTenants {
				if f.expire(now); len(f.tenants) >= MaxTenants {
					f.evict(now)
				}
			}
			t = &total{at: now}
			f.tenants[e.Key] = t
			inc(f.counts.Added)
		}
		t.tokens = t.decayed(now) + float64(e.Tokens)
		if now.After(t.at) {
			t.at = now
		}
	}
}

// Answer appends the answer to a post: every tenant's total as of now.
func (f *Fleet) Answer(dst []byte, now time.Time) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(now)
	es := make([]api.ShareEntry, 0, len(f.tenants))
	for k, t := range f.tenants {
		es = append(es, api.ShareEntry{Key: k, Tokens: float32(t.decayed(now))})
	}
	return api.AppendShares(dst, es)
}

// expire drops the tenants whose total decayed below one token.
func (f *Fleet) expire(now time.Time) {
	for k, t := range f.tenants {
		if t.decayed(now) < 1 {
			delete(f.tenants, k)
			inc(f.counts.Expired)
		}
	}
}

func (f *Fleet) evict(now time.Time) {
	victim, least := uint64(0), math.Inf(1)
	for k, t := range f.tenants {
		if d := t.decayed(now); d < least {
			victim, least = k, d
		}
	}
	delete(f.tenants, victim)
	inc(f.counts.Evicted)
}

// Len is the number of tenants held.
func (f *Fleet) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.tenants)
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
