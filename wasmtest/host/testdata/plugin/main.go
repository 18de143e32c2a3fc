// Command plugin is the host's conformance plugin: a proxy-wasm filter written with the same
// SDK as kvroute that touches every part of the ABI the SDK declares, so the host tests can
// check Envoy's semantics without the real filter. Behaviour is switched per request by
// headers (x-local-reply, x-panic, x-async, x-rewrite-body, x-upper-response,
// x-buffer-response, x-route); the root context elects a leader with a CAS lease, polls a
// cluster on tick, publishes the answer in shared data and drains a shared queue of reports.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

type config struct {
	TickMs        uint32 `json:"tick_ms"`
	LeaseKey      string `json:"lease_key"`
	LeaseTTLMs    int64  `json:"lease_ttl_ms"`
	Cluster       string `json:"cluster"`
	Queue         string `json:"queue"`
	RoutingHeader string `json:"routing_header"`
}

func init() {
	proxywasm.SetVMContext(&vm{})
}

func main() {}

type vm struct {
	types.DefaultVMContext
	vmConfig string
}

func (v *vm) OnVMStart(size int) types.OnVMStartStatus {
	if size > 0 {
		b, err := proxywasm.GetVMConfiguration()
		if err != nil {
			proxywasm.LogErrorf("vm configuration: %v", err)
			return types.OnVMStartStatusFailed
		}
		v.vmConfig = string(b)
	}
	return types.OnVMStartStatusOK
}

// NewPluginContext runs before OnVMStart: cpp-host creates the root context first
// (src/context.cc ContextBase::onStart), so the root reads the VM configuration later.
func (v *vm) NewPluginContext(id uint32) types.PluginContext {
	return &root{id: id, vm: v}
}

type root struct {
	types.DefaultPluginContext
	id      uint32
	vm      *vm
	token   string
	cfg     config
	leader  bool
	queueID uint32

	requests, ticks, polls, pollFailures, dequeued, posted, dropped, chunks, casRetries proxywasm.MetricCounter
	inflight, leaders                                                                   proxywasm.MetricGauge
	bodyBytes                                                                           proxywasm.MetricHistogram
}

