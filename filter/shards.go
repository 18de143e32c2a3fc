package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// A shard is one control plane and the models whose table it serves (api.Shard). The
// filter polls every shard it is configured for; each has its own keys in shared data
// (store.go), its own copy of the table on every VM, its own poll and report schedule on
// the leader (leader.go) and its own reports and report queue (reports.go). A request routes on
// the table of its (base) model's shard (tableFor, called by route.Router.Route once the
// model is known), and its reports go to that shard's control plane. A configuration
// without shards (the control_plane block) is one unnamed shard that serves every model,
// under the keys the filter always used: nothing changes for it.
type shard struct {
	name    string // "" for the control_plane block
	cp      *api.ControlPlane
	keys    keys
	view    view
	sched   schedule // its poll and report schedule on the leader
	reports reports  // this VM's reports for this shard since its last flush, and its queue
	gauges  *shardGauges
}

// shardGauges are a named shard's own metrics; the totals (polls, loads, ...) count
// every shard, and kvroute_table_age_ms is the stalest shard's.
type shardGauges struct {
	version, ageMs proxywasm.MetricGauge
	pollErrors     proxywasm.MetricCounter
}

// shardSet is the VM's shards and which one serves each model.
type shardSet struct {
	list    []*shard
	byModel map[string]*shard
	every   *shard // the shard serving every model: a configuration without shards
}

// newShardSet builds the VM's shards from the configuration, and the model index the
// request path looks them up in. Their reports carry proxy's name; value is the VM's
// shared-data buffer (hostmem.go).
func newShardSet(cfg *api.Config, tick int, proxy string, value *hostBuf, m *metrics) shardSet {
	list := cfg.ShardList()
	ss := shardSet{list: make([]*shard, len(list)), byModel: map[string]*shard{}}
	for i := range list {
		sc := &list[i]
		s := &shard{name: sc.Name, cp: &sc.ControlPlane, keys: newKeys(sc.Name), view: newView()}
		s.sched = newSchedule(s.cp, tick)
		if s.name != "" {
			pre := "kvroute_shard_" + s.name + "_"
			s.gauges = &shardGauges{
				version:    gaugeNamed(pre + "table_version"),
				ageMs:      gaugeNamed(pre + "table_age_ms"),
				pollErrors: counterNamed(pre + "table_poll_errors_total"),
			}
		}
		s.reports = reports{keys: &s.keys, maxBatch: s.cp.MaxReportBatch, proxy: proxy,
			value: value, dropped: m.reportsDropped}
		var err error
		// Every VM registers the same queue names and gets the same ids; only the leader
		// drains them, on its tick.
		if s.reports.queueID, err = proxywasm.RegisterSharedQueue(s.keys.queue); err != nil {
			proxywasm.LogErrorf("kvroute: cannot register the report queue %s, reports are off: %v", s.keys.queue, err)
		}
		s.reports.ok = err == nil
		if len(sc.Models) == 0 {
			ss.every = s
		}
		for _, m := range sc.Models {
			ss.byModel[m] = s
		}
		ss.list[i] = s
	}
	return ss
}

// describe names the control planes for the start-up log.
func (ss *shardSet) describe(cfg *api.Config) string {
	if len(ss.list) == 1 && ss.list[0].name == "" {
		return "control plane " + ss.list[0].cp.Cluster
	}
	var b strings.Builder
	for i, s := range ss.list {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "shard %s (%d models) at %s", s.name, len(cfg.Shards[i].Models), s.cp.Cluster)
	}
	return b.String()
}

// minTick is the tick the leader needs: the shortest poll or report interval, within
// 10..100 ms.
func minTick(cfg *api.Config) int {
	tick := 100
	for _, sc := range cfg.ShardList() {
		tick = min(tick, sc.ControlPlane.PollMs, sc.ControlPlane.ReportMs)
	}
	return max(10, tick)
}

// flushReports hands every shard's batch of reports to its queue (each VM, each tick).
func (ss *shardSet) flushReports() {
	for _, s := range ss.list {
		s.reports.flush()
	}
}

// serving is the shard that serves a base model (nil: none does).
func (ss *shardSet) serving(model string) *shard {
	if ss.every != nil {
		return ss.every
	}
	return ss.byModel[model]
}

// tableFor is route.Router.Tables: the table of the shard that serves a base model, and
// its age. A model no shard serves gets none: the request is left unrouted, which fails
// open exactly as a request before the first table does (no endpoint header; Envoy's
// fallback load balancer picks a replica, the request is never dropped), and route counts
// it in kvroute_unserved_model_total. The shard is remembered for the request's reports.
func (p *plugin) tableFor(model string) (*table.Table, time.Duration) {
	s := p.shards.serving(model)
	p.routed = s
	if s == nil {
		return nil, 0
	}
	if !s.view.loaded {
		// A worker that has not loaded this shard's table yet (just started, or a config
		// reload) reads the one in shared data now instead of failing open until its
		// next tick.
		s.view.sync(&s.keys, &p.metrics, p.reqNow)
	}
	return s.view.t, s.view.age(p.reqNow)
}

// sync catches every shard's copy up with shared data (each VM, each tick) and sets the
// table gauges.
func (ss *shardSet) sync(m *metrics, now time.Time) {
	var stalest time.Duration
	known := false
	for _, s := range ss.list {
		if !s.view.sync(&s.keys, m, now) {
			continue // no head yet: the table's age is unknown
		}
		age := s.view.age(now)
		stalest, known = max(stalest, age), true
		if s.gauges != nil {
			set(s.gauges.ageMs, int64(age/time.Millisecond))
		}
	}
	if known {
		set(m.tableAgeMs, int64(stalest/time.Millisecond))
	}
}

// confirmed is when every shard's table was last known current (the oldest such time;
// zero while a shard has none): this VM's own placements of any model are kept until
// then (route.Router.Prune).
func (ss *shardSet) confirmed() time.Time {
	var oldest time.Time
	for i, s := range ss.list {
		c := s.view.confirmed
		if c.IsZero() {
			return time.Time{}
		}
		if i == 0 || c.Before(oldest) {
			oldest = c
		}
	}
	return oldest
}

// versionLoaded sets the table version gauges once the leader applied a version of s:
// kvroute_table_version is the lowest version among the shards (0 until every shard has
// a table; with one shard, its version).
func (ss *shardSet) versionLoaded(s *shard, m *metrics) {
	if s.gauges != nil {
		set(s.gauges.version, int64(s.view.t.Version))
	}
	lowest := s.view.t.Version
	for _, o := range ss.list {
		v := uint64(0)
		if o.view.loaded {
			v = o.view.t.Version
		}
		lowest = min(lowest, v)
	}
	set(m.tableVersion, int64(lowest))
}
