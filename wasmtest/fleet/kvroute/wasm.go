package kvroute

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/publish"
	"github.com/kvroute/kvroute/controlplane/server"
	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// WasmName is the wasm variant's name in results.
const WasmName = "kvroute-wasm"

// controlPlaneCluster is the filter's name for the control plane, as Istio names it.
const controlPlaneCluster = "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local"

// WasmPolicy is kvroute's policy run through the compiled filter: each proxy is a
// wasmtest/host Host (Envoy's stand-in) running kvroute.wasm on one worker VM, all on one
// virtual clock that follows simulated time. The filter polls the control plane's real
// HTTP API (controlplane/server over controlplane/publish and the same in-process index
// as Policy) and posts its reports there; requests go through it as HTTP streams, and
// the endpoint header it sets is the routing decision. Stale delays the versions the API
// serves. AgeFromGeneration does not apply: this is the filter as built (it dates the
// table from the age the control plane's answers carry).
type WasmPolicy struct {
	*controlPlane
	cfg      Config
	routerOf func(*workload.Request) int
	clk      *clock.Virtual
	pub      *publish.Publisher
	delayed  []pending // versions waiting out Stale
	hosts    []*host.Host
	streams  map[uint64]*wasmStream
	header   string
	classes  bool // the filter has classes: requests carry their class and tenant
	Stats    Stats
}

type pending struct {
	at  time.Duration
	ups []index.ModelUpdate
}

type wasmStream struct {
	s       *host.Stream
	fwd     host.Headers
	started bool
	local   int // the status of the filter's local reply (429: shed), 0 for none
}

// The headers kvroute-wasm's requests carry their class and tenant in when the filter
// has classes (Config.Filter.Overload).
const (
	wasmClassHeader  = "x-kvroute-class"
	wasmTenantHeader = "x-kvroute-tenant"
)

// WasmOptions are the wasm variant's own knobs.
type WasmOptions struct {
	// Path is the filter module (default: built from this checkout, wasmbuild.Filter).
	Path string
	// Latency is each control plane call's latency (default 1 ms).
	Latency time.Duration
}

// NewWasm builds the deployment with cfg.Routers hosts running the filter.
func NewWasm(f policy.Fleet, routerOf func(*workload.Request) int, cfg Config, o WasmOptions) (*WasmPolicy, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if o.Latency <= 0 {
		o.Latency = time.Millisecond
	}
	path := o.Path
	if path == "" {
		var err error
		if path, err = wasmbuild.Filter(); err != nil {
			return nil, fmt.Errorf("build the filter: %w", err)
		}
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rng := policy.NewRand(cfg.Seed, 21)
	p := &WasmPolicy{cfg: cfg, routerOf: routerOf, clk: clock.NewVirtual(Epoch),
		pub: publish.New(publish.Options{FirstVersion: 1}), streams: map[uint64]*wasmStream{}}
	p.controlPlane = newControlPlane(f, cfg, rng, p.enqueueVersion)
	srv := &server.Server{Index: p.ix, Publisher: p.pub, Now: p.clk.Now}
	handler := srv.Handler()

	// WaitMs -1: the host serves an HTTP call in-process while the virtual clock waits,
	// so a long poll held by the server (which waits in real time for a version that
	// only the stopped simulation could publish) would stall each poll for the whole
	// wait. The compiled filter polls every PollInterval here: compare it with the Go
	// mirror at --poll-wait 0.
	pc := api.Config{
		ControlPlane: api.ControlPlane{Cluster: controlPlaneCluster, Authority: "kvroute-controlplane",
			PollMs: int(cfg.PollInterval / time.Millisecond), WaitMs: -1, ReportMs: int(cfg.ReportInterval / time.Millisecond),
			MaxReportBatch: cfg.MaxReportBatch},
		Guards: api.Guards{MaxKVUsage: cfg.Rule.MaxKVUsage, MaxStateAgeMs: int(cfg.Rule.MaxStateAge / time.Millisecond),
			TieEpsilon: cfg.Rule.TieEpsilon, MaxEndpoints: cfg.Rule.MaxEndpoints},
		FirstTableWaitMs: cfg.Filter.FirstTableWaitMs,
	}
	if o := cfg.Filter.Overload; o.Enabled() {
		pc.Overload = o
		pc.Overload.ClassHeader = wasmClassHeader
		pc.Tenants = api.Tenants{Source: api.SourceHeader, Header: wasmTenantHeader}
	}
	pcJSON, err := json.Marshal(pc)
	if err != nil {
		return nil, err
	}
	parsed, err := api.ParseConfig(pcJSON)
	if err != nil {
		return nil, fmt.Errorf("filter configuration: %w", err)
	}
	p.header, p.classes = parsed.EndpointHeader, parsed.Overload.Enabled()
	for k := range cfg.Routers {
		h, err := host.New(context.Background(), wasm, host.Config{
			VMs: 1, PluginConfig: pcJSON, PluginName: "kvroute", Node: host.Node{ID: fmt.Sprintf("proxy-%d", k)},
			Clusters: map[string]host.Cluster{controlPlaneCluster: {Handler: handler, Latency: o.Latency}},
			Clock:    p.clk, Rand: host.SeededRand(cfg.Seed*1000003 + uint64(k)),
		})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("proxy %d: %w", k, err)
		}
		p.hosts = append(p.hosts, h)
	}
	return p, nil
}

