package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/route"
)

// metrics are proxy-wasm stats: Envoy shares one stat per name across the worker VMs and
// exports them with its own (e.g. Prometheus) stats.
type metrics struct {
	decisions      proxywasm.MetricCounter // requests routed by the rule
	predictedHits  proxywasm.MetricCounter // ... whose pick was predicted to hold part of the prefix
	spills         proxywasm.MetricCounter // ... sent away from the replica with the longest prefix
	staleDecisions proxywasm.MetricCounter // ... with state too old for queue numbers (shared/rule's stale regime)
	fallbacks      proxywasm.MetricCounter // routed least-queued: no usable state, or no prompt
	unrouted       proxywasm.MetricCounter // header left unset: no table or unknown model
	unservedModel  proxywasm.MetricCounter // ... because no shard serves the model (failed open)
	heldForTable   proxywasm.MetricCounter // held for the model's first table (held.go)
	parseErrors    proxywasm.MetricCounter // bodies that could not be parsed
	oversized      proxywasm.MetricCounter // bodies above max_body_bytes (content-length: not held; else routed least-queued)
	saltInjected   proxywasm.MetricCounter // cache_salt set for isolated tenants
	// Isolated tenants' requests refused because their body could not be salted
	// (route.Refusal), by reason.
	refusedOversized  proxywasm.MetricCounter // body above max_body_bytes (413)
	refusedUnparsable proxywasm.MetricCounter // body kvroute cannot parse (400)
	refusedUnread     proxywasm.MetricCounter // host would not hand over or take back the body (503)
	refusedPath       proxywasm.MetricCounter // body on a path kvroute does not salt (403)
	outcomes          proxywasm.MetricCounter // responses whose usage was read
	// Successful responses to placed requests that carried no usage: streams that did
	// not ask for it (stream_options.include_usage) from engines that do not force it
	// (vLLM --enable-force-include-usage, SGLang --stream-response-default-include-usage).
	outcomesWithoutUsage proxywasm.MetricCounter
	ledgerExpired        proxywasm.MetricCounter // local queue entries dropped by timeout
	// Requests refused past capacity (429), by class and reason (package admit):
	// kvroute_shed_<class>_<reason>_total; none without overload classes.
	shedBy [][]proxywasm.MetricCounter
	// Responses requests naming previous_response_id: sent first to the replica that
	// answered it, or not (unknown, gone or unhealthy: the engine may not find it).
	followed   proxywasm.MetricCounter
	followLost proxywasm.MetricCounter
	// Responses responses whose id was not found in the body's first bytes.
	responseIDsMissed proxywasm.MetricCounter

	polls          proxywasm.MetricCounter // table polls sent (leader)
	pollErrors     proxywasm.MetricCounter // ... that failed
	failovers      proxywasm.MetricCounter // ... after which the leader asked the next control-plane replica
	tableLoads     proxywasm.MetricCounter // table versions loaded from shared data
	tableErrors    proxywasm.MetricCounter // shared-data reads that failed verification
	reportsSent    proxywasm.MetricCounter
	reportsDropped proxywasm.MetricCounter
	copiesSent     proxywasm.MetricCounter // reports also posted to another control-plane replica (failover)
	copiesDropped  proxywasm.MetricCounter // ... that it did not take, or that were not sent (it had too many outstanding)
	// Affinity entries other proxies learned (api.AffinityPath): written into the map,
	// and the fetches that failed (a control plane that does not serve them included).
	affinityLearned    proxywasm.MetricCounter
	affinityPollErrors proxywasm.MetricCounter
	// sharesErrors counts the tenant shares (api.SharesPath) lost: posts that failed or
	// were not answered, and tokens left out of the pending entry (shares.go).
	sharesErrors proxywasm.MetricCounter

	tableVersion proxywasm.MetricGauge // with shards: the lowest shard's (shards.go)
	tableAgeMs   proxywasm.MetricGauge // with shards: the stalest shard's
}

