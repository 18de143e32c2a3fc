// Package proxy is a small HTTP proxy that runs every request through the proxy-wasm host
// the way an Envoy listener with the kvroute filter would, then forwards it like Envoy's
// override_host load-balancing policy: to the first endpoint of the routing header that
// accepts the connection, then the next, then the least_request fallback over the
// configured endpoints. Responses stream back through the filter chunk by chunk.
package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// DefaultRoutingHeader is the header the filter writes and override_host reads (the
// Gateway API inference extension's name).
const DefaultRoutingHeader = "x-gateway-destination-endpoint"

// DefaultBodyLimit is Envoy's default per_connection_buffer_limit_bytes.
const DefaultBodyLimit = 1 << 20

// Config configures a Proxy.
type Config struct {
	// Host runs the filter; each request goes to its next VM (round robin).
	Host *host.Host
	// Endpoints are the cluster members ("ip:port"): only these can be chosen, and the
	// fallback balances over them.
	Endpoints []string
	// RoutingHeader is the header holding "ip:port,ip:port,..."; default DefaultRoutingHeader.
	RoutingHeader string
	// BodyLimit caps what the filter may buffer (413 above it); default DefaultBodyLimit.
	BodyLimit int
	// DialTimeout bounds a connection attempt to one endpoint; default 1s.
	DialTimeout time.Duration
	// Routes are the request paths forwarded upstream (exact match, query aside); others
	// get the router's 404. Default DefaultRoutes.
	Routes []string
	// Timeouts (edge.go gives the defaults and their sources); zero takes the default, a
	// negative value disables one.
	//
	// RequestHeadersTimeout: from a request's first byte to the end of its headers; 408.
	RequestHeadersTimeout time.Duration
	// RequestTimeout: the whole request must arrive (or the response start) in time; 408.
	RequestTimeout time.Duration
	// StreamIdleTimeout: a request with no bytes moving either way; 408 before the
	// response starts, a reset after.
	StreamIdleTimeout time.Duration
	// IdleTimeout: a connection with no request in flight is closed.
	IdleTimeout time.Duration
}

type timeouts struct{ headers, request, streamIdle, idle time.Duration }

func pick(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return max(v, 0)
}

// Proxy is an http.Handler. Create it with New.
type Proxy struct {
	host      *host.Host
	header    string
	limit     int
	transport *http.Transport
	routes    map[string]bool
	timeouts  timeouts

	mu        sync.RWMutex
	endpoints []*endpoint
	byAddr    map[string]*endpoint
	rotate    atomic.Uint64 // tie-break for the fallback

	roundRobin atomic.Bool // ignore the routing header (SetRoundRobin)
	turn       atomic.Uint64

	stats counters
}

type endpoint struct {
	addr        string
	outstanding atomic.Int64
	forwards    atomic.Int64
}

// New returns a proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if cfg.Host == nil {
		return nil, errors.New("proxy: no host")
	}
	if cfg.RoutingHeader == "" {
		cfg.RoutingHeader = DefaultRoutingHeader
	}
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = DefaultBodyLimit
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	p := &Proxy{host: cfg.Host, header: strings.ToLower(cfg.RoutingHeader), limit: cfg.BodyLimit,
		routes: map[string]bool{},
		timeouts: timeouts{
			headers:    pick(cfg.RequestHeadersTimeout, DefaultRequestHeadersTimeout),
			request:    pick(cfg.RequestTimeout, DefaultRequestTimeout),
			streamIdle: pick(cfg.StreamIdleTimeout, DefaultStreamIdleTimeout),
			idle:       pick(cfg.IdleTimeout, DefaultIdleTimeout),
		}}
	if cfg.Routes == nil {
		cfg.Routes = DefaultRoutes
	}
	for _, r := range cfg.Routes {
		p.routes[r] = true
	}
	dialer := &net.Dialer{Timeout: cfg.DialTimeout}
	p.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{addr: addr, err: err}
			}
			return c, nil
		},
		MaxIdleConnsPerHost: 256,
		DisableCompression:  true, // pass bytes through as the upstream sent them
		IdleConnTimeout:     90 * time.Second,
	}
	p.SetEndpoints(cfg.Endpoints)
	return p, nil
}