// Close stops the hosts.
func (p *WasmPolicy) Close() {
	for _, h := range p.hosts {
		_ = h.Close(context.Background())
	}
	p.hosts = nil
}

func (p *WasmPolicy) Name() string { return WasmName }

// enqueueVersion holds a version back for Stale before the API serves it.
func (p *WasmPolicy) enqueueVersion(now time.Duration, ups []index.ModelUpdate) {
	p.delayed = append(p.delayed, pending{now, ups})
	p.release(now)
}

func (p *WasmPolicy) release(now time.Duration) {
	for len(p.delayed) > 0 && p.delayed[0].at <= now-p.cfg.Stale {
		if _, err := p.pub.Publish(p.delayed[0].ups, at(p.delayed[0].at+p.cfg.Stale)); err != nil {
			panic(fmt.Sprintf("kvroute wasm sim: %v", err))
		}
		p.Stats.Versions++
		p.delayed = p.delayed[1:]
	}
}

// advance moves the virtual clock (the filters' ticks and calls) to now; events that
// reached the simulation a little late happen at the clock's time.
func (p *WasmPolicy) advance(now time.Duration) {
	t := at(now)
	if c := p.clk.Now(); c.After(t) {
		t = c
	}
	p.clk.AdvanceTo(t) // also runs what is due at the clock's current time
}

func (p *WasmPolicy) NextWake() time.Duration {
	w := p.nextControlPlaneWake()
	if len(p.delayed) > 0 {
		w = min(w, p.delayed[0].at+p.cfg.Stale)
	}
	if t, ok := p.clk.Next(); ok {
		w = min(w, t.Sub(Epoch))
	}
	return w
}

func (p *WasmPolicy) Wake(now time.Duration) {
	p.wakeControlPlane(now)
	p.release(now)
	p.advance(now)
}

func (p *WasmPolicy) Membership(now time.Duration) { p.controlPlane.Membership(now) }

// Route sends the request's headers and body through its proxy's filter and reads the
// endpoint header it set.
func (p *WasmPolicy) Route(req *workload.Request, now time.Duration) policy.Choice {
	p.advance(now)
	if ws := p.streams[req.ID]; ws != nil {
		return p.routed(req, ws, now) // held by the filter: released yet?
	}
	h := p.hosts[p.routerOf(req)]
	ws := &wasmStream{}
	ws.s = h.VM(0).NewStream(host.StreamInfo{SourceAddress: "10.1.0.1:40000"}, host.StreamHooks{
		RequestHeaders: func(hd host.Headers, _ bool) { ws.fwd = hd.Clone() },
		LocalReply:     func(status int) { ws.local = status },
	})
	p.streams[req.ID] = ws
	hdrs := host.Headers{{":method", "POST"}, {":path", apiPath(req.Schema)}, {":authority", "vllm.models.svc"},
		{":scheme", "http"}, {"content-type", "application/json"}, {"content-length", strconv.Itoa(len(req.Body))}}
	if p.classes {
		hdrs = append(hdrs, [2]string{wasmClassHeader, req.Class}, [2]string{wasmTenantHeader, req.Tenant})
	}
	if _, err := ws.s.SendRequestHeaders(hdrs, false); err != nil {
		panic(fmt.Sprintf("kvroute wasm sim: request headers: %v", err))
	}
	if _, err := ws.s.SendRequestBody(req.Body, true); err != nil {
		panic(fmt.Sprintf("kvroute wasm sim: request body: %v", err))
	}
	return p.routed(req, ws, now)
}

