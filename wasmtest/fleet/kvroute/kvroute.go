// Package kvroute is kvroute's own policy in the fleet simulation, built from the real
// code: each proxy is a shared/route Router (Decide and its Ledger) driven exactly as
// the filter drives it (filter/request.go, filter/response.go), and the control plane is
// controlplane/index in-process, fed what the real one is fed:
//
//   - the proxies' placement and outcome reports (api.Report values, posted in batches
//     every ReportInterval as the filter's leader does);
//   - every engine's KV events (the Go values the engine emits, one batch per step);
//   - scrapes of every engine's state (queued prefill tokens, KV usage, waiting and
//     running) every ScrapeInterval; a dead engine's scrape fails.
//
// Every PublishInterval the index's changes become a table version (a delta frame, as
// controlplane/publish makes them). Each proxy polls every PollInterval and receives
// the newest version that is at least Stale old; like the filter, it takes the table as
// current from the moment its poll returned (it cannot see the lag).
//
// The proxies parse the OpenAI body with shared/prompt, hash its canonical text with
// route.NewChain, and route on it; they never see token ids.
package kvroute

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
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
	// 50 ms) and the filter's (api.ControlPlane defaults: poll 100 ms, reports 500 ms).
	ScrapeInterval, PublishInterval time.Duration
	PollInterval, ReportInterval    time.Duration
	MaxReportBatch                  int
	// Stale delays the table every proxy receives.
	Stale time.Duration
	Seed  uint64
	// TokenKeys feeds the index the engines' BlockStored events too. They only make
	// token-domain keys, which text-domain (chat) requests never match, so routing is
	// the same without them (TestTokenKeysDoNotChangeTextRouting) at a third of the
	// cost; removals and clears, which age and clear text-domain entries, always go in.
	TokenKeys bool
	// LedgerDoneAtFirstByte ends a request's ledger entry at its first response body
	// bytes instead of its response headers: a proposed change to filter/response.go,
	// not what the filter does (vLLM streams send headers before prefill even starts).
	LedgerDoneAtFirstByte bool
	// AgeFromGeneration dates the table from when its version was generated instead of
	// when the poll returned: a proposed change (the control plane would tell the filter
	// its version's age), so the ledger's "sent after the snapshot" cut-off and the
	// state-age guard see the real age of the queue numbers.
	AgeFromGeneration bool
}

// DefaultConfig is kvroute as shipped.
func DefaultConfig() Config {
	return Config{
		Model: workload.DefaultModel, Routers: 1, Rule: rule.DefaultParams(),
		ScrapeInterval: 100 * time.Millisecond, PublishInterval: 50 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, ReportInterval: 500 * time.Millisecond,
		MaxReportBatch: 512, Seed: 1,
	}
}

// Epoch is the wall-clock time of simulated time 0 (the filter and index use time.Time).
var Epoch = time.Unix(1_700_000_000, 0)

// Stats count what the proxies did.
type Stats struct {
	Decisions, Unrouted, Fallbacks, Spills int
	ParseErrors                            int
	Reports, ReportsApplied                int
	Versions                               int
}

// Policy is kvroute's policy over a simulated fleet.
type Policy struct {
	policy.Base
	cfg      Config
	f        policy.Fleet
	routerOf func(*workload.Request) int
	ix       *index.Index
	events   cpkv.Handler
	ids      []string
	addrIdx  map[string]int
	seq      []uint64
	listed   []bool
	evbuf    []cpkv.Event

	scrape, publish policy.Timer
	frames          []published // not yet seen by every proxy
	framesBase      int         // global number of frames[0]
	version         uint64

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
	router int
	report api.Report
}

// router is one proxy: what one Envoy's kvroute filter holds.
type router struct {
	name         string
	rt           *route.Router
	t            *table.Table
	loaded       bool
	confirmed    time.Duration
	generated    time.Duration // when the newest applied version was published
	applied      int           // global number of frames applied
	poll, report policy.Timer
	queue        []api.Report
	parser       prompt.Parser
	keys         []uint64
	order        []int
}

var errRefused = errors.New("connect: connection refused")