// SetEndpoints replaces the cluster members (an EDS update). Outstanding counts of the
// endpoints that stay are kept.
func (p *Proxy) SetEndpoints(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.byAddr
	p.byAddr = map[string]*endpoint{}
	p.endpoints = nil
	for _, a := range addrs {
		if _, dup := p.byAddr[a]; dup {
			continue
		}
		ep := old[a]
		if ep == nil {
			ep = &endpoint{addr: a}
		}
		p.byAddr[a] = ep
		p.endpoints = append(p.endpoints, ep)
	}
}

// SetRoundRobin switches the balancer between Envoy's override_host policy (the default:
// the routing header's endpoints, then least_request) and plain round robin over the
// members, which ignores the filter's choice: the baseline kvroute is measured against,
// through the same proxy and filter.
func (p *Proxy) SetRoundRobin(on bool) { p.roundRobin.Store(on) }

// Close drops idle upstream connections.
func (p *Proxy) Close() { p.transport.CloseIdleConnections() }

// dialError marks a failure to connect: the request never left, the next endpoint may
// have it (Envoy's connect-failure retry).
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return "connect " + e.addr + ": " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// ServeHTTP runs one request through a VM and forwards it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if st, ok := r.Context().Value(connKey{}).(*connTimers); ok && !st.serving() {
		return // the request-headers timeout answered first
	}
	p.stats.requests.Add(1)
	tgt, ok := parseTarget(r)
	if !ok || !validMethod(r.Method) {
		// An HTTP/1 codec error in Envoy: 400, and the connection is not reused.
		p.stats.badRequests.Add(1)
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "11")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "Bad Request")
		return
	}
	ex := &exchange{p: p, w: w, r: r, rc: http.NewResponseController(w), start: time.Now(),
		events: newEventQueue(), body: newBodyBuffer(), target: tgt}
	// Envoy streams both ways at once; net/http's HTTP/1 server needs this to read the
	// request body after the response started.
	_ = ex.rc.EnableFullDuplex()
	ex.run()
}

// exchange is one request in flight.
type exchange struct {
	p      *Proxy
	w      http.ResponseWriter
	r      *http.Request
	rc     *http.ResponseController
	s      *host.Stream
	start  time.Time
	events *eventQueue
	body   *bodyBuffer
	target target

	wroteHeaders bool        // the handler wrote the response status
	respStarted  atomic.Bool // the filter released response headers
	lastActive   atomic.Int64
	timers       []*time.Timer

	upstreamCtx    context.Context
	cancelUpstream context.CancelFunc
	finished       bool

	pumpMu      sync.Mutex
	pumpStop    bool // the handler is returning: read no more
	pumpReading bool // the pump is inside Body.Read
	pumpEnded   atomic.Bool
}

type eventKind int

const (
	evRequestHeaders eventKind = iota
	evResponseHeaders
	evResponseData
	evResponseTrailers
	evLocalReply
	evReset
	evEdgeReply // a timeout or a framing error: the proxy answers (or resets) itself
)

type event struct {
	kind    eventKind
	headers host.Headers
	data    []byte
	eos     bool
	status  int
	reason  string
}

func (ex *exchange) hooks() host.StreamHooks {
	q := ex.events
	return host.StreamHooks{
		RequestHeaders: func(h host.Headers, eos bool) {
			if eos {
				ex.body.finish(nil)
			}
			q.push(event{kind: evRequestHeaders, headers: h, eos: eos})
		},
		RequestData: func(b []byte, eos bool) {
			ex.body.append(b)
			if eos {
				ex.body.finish(nil)
			}
		},
		RequestTrailers: func(t host.Headers) { ex.body.finish(t) },
		ResponseHeaders: func(h host.Headers, eos bool) {
			ex.respStarted.Store(true)
			q.push(event{kind: evResponseHeaders, headers: h, eos: eos})
		},
		ResponseData:     func(b []byte, eos bool) { q.push(event{kind: evResponseData, data: b, eos: eos}) },
		ResponseTrailers: func(t host.Headers) { q.push(event{kind: evResponseTrailers, headers: t}) },
		LocalReply: func(status int) {
			ex.body.fail(errLocalReply)
			q.push(event{kind: evLocalReply, status: status})
		},
		Reset: func(reason string) {
			ex.body.fail(errReset)
			q.push(event{kind: evReset, reason: reason})
		},
	}
}