func defineMetrics() metrics {
	c := proxywasm.DefineCounterMetric
	g := proxywasm.DefineGaugeMetric
	return metrics{
		decisions:            c("kvroute_decisions_total"),
		predictedHits:        c("kvroute_predicted_hits_total"),
		spills:               c("kvroute_spills_total"),
		staleDecisions:       c("kvroute_stale_decisions_total"),
		fallbacks:            c("kvroute_fallbacks_total"),
		unrouted:             c("kvroute_unrouted_total"),
		unservedModel:        c("kvroute_unserved_model_total"),
		heldForTable:         c("kvroute_held_for_table_total"),
		parseErrors:          c("kvroute_parse_errors_total"),
		oversized:            c("kvroute_oversized_bodies_total"),
		saltInjected:         c("kvroute_cache_salt_injected_total"),
		refusedOversized:     c("kvroute_unsalted_refused_oversized_total"),
		refusedUnparsable:    c("kvroute_unsalted_refused_unparsable_total"),
		refusedUnread:        c("kvroute_unsalted_refused_unread_total"),
		refusedPath:          c("kvroute_unsalted_refused_path_total"),
		outcomes:             c("kvroute_outcomes_total"),
		outcomesWithoutUsage: c("kvroute_outcomes_without_usage_total"),
		ledgerExpired:        c("kvroute_ledger_expired_total"),
		followed:             c("kvroute_follow_ups_affine_total"),
		followLost:           c("kvroute_follow_ups_lost_total"),
		responseIDsMissed:    c("kvroute_response_ids_missed_total"),
		polls:                c("kvroute_table_polls_total"),
		pollErrors:           c("kvroute_table_poll_errors_total"),
		failovers:            c("kvroute_table_failovers_total"),
		tableLoads:           c("kvroute_table_loads_total"),
		tableErrors:          c("kvroute_table_load_errors_total"),
		reportsSent:          c("kvroute_reports_sent_total"),
		reportsDropped:       c("kvroute_reports_dropped_total"),
		copiesSent:           c("kvroute_report_copies_sent_total"),
		copiesDropped:        c("kvroute_report_copies_dropped_total"),
		affinityLearned:      c("kvroute_affinity_learned_total"),
		affinityPollErrors:   c("kvroute_affinity_poll_errors_total"),
		sharesErrors:         c("kvroute_shares_errors_total"),
		tableVersion:         g("kvroute_table_version"),
		tableAgeMs:           g("kvroute_table_age_ms"),
	}
}

// builtNames keeps alive the names of the metrics defined with names built at run time:
// the SDK's test host (proxytest's ProxyDefineMetric) keys a metric by an unsafe.String
// view of the guest's memory, which the collector reuses once the name is garbage, and
// a test then finds the metric under another name. Envoy copies the name.
var builtNames []string

// counterNamed and gaugeNamed define a metric whose name was built at run time.
func counterNamed(name string) proxywasm.MetricCounter {
	builtNames = append(builtNames, name)
	return proxywasm.DefineCounterMetric(name)
}

func gaugeNamed(name string) proxywasm.MetricGauge {
	builtNames = append(builtNames, name)
	return proxywasm.DefineGaugeMetric(name)
}

// defineShed defines the shed counters of o's classes.
func (m *metrics) defineShed(o *api.Overload) {
	for _, c := range o.Classes {
		byReason := make([]proxywasm.MetricCounter, len(admit.Reasons))
		for i, r := range admit.Reasons {
			byReason[i] = counterNamed("kvroute_shed_" + c.Name + "_" + r.String() + "_total")
		}
		m.shedBy = append(m.shedBy, byReason)
	}
}

// shed is the counter of a refusal past capacity.
func (m *metrics) shed(v admit.Verdict) proxywasm.MetricCounter {
	return m.shedBy[v.Class][v.Reason-admit.ShedWait]
}

// refused is the counter of one refusal reason.
func (m *metrics) refused(why route.Refusal) proxywasm.MetricCounter {
	switch why {
	case route.RefusedOversized:
		return m.refusedOversized
	case route.RefusedUnparsable:
		return m.refusedUnparsable
	case route.RefusedPath:
		return m.refusedPath
	}
	return m.refusedUnread
}

// set gives a gauge an absolute value (the ABI only adds).
func set(g proxywasm.MetricGauge, v int64) {
	if d := v - g.Value(); d != 0 {
		g.Add(d)
	}
}
