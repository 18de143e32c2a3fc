package kvroute_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// tiny is 20 customers at 20 req/s, 800-token prompts with a 600-token prefix, on the
// fast profile: a seconds-long run in milliseconds.
func tiny(t *testing.T, d time.Duration) workload.Workload { return seedOf(t, 20, 800, 600, d) }

// seedOf is the seed workload of customers at 20 req/s for d, prompts of prompt tokens
// with a prefix of prefix, 50 output tokens.
func seedOf(t *testing.T, customers, prompt, prefix int, d time.Duration) *workload.Seed {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = customers, 20, d
	c.PromptTokens, c.PrefixTokens, c.OutputTokens = prompt, prefix, 50
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	return w
}

func run(t *testing.T, w workload.Workload, replicas int, cfg kvroute.Config, faults ...sim.Fault) (*sim.Result, *kvroute.Policy) {
	t.Helper()
	return runWrapped(t, w, replicas, cfg, nil, faults...)
}

// runWrapped is run with the simulator calling wrap's policy instead of kvroute's own
// (a probe that observes it) when wrap is not nil.
func runWrapped(t *testing.T, w workload.Workload, replicas int, cfg kvroute.Config, wrap func(*kvroute.Policy) policy.Policy,
	faults ...sim.Fault) (*sim.Result, *kvroute.Policy) {
	t.Helper()
	var kp *kvroute.Policy
	res, err := sim.Run(sim.Config{Replicas: replicas, Profile: timing.Fast(), Workload: w, Seed: 1, Routers: cfg.Routers,
		Stream: true, HotGroup: -1, Faults: faults},
		func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
			var err error
			if kp, err = kvroute.New(f, routerOf, cfg); err != nil || wrap == nil {
				return kp, err
			}
			return wrap(kp), nil
		})
	require.NoError(t, err)
	return res, kp
}

func TestRoutesCustomersToTheirPrefixOwners(t *testing.T) {
	w := tiny(t, 30*time.Second)
	res, kp := run(t, w, 4, kvroute.DefaultConfig())
	orc, err := sim.Run(sim.Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1},
		func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
			return policy.NewOracle(f, rule.DefaultParams(), 1), nil
		})
	require.NoError(t, err)

	assert.Equal(t, w.Len(), res.Requests)
	assert.InDelta(t, orc.CachedTokenRate, res.CachedTokenRate, 0.03, "close to the oracle's hit rate")
	assert.Less(t, res.SpillRate, 0.1)
	st := kp.Stats
	assert.Positive(t, st.HeldForTable, "requests before the first table poll are held for it")
	assert.Zero(t, st.Unrouted)
	assert.Equal(t, w.Len(), st.Decisions)
	assert.Equal(t, 3*st.Decisions, st.Reports, "a placement, a start and an outcome per decision")
	assert.GreaterOrEqual(t, st.ReportsApplied, st.Reports-40, "all but the last batch reached the index")
	ix := kp.Index().Stats()
	assert.InDelta(t, st.Decisions, int(ix.Placements), 40, "all but the last batch")
	assert.Positive(t, ix.Confirms)
	for _, r := range kp.Index().DebugState(kvroute.Epoch.Add(res.SimTime)) {
		assert.Positive(t, r.TextKeys, "%s holds confirmed text keys", r.ID)
	}
}

func TestTokenKeysDoNotChangeTextRouting(t *testing.T) {
	w := tiny(t, 20*time.Second)
	cfg := kvroute.DefaultConfig()
	without, _ := run(t, w, 3, cfg)
	cfg.TokenKeys = true
	with, kp := run(t, w, 3, cfg)
	without.Wall, with.Wall = 0, 0
	assert.Equal(t, without, with, "token-domain keys never match a chat request's text keys")
	tok := 0
	for _, r := range kp.Index().DebugState(kvroute.Epoch.Add(with.SimTime)) {
		tok += r.TokenKeys
		assert.Positive(t, r.KVEvents.Batches, "%s's KV events reached the index", r.ID)
	}
	assert.Positive(t, tok, "with TokenKeys the index did build token-domain keys")
}

// The engines' KV-event batches reach the index stamped with the engine's time, as
// vLLM's are, so the measures dated by it work: with blocks stored (TokenKeys) and a
// workload that outgrows the pools, each replica has a block residency.
func TestKVEventsCarryTheEnginesTime(t *testing.T) {
	cfg := kvroute.DefaultConfig()
	cfg.TokenKeys = true
	res, kp := run(t, seedOf(t, 200, 2000, 1500, 30*time.Second), 3, cfg)
	for _, r := range kp.Index().DebugState(kvroute.Epoch.Add(res.SimTime)) {
		require.Positive(t, r.KVEvents.RemovedBlocks, "%s evicted blocks", r.ID)
		assert.Positive(t, r.KVEvents.EvictedResidencyS, "%s's evicted blocks have a residency", r.ID)
	}
}