func (r *root) OnPluginStart(size int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogCriticalf("plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if len(raw) != size {
		proxywasm.LogCriticalf("plugin configuration is %d bytes, callback said %d", len(raw), size)
		return types.OnPluginStartStatusFailed
	}
	r.cfg = config{TickMs: 100, LeaseKey: "test/lease", LeaseTTLMs: 1000, Cluster: "control", Queue: "reports",
		RoutingHeader: "x-gateway-destination-endpoint"}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.cfg); err != nil {
			proxywasm.LogCriticalf("plugin configuration: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		proxywasm.LogCriticalf("random: %v", err)
		return types.OnPluginStartStatusFailed
	}
	r.token = hex.EncodeToString(id[:])

	r.requests = proxywasm.DefineCounterMetric("test.requests")
	r.ticks = proxywasm.DefineCounterMetric("test.ticks")
	r.polls = proxywasm.DefineCounterMetric("test.polls")
	r.pollFailures = proxywasm.DefineCounterMetric("test.poll_failures")
	r.dequeued = proxywasm.DefineCounterMetric("test.reports_dequeued")
	r.posted = proxywasm.DefineCounterMetric("test.reports_posted")
	r.dropped = proxywasm.DefineCounterMetric("test.reports_dropped")
	r.chunks = proxywasm.DefineCounterMetric("test.response_chunks")
	r.casRetries = proxywasm.DefineCounterMetric("test.cas_retries")
	r.inflight = proxywasm.DefineGaugeMetric("test.inflight")
	r.leaders = proxywasm.DefineGaugeMetric("test.leaders")
	r.bodyBytes = proxywasm.DefineHistogramMetric("test.request_body_bytes")

	// Every level once, so the host's level mapping is visible in its log.
	proxywasm.LogTracef("level trace %s", r.token)
	proxywasm.LogDebugf("level debug %s", r.token)
	proxywasm.LogInfof("level info %s", r.token)
	proxywasm.LogWarnf("level warn %s", r.token)
	proxywasm.LogErrorf("level error %s", r.token)
	proxywasm.LogCriticalf("level critical %s", r.token)

	// Join the list of VMs with a CAS loop: VMs of one host share this key.
	for {
		val, cas, err := proxywasm.GetSharedData("test/vms")
		if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
			proxywasm.LogCriticalf("get test/vms: %v", err)
			return types.OnPluginStartStatusFailed
		}
		next := r.token
		if len(val) > 0 {
			next = string(val) + "," + r.token
		}
		err = proxywasm.SetSharedData("test/vms", []byte(next), cas)
		if errors.Is(err, types.ErrorStatusCasMismatch) {
			continue
		}
		if err != nil {
			proxywasm.LogCriticalf("set test/vms: %v", err)
			return types.OnPluginStartStatusFailed
		}
		break
	}
	name, _ := proxywasm.GetProperty([]string{"plugin_name"})
	rootID, _ := proxywasm.GetProperty([]string{"plugin_root_id"})
	node, _ := proxywasm.GetProperty([]string{"node", "id"})
	_ = proxywasm.SetSharedData("test/root_props", []byte(fmt.Sprintf("plugin_name=%s root_id=%s node=%s vm_config=%s",
		name, rootID, node, r.vm.vmConfig)), 0)
	_ = proxywasm.SetSharedData("test/start/"+r.token, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0)

	if r.cfg.TickMs > 0 {
		if err := proxywasm.SetTickPeriodMilliSeconds(r.cfg.TickMs); err != nil {
			proxywasm.LogCriticalf("tick: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	proxywasm.LogInfof("vm %s started (root context %d)", r.token, r.id)
	return types.OnPluginStartStatusOK
}

func (r *root) OnTick() {
	r.ticks.Increment(1)
	key := "test/ticks/" + r.token
	val, cas, _ := proxywasm.GetSharedData(key)
	n, _ := strconv.Atoi(string(val))
	if err := proxywasm.SetSharedData(key, []byte(strconv.Itoa(n+1)), cas); err != nil {
		proxywasm.LogErrorf("set %s: %v", key, err)
	}
	r.lease()
	if !r.leader {
		return
	}
	headers := [][2]string{{":method", "GET"}, {":path", "/poll?vm=" + r.token}, {":authority", "control"}}
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, nil, nil, 500, func(numHeaders, bodySize, _ int) {
		if numHeaders == 0 {
			r.pollFailures.Increment(1)
			return
		}
		status := callStatus()
		body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		if status != "200" {
			r.pollFailures.Increment(1)
			_ = proxywasm.SetSharedData("test/poll_status", []byte(status+" "+string(body)), 0)
			return
		}
		if err := proxywasm.SetSharedData("test/table", body, 0); err != nil {
			proxywasm.LogErrorf("publish table: %v", err)
			return
		}
		r.polls.Increment(1)
	})
	if err != nil {
		proxywasm.LogErrorf("poll: %v", err)
	}
}

// lease renews or takes the leader lease: {owner, expiry} under one key, written only with
// the CAS number just read, so of the VMs that read the same version exactly one wins.
func (r *root) lease() {
	now := time.Now().UnixNano()
	val, cas, err := proxywasm.GetSharedData(r.cfg.LeaseKey)
	if errors.Is(err, types.ErrorStatusNotFound) {
		// cas 0 writes unconditionally: bootstrap an expired lease, then read it back.
		_ = proxywasm.SetSharedData(r.cfg.LeaseKey, []byte(":0"), 0)
		val, cas, err = proxywasm.GetSharedData(r.cfg.LeaseKey)
	}
	if err != nil {
		proxywasm.LogErrorf("lease: %v", err)
		return
	}
	owner, expiry, _ := strings.Cut(string(val), ":")
	exp, _ := strconv.ParseInt(expiry, 10, 64)
	mine := owner == r.token
	if !mine && exp > now {
		r.setLeader(false)
		return
	}
	next := fmt.Sprintf("%s:%d", r.token, now+r.cfg.LeaseTTLMs*int64(time.Millisecond))
	err = proxywasm.SetSharedData(r.cfg.LeaseKey, []byte(next), cas)
	r.setLeader(err == nil)
}

func (r *root) setLeader(leader bool) {
	if leader == r.leader {
		return
	}
	r.leader = leader
	if !leader {
		r.leaders.Add(-1)
		proxywasm.LogInfof("vm %s lost the lease", r.token)
		return
	}
	r.leaders.Add(1)
	qid, err := proxywasm.RegisterSharedQueue(r.cfg.Queue)
	if err != nil {
		proxywasm.LogErrorf("register queue: %v", err)
		return
	}
	r.queueID = qid
	_ = proxywasm.SetSharedData("test/leader", []byte(r.token), 0)
	proxywasm.LogInfof("vm %s is the leader (queue %d)", r.token, qid)
}

func (r *root) OnQueueReady(queueID uint32) {
	var batch [][]byte
	for {
		item, err := proxywasm.DequeueSharedQueue(queueID)
		if errors.Is(err, types.ErrorStatusEmpty) {
			break
		}
		if err != nil {
			proxywasm.LogErrorf("dequeue: %v", err)
			return
		}
		batch = append(batch, append([]byte(nil), item...))
	}
	if len(batch) == 0 {
		return
	}
	r.dequeued.Increment(uint64(len(batch)))
	key := "test/dequeued_by/" + r.token
	val, cas, _ := proxywasm.GetSharedData(key)
	n, _ := strconv.Atoi(string(val))
	_ = proxywasm.SetSharedData(key, []byte(strconv.Itoa(n+len(batch))), cas)
	headers := [][2]string{{":method", "POST"}, {":path", "/reports"}, {":authority", "control"}, {"content-type", "text/plain"}}
	n = len(batch)
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, bytes.Join(batch, []byte("\n")), nil, 1000,
		func(numHeaders, _, _ int) {
			if callStatus() == "200" {
				r.posted.Increment(uint64(n))
			}
		})
	if err != nil {
		proxywasm.LogErrorf("post reports: %v", err)
	}
}

