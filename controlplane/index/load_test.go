package index

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/scrape"
)

// A replica's table entry carries its load: the requests it ran and the share of recent
// time it had prefill waiting (10 s time-weighted averages of its scrapes, from idle
// before the first), and the mean prompt tokens it prefills for a request.
func TestTableCarriesEachReplicasLoad(t *testing.T) {
	ix := fixture(t, Config{DefaultUncachedTokens: 1500})
	now := t0
	scrapeA := func(queued float64) {
		ix.ApplyScrape("a", scrape.Sample{Running: 12, Waiting: 1, QueuedTokens: queued, HasQueuedTokens: true}, nil, now)
		ix.ApplyScrape("b", scrape.Sample{}, nil, now)
		now = now.Add(100 * time.Millisecond)
	}
	for range 100 { // 10 s with prefill waiting
		scrapeA(4000)
	}
	for range 100 { // then 10 s without
		scrapeA(0)
	}
	ups := ix.Flush(now, true)
	if len(ups) != 1 || len(ups[0].Replicas) != 2 {
		t.Fatalf("flush: %+v", ups)
	}
	a, b := ups[0].Replicas[0], ups[0].Replicas[1]
	// Idle before its first scrape; 12 running at every scrape for 20 s: 1 - exp(-2) of 12.
	if want := math.Round(12*(1-math.Exp(-2))*10) / 10; math.Abs(a.Running-want) > 0.11 || a.MeanUncached != 1500 {
		t.Errorf("replica a: running %v, mean uncached %d; want %v, 1500", a.Running, a.MeanUncached, want)
	}
	// Busy for 10 s (1 - exp(-1)), then idle for 10 s: exp(-1) of that remains (0.23).
	if want := math.Round((1-math.Exp(-1))*math.Exp(-1)*100) / 100; math.Abs(a.Busy-want) > 0.011 {
		t.Errorf("replica a: busy %v, want %v", a.Busy, want)
	}
	if b.Busy != 0 || b.Running != 0 {
		t.Errorf("replica b, idle: busy %v, running %v", b.Busy, b.Running)
	}
}
