// Package kvroute is kvroute's own policy in the fleet simulation, built from the real
// code: each proxy is a Proxy whose requests go through route.Router.Route, the function
// the filter calls (filter/request.go; filter/parity_test.go checks both give the same
// results), with its Ledger ended as filter/response.go ends it, and the control plane is
// controlplane/index in-process, fed what the real one is fed:
//
//   - the proxies' placement, start and outcome reports (api.Report values, posted in batches
//     every ReportInterval as the filter's leader does);
//   - every engine's KV events (the Go values the engine emits, one batch per step);
//   - scrapes of every engine's state (queued prefill tokens, KV usage, waiting and
//     running) every ScrapeInterval; a dead engine's scrape fails.
//
// Every PublishInterval the index's changes become a table version (a delta frame, as
// controlplane/publish makes them). Each proxy's leader long-polls the table as the
// filter does (control_plane.wait_ms, Config.Wait): the control plane answers as soon
// as it publishes a version the proxy lacks, so the proxy receives each version when it
// is published, Stale later; with Wait 0 it polls every PollInterval and receives the
// newest version at least Stale old (the filter's behaviour before the long poll).
//
// A Responses answer's replica is learned by the proxy that forwarded it at the answer's
// first bytes, reaches the control plane (controlplane/affinity) in the outcome report
// at the stream's end, and every other proxy's leader fetches it on its next affinity
// poll (every PollInterval), as the filter does (filter/affinitypoll.go).
//
// The proxies parse the OpenAI body with shared/prompt, hash its canonical text with
// route.NewChain, and route on it; they never see token ids.
package kvroute

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// Config configures the simulated kvroute deployment.
type Config struct {
	Model   string
	Routers int
	Rule    rule.Params
	Index   index.Config
	// Control plane cadence (controlplane.Options defaults: scrape 100 ms, publish
	// 50 ms) and the filter's (api.ControlPlane defaults: poll 100 ms, reports 100 ms).
	ScrapeInterval, PublishInterval time.Duration
	PollInterval, ReportInterval    time.Duration
	MaxReportBatch                  int
	// Filter is the filter's configuration as Route reads it (body limits, adapters,
	// tenants); the zero value takes the filter's defaults.
	Filter api.Config
	// Stale delays the table every proxy receives.
	Stale time.Duration
	// ScrapeLatency is how long after the control plane sends a scrape the engine takes
	// its numbers. The control plane dates the queue by the stamp on the engine's
	// queued-tokens gauge, and the rest, and a queue counted from reports (StockMetrics),
	// when it sent the scrape (controlplane.scrapeLoop): there a request sent within the
	// latency is counted by the engine but taken by the proxies' ledgers as sent after
	// the numbers. 0: the engine answers at once.
	ScrapeLatency time.Duration
	// StockMetrics scrapes the engines as stock vLLM exports them (the names of
	// vllm/v1/metrics/loggers.py, wasmtest/engine/metrics): without
	// kvroute:queued_prefill_tokens, so the control plane counts Q(r) from the proxies'
	// placement and start reports (controlplane/index/placed.go).
	StockMetrics bool
	// Wait is the leader's long poll (control_plane.wait_ms, default 1 s): a version
	// reaches the proxy when it is published (Stale later), and a poll that finds none
	// for Wait confirms the table (304). 0 polls every PollInterval instead.
	Wait time.Duration
	// Outages are control-plane outages: from At for Duration no proxy receives a
	// table and every report a proxy posts is lost (the control plane itself keeps
	// scraping and publishing).
	Outages []Outage
	// NoLocal turns off matching the proxies' own recent placements (route.Local), for
	// comparison with the behaviour before it.
	NoLocal bool
	// NoHomes turns off crediting a prefix's home, the replica that held it last, where
	// the table lists none of it (route.Router.HomeCredit 0), for comparison.
	NoHomes bool
	// AffinityPerProxy keeps each proxy's Responses affinity to itself (no affinity
	// polls), for comparison with the map shared through the control plane.
	AffinityPerProxy bool
	// SharesPerProxy keeps each proxy's tenant shares to itself (no shares posted to the
	// control plane, api.SharesPath): what a control plane without the path gives.
	SharesPerProxy bool
	// LedgerStarts: at a request's first response byte the proxy records its start
	// (route.Ledger.Started), so that a snapshot measured before it no longer counts its
	// tokens as queued. False drops the ledger entry there (Ledger.Done), as
	// filter/response.go did before Started existed.
	LedgerStarts bool
	Seed         uint64
	// TokenKeys feeds the index the engines' BlockStored events too. They only make
	// token-domain keys, which text-domain (chat) requests never match, so routing is
	// the same without them (TestTokenKeysDoNotChangeTextRouting) at a third of the
	// cost; removals and clears, which age and clear text-domain entries, always go in.
	TokenKeys bool
	// AgeFromGeneration dates the table from when its version was generated, as the
	// filter does (the control plane sends each version's age): the ledger's "sent
	// after the snapshot" cut-off and the state-age guard see the real age of the queue
	// numbers. False dates it from the poll's return, the filter's earlier behaviour,
	// kept for comparison.
	AgeFromGeneration bool
	// GPUOnly: the proxies get table format 1 (GPU holders only), the format that
	// predates slower tiers, so a CPU-tier hit counts for nothing.
	GPUOnly bool
}

