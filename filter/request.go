package main

import (
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
)

// httpContext follows one request. The request path: strip any client-sent endpoint
// header, hold the headers (ActionPause) until the body has arrived, parse it, route it,
// set the endpoint header and let Envoy continue. Nothing here rejects a request because
// routing failed: the header is then set by least-queued order or left unset, and Envoy's
// fallback load balancer decides. The one refusal is an isolated tenant's request that
// cannot carry its cache_salt (route.Refusal), and, with overload classes configured, a
// request past the fleet's capacity (admit.Verdict).
type httpContext struct {
	types.DefaultHttpContext
	p         *plugin
	reqID     uint64
	contextID uint32 // the host's, for proxy_set_effective_context (held.go)

	schema      prompt.Schema
	routable    bool // a POST to a path prompt.SchemaForPath knows: held for its body
	decided     bool
	tenant      string
	modelHeader string
	class       string // the class header's value (overload.class_header), if read
	session     uint64 // the session header's entry key (affinity.go), 0: none

	// While the body is held (see OnHttpRequestBody).
	contentLength int64 // -1: none, or not a number
	seen          int   // body bytes at the last body callback
	largestChunk  int
	// whole: the request was decided with its end of stream seen, its body read with
	// requestBody(wholeSize) (-1: no body); only then may it be held (held.go).
	whole     bool
	wholeSize int
	// While held for the first table of heldFor (held.go).
	heldFor *shard

	// Set when the request was placed by the rule; the response completes the report.
	placed   bool
	shard    *shard // whose control plane gets the reports
	shared   uint64 // the placement's number in shared data (filter/placed.go), until it started
	report   api.Report
	keys     []uint64 // report.Keys' storage, kept when the context is reused
	first    string
	status   int
	tail     []byte
	finished bool
	// startSent: the start report is queued (its first response byte came).
	startSent bool
	// A Messages stream's usage in its first chunk (message_start), if any.
	head             prompt.Usage
	headRead, headOK bool
	// idSought: body bytes searched for a Responses response's id (affinity.go), -1
	// once found or given up.
	idSought int
}

// maxFreeContexts bounds the contexts a VM keeps for reuse.
const maxFreeContexts = 1024

// recycle keeps h for a later request: the SDK calls nothing on a context after
// OnHttpStreamDone (proxy_on_log); proxy_on_delete only drops its map entry.
func (p *plugin) recycle(h *httpContext) {
	if len(p.free) >= maxFreeContexts {
		return
	}
	*h = httpContext{p: p, keys: h.keys[:0], tail: h.tail[:0]}
	p.free = append(p.free, h)
}

func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	cfg := &h.p.cfg
	// Only kvroute chooses endpoints: a client-sent header would let any client aim its
	// requests at any replica (and at other tenants' caches).
	_ = proxywasm.RemoveHttpRequestHeader(cfg.EndpointHeader)
	// Each value read through p.mem.value is used before the next read overwrites it.
	v := &h.p.mem.value
	method, _ := v.requestHeader(":method")
	post := method == "POST"
	path, _ := v.requestHeader(":path")
	a, ok := prompt.SchemaForPath(path)
	mayPassUnsalted := cfg.MayPassUnsalted(path) // before the next read overwrites path
	h.tenant = h.p.tenant(v)
	if !ok || !post || !a.TakesCacheSalt() {
		// A body kvroute does not read, or cannot salt (the engine's Messages request
		// has no cache_salt), is forwarded as it is, which an isolated tenant's may not
		// be unless the operator says the engine caches nothing for that path.
		if !endOfStream && cfg.MustSalt(h.tenant) && !mayPassUnsalted {
			return h.refuse(route.RefusedPath)
		}
		if !ok || !post {
			return types.ActionContinue
		}
	}
	h.schema, h.routable = a, true
	if cfg.ModelHeader != "" {
		m, _ := v.requestHeader(cfg.ModelHeader)
		h.modelHeader = h.p.names.keep(m)
	}
	if cfg.Overload.ClassHeader != "" {
		c, _ := v.requestHeader(cfg.Overload.ClassHeader)
		h.class = h.p.names.keep(c)
	}
	if cfg.SessionHeader != "" {
		if s, err := v.requestHeader(cfg.SessionHeader); err == nil && s != "" {
			h.session = api.AffinityKey(api.AffinitySession, h.tenant, []byte(s))
		}
	}
	if endOfStream {
		if h.decideWhole(-1) {
			return types.ActionPause
		}
		return types.ActionContinue
	}
	h.contentLength = -1
	if cl, err := v.requestHeader("content-length"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && n >= 0 {
			h.contentLength = n
		}
	}
	if h.contentLength > int64(cfg.MaxBodyBytes) {
		// Known to be oversized: never held, so Envoy never buffers it, and with no
		// routing header Envoy's fallback load balancer picks the replica.
		if cfg.MustSalt(h.tenant) {
			h.p.metrics.oversized.Increment(1)
			return h.refuse(route.RefusedOversized)
		}
		h.decided = true
		h.p.metrics.oversized.Increment(1)
		proxywasm.LogDebugf("kvroute: content-length %d above max_body_bytes %d, not held", h.contentLength, cfg.MaxBodyBytes)
		return types.ActionContinue
	}
	// Hold the headers until the body is in (Envoy >= 1.35 with
	// allow_on_headers_stop_iteration; see manifests/).
	return types.ActionPause
}