// routed reads the filter's decision on ws: a local reply, the forwarded request's
// endpoint header, or neither yet (the filter holds the request for its first table:
// ask again at the host's next timer, a tick that may release it).
func (p *WasmPolicy) routed(req *workload.Request, ws *wasmStream, now time.Duration) policy.Choice {
	if ws.fwd == nil && ws.local == 0 {
		next, ok := p.clk.Next()
		if d := next.Sub(Epoch) - now; ok && d > 0 {
			return policy.Choice{Retry: d}
		}
		return policy.Choice{Retry: time.Millisecond}
	}
	if ws.local == admit.Status {
		delete(p.streams, req.ID)
		p.Stats.Shed++
		return policy.Choice{Shed: true}
	}
	v := ws.fwd.Get(p.header)
	if v == "" {
		p.Stats.Unrouted++
		return policy.Choice{}
	}
	p.Stats.Decisions++
	var order []int
	for _, a := range strings.Split(v, ",") {
		if i, ok := p.addrIdx[strings.TrimSpace(a)]; ok {
			order = append(order, i)
		}
	}
	return policy.Choice{Order: order}
}

func (p *WasmPolicy) Sent(req *workload.Request, i int, _ time.Duration) {
	if ws := p.streams[req.ID]; ws != nil {
		ws.s.SetUpstreamAddress(p.f.Addr(i))
	}
}

// Started delivers the response headers.
func (p *WasmPolicy) Started(req *workload.Request, _ int, at time.Duration) {
	ws := p.streams[req.ID]
	if ws == nil || ws.started {
		return
	}
	p.advance(at)
	ws.started = true
	_, _ = ws.s.SendResponseHeaders(host.Headers{{":status", "200"}, {"content-type", "text/event-stream; charset=utf-8"}}, false)
}

// FirstByte delivers the first SSE chunk: the role delta vLLM sends with the first token;
// a Responses stream's response.created event, which carries the response's id; a
// Messages stream's message_start.
func (p *WasmPolicy) FirstByte(req *workload.Request, _ int, at time.Duration) {
	ws := p.streams[req.ID]
	if ws == nil || !ws.started {
		return
	}
	p.advance(at)
	first := `data: {"id":"chatcmpl-sim","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	switch req.Schema {
	case prompt.Responses:
		first = `event: response.created` + "\n" + `data: {"response":{"id":"` + workload.ResponseID(req.ID) + `","object":"response","status":"in_progress","output":[]},"sequence_number":0,"type":"response.created"}` + "\n\n"
	case prompt.Messages:
		first = `event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"chatcmpl-sim","content":[],"model":"sim","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + strconv.Itoa(len(req.Tokens)) + `,"output_tokens":0}}}` + "\n\n"
	}
	_, _ = ws.s.SendResponseBody([]byte(first), false)
}

// apiPath is the request path of schema's API.
func apiPath(schema prompt.Schema) string {
	switch schema {
	case prompt.Responses:
		return "/v1/responses"
	case prompt.Messages:
		return "/v1/messages"
	}
	return "/v1/chat/completions"
}

// Finished ends the stream: the last SSE chunk carries usage, as vLLM's with
// stream_options.include_usage; failures end in a reset or a local error status.
func (p *WasmPolicy) Finished(req *workload.Request, _ int, at time.Duration, o policy.Outcome) {
	ws := p.streams[req.ID]
	if ws == nil {
		return
	}
	delete(p.streams, req.ID)
	p.advance(at)
	switch {
	case o.Completed:
		if !ws.started {
			_, _ = ws.s.SendResponseHeaders(host.Headers{{":status", "200"}, {"content-type", "text/event-stream; charset=utf-8"}}, false)
		}
		usage := fmt.Sprintf(`data: {"id":"chatcmpl-sim","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\ndata: [DONE]\n\n",
			o.PromptTokens, req.OutputTokens, o.PromptTokens+req.OutputTokens, o.CachedTokens)
		switch req.Schema {
		case prompt.Responses: // vLLM's ResponseUsage in response.completed
			usage = fmt.Sprintf(`event: response.completed`+"\n"+`data: {"response":{"id":"%s","object":"response","status":"completed","usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"total_tokens":%d}},"type":"response.completed"}`+"\n\n",
				workload.ResponseID(req.ID), o.PromptTokens, o.CachedTokens, req.OutputTokens, o.PromptTokens+req.OutputTokens)
		case prompt.Messages: // vLLM's message_delta: no cached count
			usage = fmt.Sprintf(`event: message_delta`+"\n"+`data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":%d,"output_tokens":%d}}`+"\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\ndata: [DONE]\n\n",
				o.PromptTokens, req.OutputTokens)
		}
		_, _ = ws.s.SendResponseBody([]byte(usage), true)
	case ws.started:
		ws.s.Reset("upstream reset") // the engine died mid-stream
	default:
		status := o.Status
		if status == 0 {
			status = 503
		}
		_, _ = ws.s.SendResponseHeaders(host.Headers{{":status", strconv.Itoa(status)}, {"content-type", "application/json"}}, false)
		_, _ = ws.s.SendResponseBody([]byte(`{"object":"error","message":"simulated failure","code":`+strconv.Itoa(status)+`}`), true)
	}
	ws.s.Close()
}