func TestStaleTablesArriveLate(t *testing.T) {
	w := tiny(t, 10*time.Second)
	_, fresh := run(t, w, 3, kvroute.DefaultConfig())
	cfg := kvroute.DefaultConfig()
	cfg.Stale = 2 * time.Second
	_, stale := run(t, w, 3, cfg)
	// No table for the first ~2 s: about 40 requests are left to Envoy.
	assert.Greater(t, stale.Stats.Unrouted, 30)
	assert.Less(t, fresh.Stats.Unrouted, 10)
}

// A proxy's requests before its first table are held for it and routed on it, none
// left to Envoy; with first_table_wait_ms -1 the same requests go to Envoy, and no
// control plane hears of their prefixes.
func TestFirstRequestsWaitForTheFirstTable(t *testing.T) {
	w := tiny(t, 5*time.Second)
	_, held := run(t, w, 3, kvroute.DefaultConfig())
	cfg := kvroute.DefaultConfig()
	cfg.Filter.FirstTableWaitMs = -1
	_, unheld := run(t, w, 3, cfg)
	assert.Positive(t, unheld.Stats.Unrouted)
	assert.Zero(t, unheld.Stats.HeldForTable)
	assert.Equal(t, unheld.Stats.Unrouted, held.Stats.HeldForTable, "the requests before the first table")
	assert.Zero(t, held.Stats.Unrouted)
	assert.Equal(t, w.Len(), held.Stats.Decisions)
}

func TestRoutersAreIndependentProxies(t *testing.T) {
	w := tiny(t, 10*time.Second)
	cfg := kvroute.DefaultConfig()
	cfg.Routers = 4
	cfg.Filter.FirstTableWaitMs = -1
	res, kp := run(t, w, 3, cfg)
	assert.Equal(t, w.Len(), res.Requests)
	// Each proxy polls on its own: each is without a table until its first poll.
	assert.Positive(t, kp.Stats.Unrouted)
	assert.Equal(t, w.Len(), kp.Stats.Decisions+kp.Stats.Unrouted)
}

func TestKilledReplicaLeavesTheTable(t *testing.T) {
	w := tiny(t, 10*time.Second)
	res, kp := run(t, w, 3, kvroute.DefaultConfig(), sim.Fault{At: 3 * time.Second, Kind: sim.Kill, Replica: 2})
	assert.Equal(t, w.Len(), res.Requests+res.Failed)
	ids := map[string]bool{}
	for _, r := range kp.Index().DebugState(kvroute.Epoch.Add(res.SimTime)) {
		ids[r.ID] = true
	}
	assert.Equal(t, map[string]bool{"engine-0": true, "engine-1": true}, ids, "discovery dropped it")
}

func TestInvalidConfig(t *testing.T) {
	cfg := kvroute.DefaultConfig()
	cfg.PollInterval = 0
	_, err := kvroute.New(nil, nil, cfg)
	assert.Error(t, err)
}

// TestWasmFilterRoutesLikeTheGoMirror runs the compiled filter on the wasm host against
// the control plane's HTTP API and checks it behaves as Policy, the Go mirror of its
// request path: same requests served, hit rates close.
func TestWasmFilterRoutesLikeTheGoMirror(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the filter for wasip1")
	}
	w := tiny(t, 20*time.Second)
	goCfg := kvroute.DefaultConfig()
	goCfg.Wait = 0 // kvroute-wasm polls periodically (NewWasm)
	goRes, _ := run(t, w, 4, goCfg)
	var wp *kvroute.WasmPolicy
	res, err := sim.Run(sim.Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1},
		func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
			var err error
			wp, err = kvroute.NewWasm(f, routerOf, kvroute.DefaultConfig(), kvroute.WasmOptions{})
			return wp, err
		})
	require.NoError(t, err)
	assert.Equal(t, "kvroute-wasm", res.Policy)
	assert.Equal(t, w.Len(), res.Requests)
	assert.InDelta(t, goRes.CachedTokenRate, res.CachedTokenRate, 0.05)
	assert.Less(t, res.SpillRate, 0.1)
	assert.Positive(t, wp.Stats.Versions, "the filter polled published versions")
	assert.Zero(t, wp.Stats.Unrouted, "requests before the first table are held for it")
	assert.Equal(t, w.Len(), wp.Stats.Decisions+wp.Stats.Unrouted)
	ix := wp.Index().Stats()
	assert.Positive(t, ix.Placements, "the filter's placement reports reached the index over HTTP")
	assert.Positive(t, ix.Confirms, "and its outcome reports")
}