// OnHttpRequestBody holds the body (ActionPause: Envoy's StopIterationAndBuffer) until
// end of stream, or stops holding it for good (ActionContinue) when it is, or may with its
// next chunk become, larger than max_body_bytes; the request then routes least-queued.
//
// Why stopping is decided here, at most max_body_bytes in, and always from inside this
// callback (checked against envoyproxy/envoy, source/extensions/common/wasm/context.cc and
// source/common/http/filter_manager.cc):
//
//   - Once this callback paused, Context::decodeData moves each NEXT chunk into the
//     stream's buffer (addDecodedData) BEFORE calling the filter again, and a buffer past
//     Envoy's limit answers 413 right there (the watermark buffer's
//     requestDataTooLarge; the Wasm filter buffers with streaming=false). Waiting for end
//     of stream, or for the body to pass the limit, would turn large bodies into 413s.
//     So the filter stops holding as soon as the body plus one more chunk (see
//     nextChunk) would not fit in max_body_bytes: with max_body_bytes at or below Envoy's
//     buffer limit, Envoy then never holds more than the limit for this filter, unless a
//     chunk arrives that is larger than every earlier one and than the headroom.
//   - ActionContinue returned from this callback after earlier pauses is the path Envoy
//     handles without loss: FilterManager::commonHandleAfterDataCallback sees Continue
//     while the filter is stopped (StopSingleIteration), moves the current chunk into
//     the buffer and calls commonContinue, which passes the headers (with our changes)
//     and then the whole buffer once; Context::decodeData clears its
//     buffering_request_body_ flag on Continue, so later chunks stream straight through.
//   - The known chunk loss (envoyproxy/envoy#46841, fixed by #46842 and its backports; the
//     reason Kuadrant turned allow_on_headers_stop_iteration off, Kuadrant/wasm-shim#388,
//     Kuadrant/kuadrant-operator#2101) needs the opposite: a stream resumed by
//     proxy_continue_stream while the last body callback had paused. buffering_request_body_
//     then stays set, the next chunk is moved into the buffer and the Continue forwards
//     an empty frame instead. This filter never calls proxy_continue_stream
//     (ResumeHttpRequest); keep it that way, or finish the body first.
func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !h.routable || h.decided {
		return types.ActionContinue
	}
	limit := h.p.cfg.MaxBodyBytes
	h.largestChunk = max(h.largestChunk, bodySize-h.seen)
	h.seen = bodySize
	if bodySize > limit || (!endOfStream && bodySize+h.nextChunk(bodySize) > limit) {
		// Route on what is known without the prompt, and let the body stream on.
		if h.route(&route.Request{Oversized: true, Size: bodySize}) {
			return types.ActionPause
		}
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	if h.decideWhole(bodySize) {
		return types.ActionPause
	}
	return types.ActionContinue
}

// minHeadroom bounds the next chunk from below when predicting it: 16 KiB is HTTP/2's
// default maximum DATA frame; limit/16 keeps small limits usable.
const minHeadroom = 16 << 10