var (
	errLocalReply = errors.New("request answered locally")
	errReset      = errors.New("stream reset")
)

func (ex *exchange) run() {
	p, r := ex.p, ex.r
	ex.upstreamCtx, ex.cancelUpstream = context.WithCancel(context.Background())
	defer ex.cancelUpstream()
	info := host.StreamInfo{SourceAddress: r.RemoteAddr, Protocol: r.Proto, BufferLimit: p.limit}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		info.DestinationAddress = a.String()
	}
	ex.s = p.host.NewStream(info, ex.hooks())
	defer ex.finish()

	noBody := r.Body == nil || r.Body == http.NoBody || (r.ContentLength == 0 && len(r.Trailer) == 0)
	ex.startTimers(noBody)
	defer ex.stopTimers()
	if _, err := ex.s.SendRequestHeaders(requestHeaders(r, ex.target), noBody); err != nil && !errors.Is(err, host.ErrStreamEnded) {
		http.Error(ex.w, err.Error(), http.StatusInternalServerError)
		return
	}
	if noBody {
		ex.pumpEnded.Store(true)
	} else {
		pumped := make(chan struct{})
		go func() {
			defer close(pumped)
			ex.pumpRequestBody()
		}()
		// net/http forbids touching the request body once the handler returns: stop the
		// reader first, cutting short a read that waits for more from the client.
		defer func() {
			ex.pumpMu.Lock()
			ex.pumpStop = true
			reading := ex.pumpReading
			ex.pumpMu.Unlock()
			if reading {
				_ = ex.rc.SetReadDeadline(time.Now())
			}
			<-pumped
			if !ex.pumpEnded.Load() {
				// The body did not arrive whole and the connection closes (writeHeaders
				// said so): keep the deadline in the past, or net/http would wait to
				// discard the rest of a body the client may trickle forever.
				_ = ex.rc.SetReadDeadline(time.Now())
			} else if reading {
				_ = ex.rc.SetReadDeadline(time.Time{})
			}
		}()
	}
	for {
		select {
		case <-ex.events.signal:
			for _, ev := range ex.events.take() {
				if ex.handle(ev) {
					return
				}
			}
		case <-r.Context().Done():
			ex.s.Reset("downstream went away")
			return
		}
	}
}

// finish closes the stream (proxy_on_log, proxy_on_done, proxy_on_delete) and records the
// request's numbers. It runs before the response's last bytes are written, so a client
// that has the whole response also sees the request in Stats.
func (ex *exchange) finish() {
	if ex.finished {
		return
	}
	ex.finished = true
	p := ex.p
	ex.s.Close()
	p.stats.filter.add(ex.s.FilterTime())
	p.stats.total.add(time.Since(ex.start))
	if ex.s.FailedOpen() {
		p.stats.failOpen.Add(1)
	}
}

