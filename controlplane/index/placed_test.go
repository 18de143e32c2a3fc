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

// startingOn is placedOn from a filter that reports its placements' starts.
func startingOn(chain uint64, tokens, cached int) api.Report {
	p := placedOn(chain, tokens, cached)
	p.Starts = true
	return p
}

// startOf is p's start report, at at.
func startOf(p api.Report, at time.Time) api.Report {
	return api.Report{Kind: api.KindStart, Model: p.Model, Replica: p.Replica, Domain: p.Domain,
		BlockSize: p.BlockSize, Stride: p.Stride, Placement: p.PlacementID(), AtMs: at.UnixMilli()}
}

// Stock engines export waiting requests, not queued tokens. When the filters report
// starts, Q(r) is the uncached tokens of the placements made and not started by the time
// whose reports are all in (a report lag before the flush, or the scrape if older), at
// most as many as the engine has requests, and the table dates it then.
func TestQueuedTokensFromStarts(t *testing.T) {
	const lag = 100 * time.Millisecond
	ix := fixture(t, Config{DefaultUncachedTokens: 100, ReportLag: lag})
	state := func(now time.Time) (uint64, uint32) {
		r := ix.Flush(now, true)[0].Replicas[0]
		return r.Queued, r.StateAgeMs
	}
	queued := func(scrapedAt time.Time) uint64 { q, _ := state(scrapedAt.Add(lag)); return q }
	p1, p2, p3 := startingOn(100, 8000, 6000), startingOn(200, 20000, 0), startingOn(300, 4000, 1000)
	ix.ApplyReports(reports(p1, p2, p3), t0, nil)

	// p1 started; p2 and p3 are both being prefilled (chunked prefill runs several at
	// once): nothing waits, and both still count. The order estimate would count the
	// request admitted last alone (3000).
	ix.ApplyReports(reports(startOf(p1, t0.Add(50*time.Millisecond))), t0.Add(60*time.Millisecond), nil)
	t1 := t0.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Running: 3}, nil, t1)
	// p2 starts after the scrape. Before a report lag has passed since, the queue is
	// dated a lag ago: when p1 had not started either (a start reported late would have
	// counted as queued until it arrived).
	ix.ApplyReports(reports(startOf(p2, t1.Add(20*time.Millisecond))), t1.Add(30*time.Millisecond), nil)
	q, age := state(t1.Add(40 * time.Millisecond))
	assert.EqualValues(t, 2000+20000+3000, q)
	assert.EqualValues(t, lag.Milliseconds(), age, "dated a report lag ago")
	// A lag after the scrape, at the scrape: p2 had not started then.
	q, age = state(t1.Add(lag))
	assert.EqualValues(t, 20000+3000, q)
	assert.EqualValues(t, lag.Milliseconds(), age, "dated at the scrape")
	t2 := t1.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Running: 3}, nil, t2)
	assert.EqualValues(t, 3000, queued(t2))

	// A start that never arrives (its batch lost) counts no longer than the engine has
	// requests; a start of a placement the list does not hold changes nothing.
	ix.ApplyReports(reports(startOf(placedOn(999, 100, 0), t2)), t2, nil)
	t3 := t2.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Running: 2}, nil, t3)
	assert.EqualValues(t, 3000, queued(t3))
	t4 := t3.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{}, nil, t4)
	assert.EqualValues(t, 0, queued(t4))

	// Waiting requests beyond the placements not started: the mean for each.
	t5 := t4.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 3, Running: 2}, nil, t5)
	assert.EqualValues(t, 3000+2*100, queued(t5))

	// During a rollout a placement from a filter that does not report starts puts the
	// replica back on the order estimate at the scrape: the last waiting placements, and
	// the one admitted last while requests run.
	old := placedOn(400, 9000, 0)
	old.AtMs = t5.UnixMilli()
	ix.ApplyReports(reports(old), t5.Add(lag), nil)
	t6 := t5.Add(200 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1, Running: 2}, nil, t6)
	q, age = state(t6.Add(lag))
	assert.EqualValues(t, 9000+3000, q)
	assert.EqualValues(t, lag.Milliseconds(), age)
}

// Placements from several proxies arrive out of the order they were made in: each counts
// by when it was made.
func TestStartsCountPlacementsByWhenTheyWereMade(t *testing.T) {
	const lag = 100 * time.Millisecond
	ix := fixture(t, Config{DefaultUncachedTokens: 100, ReportLag: lag})
	after, before := startingOn(100, 5000, 0), startingOn(200, 7000, 0)
	after.AtMs, before.AtMs = t0.Add(150*time.Millisecond).UnixMilli(), t0.Add(50*time.Millisecond).UnixMilli()
	ix.ApplyReports(&api.ReportBatch{Proxy: "p", Reports: []api.Report{after}}, t0.Add(160*time.Millisecond), nil)
	ix.ApplyReports(&api.ReportBatch{Proxy: "q", Reports: []api.Report{before}}, t0.Add(170*time.Millisecond), nil)
	scraped := t0.Add(100 * time.Millisecond)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 2}, nil, scraped)
	assert.EqualValues(t, 7000+100, ix.Flush(scraped.Add(lag), true)[0].Replicas[0].Queued,
		"the placement made before the scrape, and the mean for the other waiting request")
}

// A flood of starts that name no placement the list holds (a proxy gone wrong, or one
// replaying old reports) changes no queue, and a second start of a placement changes
// nothing either.
func TestStartsOfNothingChangeNothing(t *testing.T) {
	const lag = 100 * time.Millisecond
	ix := fixture(t, Config{ReportLag: lag})
	p1, p2 := startingOn(100, 4000, 0), startingOn(200, 6000, 0)
	ix.ApplyReports(reports(p1, p2), t0, nil)
	flood := make([]api.Report, 0, 10*maxPlaced)
	for i := range cap(flood) {
		flood = append(flood, startOf(placedOn(uint64(1000+i), 1000, 0), t0))
	}
	ix.ApplyReports(reports(flood...), t0, nil)
	ix.ApplyReports(reports(startOf(p1, t0), startOf(p1, t0)), t0, nil)
	scraped := t0.Add(time.Second)
	ix.ApplyScrape("a", scrape.Sample{Waiting: 1, Running: 1}, nil, scraped)
	assert.EqualValues(t, 6000, ix.Flush(scraped.Add(lag), true)[0].Replicas[0].Queued, "p2 alone waits")
	assert.Len(t, ix.replicas["a"].placed.q, 2)
}

// From filters that do not report starts, Q(r) is the uncached tokens of the placements
// the waiting requests are, the last ones placed before the scrape, and of the one
// admitted last while requests run (it may be prefilling still).
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