// nextChunk is how large the next body chunk may be: the largest so far, at least
// min(minHeadroom, max_body_bytes/16), and never more than an honest content-length
// leaves (Envoy's codecs enforce it), so a body declared within the limit is always read.
func (h *httpContext) nextChunk(bodySize int) int {
	n := max(h.largestChunk, min(minHeadroom, h.p.cfg.MaxBodyBytes/16))
	if h.contentLength >= 0 && int64(bodySize) <= h.contentLength {
		n = int(min(int64(n), h.contentLength-int64(bodySize)))
	}
	return n
}

// OnHttpRequestTrailers: with HTTP/2 trailers the body callback never sees end of
// stream, so the decision happens here.
func (h *httpContext) OnHttpRequestTrailers(int) types.Action {
	if h.routable && !h.decided && h.decideWhole(h.p.cfg.MaxBodyBytes+1) {
		return types.ActionPause
	}
	return types.ActionContinue
}

// decideWhole routes a request whose end of stream was seen, on its body read with
// requestBody(size) (-1: none); true when the stream stays paused: refused (a local
// reply is on its way) or held for the first table.
func (h *httpContext) decideWhole(size int) bool {
	h.whole, h.wholeSize = true, size
	body, err := h.wholeBody()
	return h.decide(body, err)
}

// wholeBody reads the whole request's body again (nil: it has none). It lives in
// p.mem.body until the next request's: routing copies what it keeps.
func (h *httpContext) wholeBody() ([]byte, error) {
	if h.wholeSize < 0 {
		return nil, nil
	}
	return h.p.mem.body.requestBody(h.wholeSize)
}

// decide routes a request on its whole body (nil: none, or readErr when the host would
// not hand it over); true when the stream stays paused (route).
func (h *httpContext) decide(body []byte, readErr error) bool {
	if readErr != nil {
		return h.route(&route.Request{Unread: true, Size: len(body)})
	}
	return h.route(&route.Request{Body: body})
}

// tenant is who the request belongs to, from where tenants.source says (api.Tenants):
// the proxy's workload, the downstream's mTLS identity, or a header the mesh trusts.
func (p *plugin) tenant(v *hostBuf) string {
	switch p.cfg.Tenants.Source {
	case api.SourceHeader:
		t, _ := v.requestHeader(p.cfg.Tenants.Header)
		return p.names.keep(t)
	case api.SourcePeer:
		id, err := proxywasm.GetProperty([]string{"connection", "uri_san_peer_certificate"})
		if err != nil {
			return ""
		}
		return p.names.keep(string(id))
	}
	return p.workload
}

// refuse answers the request locally instead of forwarding it (route.Refusal), and
// counts it; the caller returns ActionPause.
func (h *httpContext) refuse(why route.Refusal) types.Action {
	h.decided = true
	h.p.metrics.refused(why).Increment(1)
	if err := proxywasm.SendHttpResponse(uint32(why.Status()), [][2]string{{"content-type", "text/plain"}},
		[]byte(why.Message()), -1); err != nil {
		proxywasm.LogCriticalf("kvroute: cannot refuse an unsalted request of an isolated tenant (%s): %v", why, err)
	}
	return types.ActionPause
}

// shed refuses a request past the fleet's capacity (package admit) with 429 and
// Retry-After, an Envoy local reply, and counts it by class and reason.
func (h *httpContext) shed(v admit.Verdict) {
	h.p.metrics.shed(v).Increment(1)
	hs := [][2]string{{"content-type", "text/plain"}, {"retry-after", strconv.Itoa(v.RetryAfter)}}
	if err := proxywasm.SendHttpResponse(admit.Status, hs, []byte(v.Message()), -1); err != nil {
		proxywasm.LogCriticalf("kvroute: cannot refuse a request past capacity: %v", err)
	}
}