// New builds the deployment over f; routerOf says which proxy gets a request.
func New(f policy.Fleet, routerOf func(*workload.Request) int, cfg Config) (*Policy, error) {
	if cfg.Routers < 1 {
		cfg.Routers = 1
	}
	if cfg.ScrapeInterval <= 0 || cfg.PublishInterval <= 0 || cfg.PollInterval <= 0 || cfg.ReportInterval <= 0 {
		return nil, fmt.Errorf("kvroute: scrape, publish, poll and report intervals must be positive")
	}
	if cfg.MaxReportBatch <= 0 {
		cfg.MaxReportBatch = 512
	}
	if cfg.Model == "" {
		cfg.Model = workload.DefaultModel
	}
	p := &Policy{cfg: cfg, f: f, routerOf: routerOf, ix: index.New(cfg.Index),
		addrIdx: map[string]int{}, seq: make([]uint64, f.Len()), listed: make([]bool, f.Len()),
		placed: map[uint64]*placement{}}
	p.events = p.ix.Events()
	rng := policy.NewRand(cfg.Seed, 21)
	for i := range f.Len() {
		p.ids = append(p.ids, fmt.Sprintf("engine-%d", i))
		p.addrIdx[f.Addr(i)] = i
	}
	p.scrape = policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.ScrapeInterval)), Every: cfg.ScrapeInterval}
	p.publish = policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.PublishInterval)), Every: cfg.PublishInterval}
	for k := range cfg.Routers {
		r := &router{
			name:   fmt.Sprintf("proxy-%d", k),
			rt:     route.NewRouter(cfg.Rule, cfg.Seed*1000003+uint64(k)),
			t:      table.New(),
			poll:   policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.PollInterval)), Every: cfg.PollInterval},
			report: policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.ReportInterval)), Every: cfg.ReportInterval},
		}
		p.routers = append(p.routers, r)
	}
	p.discover(0)
	return p, nil
}

// Index exposes the control plane's index (tests, debugging).
func (p *Policy) Index() *index.Index { return p.ix }

func (p *Policy) Name() string {
	if p.Label != "" {
		return p.Label
	}
	return "kvroute"
}

func (p *Policy) WantsEvents() bool { return true }

func at(d time.Duration) time.Time { return Epoch.Add(d) }

// discover gives the index discovery's replica list: every replica Fleet.Up lists.
func (p *Policy) discover(now time.Duration) {
	var specs []index.Spec
	for i := range p.f.Len() {
		p.listed[i] = p.f.Up(i)
		if p.listed[i] {
			specs = append(specs, index.Spec{ID: p.ids[i], Model: p.cfg.Model, Addr: p.f.Addr(i), Kind: scrape.VLLM, Events: true})
		}
	}
	p.ix.SetReplicas(specs, at(now))
}

func (p *Policy) Membership(now time.Duration) { p.discover(now) }

// ---- control plane ----

func (p *Policy) NextWake() time.Duration {
	w := min(p.scrape.At(), p.publish.At())
	for _, r := range p.routers {
		w = min(w, r.poll.At(), r.report.At())
	}
	return w
}

func (p *Policy) Wake(now time.Duration) {
	if p.scrape.Due(now) {
		p.scrapeAll(now)
	}
	if p.publish.Due(now) {
		p.publishVersion(now)
	}
	for _, r := range p.routers {
		if r.poll.Due(now) {
			p.pollTable(r, now)
		}
		if r.report.Due(now) {
			p.postReports(r, now)
		}
	}
	p.trimFrames()
}

func (p *Policy) scrapeAll(now time.Duration) {
	bs := p.f.BlockSize()
	for i := range p.f.Len() {
		if !p.listed[i] {
			continue
		}
		if !p.f.Reachable(i) {
			p.ix.ApplyScrape(p.ids[i], scrape.Sample{}, errRefused, at(now))
			continue
		}
		st, stats := p.f.State(i), p.f.Stats(i)
		s := scrape.Sample{
			Waiting: float64(st.Waiting), Running: float64(st.Running),
			KVUsage: st.KVUsage, HasKVUsage: true,
			QueuedTokens: float64(st.QueuedPrefillTokens), HasQueuedTokens: true,
			CapacityTokens: int64(p.f.CapacityTokens(i)), BlockSize: bs,
		}
		if stats.PrefixQueries > 0 {
			s.HitRate = float64(stats.PrefixHits) / float64(stats.PrefixQueries)
		}
		p.ix.ApplyScrape(p.ids[i], s, nil, at(now))
	}
}

// publishVersion turns the index's changes into the next table version, a delta frame
// as controlplane/publish builds it.
func (p *Policy) publishVersion(now time.Duration) {
	ups := p.ix.Flush(at(now), false)
	if ups == nil {
		return
	}
	p.version++
	f := &table.Frame{Kind: table.Delta, Version: p.version, Base: p.version - 1, GeneratedMs: at(now).UnixMilli()}
	for i := range ups {
		u := &ups[i]
		f.Models = append(f.Models, table.ModelChange{
			Name: u.Name, Removed: u.Removed, Reset: u.Reset, Config: u.Config,
			Replicas: u.Replicas, Upserts: u.Upserts, Removes: u.Removes,
		})
	}
	p.frames = append(p.frames, published{now, f})
	p.Stats.Versions++
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
	}
	if r.loaded {
		r.confirmed = now
		if p.cfg.AgeFromGeneration {
			r.confirmed = r.generated
		}
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
	r.queue = append(r.queue[:0], r.queue[n:]...)
}