// DefaultConfig is kvroute as shipped: the filter's defaults (api.ParseConfig: poll,
// report interval and batch, guards, body limit) and the control plane's
// (controlplane.Options: scrape 100 ms, publish 50 ms; index.Config defaults).
func DefaultConfig() Config {
	fc := filterDefaults()
	return Config{
		Model: workload.DefaultModel, Routers: 1,
		Rule:           fc.RuleParams(),
		ScrapeInterval: 100 * time.Millisecond, PublishInterval: 50 * time.Millisecond,
		PollInterval:   time.Duration(fc.ControlPlane.PollMs) * time.Millisecond,
		Wait:           time.Duration(max(fc.ControlPlane.WaitMs, 0)) * time.Millisecond,
		ReportInterval: time.Duration(fc.ControlPlane.ReportMs) * time.Millisecond,
		MaxReportBatch: fc.ControlPlane.MaxReportBatch, Filter: fc,
		AgeFromGeneration: true, LedgerStarts: true, Seed: 1,
	}
}

// filterDefaults is the filter's configuration with every default filled in.
func filterDefaults() api.Config {
	c, err := api.ParseConfig([]byte(`{"control_plane":{"cluster":"kvroute","authority":"kvroute"}}`))
	if err != nil {
		panic(fmt.Sprintf("kvroute sim: the filter's default configuration does not parse: %v", err))
	}
	return c
}

// Outage is a span in which the proxies cannot reach the control plane. With Failover,
// the replica they poll is gone and they reach another one after Duration: their
// reports meanwhile are not lost (the filter posts a copy of each to every replica, and
// each replica ingests the engines itself, so the other holds the same state).
type Outage struct {
	At, Duration time.Duration
	Failover     bool
}

// FailoverOutage is a SIGKILL of the control-plane replica the proxies poll, with
// another replica beside it: the long poll in flight fails at once and the leader asks
// the next replica on its next tick (filter/leader.go), one poll interval later.
func FailoverOutage(at time.Duration, cfg Config) Outage {
	return Outage{At: at, Duration: cfg.PollInterval, Failover: true}
}

// reportsLost reports whether a report posted at now is lost: in an outage without
// another replica to take it.
func (p *Policy) reportsLost(now time.Duration) bool {
	for _, o := range p.cfg.Outages {
		if now >= o.At && now < o.At+o.Duration {
			return !o.Failover
		}
	}
	return false
}

// cpDown reports whether the control plane is unreachable at now.
func (p *Policy) cpDown(now time.Duration) bool {
	_, down := p.cpBack(now)
	return down
}

// cpBack is when the outage around now ends (down: now is in one).
func (p *Policy) cpBack(now time.Duration) (back time.Duration, down bool) {
	for _, o := range p.cfg.Outages {
		if now >= o.At && now < o.At+o.Duration {
			return o.At + o.Duration, true
		}
	}
	return now, false
}

// Epoch is the wall-clock time of simulated time 0 (the filter and index use time.Time).
var Epoch = time.Unix(1_700_000_000, 0)

