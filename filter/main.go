// Command kvroute is the proxy-wasm filter: built with GOOS=wasip1 GOARCH=wasm
// -buildmode=c-shared, loaded by Envoy (>= 1.35, allow_on_headers_stop_iteration) once
// per worker thread. Each request's body is parsed, hashed into block keys and routed by
// package route; the chosen "ip:port" list goes into the endpoint header that Envoy's
// override_host load balancer reads.
//
// The plugin (one per VM) holds its components, each with its own state and methods: the
// shards (shardSet), the leader, the sibling placements (placed), and on each shard its
// reports and table.
//
// Files: main.go (contexts, tick), request.go (request path, the endpoint header),
// held.go (requests held for their model's first table, resumed on a tick), response.go
// (usage and outcome reports), reports.go (a shard's report batches and its queue),
// shards.go (the control planes polled, one per model or pool, and which one
// serves a request's model), store.go (each shard's table in shared data), placed.go
// (placements shared between the worker VMs), affinity.go (the replicas of responses and
// sessions, shared between the worker VMs), leader.go (lease, polling each shard's
// control plane and failing over between its replicas, sharing its tables, posting its
// reports to every replica), affinitypoll.go (the other proxies' affinity entries,
// fetched from the control plane), shares.go (the tenants' admitted tokens, posted for
// the fleet's totals), hostmem.go (the buffers host calls write their
// values into, reused from request to request), hostcall_wasm.go (the
// filter's proxy_on_memory_allocate and the host calls the request path makes itself;
// hostcall_native.go: the SDK's, natively), warmup.go (the request path run once on
// made-up requests at plugin start), metrics.go.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
)

func main() {} // unused in a WASI reactor; the host calls the exported callbacks

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

// plugin is the root context of one VM (one Envoy worker thread). It owns everything
// the request path needs, so requests make no large shared-data reads.
type plugin struct {
	types.DefaultPluginContext
	cfg     api.Config
	vmID    uint64
	now     func() time.Time
	router  *route.Router
	metrics metrics
	nextReq uint64
	// workload is this proxy's namespace: the tenant with tenants.source "workload".
	workload string
	shards   shardSet  // the control planes polled, and which serves each model (shards.go)
	leader   leader    // the lease, and polling and posting when this VM holds it (leader.go)
	placed   placed    // the placements shared with the sibling VMs (placed.go)
	affinity affinity  // responses' and sessions' replicas, shared with the sibling VMs (affinity.go)
	shares   vmShares  // the tenants' admitted prefill, to and from the control plane (shares.go)
	routed   *shard    // the shard of the request being routed
	reqNow   time.Time // when the request being routed is routed
	free     []*httpContext
	held     []*httpContext // waiting for their model's first table (held.go)
	started  time.Time      // when the plugin started: requests are held within its first wait
	header   endpointHeader
	usage    prompt.Parser // reads usage in responses (its buffers)
	mem      hostBufs      // what host calls on the request path return (hostmem.go)
	names    names         // tenants, model headers and upstream addresses kept
}