// sixtyCustomers is 60 customers of 3,000-token prefixes at 20 requests/s for d: all of
// them fit 4 replicas' caches only when each replica keeps its own customers.
func sixtyCustomers(t *testing.T, d time.Duration) *workload.Seed {
	return seedOf(t, 60, 3400, 3000, d)
}

// A control-plane outage (no tables, reports lost) keeps the hit rate: past the 2 s
// state-age guard the rule routes on the last table's prefix entries and the proxy's
// own placements with its ledger as the load (shared/rule's stale regime). Without
// that regime (MaxCacheAge 0: least-queued once the table is 2 s old, no local
// placements) the same run falls to the cache-blind rate, so the test can fail.
func TestControlPlaneOutageKeepsAffinity(t *testing.T) {
	w := sixtyCustomers(t, 60*time.Second)
	phases := []sim.Phase{{Name: "before", From: 5 * time.Second, To: 20 * time.Second}, {Name: "outage", From: 23 * time.Second, To: 50 * time.Second}}
	runOutage := func(cfg kvroute.Config) *sim.Result {
		cfg.Outages = []kvroute.Outage{{At: 20 * time.Second, Duration: 30 * time.Second}}
		res, err := sim.Run(sim.Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1, Phases: phases},
			func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
				return kvroute.New(f, routerOf, cfg)
			})
		require.NoError(t, err)
		return res
	}
	res := runOutage(kvroute.DefaultConfig())
	before, during := res.Phases[0], res.Phases[1]
	assert.Zero(t, res.Failed)
	assert.GreaterOrEqual(t, during.CachedTokenRate, 0.8*before.CachedTokenRate, "before %.3f, during %.3f", before.CachedTokenRate, during.CachedTokenRate)
	t.Logf("cached before %.3f, during the outage %.3f", before.CachedTokenRate, during.CachedTokenRate)

	old := kvroute.DefaultConfig()
	old.Rule.MaxCacheAge, old.NoLocal = 0, true
	res = runOutage(old)
	t.Logf("cache-blind fallback: cached before %.3f, during the outage %.3f", res.Phases[0].CachedTokenRate, res.Phases[1].CachedTokenRate)
	assert.Less(t, res.Phases[1].CachedTokenRate, 0.8*res.Phases[0].CachedTokenRate, "the cache-blind fallback")
}

// firstBytes wraps the policy to look at the proxy's ledger right after a request's first
// byte: how a snapshot measured when the request was sent would be corrected.
type firstBytes struct {
	*kvroute.Policy
	sent        map[uint64]time.Duration
	corrections []float64
}

func (f *firstBytes) Route(r *workload.Request, now time.Duration) policy.Choice {
	ch := f.Policy.Route(r, now)
	if ch.Rule {
		f.sent[r.ID] = now
	}
	return ch
}

func (f *firstBytes) FirstByte(r *workload.Request, i int, now time.Duration) {
	f.Policy.FirstByte(r, i, now)
	if at, ok := f.sent[r.ID]; ok {
		c, _ := f.Proxy(0).Router().Ledger.Sums(sim.Addr(i), kvroute.Epoch.Add(at))
		f.corrections = append(f.corrections, c)
	}
}

// A request's first byte records its start in the ledger (route.Ledger.Started): a queue
// snapshot measured when it was sent, which still counts its prefill, is corrected by it.
// With LedgerStarts off (the simulator before Started existed) the entry is dropped and
// nothing corrects that snapshot: every correction is zero or positive.
func TestFirstByteCorrectsOlderSnapshots(t *testing.T) {
	w := tiny(t, 5*time.Second)
	corrections := func(starts bool) []float64 {
		cfg := kvroute.DefaultConfig()
		cfg.LedgerStarts = starts
		var fb *firstBytes
		runWrapped(t, w, 3, cfg, func(kp *kvroute.Policy) policy.Policy {
			fb = &firstBytes{Policy: kp, sent: map[uint64]time.Duration{}}
			return fb
		})
		require.NotEmpty(t, fb.corrections)
		return fb.corrections
	}
	negative := func(cs []float64) int {
		n := 0
		for _, c := range cs {
			if c < 0 {
				n++
			}
		}
		return n
	}
	with, without := corrections(true), corrections(false)
	assert.Greater(t, negative(with), len(with)/2, "most first bytes take the request off an older snapshot")
	assert.Zero(t, negative(without))
}