// handle applies one event on the handler goroutine; it reports whether the exchange is over.
func (ex *exchange) handle(ev event) bool {
	switch ev.kind {
	case evRequestHeaders:
		go ex.forward(ev.headers, ev.eos)
	case evLocalReply:
		ex.p.stats.localReplies.Add(1)
		ex.cancelUpstream()
	case evResponseHeaders:
		if ev.eos {
			ex.finish()
		}
		ex.writeHeaders(ev.headers)
		ex.touch()
		if ev.eos {
			return true
		}
		_ = ex.rc.Flush()
	case evResponseData:
		if ev.eos {
			ex.finish()
		}
		if len(ev.data) > 0 {
			if _, err := ex.w.Write(ev.data); err != nil {
				ex.s.Reset("downstream write: " + err.Error())
				return true
			}
			_ = ex.rc.Flush() // SSE: every chunk leaves as it comes
			ex.touch()
		}
		return ev.eos
	case evResponseTrailers:
		ex.finish()
		for _, kv := range ev.headers {
			ex.w.Header().Add(http.TrailerPrefix+kv[0], kv[1])
		}
		return true
	case evReset:
		ex.cancelUpstream()
		// Envoy resets the downstream stream: abort the connection, no clean response.
		panic(http.ErrAbortHandler)
	case evEdgeReply:
		ex.cancelUpstream()
		if ex.wroteHeaders || ex.respStarted.Load() {
			// Envoy's sendLocalReply on a stream whose response started resets it.
			panic(http.ErrAbortHandler)
		}
		ex.body.fail(errLocalReply) // an upstream attempt reading the body stops
		// Like Envoy's sendLocalReply, the answer passes the filter's response callbacks;
		// its events come back through the queue.
		if err := ex.localReply(ev.status, ev.reason); err != nil && !ex.respStarted.Load() {
			ex.writeDirect(ev.status, ev.reason)
			return true
		}
	}
	return false
}

// writeDirect answers without the filter (its stream cannot take a response any more).
func (ex *exchange) writeDirect(status int, body string) {
	ex.finish()
	h := ex.w.Header()
	h.Set("Content-Type", "text/plain")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if !ex.pumpEnded.Load() {
		h.Set("Connection", "close")
	}
	ex.wroteHeaders = true
	ex.w.WriteHeader(status)
	_, _ = io.WriteString(ex.w, body)
}

// touch records activity for the stream idle timeout.
func (ex *exchange) touch() { ex.lastActive.Store(time.Now().UnixNano()) }

// startTimers arms the stream's timeouts (Envoy's ActiveStream timers in
// source/common/http/conn_manager_impl.cc; the answers are onRequestTimeout's and
// onIdleTimeout's).
func (ex *exchange) startTimers(noBody bool) {
	t := ex.p.timeouts
	if t.request > 0 && !noBody {
		ex.timers = append(ex.timers, time.AfterFunc(t.request, func() {
			if ex.pumpEnded.Load() || ex.respStarted.Load() {
				return // the request arrived, or the response began: disarmed
			}
			ex.p.stats.requestTimeouts.Add(1)
			ex.events.push(event{kind: evEdgeReply, status: http.StatusRequestTimeout, reason: "request timeout"})
		}))
	}
	if t.streamIdle > 0 {
		ex.touch()
		var idle *time.Timer
		idle = time.AfterFunc(t.streamIdle, func() {
			if since := time.Since(time.Unix(0, ex.lastActive.Load())); since < t.streamIdle {
				idle.Reset(t.streamIdle - since)
				return
			}
			ex.p.stats.streamIdleTimeouts.Add(1)
			if ex.respStarted.Load() {
				// A reset; a handler stuck writing to a client that stopped reading
				// must see it too.
				_ = ex.rc.SetWriteDeadline(time.Now())
			}
			ex.events.push(event{kind: evEdgeReply, status: http.StatusRequestTimeout, reason: "stream timeout"})
		})
		ex.timers = append(ex.timers, idle)
	}
}

func (ex *exchange) stopTimers() {
	for _, t := range ex.timers {
		t.Stop()
	}
}

// hopByHop are connection-level headers a proxy does not pass on (RFC 9110 7.6.1).
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"te": true, "trailer": true, "transfer-encoding": true, "upgrade": true}

func (ex *exchange) writeHeaders(h host.Headers) {
	status, err := strconv.Atoi(h.Get(":status"))
	if err != nil || status < 100 {
		status = http.StatusBadGateway
	}
	out := ex.w.Header()
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] {
			continue
		}
		out.Add(kv[0], kv[1])
	}
	if !ex.pumpEnded.Load() {
		// Answered before the client finished sending (a 413, a local reply): like Envoy,
		// do not reuse a connection whose request body was not read to its end.
		out.Set("Connection", "close")
	}
	ex.wroteHeaders = true
	ex.w.WriteHeader(status)
}

