package kvroute

import (
	"errors"
	"fmt"
	"time"

	cpaffinity "github.com/kvroute/kvroute/controlplane/affinity"
	"github.com/kvroute/kvroute/controlplane/index"
	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	cpshares "github.com/kvroute/kvroute/controlplane/shares"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
)

// controlPlane is the control plane in-process: discovery's list, scrapes and KV events
// into controlplane/index, and a version from the index's changes every publish
// interval (handed to publish, which gives it to the proxies).
type controlPlane struct {
	cfg     Config
	f       policy.Fleet
	ix      *index.Index
	aff     *cpaffinity.Map // the Responses affinity the reports carry (api.AffinityPath)
	shares  *cpshares.Fleet // the tenants' admitted prefill the proxies post (api.SharesPath)
	events  cpkv.Handler
	ids     []string
	addrIdx map[string]int
	seq     []uint64
	listed  []bool
	evbuf   []cpkv.Event

	scrape, flush policy.Timer
	publish       func(now time.Duration, ups []index.ModelUpdate)
}

var errRefused = errors.New("connect: connection refused")

func newControlPlane(f policy.Fleet, cfg Config, rng *policy.Rand, publish func(time.Duration, []index.ModelUpdate)) *controlPlane {
	c := &controlPlane{cfg: cfg, f: f, ix: index.New(cfg.Index), aff: cpaffinity.New(1, 0, 0, cpaffinity.Counts{}), shares: cpshares.New(cpshares.Counts{}), addrIdx: map[string]int{},
		seq: make([]uint64, f.Len()), listed: make([]bool, f.Len()), publish: publish}
	c.events = c.ix.Events()
	for i := range f.Len() {
		c.ids = append(c.ids, fmt.Sprintf("engine-%d", i))
		c.addrIdx[f.Addr(i)] = i
	}
	c.scrape = policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.ScrapeInterval)), Every: cfg.ScrapeInterval}
	c.flush = policy.Timer{Next: time.Duration(rng.Uint64() % uint64(cfg.PublishInterval)), Every: cfg.PublishInterval}
	c.discover(0)
	return c
}

// Index exposes the control plane's index (tests, debugging).
func (c *controlPlane) Index() *index.Index { return c.ix }

func (c *controlPlane) WantsEvents() bool { return true }

func at(d time.Duration) time.Time { return Epoch.Add(d) }

// discover gives the index discovery's replica list: every replica Fleet.Up lists.
func (c *controlPlane) discover(now time.Duration) {
	var specs []index.Spec
	for i := range c.f.Len() {
		c.listed[i] = c.f.Up(i)
		if c.listed[i] {
			specs = append(specs, index.Spec{ID: c.ids[i], Model: c.cfg.Model, Addr: c.f.Addr(i), Kind: scrape.VLLM, Events: true})
		}
	}
	c.ix.SetReplicas(specs, at(now))
}

func (c *controlPlane) Membership(now time.Duration) { c.discover(now) }

func (c *controlPlane) nextControlPlaneWake() time.Duration { return min(c.scrape.At(), c.flush.At()) }

// wakeControlPlane runs the scrape and publish timers due at now.
func (c *controlPlane) wakeControlPlane(now time.Duration) {
	if c.scrape.Due(now) {
		c.scrapeAll(now)
	}
	if c.flush.Due(now) {
		if ups := c.ix.Flush(at(now), false); ups != nil {
			c.publish(now, ups)
		}
	}
}

func (c *controlPlane) scrapeAll(now time.Duration) {
	bs := c.f.BlockSize()
	for i := range c.f.Len() {
		if !c.listed[i] {
			continue
		}
		if !c.f.Reachable(i) {
			c.ix.ApplyScrape(c.ids[i], scrape.Sample{}, errRefused, at(now))
			continue
		}
		st, stats := c.f.State(i), c.f.Stats(i)
		s := scrape.Sample{
			Waiting: float64(st.Waiting), Running: float64(st.Running),
			KVUsage: st.KVUsage, HasKVUsage: true,
			CapacityTokens: int64(c.f.CapacityTokens(i)), BlockSize: bs,
		}
		if !c.cfg.StockMetrics { // stock vLLM exports no queued-prefill gauge
			// The engine simulator stamps the gauge with when it read it, in the
			// exposition format's whole milliseconds (wasmtest/engine/metrics).
			s.QueuedTokens, s.HasQueuedTokens = float64(st.QueuedPrefillTokens), true
			s.QueuedAt = time.UnixMilli(at(now).UnixMilli())
		}
		if stats.PrefixQueries > 0 {
			s.HitRate = float64(stats.PrefixHits) / float64(stats.PrefixQueries)
		}
		s.SetTokenCounters(float64(stats.PrefixQueries), float64(stats.PrefixHits), float64(stats.GenerationTokens))
		asked := at(now - c.cfg.ScrapeLatency)
		s.DateQueued(asked, at(now)) // as controlplane.scrapeLoop dates it
		c.ix.ApplyScrape(c.ids[i], s, nil, asked)
	}
}

// Events feeds replica i's KV event batch, published at engine time now, to the index,
// as the subscriber would: stamped with that time, as vLLM's scheduler stamps each batch
// time.time() (KVEventBatch(ts=...), vllm/v1/core/sched/scheduler.py).
func (c *controlPlane) Events(i int, now time.Duration, evs []kvevents.Event) {
	if !c.listed[i] {
		return
	}
	c.evbuf = c.evbuf[:0]
	for k := range evs {
		e := &evs[k]
		ce := cpkv.Event{Hashes: e.BlockHashes, Medium: e.Medium, GroupIdx: e.GroupIdx, SpecKind: e.KVCacheSpecKind}
		switch e.Kind {
		case kvevents.BlockStored:
			if !c.cfg.TokenKeys && e.Medium == kvevents.MediumGPU {
				continue // a slower tier's stores (hash-only) always go in: they show the tier
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
		c.evbuf = append(c.evbuf, ce)
	}
	if len(c.evbuf) == 0 {
		return
	}
	c.seq[i]++
	ts := float64(at(now).UnixNano()) / 1e9
	c.events.Batch(cpkv.StreamID{Replica: c.ids[i]}, c.seq[i], &cpkv.Batch{TS: ts, Events: c.evbuf})
}