// Stats count what the proxies did, as the filter's metrics of the same names do.
type Stats struct {
	Decisions, Unrouted, Fallbacks, Spills int
	PredictedHits                          int
	ParseErrors, Oversized, SaltInjected   int
	Reports, ReportsApplied, ReportsLost   int
	Versions                               int
	// HeldForTable are the requests held for their proxy's first table
	// (kvroute_held_for_table_total).
	HeldForTable int
	// StaleDecisions are the rule's stale-regime decisions
	// (kvroute_stale_decisions_total).
	StaleDecisions int
	// Shed are the requests refused past capacity (api.Overload; 429).
	Shed int
	// Followed and FollowLost are the Responses follow-ups sent to the replica that
	// stored their previous response, or not (kvroute_follow_ups_affine_total,
	// kvroute_follow_ups_lost_total).
	Followed, FollowLost int
	// AffinityLearned are the entries the proxies took from the control plane
	// (kvroute_affinity_learned_total).
	AffinityLearned int
	// Applied counts the versions the proxies applied and ApplyLag their total delay
	// from publication (the Go mirror's proxies; not counted for kvroute-wasm).
	Applied  int
	ApplyLag time.Duration
}

// Policy is kvroute's policy over a simulated fleet.
type Policy struct {
	policy.Base
	cfg Config
	*controlPlane
	routerOf   func(*workload.Request) int
	frames     []published // not yet seen by every proxy
	framesBase int         // global number of frames[0]
	version    uint64

	routers []*router
	placed  map[uint64]*placement
	Stats   Stats
	// Label, when set, is the policy's name in results (variants of the deployment).
	Label string
}

type published struct {
	at time.Duration
	f  *table.Frame
}

type placement struct {
	router  int
	placed  bool // by the rule: a start report (at its first byte) and an outcome follow
	started bool // its start is reported
	report  api.Report
	// affinity is the key of the Responses answer's id, learned at its first bytes; the
	// outcome report carries it.
	affinity uint64
}

// router is one proxy in the simulation: its Proxy (what one Envoy's kvroute filter
// holds) and the leader's state.
type router struct {
	*Proxy
	name         string
	loaded       bool
	confirmed    time.Duration
	generated    time.Duration // when the newest applied version was published
	applied      int           // global number of frames applied
	poll, report policy.Timer
	// affinity polls the control plane for the other proxies' entries (api.AffinityPath)
	// from cursor affSince of epoch affEpoch.
	affinity           policy.Timer
	affSince, affEpoch uint64
	// Long poll (Config.Wait): polling is true from the first poll tick with the
	// control plane reachable until one without (a failed poll waits for the tick);
	// answered is when the control plane last answered.
	polling  bool
	answered time.Duration
	queue    []api.Report
	order    []int
	// responses is the filter's map of Responses answers (by api.AffinityKey) to the
	// replica that answered and when (filter/affinity.go): learned at their first body
	// bytes, or from the control plane; one per proxy, shared by its worker VMs.
	responses map[uint64]learned
	shares    []api.ShareEntry // a post's and an answer's entries, reused
	// held are the requests the proxy holds for its first table (filter/held.go).
	held map[uint64]bool
}

type learned struct {
	replica string
	at      time.Duration
}

func (cfg *Config) check() error {
	if cfg.Routers < 1 {
		cfg.Routers = 1
	}
	if cfg.ScrapeInterval <= 0 || cfg.PublishInterval <= 0 || cfg.PollInterval <= 0 || cfg.ReportInterval <= 0 {
		return fmt.Errorf("kvroute: scrape, publish, poll and report intervals must be positive")
	}
	fc := filterDefaults()
	if cfg.MaxReportBatch <= 0 {
		cfg.MaxReportBatch = fc.ControlPlane.MaxReportBatch
	}
	if cfg.Filter.MaxBodyBytes <= 0 {
		cfg.Filter = fc
	}
	if cfg.Model == "" {
		cfg.Model = workload.DefaultModel
	}
	if cfg.Index.ReportLag <= 0 {
		// As docs/configuration.md advises: the report interval and a tick (the
		// simulated leader posts on its own timer, so a second interval stands for it).
		cfg.Index.ReportLag = 2 * cfg.ReportInterval
	}
	return nil
}