// requestHeaders is what Envoy's connection manager hands the filter chain: pseudo-headers,
// lower-case names, no hop-by-hop headers, x-request-id and x-forwarded-proto added.
func requestHeaders(r *http.Request, t target) host.Headers {
	h := host.Headers{{":method", r.Method}, {":path", t.path}, {":authority", t.authority}, {":scheme", "http"}}
	hasID := false
	for _, kv := range host.HeadersFromHTTP(r.Header) {
		if hopByHop[kv[0]] || kv[0] == "x-forwarded-proto" {
			continue
		}
		hasID = hasID || kv[0] == "x-request-id"
		h = append(h, kv)
	}
	h = append(h, [2]string{"x-forwarded-proto", "http"})
	if !hasID {
		h = append(h, [2]string{"x-request-id", requestID()})
	}
	return h
}

func requestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// pumpRequestBody feeds the client's body to the filter as it arrives.
func (ex *exchange) pumpRequestBody() {
	r := ex.r
	buf := getBuffer()
	defer putBuffer(buf)
	var total int64
	for {
		ex.pumpMu.Lock()
		if ex.pumpStop {
			ex.pumpMu.Unlock()
			return
		}
		ex.pumpReading = true
		ex.pumpMu.Unlock()
		n, err := r.Body.Read(buf)
		ex.pumpMu.Lock()
		ex.pumpReading = false
		ex.pumpMu.Unlock()
		total += int64(n)
		if n > 0 {
			ex.touch()
		}
		end := err == io.EOF || (r.ContentLength > 0 && total >= r.ContentLength)
		if err != nil && err != io.EOF {
			if framingError(err) {
				// Envoy's codec: a malformed chunk size is a protocol error, answered
				// 400 (HPE_INVALID_CHUNK_SIZE in source/common/http/http1/balsa_parser.cc).
				ex.p.stats.framingErrors.Add(1)
				ex.events.push(event{kind: evEdgeReply, status: http.StatusBadRequest, reason: "Bad Request"})
				return
			}
			ex.s.Reset("downstream request body: " + err.Error())
			return
		}
		chunk := append([]byte(nil), buf[:n]...)
		if end {
			ex.pumpEnded.Store(true)
			if t := host.HeadersFromHTTP(r.Trailer); len(t) > 0 && nonEmpty(t) {
				if n > 0 {
					if _, err := ex.s.SendRequestBody(chunk, false); err != nil {
						return
					}
				}
				_, _ = ex.s.SendRequestTrailers(t)
				return
			}
			_, _ = ex.s.SendRequestBody(chunk, true)
			return
		}
		if n > 0 {
			if _, err := ex.s.SendRequestBody(chunk, false); err != nil {
				return // answered locally or reset: stop reading
			}
		}
	}
}

// framingError tells a malformed request body (bad chunk framing) from a client that went
// away or a read cut short by the proxy itself.
func framingError(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &ne),
		errors.Is(err, http.ErrBodyReadAfterClose), errors.Is(err, syscall.ECONNRESET):
		return false
	}
	return true
}

func nonEmpty(t host.Headers) bool {
	for _, kv := range t {
		if kv[1] != "" {
			return true
		}
	}
	return false
}

// buffers are the read buffers of request and response bodies (chunks are copied out).
var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func getBuffer() []byte  { return *buffers.Get().(*[]byte) }
func putBuffer(b []byte) { buffers.Put(&b) }

// eventQueue carries hook events to the handler goroutine without ever blocking a hook.
type eventQueue struct {
	mu     sync.Mutex
	items  []event
	signal chan struct{}
}

func newEventQueue() *eventQueue { return &eventQueue{signal: make(chan struct{}, 1)} }

func (q *eventQueue) push(e event) {
	q.mu.Lock()
	q.items = append(q.items, e)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []event {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
