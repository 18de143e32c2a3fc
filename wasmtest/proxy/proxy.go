// Package proxy is a small HTTP proxy that runs every request through the proxy-wasm host
// the way an Envoy listener with the kvroute filter would, then forwards it like Envoy's
// override_host load-balancing policy: to the first endpoint of the routing header that
// accepts the connection, then the next, then the least_request fallback over the
// configured endpoints. Responses stream back through the filter chunk by chunk.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