// New builds the deployment over f; routerOf says which proxy gets a request.
func New(f policy.Fleet, routerOf func(*workload.Request) int, cfg Config) (*Policy, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rng := policy.NewRand(cfg.Seed, 21)
	p := &Policy{cfg: cfg, routerOf: routerOf, placed: map[uint64]*placement{}}
	p.controlPlane = newControlPlane(f, cfg, rng, p.publishVersion)
	for k := range cfg.Routers {
		r := &router{
			Proxy:  NewProxy(cfg.Filter, cfg.Rule, cfg.Seed*1000003+uint64(k), &p.Stats),
			name:   fmt.Sprintf("proxy-%d", k),
			poll:   policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.PollInterval)), Every: cfg.PollInterval},
			report: policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.ReportInterval)), Every: cfg.ReportInterval},
		}
		// The leader asks for affinity on the ticks it polls the table (filter/leader.go).
		r.affinity = policy.Timer{Next: r.poll.Next, Every: cfg.PollInterval}
		if cfg.NoLocal {
			r.rt.Local.MaxKeys = 0
		}
		if cfg.NoHomes {
			r.rt.HomeCredit = 0
		}
		r.responses, r.held = map[uint64]learned{}, map[uint64]bool{}
		r.rt.Follows = func(id []byte, tenant string) string {
			return r.responses[api.AffinityKey(api.AffinityResponse, tenant, id)].replica
		}
		p.routers = append(p.routers, r)
	}
	return p, nil
}

// Proxy is proxy k (tests, debugging).
func (p *Policy) Proxy(k int) *Proxy { return p.routers[k].Proxy }

func (p *Policy) Name() string {
	if p.Label != "" {
		return p.Label
	}
	return "kvroute"
}

// ---- control plane ----

func (p *Policy) NextWake() time.Duration {
	w := p.nextControlPlaneWake()
	for _, r := range p.routers {
		w = min(w, r.poll.At(), r.report.At(), r.affinity.At(), p.nextAnswer(r))
	}
	return w
}

func (p *Policy) Wake(now time.Duration) {
	p.wakeControlPlane(now)
	down := p.cpDown(now)
	for _, r := range p.routers {
		if r.poll.Due(now) {
			switch {
			case down:
				r.polling = false
			case p.cfg.Wait <= 0 || !r.polling:
				// A periodic poll, or the long poll's first: the control plane answers
				// at once with what the proxy lacks.
				p.pollTable(r, now)
				r.polling, r.answered = p.cfg.Wait > 0, now
			}
			r.rt.Prune(r.Proxy.confirmed, at(now))
		}
		if r.polling && !down && p.nextAnswer(r) <= now {
			p.pollTable(r, now)
			r.answered = now
		}
		if r.affinity.Due(now) && !down {
			if !p.cfg.AffinityPerProxy {
				p.pollAffinity(r, now)
			}
			if !p.cfg.SharesPerProxy {
				p.postShares(r, now)
			}
		}
		if r.report.Due(now) {
			if p.reportsLost(now) {
				p.Stats.ReportsLost += len(r.queue)
				r.queue = r.queue[:0]
			} else {
				p.postReports(r, now)
			}
		}
	}
	p.trimFrames()
}

// publishVersion turns the index's changes into the next table version, a delta frame
// as controlplane/publish builds it.
func (p *Policy) publishVersion(now time.Duration, ups []index.ModelUpdate) {
	p.version++
	f := &table.Frame{Kind: table.Delta, Version: p.version, Base: p.version - 1, GeneratedMs: at(now).UnixMilli()}
	for i := range ups {
		u := &ups[i]
		f.Models = append(f.Models, table.ModelChange{
			Name: u.Name, Removed: u.Removed, Reset: u.Reset, Config: u.Config,
			Replicas: u.Replicas, Tiers: u.Tiers, Upserts: u.Upserts, Removes: u.Removes,
			Homes: u.Homes,
		})
	}
	if p.cfg.GPUOnly {
		// What a format-1 filter receives: the frame through the format-1 encoding.
		g, err := table.Decode(table.Encode(f))
		if err != nil {
			panic(fmt.Sprintf("kvroute sim: format-1 v%d: %v", f.Version, err))
		}
		f = g
	}
	p.frames = append(p.frames, published{now, f})
	p.Stats.Versions++
}

// nextAnswer is when the control plane answers r's long poll: when the first version r
// lacks is Stale old, or with a 304 Wait after its last answer; never while r is not
// long-polling, and not before the control plane is back.
func (p *Policy) nextAnswer(r *router) time.Duration {
	if !r.polling {
		return policy.Never
	}
	t := r.answered + p.cfg.Wait
	if r.applied < p.framesBase+len(p.frames) {
		t = min(t, p.frames[r.applied-p.framesBase].at+p.cfg.Stale)
	}
	back, _ := p.cpBack(t)
	return back
}