// The leader long-polls (Config.Wait, the filter's control_plane.wait_ms): each version
// reaches the proxy when it is published, Stale later. Before the simulator modelled it,
// proxies polled every PollInterval (what Wait 0 still does) and a version waited for the
// next poll: with versions every 50 ms and polls every 100 ms, 0-100 ms, 25 ms plus the
// two timers' phase difference on average (23.5 ms in this run).
func TestLongPollDeliversVersionsWhenPublished(t *testing.T) {
	w := tiny(t, 10*time.Second)
	lag := func(wait, stale time.Duration) (time.Duration, *kvroute.Policy) {
		cfg := kvroute.DefaultConfig()
		cfg.Wait, cfg.Stale = wait, stale
		res, kp := run(t, w, 3, cfg)
		require.Equal(t, w.Len(), res.Requests)
		require.Positive(t, kp.Stats.Applied)
		return kp.Stats.ApplyLag / time.Duration(kp.Stats.Applied), kp
	}
	assert.Equal(t, time.Second, kvroute.DefaultConfig().Wait, "the filter's default wait_ms")
	// Only the versions published before the proxy's first poll (in its first 100 ms)
	// wait.
	mean, kp := lag(time.Second, 0)
	assert.Less(t, mean, time.Millisecond, "versions applied when published")
	assert.Equal(t, kp.Stats.Versions, kp.Stats.Applied, "one proxy: every version, none skipped")
	mean, _ = lag(time.Second, 200*time.Millisecond)
	assert.InDelta(t, 200*time.Millisecond, mean, float64(time.Millisecond), "--stale delays each version by that")
	mean, _ = lag(0, 0)
	assert.Greater(t, mean, 20*time.Millisecond, "periodic polls every 100 ms")
}

// A long poll that finds no new version for Wait is a 304 that confirms the table: with
// the table dated from the poll's return (AgeFromGeneration false) its age stays under
// Wait even when the control plane publishes nothing for seconds. (Without the 304s the
// age grew to the 10 s between versions and most decisions were the stale regime's.)
func TestLongPollTimesOutInto304(t *testing.T) {
	w := tiny(t, 30*time.Second)
	cfg := kvroute.DefaultConfig()
	cfg.PublishInterval = 10 * time.Second
	cfg.Wait = 300 * time.Millisecond
	cfg.AgeFromGeneration = false
	res, kp := run(t, w, 3, cfg)
	assert.Equal(t, w.Len(), res.Requests)
	assert.LessOrEqual(t, kp.Stats.Versions, 3)
	assert.Greater(t, kp.Stats.Decisions, w.Len()/2)
	assert.Zero(t, kp.Stats.StaleDecisions, "the table never went stale: 304s kept confirming it")
}

// A SIGKILL of the control-plane replica the proxies poll, with another replica beside
// it (--cp-failover): the proxies go without a table for one poll interval and lose no
// report (their copies reached the other replica), so the cached rate after is the rate
// before.
func TestControlPlaneFailoverLosesNoReport(t *testing.T) {
	w := sixtyCustomers(t, 40*time.Second)
	phases := []sim.Phase{{Name: "before", From: 5 * time.Second, To: 20 * time.Second}, {Name: "after", From: 20 * time.Second, To: 40 * time.Second}}
	run := func(o kvroute.Outage) (*sim.Result, int) {
		cfg := kvroute.DefaultConfig()
		cfg.Outages = []kvroute.Outage{o}
		var p *kvroute.Policy
		var err error
		res, err := sim.Run(sim.Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1, Phases: phases},
			func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
				p, err = kvroute.New(f, routerOf, cfg)
				return p, err
			})
		require.NoError(t, err)
		return res, p.Stats.ReportsLost
	}
	failover := kvroute.FailoverOutage(20*time.Second, kvroute.DefaultConfig())
	assert.Equal(t, 100*time.Millisecond, failover.Duration, "one poll interval")
	res, lost := run(failover)
	before, after := res.Phases[0], res.Phases[1]
	t.Logf("cached before %.3f, after the failover %.3f", before.CachedTokenRate, after.CachedTokenRate)
	assert.Zero(t, res.Failed)
	assert.Zero(t, lost)
	assert.GreaterOrEqual(t, after.CachedTokenRate, 0.98*before.CachedTokenRate)

	// Over a longer span the difference shows: reports posted while no replica answers
	// polls are lost only without another replica to take their copies.
	long := kvroute.Outage{At: 20 * time.Second, Duration: 2 * time.Second, Failover: true}
	_, lost = run(long)
	assert.Zero(t, lost)
	long.Failover = false
	_, lost = run(long)
	assert.Positive(t, lost, "an outage without another replica loses the reports posted in it")
}

