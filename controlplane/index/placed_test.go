package index

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/api"
)

// placedOn is a placement of a prompt of tokens tokens (text at the default 4 bytes a
// token), predicted cached tokens of it, on replica a.
func placedOn(chain uint64, tokens, cached int) api.Report {
	p := placement(addrA, seqHashes(2, chain))
	p.PromptBytes, p.PredictedCachedTokens = 4*tokens, cached
	return p
}

// Stock engines export waiting requests, not queued tokens: Q(r) is the uncached tokens
// of the placements the waiting requests are, the last ones placed before the scrape,
// and of the one admitted last while requests run (it may be prefilling still).
func TestQueuedTokensFromPlacements(t *testing.T) {
	ix := fixture(t, Config{DefaultUncachedTokens: 100})
	queued := func(at time.Time) uint64 { return ix.Flush(at, true)[0].Replicas[0].Queued }
	p1, p2, p3 := placedOn(100, 8000, 6000), placedOn(200, 20000, 0), placedOn(300, 4000, 1000)
	ix.ApplyReports(reports(p1, p2, p3), t0, nil)

	// Two wait, one runs: p3 and p2 wait, p1 (admitted last) may be prefilling.
	t1 := t0.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 2, Running: 1}, nil, t1)
	assert.EqualValues(t, 3000+20000+2000, queued(t1))

	// A placement after the scrape is the filters' ledgers' business, not the snapshot's.
	late := placedOn(400, 9000, 0)
	late.AtMs = t1.Add(50 * time.Millisecond).UnixMilli()
	ix.ApplyReports(reports(late), t1.Add(50*time.Millisecond), nil)
	assert.EqualValues(t, 3000+20000+2000, queued(t1.Add(60*time.Millisecond)))

	// p2 ends (a retry elsewhere, say: any outcome ends it); the next scrape shows one
	// waiting and nothing running: the last placed before it, the late one.
	o := p2
	o.Kind, o.Status = api.KindOutcome, 200
	ix.ApplyReports(reports(o), t1.Add(70*time.Millisecond), nil)
	t2 := t1.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1}, nil, t2)
	assert.EqualValues(t, 9000, queued(t2))

	// More waiting than placements (traffic that did not come through kvroute): the
	// mean uncached prompt for each of the rest. The list keeps at most the engine's
	// requests and some slack, oldest out.
	ix.ApplyScrape("a", scrape.Sample{Waiting: 6}, nil, t2.Add(time.Millisecond))
	assert.EqualValues(t, 9000+3000+2000+3*100, queued(t2.Add(time.Millisecond)))
	for i := range 40 {
		ix.ApplyReports(reports(placedOn(uint64(1000+10*i), 1000, 0)), t2, nil)
	}
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1}, nil, t2.Add(2*time.Millisecond))
	assert.Len(t, ix.replicas["a"].placed.q, 1+placedSlack)

	// An engine that exports the gauge is taken at its word.
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1, QueuedTokens: 1234, HasQueuedTokens: true}, nil, t2.Add(3*time.Millisecond))
	assert.EqualValues(t, 1234, queued(t2.Add(3*time.Millisecond)))
}

// A placement that claims more than the replica's KV holds counts as that much: no
// engine runs a longer prompt.
func TestAPlacementCountsAtMostTheReplicasCapacity(t *testing.T) {
	ix := fixture(t, Config{})
	ix.ApplyScrape("a", scrape.Sample{CapacityTokens: 640}, nil, t0)
	ix.ApplyReports(reports(placedOn(100, 1<<30, 0)), t0, nil)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1, CapacityTokens: 640}, nil, t0.Add(time.Millisecond))
	assert.EqualValues(t, 640, ix.Flush(t0.Add(time.Millisecond), true)[0].Replicas[0].Queued)
}

// A flood of placements without outcomes or scrapes (a proxy gone wrong) keeps at most
// maxPlaced a replica, the newest, and the queue they make is at most the waiting
// requests' worth.
func TestPlacementFloodIsBounded(t *testing.T) {
	ix := fixture(t, Config{})
	for i := range 10 * maxPlaced {
		ix.ApplyReports(reports(placedOn(uint64(10+i), 1000+i, 0)), t0, nil)
	}
	q := ix.replicas["a"].placed.q
	assert.Len(t, q, maxPlaced)
	assert.EqualValues(t, 1000+10*maxPlaced-1, q[len(q)-1].tokens, "the newest stay")
	ix.ApplyScrape("a", scrape.Sample{Waiting: 2}, nil, t0.Add(time.Millisecond))
	assert.EqualValues(t, 2*1000+2*10*maxPlaced-3, ix.Flush(t0.Add(time.Millisecond), true)[0].Replicas[0].Queued)
	assert.Len(t, ix.replicas["a"].placed.q, 2+placedSlack, "the scrape prunes to what the engine holds")
}