func (r *root) NewHttpContext(id uint32) types.HttpContext {
	return &stream{root: r, id: id}
}

type stream struct {
	types.DefaultHttpContext
	root       *root
	id         uint32
	upper      bool
	bufferResp bool
	finished   bool
	chunks     int
}

func (s *stream) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	r := s.root
	r.requests.Increment(1)
	r.inflight.Add(1)
	hdrs, err := proxywasm.GetHttpRequestHeaders()
	if err != nil || len(hdrs) != numHeaders {
		addHeader("x-test-error", fmt.Sprintf("headers: %d pairs, callback said %d (%v)", len(hdrs), numHeaders, err))
	}
	if has("x-panic") {
		panic("test plugin: panic requested")
	}
	if v, err := proxywasm.GetHttpRequestHeader("x-count"); err == nil {
		// A shared counter bumped with CAS loops from every VM at once: no update may be lost.
		n, _ := strconv.Atoi(v)
		for i := 0; i < n; i++ {
			casIncrement(r)
		}
	}
	if has("x-bad-call") {
		// Envoy refuses an HTTP call without :authority.
		_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, [][2]string{{":method", "GET"}, {":path", "/"}}, nil, nil, 100,
			func(int, int, int) {})
		addHeader("x-test-error", fmt.Sprintf("bad call: %v", err))
	}
	if has("x-local-reply") {
		if err := proxywasm.SendHttpResponse(418, [][2]string{{"x-test-local", "1"}}, []byte("teapot"), -1); err != nil {
			proxywasm.LogErrorf("local reply: %v", err)
		}
		return types.ActionPause
	}
	_ = proxywasm.RemoveHttpRequestHeader("x-remove-me")
	_ = proxywasm.ReplaceHttpRequestHeader("x-replace-me", "replaced")
	_ = proxywasm.AddHttpRequestHeader("x-added", "1")
	// A client must not choose the endpoint: only this filter writes the routing header.
	_ = proxywasm.RemoveHttpRequestHeader(r.cfg.RoutingHeader)

	for _, p := range []struct{ header, path string }{
		{"x-test-path", "request.path"}, {"x-test-method", "request.method"},
		{"x-test-source", "source.address"}, {"x-test-plugin", "plugin_name"},
		{"x-test-node", "node.id"}, {"x-test-ua", "request.headers.user-agent"},
	} {
		v, err := proxywasm.GetProperty(strings.Split(p.path, "."))
		if err != nil {
			v = []byte("error: " + err.Error())
		}
		_ = proxywasm.ReplaceHttpRequestHeader(p.header, string(v))
	}
	if err := proxywasm.SetProperty([]string{"test_state"}, []byte("headers-seen")); err != nil {
		addHeader("x-test-error", "set property: "+err.Error())
	}
	state, _ := proxywasm.GetProperty([]string{"test_state"})
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-state", string(state))
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-vm", r.token)
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-requests-seen", strconv.FormatUint(r.requests.Value(), 10))
	if table, _, err := proxywasm.GetSharedData("test/table"); err == nil {
		_ = proxywasm.ReplaceHttpRequestHeader("x-test-table", string(table))
	}
	s.upper = has("x-upper-response")
	s.bufferResp = has("x-buffer-response")
	if endOfStream {
		s.finish(nil)
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause // keep buffering: the next call sees the whole body so far
	}
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil && bodySize > 0 {
		addHeader("x-test-error", "body: "+err.Error())
	}
	if len(body) != bodySize {
		addHeader("x-test-error", fmt.Sprintf("body is %d bytes, callback said %d", len(body), bodySize))
	}
	return s.finish(body)
}