// With ScrapeLatency the engines take their numbers that long after the control plane
// sent the scrape. The queued-tokens gauge carries the engine's stamp, which dates the
// numbers when they were taken; a queue counted from reports (stock metrics) is dated at
// the send (controlplane.scrapeLoop), so no state in the index is younger than the
// latency.
func TestScrapeLatencyDatesTheNumbersWhenTheEngineTookThem(t *testing.T) {
	w := tiny(t, 3*time.Second)
	youngest := func(latency time.Duration, stock bool) int64 {
		cfg := kvroute.DefaultConfig()
		cfg.ScrapeLatency, cfg.StockMetrics = latency, stock
		var probe *ageProbe
		runWrapped(t, w, 3, cfg, func(kp *kvroute.Policy) policy.Policy {
			probe = &ageProbe{Policy: kp, youngest: math.MaxInt64}
			return probe
		})
		return probe.youngest
	}
	assert.Less(t, youngest(0, false), int64(5), "numbers taken at the scrape's send are as young as the last scrape")
	assert.Less(t, youngest(40*time.Millisecond, false), int64(5), "the engine's stamp dates its numbers when it took them")
	assert.GreaterOrEqual(t, youngest(40*time.Millisecond, true), int64(40), "without a stamp they are dated at the send")
}

// ageProbe records the youngest replica state the index holds at any decision after
// the first second.
type ageProbe struct {
	*kvroute.Policy
	youngest int64
}

func (p *ageProbe) Route(r *workload.Request, now time.Duration) policy.Choice {
	if now > time.Second { // every replica scraped: before that, ages count from discovery
		for _, st := range p.Index().DebugState(kvroute.Epoch.Add(now)) {
			p.youngest = min(p.youngest, st.StateAgeMs)
		}
	}
	return p.Policy.Route(r, now)
}

// With StockMetrics the engines export vLLM's metrics only, so the control plane cannot
// read queued prefill tokens: it counts the placements not started, from the proxies'
// placement and start reports (controlplane/index/placed.go). On a loaded fleet that
// is within a tenth of the engines' own count (from placements and the engines' waiting
// count alone it was 0.87x), and routing keeps what the exact count gives.
func TestStockMetricsEstimateQueuesFromPlacements(t *testing.T) {
	w := seedOf(t, 40, 8000, 6000, 20*time.Second)
	run := func(stock bool) (*sim.Result, *queueProbe) {
		cfg := kvroute.DefaultConfig()
		cfg.StockMetrics = stock
		var probe *queueProbe
		res, err := sim.Run(sim.Config{Replicas: 2, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1},
			func(f policy.Fleet, routerOf func(*workload.Request) int) (policy.Policy, error) {
				kp, err := kvroute.New(f, routerOf, cfg)
				probe = &queueProbe{Policy: kp, f: f}
				return probe, err
			})
		require.NoError(t, err)
		return res, probe
	}
	exact, pe := run(false)
	stock, ps := run(true)
	require.Positive(t, pe.truth, "the fleet queues prefill")
	t.Logf("mean queued tokens: engines %.0f, exact %.0f, estimated %.0f; cached %.3f exact, %.3f estimated",
		ps.truth/ps.n, pe.seen/pe.n, ps.seen/ps.n, exact.CachedTokenRate, stock.CachedTokenRate)
	assert.InDelta(t, 1, (ps.seen/ps.n)/(ps.truth/ps.n), 0.1, "the estimate follows the engines' count")
	assert.InDelta(t, exact.CachedTokenRate, stock.CachedTokenRate, 0.03)
}

// queueProbe sums, at every decision after the first second, the queued prefill tokens
// the engines hold and those the router would count for them: the control plane's
// index's, corrected by the proxy's ledger for what it sent and saw start since the
// index's number is dated (shared/route.Router.Decide).
type queueProbe struct {
	*kvroute.Policy
	f              policy.Fleet
	truth, seen, n float64
}

func (p *queueProbe) Route(r *workload.Request, now time.Duration) policy.Choice {
	if now > time.Second {
		at := kvroute.Epoch.Add(now)
		ledger := p.Proxy(0).Router().Ledger
		for _, st := range p.Index().DebugState(at) {
			correction, _ := ledger.Sums(st.Address, at.Add(-time.Duration(st.StateAgeMs)*time.Millisecond))
			p.seen += max(st.QueueTokens+correction, 0)
		}
		for i := range p.f.Len() {
			p.truth += float64(p.f.State(i).QueuedPrefillTokens)
		}
		p.n++
	}
	return p.Policy.Route(r, now)
}