// Events feeds replica i's KV event batch to the index, as the subscriber would.
func (p *Policy) Events(i int, _ time.Duration, evs []kvevents.Event) {
	if !p.listed[i] {
		return
	}
	p.evbuf = p.evbuf[:0]
	for k := range evs {
		e := &evs[k]
		ce := cpkv.Event{Hashes: e.BlockHashes, Medium: e.Medium, GroupIdx: e.GroupIdx, SpecKind: e.KVCacheSpecKind}
		switch e.Kind {
		case kvevents.BlockStored:
			if !p.cfg.TokenKeys {
				continue
			}
			ce.Kind, ce.Tag = cpkv.BlockStored, "BlockStored"
			ce.Parent, ce.HasParent = e.ParentBlockHash, e.HasParent
			ce.Tokens, ce.BlockSize = e.TokenIDs, e.BlockSize
			ce.LoraName, ce.LoraID, ce.HasLoraID = e.LoraName, int64(e.LoraID), e.LoraID != 0
			if len(e.ExtraKeys) > 0 {
				ce.FirstExtra = e.ExtraKeys[0]
			}
		case kvevents.BlockRemoved:
			ce.Kind, ce.Tag = cpkv.BlockRemoved, "BlockRemoved"
		case kvevents.AllBlocksCleared:
			ce.Kind, ce.Tag = cpkv.AllBlocksCleared, "AllBlocksCleared"
		default:
			ce.Kind = cpkv.Unknown
		}
		p.evbuf = append(p.evbuf, ce)
	}
	if len(p.evbuf) == 0 {
		return
	}
	p.seq[i]++
	p.events.Batch(cpkv.StreamID{Replica: p.ids[i]}, p.seq[i], &cpkv.Batch{Events: p.evbuf})
}

// ---- proxies ----

// Route is filter/request.go's decide for a chat request.
func (p *Policy) Route(req *workload.Request, now time.Duration) policy.Choice {
	k := p.routerOf(req)
	r := p.routers[k]
	if !r.loaded {
		p.Stats.Unrouted++ // no table yet: the header stays unset and Envoy decides
		return policy.Choice{}
	}
	pr, err := r.parser.Parse(prompt.Chat, req.Body, prompt.Limits{MaxBytes: 4 << 20, MaxDepth: 64})
	if err != nil {
		p.Stats.ParseErrors++
		return policy.Choice{}
	}
	m := r.t.Models[pr.Model]
	if m == nil || len(m.Replicas) == 0 {
		p.Stats.Unrouted++
		return policy.Choice{}
	}
	nowT := at(now)
	chain := route.NewChain(m.Config, route.Identity{Model: pr.Model}, &pr, r.keys)
	r.keys = chain.Keys
	d := r.rt.Decide(m, &chain, now-r.confirmed, nowT)
	if len(d.Addrs) == 0 {
		p.Stats.Unrouted++
		return policy.Choice{}
	}
	r.rt.Ledger.Add(req.ID, d.Addrs[0], d.Uncached, nowT)
	p.Stats.Decisions++
	if d.Spill {
		p.Stats.Spills++
	}
	if d.Fallback {
		p.Stats.Fallbacks++
	}
	stride := max(int(m.Config.Stride), 1)
	rep := api.Report{
		Kind: api.KindPlacement, Model: pr.Model, Replica: d.Addrs[0], Domain: chain.Domain,
		BlockSize: chain.BlockSize, Stride: stride, Blocks: len(chain.Keys),
		Keys:        prefix.Checkpoints(nil, chain.Keys, stride),
		PromptBytes: chain.PromptBytes, PredictedCachedTokens: int(d.PredictedCached),
		AtMs: nowT.UnixMilli(),
	}
	r.queue = append(r.queue, rep)
	p.Stats.Reports++
	p.placed[req.ID] = &placement{router: k, report: rep}
	r.order = r.order[:0]
	for _, a := range d.Addrs {
		if i, ok := p.addrIdx[a]; ok {
			r.order = append(r.order, i)
		}
	}
	return policy.Choice{Order: r.order, Rule: true, Spill: d.Spill}
}

// Started is OnHttpResponseHeaders: the engine started answering, so its own queue
// numbers cover the request now.
func (p *Policy) Started(req *workload.Request, _ int, _ time.Duration) {
	if pl := p.placed[req.ID]; pl != nil && !p.cfg.LedgerDoneAtFirstByte {
		p.routers[pl.router].rt.Ledger.Done(req.ID)
	}
}

// FirstByte ends the ledger entry when LedgerDoneAtFirstByte is set.
func (p *Policy) FirstByte(req *workload.Request, _ int, _ time.Duration) {
	if pl := p.placed[req.ID]; pl != nil && p.cfg.LedgerDoneAtFirstByte {
		p.routers[pl.router].rt.Ledger.Done(req.ID)
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
	r.rt.Ledger.Done(req.ID)
	rep := pl.report
	rep.Kind = api.KindOutcome
	rep.Status = o.Status
	rep.AtMs = at(now).UnixMilli()
	rep.Replica = p.f.Addr(i) // upstream.address: the replica that served
	rep.CachedTokens = -1
	if o.CachedTokens >= 0 {
		rep.PromptTokens, rep.CachedTokens = o.PromptTokens, o.CachedTokens
	}
	r.queue = append(r.queue, rep)
	p.Stats.Reports++
}