// pollTable is the filter leader's poll: every version published at least Stale ago
// that the proxy lacks, applied in order; the table counts as confirmed now.
func (p *Policy) pollTable(r *router, now time.Duration) {
	for r.applied < p.framesBase+len(p.frames) {
		pf := p.frames[r.applied-p.framesBase]
		if pf.at > now-p.cfg.Stale {
			break
		}
		if err := r.t.ApplyFrame(pf.f); err != nil {
			panic(fmt.Sprintf("kvroute sim: %s cannot apply v%d: %v", r.name, pf.f.Version, err))
		}
		r.applied++
		r.loaded = true
		r.generated = pf.at
		p.Stats.Applied++
		p.Stats.ApplyLag += now - pf.at
	}
	if r.loaded {
		r.confirmed = now
		if p.cfg.AgeFromGeneration {
			r.confirmed = r.generated
		}
		r.Proxy.confirmed = at(r.confirmed)
	}
}

func (p *Policy) trimFrames() {
	lo := p.framesBase + len(p.frames)
	for _, r := range p.routers {
		lo = min(lo, r.applied)
	}
	if k := lo - p.framesBase; k > 64 {
		p.frames = append(p.frames[:0], p.frames[k:]...)
		p.framesBase = lo
	}
}

// postReports is the filter leader's batch post; the control plane applies it on
// arrival.
func (p *Policy) postReports(r *router, now time.Duration) {
	if len(r.queue) == 0 {
		return
	}
	n := min(len(r.queue), p.cfg.MaxReportBatch)
	b := api.ReportBatch{Proxy: r.name, Reports: r.queue[:n]}
	for i := range b.Reports {
		if err := b.Reports[i].Validate(); err != nil {
			panic(fmt.Sprintf("kvroute sim: invalid report: %v", err))
		}
	}
	p.Stats.ReportsApplied += p.ix.ApplyReports(&b, at(now), nil)
	p.aff.Add(&b, at(now))
	r.queue = append(r.queue[:0], r.queue[n:]...)
}

// pollAffinity is the filter leader's affinity poll (filter/affinitypoll.go): the
// entries other proxies reported since r's cursor, each kept unless r holds the key
// with that replica or a newer entry.
func (p *Policy) pollAffinity(r *router, now time.Duration) {
	b, _ := p.aff.Answer(nil, r.affSince, r.affEpoch, api.ProxyKey(r.name), at(now))
	epoch, next, es, err := api.ParseAffinityAnswer(b)
	if err != nil {
		panic(fmt.Sprintf("kvroute sim: %s: affinity answer: %v", r.name, err))
	}
	r.affEpoch, r.affSince = epoch, next
	for _, e := range es {
		when := now - time.Duration(e.AgeMs)*time.Millisecond
		if old, ok := r.responses[e.Key]; ok && (old.replica == e.Replica || old.at >= when) {
			continue
		}
		r.responses[e.Key] = learned{e.Replica, when}
		p.Stats.AffinityLearned++
	}
}

// postShares is the filter leader's shares post (api.SharesPath), on the ticks it polls
// affinity: the tenants' tokens r admitted since its last post, answered with the fleet's
// totals.
func (p *Policy) postShares(r *router, now time.Duration) {
	c := r.rt.Admit
	if c == nil {
		return
	}
	r.shares = c.Pending(r.shares[:0])
	p.shares.Add(r.shares, at(now))
	es, err := api.ParseShares(r.shares[:0], p.shares.Answer(nil, at(now)), api.MaxSharesAnswer)
	if err != nil {
		panic(fmt.Sprintf("kvroute sim: %s: shares answer: %v", r.name, err))
	}
	c.SetFleet(es, at(now))
	r.shares = es
}

// ---- proxies ----

