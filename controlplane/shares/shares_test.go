package shares

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func answer(t *testing.T, f *Fleet, now time.Time) map[uint64]float64 {
	t.Helper()
	es, err := api.ParseShares(nil, f.Answer(nil, now), api.MaxSharesAnswer)
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint64]float64{}
	for _, e := range es {
		m[e.Key] = float64(e.Tokens)
	}
	return m
}

// Two proxies' posts add up per tenant, and the totals decay with admit.ShareWindow.
func TestFleetAddsProxiesAndDecays(t *testing.T) {
	f := New(Counts{})
	t0 := time.Unix(1000, 0)
	noisy, quiet := api.TenantKey("noisy"), api.TenantKey("quiet")
	f.Add([]api.ShareEntry{{Key: noisy, Tokens: 6000}, {Key: quiet, Tokens: 2000}}, t0)
	f.Add([]api.ShareEntry{{Key: noisy, Tokens: 6000}}, t0)
	got := answer(t, f, t0)
	if got[noisy] != 12000 || got[quiet] != 2000 || len(got) != 2 {
		t.Fatalf("answer %v: want noisy 12000, quiet 2000", got)
	}
	later := t0.Add(admit.ShareWindow)
	got = answer(t, f, later)
	if want := 12000 / math.E; math.Abs(got[noisy]-want) > 1 {
		t.Fatalf("noisy after one window %v, want %v", got[noisy], want)
	}
}

// Whatever the proxies send, Fleet holds at most MaxTenants tenants: the one with the
// fewest recent tokens makes way (counted), and decayed tenants are dropped (counted).
func TestFleetBounded(t *testing.T) {
	evicted := prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"})
	expired := prometheus.NewCounter(prometheus.CounterOpts{Name: "expired"})
	f := New(Counts{Evicted: evicted, Expired: expired})
	t0 := time.Unix(1000, 0)
	heavy := api.TenantKey("heavy")
	f.Add([]api.ShareEntry{{Key: heavy, Tokens: 1e6}}, t0)
	for i := range 4 * MaxTenants {
		f.Add([]api.ShareEntry{{Key: uint64(i + 1), Tokens: 10}}, t0)
	}
	if f.Len() != MaxTenants {
		t.Fatalf("%d tenants held, want %d", f.Len(), MaxTenants)
	}
	if n := value(evicted); n != 3*MaxTenants+1 {
		t.Fatalf("%v evicted, want %d", n, 3*MaxTenants+1)
	}
	if got := answer(t, f, t0); got[heavy] != 1e6 {
		t.Fatalf("the heavy tenant was evicted: %v", got[heavy])
	}
	// Ten windows later the small tenants are below a token and dropped; heavy is not.
	got := answer(t, f, t0.Add(10*admit.ShareWindow))
	if len(got) != 1 || got[heavy] == 0 {
		t.Fatalf("after 10 windows %d tenants, heavy %v: want heavy alone", len(got), got[heavy])
	}
	if n := value(expired); n != MaxTenants-1 {
		t.Fatalf("%v expired, want %d", n, MaxTenants-1)
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