func (p *plugin) OnPluginStart(int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("kvroute: cannot read plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := api.ParseConfig(raw)
	if err != nil {
		proxywasm.LogCriticalf("kvroute: invalid plugin configuration, filter not started: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.mem = newHostBufs(cfg.MaxBodyBytes)
	p.now = time.Now
	p.started = p.now()
	p.vmID = randomID()
	p.router = route.NewRouter(cfg.RuleParams(), randomID())
	p.router.Config = cfg
	p.router.Reuse = true // the request path copies what it keeps (request.go route)
	p.router.Tables = p.tableFor
	p.router.Admit = admit.New(&p.cfg.Overload) // nil without classes: every request admitted
	p.placed = newPlaced(p.vmID, &p.mem.value, p.router)
	p.affinity = affinity{value: &p.mem.value, names: &p.names}
	p.router.Follows = p.follows
	p.metrics = defineMetrics()
	p.metrics.defineShed(&p.cfg.Overload)
	tick := minTick(&p.cfg)
	// The name reports carry, read once now rather than in the first request's.
	p.shards = newShardSet(&p.cfg, tick, proxyName(p.vmID), &p.mem.value, &p.metrics)
	p.leader = leader{vmID: p.vmID, tickMs: tick, shards: &p.shards, clock: &p.now, value: &p.mem.value,
		metrics: &p.metrics, affinity: &p.affinity, sharesPost: sharesPost{on: p.router.Admit != nil}}
	p.shares = vmShares{c: p.router.Admit, value: &p.mem.value, errors: p.metrics.sharesErrors}
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(tick)); err != nil {
		proxywasm.LogCriticalf("kvroute: cannot set the tick period: %v", err)
		return types.OnPluginStartStatusFailed
	}
	t0 := time.Now()
	warmUp(cfg)
	p.readWorkload()
	proxywasm.LogInfof("kvroute: started (vm %016x, %s, tick %d ms, warm-up %d ms)", p.vmID, p.shards.describe(&p.cfg), tick,
		time.Since(t0).Milliseconds())
	if p.router.Admit != nil {
		proxywasm.LogInfof("kvroute: overload %s", &p.cfg.Overload)
	}
	return types.OnPluginStartStatusOK
}

// OnTick runs on every VM: the lease, the leader's work, then catching up with the
// tables in shared data, and dropping ledger entries of streams that never answered.
func (p *plugin) OnTick() {
	now := p.now()
	// The leader first: it posts its own reports from its buffer (postOwn); the other
	// VMs, and a leader not posting on this tick, hand theirs to the queue.
	p.leader.tick(now)
	p.shards.flushReports()
	p.shards.sync(&p.metrics, now)
	p.shares.tick()
	p.placed.catchUp(now)
	p.placed.flushStarts()
	// Placements a table confirmed current has had the chance to learn are its to say
	// (with shards, once every shard's table has).
	p.router.Prune(p.shards.confirmed(), now)
	if n := p.router.Expire(now.Add(-time.Duration(p.cfg.LedgerTimeoutMs) * time.Millisecond)); n > 0 {
		p.metrics.ledgerExpired.Increment(uint64(n))
	}
	// Last: it switches the effective context to each stream it resumes.
	p.releaseHeld(now, false)
}

func (p *plugin) NewHttpContext(contextID uint32) types.HttpContext {
	p.nextReq++
	if n := len(p.free); n > 0 {
		h := p.free[n-1]
		p.free = p.free[:n-1]
		h.reqID, h.contextID = p.nextReq, contextID
		return h
	}
	return &httpContext{p: p, reqID: p.nextReq, contextID: contextID}
}

func randomID() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// WASI random_get failing is a broken host; a time-based id still keeps
		// leases apart in practice.
		return uint64(time.Now().UnixNano())
	}
	return binary.LittleEndian.Uint64(b[:])
}

// readWorkload reads this proxy's namespace from Istio's node metadata (NAMESPACE), the
// tenant of every request with tenants.source "workload". Without it (not an Istio
// sidecar) every request has no tenant and gets tenants.default_policy.
func (p *plugin) readWorkload() {
	if p.cfg.Tenants.Source != api.SourceWorkload {
		return
	}
	ns, err := proxywasm.GetProperty([]string{"node", "metadata", "NAMESPACE"})
	if err != nil || len(ns) == 0 {
		if len(p.cfg.Tenants.Policies) > 0 {
			proxywasm.LogWarnf("kvroute: tenants.source is %q but the proxy's node metadata has no NAMESPACE: "+
				"every request gets tenants.default_policy %q", api.SourceWorkload, p.cfg.Tenants.DefaultPolicy)
		}
		return
	}
	p.workload = string(ns)
}

// proxyName identifies this proxy in reports: Envoy's node id when the host has one, else
// the VM's id.
func proxyName(vmID uint64) string {
	if id, err := proxywasm.GetProperty([]string{"node", "id"}); err == nil && len(id) > 0 {
		return string(id)
	}
	return fmt.Sprintf("vm-%016x", vmID)
}
