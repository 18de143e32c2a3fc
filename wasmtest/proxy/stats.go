package proxy

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the proxy's counters since it started.
type Stats struct {
	Requests int64
	// Forwards counts requests sent to each endpoint (the connection was accepted).
	Forwards map[string]int64
	// Retries counts moves to another endpoint after one refused the connection or reset
	// it before answering.
	Retries int64
	// Resets counts attempts whose connection was closed or reset before any response
	// header (retried on the next endpoint, up to MaxResetRetries per request).
	Resets int64
	// Fallbacks counts requests that reached the least_request fallback: no routing header,
	// no cluster member in it, or every listed member refused.
	Fallbacks int64
	// UnknownEndpoints counts header entries skipped because they are not cluster members.
	UnknownEndpoints int64
	// UpstreamFailures counts requests no endpoint accepted (answered 503).
	UpstreamFailures int64
	// LocalReplies counts requests the filter (or the 413 limit) answered itself.
	LocalReplies int64
	// FailOpen counts requests that bypassed the filter because its VM had failed.
	FailOpen int64
	// BadRequests counts requests refused at the edge with 400 (a method or request
	// target Envoy's HTTP/1 codec rejects); FramingErrors those whose body framing was
	// malformed (400, or a reset once the response had started).
	BadRequests, FramingErrors int64
	// NoRoute counts requests whose path is not a route (404).
	NoRoute int64
	// HeaderTimeouts, RequestTimeouts and StreamIdleTimeouts count requests cut by each
	// timeout; IdleClosed counts connections closed by the idle timeout.
	HeaderTimeouts, RequestTimeouts, StreamIdleTimeouts, IdleClosed int64
	// OpenConnections is the number of client connections open now.
	OpenConnections int64
	// Filter is the time spent inside the filter's callbacks, per request.
	Filter Latency
	// Upstream is the time from the first connection attempt to the end of the upstream
	// response, per forwarded request.
	Upstream Latency
	// Total is the time the proxy spent on each request, end to end.
	Total Latency
}

// Latency summarises durations.
type Latency struct {
	Count              int64
	Sum, P50, P99, Max time.Duration
}

// Mean is Sum / Count.
func (l Latency) Mean() time.Duration {
	if l.Count == 0 {
		return 0
	}
	return l.Sum / time.Duration(l.Count)
}

type counters struct {
	requests, retries, resets, fallbacks, unknownEndpoints, upstreamFailures, localReplies, failOpen atomic.Int64
	badRequests, framingErrors, noRoute, headerTimeouts, requestTimeouts, streamIdleTimeouts         atomic.Int64
	idleClosed, openConns                                                                            atomic.Int64
	filter, upstream, total                                                                          samples
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	s := Stats{
		Requests:           p.stats.requests.Load(),
		Retries:            p.stats.retries.Load(),
		Resets:             p.stats.resets.Load(),
		Fallbacks:          p.stats.fallbacks.Load(),
		UnknownEndpoints:   p.stats.unknownEndpoints.Load(),
		UpstreamFailures:   p.stats.upstreamFailures.Load(),
		LocalReplies:       p.stats.localReplies.Load(),
		FailOpen:           p.stats.failOpen.Load(),
		BadRequests:        p.stats.badRequests.Load(),
		FramingErrors:      p.stats.framingErrors.Load(),
		NoRoute:            p.stats.noRoute.Load(),
		HeaderTimeouts:     p.stats.headerTimeouts.Load(),
		RequestTimeouts:    p.stats.requestTimeouts.Load(),
		StreamIdleTimeouts: p.stats.streamIdleTimeouts.Load(),
		IdleClosed:         p.stats.idleClosed.Load(),
		OpenConnections:    p.stats.openConns.Load(),
		Filter:             p.stats.filter.summary(),
		Upstream:           p.stats.upstream.summary(),
		Total:              p.stats.total.summary(),
		Forwards:           map[string]int64{},
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, ep := range p.endpoints {
		s.Forwards[ep.addr] = ep.forwards.Load()
	}
	return s
}

// keepSamples bounds the durations kept for percentiles: the most recent ones.
const keepSamples = 1 << 16

type samples struct {
	mu    sync.Mutex
	ring  []time.Duration
	next  int
	count int64
	sum   time.Duration
	max   time.Duration
}

func (s *samples) add(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	s.sum += d
	s.max = max(s.max, d)
	if len(s.ring) < keepSamples {
		s.ring = append(s.ring, d)
		return
	}
	s.ring[s.next] = d
	s.next = (s.next + 1) % keepSamples
}

func (s *samples) summary() Latency {
	s.mu.Lock()
	sorted := slices.Clone(s.ring)
	l := Latency{Count: s.count, Sum: s.sum, Max: s.max}
	s.mu.Unlock()
	if len(sorted) == 0 {
		return l
	}
	slices.Sort(sorted)
	at := func(q float64) time.Duration { return sorted[int(q*float64(len(sorted)-1)+0.5)] }
	l.P50, l.P99 = at(0.50), at(0.99)
	return l
}