func (s *stream) OnHttpRequestTrailers(numTrailers int) types.Action {
	trailers, _ := proxywasm.GetHttpRequestTrailers()
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-trailers", strconv.Itoa(len(trailers)))
	_ = proxywasm.AddHttpRequestTrailer("x-trailer-seen", strconv.Itoa(numTrailers))
	// With trailers the body callback never sees end of stream: decide here.
	body, _ := proxywasm.GetHttpRequestBody(0, 1<<30)
	return s.finish(body)
}

// finish is the routing decision, made once the whole request is known.
func (s *stream) finish(body []byte) types.Action {
	if s.finished {
		return types.ActionContinue
	}
	s.finished = true
	r := s.root
	r.bodyBytes.Record(uint64(len(body)))
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-body-size", strconv.Itoa(len(body)))
	route, _ := proxywasm.GetHttpRequestHeader("x-route")
	var parsed struct {
		Route string `json:"route"`
	}
	if len(body) > 0 && json.Unmarshal(body, &parsed) == nil && parsed.Route != "" {
		route = parsed.Route
	}
	if route != "" {
		_ = proxywasm.ReplaceHttpRequestHeader(r.cfg.RoutingHeader, route)
	}
	if has("x-set-pairs") {
		all, _ := proxywasm.GetHttpRequestHeaders()
		_ = proxywasm.ReplaceHttpRequestHeaders(append(all, [2]string{"x-pairs-set", strconv.Itoa(len(all))}))
	}
	// Envoy >= 1.33 keeps the route cache for ABI > 0.2.1; this SDK is 0.2.0, the call is harmless.
	if _, err := proxywasm.CallForeignFunction("clear_route_cache", nil); err != nil {
		addHeader("x-test-error", "clear_route_cache: "+err.Error())
	}
	if has("x-rewrite-body") {
		if err := proxywasm.ReplaceHttpRequestBody(append([]byte("rewritten:"), body...)); err != nil {
			addHeader("x-test-error", "replace body: "+err.Error())
		}
	}
	if qid, err := proxywasm.ResolveSharedQueue("", r.cfg.Queue); err != nil {
		r.dropped.Increment(1)
	} else if err := proxywasm.EnqueueSharedQueue(qid, []byte(fmt.Sprintf("report vm=%s stream=%d bytes=%d", r.token, s.id, len(body)))); err != nil {
		proxywasm.LogErrorf("enqueue: %v", err)
	}
	if !has("x-async") {
		return types.ActionContinue
	}
	headers := [][2]string{{":method", "GET"}, {":path", "/async"}, {":authority", "control"}}
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, nil, nil, 5000, func(numHeaders, bodySize, _ int) {
		status := callStatus()
		answer, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		// The request is still held: its headers can change until it is resumed.
		_ = proxywasm.ReplaceHttpRequestHeader("x-async-status", fmt.Sprintf("%s/%d", status, numHeaders))
		_ = proxywasm.ReplaceHttpRequestHeader("x-async-result", string(answer))
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogErrorf("resume: %v", err)
		}
	})
	if err != nil {
		addHeader("x-test-error", "dispatch: "+err.Error())
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpResponseHeaders(numHeaders int, endOfStream bool) types.Action {
	_ = proxywasm.AddHttpResponseHeader("x-test-filter", s.root.token)
	status, _ := proxywasm.GetHttpResponseHeader(":status")
	_ = proxywasm.ReplaceHttpResponseHeader("x-test-status-seen", status)
	// Envoy releases the request headers once the request went upstream.
	_, err := proxywasm.GetHttpRequestHeader(":path")
	seen := "ok"
	if err != nil {
		seen = err.Error()
	}
	_ = proxywasm.ReplaceHttpResponseHeader("x-test-request-headers-in-response", seen)
	if s.upper || s.bufferResp {
		_ = proxywasm.RemoveHttpResponseHeader("content-length")
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	if bodySize > 0 {
		s.chunks++
		s.root.chunks.Increment(1)
	}
	if s.bufferResp {
		if !endOfStream {
			return types.ActionPause
		}
		body, _ := proxywasm.GetHttpResponseBody(0, bodySize)
		_ = proxywasm.ReplaceHttpResponseBody([]byte(fmt.Sprintf("%s|buffered=%d", body, bodySize)))
		return types.ActionContinue
	}
	if s.upper && bodySize > 0 {
		body, err := proxywasm.GetHttpResponseBody(0, bodySize)
		if err == nil {
			_ = proxywasm.ReplaceHttpResponseBody(bytes.ToUpper(body))
		}
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseTrailers(int) types.Action {
	_ = proxywasm.AddHttpResponseTrailer("x-test-trailer", "1")
	return types.ActionContinue
}

func (s *stream) OnHttpStreamDone() {
	s.root.inflight.Add(-1)
	proxywasm.LogDebugf("stream %d done after %d response chunks", s.id, s.chunks)
}

// callStatus is the :status of the HTTP call response being delivered, "" on failure.
func callStatus() string {
	hdrs, _ := proxywasm.GetHttpCallResponseHeaders()
	for _, h := range hdrs {
		if h[0] == ":status" {
			return h[1]
		}
	}
	return ""
}

func casIncrement(r *root) {
	for {
		val, cas, _ := proxywasm.GetSharedData("test/counter")
		n, _ := strconv.Atoi(string(val))
		err := proxywasm.SetSharedData("test/counter", []byte(strconv.Itoa(n+1)), cas)
		if err == nil {
			return
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			addHeader("x-test-error", "counter: "+err.Error())
			return
		}
		r.casRetries.Increment(1)
	}
}

func has(name string) bool {
	_, err := proxywasm.GetHttpRequestHeader(name)
	return err == nil
}

func addHeader(name, value string) {
	_ = proxywasm.AddHttpRequestHeader(name, value)
}
