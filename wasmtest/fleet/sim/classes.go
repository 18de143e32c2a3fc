package sim

import (
	"slices"
	"time"
)

// ClassStats are one priority class's measured requests.
type ClassStats struct {
	Name string
	// Arrived = Completed + Shed + Failed + those still running when the run ended.
	Arrived, Completed, Shed, Failed int
	TTFTp50, TTFTp95, TTFTp99        time.Duration
	Budget                           time.Duration
	// Goodput is the completed requests whose TTFT met Budget, per second of measured
	// arrivals.
	Goodput float64
}

// TenantStats are one tenant's completed requests' prefill: their prompt tokens the
// engines did not find cached.
type TenantStats struct {
	Name          string
	PrefillTokens int64
	// Share is PrefillTokens over every tenant's.
	Share float64
}

// byClass splits the measured requests by class and by tenant.
func (r *runner) byClass() ([]ClassStats, []TenantStats) {
	var classes []ClassStats
	var ttfts [][]time.Duration
	var tenants []TenantStats
	var total int64
	from, to := time.Duration(-1), time.Duration(0)
	for i := range r.recs {
		rec := &r.recs[i]
		if !rec.measured {
			continue
		}
		if from < 0 {
			from = rec.at
		}
		to = rec.at
		k := slices.IndexFunc(classes, func(c ClassStats) bool { return c.Name == rec.class })
		if k < 0 {
			k = len(classes)
			classes = append(classes, ClassStats{Name: rec.class, Budget: r.cfg.ClassBudgets[rec.class]})
			ttfts = append(ttfts, nil)
		}
		c := &classes[k]
		c.Arrived++
		switch rec.state {
		case done:
			c.Completed++
			ttft := rec.first - rec.at
			ttfts[k] = append(ttfts[k], ttft)
			if c.Budget <= 0 || ttft <= c.Budget {
				c.Goodput++
			}
			j := slices.IndexFunc(tenants, func(t TenantStats) bool { return t.Name == rec.tenant })
			if j < 0 {
				j = len(tenants)
				tenants = append(tenants, TenantStats{Name: rec.tenant})
			}
			tenants[j].PrefillTokens += int64(rec.prompt - rec.cached)
			total += int64(rec.prompt - rec.cached)
		case shed:
			c.Shed++
		case failed:
			c.Failed++
		}
	}
	span := (to - from).Seconds()
	for k := range classes {
		c := &classes[k]
		slices.Sort(ttfts[k])
		c.TTFTp50, c.TTFTp95, c.TTFTp99 = Quantile(ttfts[k], 0.50), Quantile(ttfts[k], 0.95), Quantile(ttfts[k], 0.99)
		if span > 0 {
			c.Goodput /= span
		}
	}
	for j := range tenants {
		if total > 0 {
			tenants[j].Share = float64(tenants[j].PrefillTokens) / float64(total)
		}
	}
	return classes, tenants
}