// Route is the filter's request path (filter/request.go): the proxy the request reaches
// runs route.Router.Route on its table.
func (p *Policy) Route(req *workload.Request, now time.Duration) policy.Choice {
	k := p.routerOf(req)
	r := p.routers[k]
	if !r.loaded {
		if p.holdForTable(r, req, now) {
			return policy.Choice{Retry: r.untilTick(now)}
		}
		p.Stats.Unrouted++ // no table yet: the header stays unset and Envoy decides
		return policy.Choice{}
	}
	delete(r.held, req.ID)
	nowT := at(now)
	schema := req.Schema
	if schema == 0 {
		schema = prompt.Chat
	}
	d, res := r.Proxy.Route(&route.Request{ID: req.ID, Schema: schema, Body: req.Body, Tenant: req.Tenant, Class: req.Class}, nowT)
	if res.Verdict.Shed() {
		return policy.Choice{Shed: true}
	}
	if res.Action == route.Unrouted {
		return policy.Choice{}
	}
	pl := &placement{router: k}
	if res.Action == route.Placed {
		pl.placed, pl.report = true, res.Placement
		r.queue = append(r.queue, res.Placement)
		p.Stats.Reports++
	}
	p.placed[req.ID] = pl
	r.order = r.order[:0]
	for _, a := range d.Addrs {
		if i, ok := p.addrIdx[a]; ok {
			r.order = append(r.order, i)
		}
	}
	return policy.Choice{Order: r.order, Rule: res.Action == route.Placed, Spill: d.Spill}
}

// holdForTable is the filter's held.go: a request that finds no table is held while
// route.HoldForTable agrees (the proxies start with the simulation), and released on a
// tick (the proxy's poll timer is its tick): routed if the table came, else left to
// Envoy.
func (p *Policy) holdForTable(r *router, req *workload.Request, now time.Duration) bool {
	already := r.held[req.ID]
	if route.HoldForTable(now, p.cfg.Filter.FirstTableWait(), len(r.held), already) {
		if !already {
			r.held[req.ID] = true
			p.Stats.HeldForTable++
		}
		return true
	}
	delete(r.held, req.ID)
	return false
}

// untilTick is how long from now to the proxy's next tick.
func (r *router) untilTick(now time.Duration) time.Duration {
	if d := r.poll.At() - now; d > 0 {
		return d
	}
	return r.poll.Every
}

// Started is OnHttpResponseHeaders. The ledger entry stays: vLLM sends a stream's
// headers before prefill even starts (and a non-streamed response's headers come
// with its body, right before FirstByte).
func (p *Policy) Started(*workload.Request, int, time.Duration) {}

// FirstByte is OnHttpResponseBody's first call: prefill is done (for a stream, the first
// token), so the engine's queue numbers no longer hold the request's prefill.
func (p *Policy) FirstByte(req *workload.Request, i int, now time.Duration) {
	if pl := p.placed[req.ID]; pl != nil {
		if req.Schema == prompt.Responses && pl.placed {
			// The answer's first bytes carry its id (filter/response.go learnResponseID).
			pl.affinity = api.AffinityKey(api.AffinityResponse, req.Tenant, []byte(workload.ResponseID(req.ID)))
			p.routers[pl.router].responses[pl.affinity] = learned{p.f.Addr(i), now}
		}
		r := p.routers[pl.router]
		if p.cfg.LedgerStarts {
			r.rt.Started(req.ID, at(now))
		} else {
			r.rt.Done(req.ID)
		}
		if pl.placed && !pl.started { // the start report (filter/response.go)
			pl.started = true
			r.queue = append(r.queue, route.Start(&pl.report, at(now)))
			p.Stats.Reports++
		}
	}
}

// Finished is OnHttpStreamDone and the outcome report (filter/response.go finish).
func (p *Policy) Finished(req *workload.Request, i int, now time.Duration, o policy.Outcome) {
	pl := p.placed[req.ID]
	if pl == nil {
		return
	}
	delete(p.placed, req.ID)
	r := p.routers[pl.router]
	r.rt.Done(req.ID)
	if !pl.placed {
		return
	}
	var usage *prompt.Usage
	if o.CachedTokens >= 0 {
		usage = &prompt.Usage{PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens}
	}
	// upstream.address: the replica that served
	out := route.Outcome(pl.report, p.f.Addr(i), o.Status, usage, at(now))
	out.Affinity = pl.affinity
	r.queue = append(r.queue, out)
	p.Stats.Reports++
}

// Events, WantsEvents and Membership are the control plane's.
func (p *Policy) Events(i int, at time.Duration, evs []kvevents.Event) {
	p.controlPlane.Events(i, at, evs)
}
func (p *Policy) WantsEvents() bool            { return true }
func (p *Policy) Membership(now time.Duration) { p.controlPlane.Membership(now) }