// route runs the routing sequence (route.Router.Route, the same function the fleet
// simulator runs) and carries out its result: the endpoint header, the body with the
// tenant's cache_salt, the counters and the placement report; or, for an isolated
// tenant's body that cannot be salted, a local reply; or, for a whole request that
// finds no table yet, nothing until the table comes (held.go). True when the stream
// stays paused: answered locally, or held.
func (h *httpContext) route(req *route.Request) (paused bool) {
	h.decided = true
	p := h.p
	now := p.now()
	// The sibling VMs' placements since the last request (one 8-byte read if none).
	p.placed.catchUp(now)
	req.ID, req.Schema, req.ModelHeader, req.Tenant, req.Class = h.reqID, h.schema, h.modelHeader, h.tenant, h.class
	if h.session != 0 {
		req.Session, req.SessionBlocks, _ = p.affinity.lookup(h.session, sessionMaxAge, now)
	}
	// Route asks p.tableFor for the table of the model's shard once it knows the model.
	p.routed, p.reqNow = nil, now
	d, res := p.router.Route(nil, req, 0, now)
	if h.holdForTable(&res, now) {
		return true // counted, salted and reported when it is released
	}
	m := &p.metrics
	if res.Verdict.Shed() {
		h.shed(res.Verdict)
		return true
	}
	if res.Oversized {
		m.oversized.Increment(1)
	}
	if res.ParseError != nil {
		m.parseErrors.Increment(1)
		proxywasm.LogDebugf("kvroute: request body not parsed (%d bytes): %v", len(req.Body), res.ParseError)
	}
	if res.Refused == route.NotRefused && res.Body != nil {
		if err := proxywasm.ReplaceHttpRequestBody(res.Body); err != nil {
			proxywasm.LogWarnf("kvroute: cannot set cache_salt: %v", err)
			res.Refused = route.RefusedUnread
		} else {
			_ = proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(res.Body)))
			m.saltInjected.Increment(1)
		}
	}
	if res.Refused != route.NotRefused {
		if d.Addrs != nil {
			p.router.Done(h.reqID)
		}
		h.refuse(res.Refused)
		return true
	}
	if res.Action == route.Unrouted {
		// No table yet, or a model the control plane does not know, or a model no shard
		// serves: fail open, Envoy decides.
		m.unrouted.Increment(1)
		if p.routed == nil {
			m.unservedModel.Increment(1)
		}
		return
	}
	if err := proxywasm.ReplaceHttpRequestHeader(p.cfg.EndpointHeader, p.header.join(d.Addrs)); err != nil {
		proxywasm.LogWarnf("kvroute: cannot set %s: %v", p.cfg.EndpointHeader, err)
		p.router.Done(h.reqID)
		m.unrouted.Increment(1)
		return
	}
	switch res.Follow {
	case route.Followed:
		m.followed.Increment(1)
	case route.FollowLost:
		m.followLost.Increment(1)
	}
	if h.session != 0 {
		p.affinity.remember(h.session, d.Addrs[0], d.Blocks, now)
	}
	if res.Action == route.NoPrompt {
		m.fallbacks.Increment(1)
		return
	}
	m.decisions.Increment(1)
	if d.Stale {
		m.staleDecisions.Increment(1)
	}
	if d.PredictedCached > 0 {
		m.predictedHits.Increment(1)
	}
	if d.Spill {
		m.spills.Increment(1)
	}
	if d.Fallback {
		m.fallbacks.Increment(1)
	}
	// The router's buffers are reused by the next request: keep a copy of the keys.
	h.placed, h.first, h.report, h.shard = true, d.Addrs[0], res.Placement, p.routed
	h.keys = append(h.keys[:0], res.Placement.Keys...)
	h.report.Keys = h.keys
	h.shard.reports.enqueue(&h.report)
	h.shared = p.placed.share(&h.report, res.LocalKeys, d.Uncached)
	return false
}

// follows is the router's Follows: the replica that answered a Responses response.
func (p *plugin) follows(previousResponseID []byte, tenant string) string {
	addr, _, _ := p.affinity.lookup(api.AffinityKey(api.AffinityResponse, tenant, previousResponseID), responseMaxAge, p.reqNow)
	return addr
}

// endpointHeader builds the endpoint header's value.
type endpointHeader struct {
	buf  []byte // the value being built
	last string // ... and the last one set
}

// join joins addrs as the endpoint header's value, d.Header() without allocating when
// the order is the previous request's.
func (e *endpointHeader) join(addrs []string) string {
	b := e.buf[:0]
	for i, a := range addrs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, a...)
	}
	e.buf = b
	if string(b) != e.last {
		e.last = string(b)
	}
	return e.last
}
