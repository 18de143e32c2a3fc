package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// Envoy's router answers these itself.
const (
	noHealthyUpstream = "no healthy upstream"
	connectFailure    = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
	resetBeforeHeader = "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
)

// MaxResetRetries bounds the moves to another endpoint after resets before response
// headers, as `retries.attempts` does in manifests/filter/override-host/virtualservice.yaml:
// a request that kills every engine it reaches must not walk the whole fleet.
const MaxResetRetries = 2

// forward sends the request (as the filter released it) upstream, the way Envoy's
// override_host policy picks hosts under kvroute's retry policy (retryOn connect-failure
// and reset): the header's addresses in order, skipping those that are not cluster
// members, moving on when one refuses the connection or resets it before answering; then
// the least_request fallback over the members not tried yet.
func (ex *exchange) forward(h host.Headers, noBody bool) {
	p := ex.p
	// The router matches the path the filter released against the route table.
	route, query, ok := p.routeOf(h.Get(":path"))
	if !ok || !validPathChars(query) {
		p.stats.noRoute.Add(1)
		_ = ex.localReply(http.StatusNotFound, "")
		return
	}
	start := time.Now()
	tried := map[*endpoint]bool{}
	attempts, resets := 0, 0
	failure := connectFailure // what the last failed attempt was, for the final 503
	try := func(ep *endpoint) (done bool) {
		tried[ep] = true
		if attempts > 0 {
			p.stats.retries.Add(1)
		}
		attempts++
		switch ex.attempt(ep, route, query, h, noBody, start) {
		case refused:
			failure = connectFailure
			return false
		case reset:
			p.stats.resets.Add(1)
			if failure = resetBeforeHeader; resets < MaxResetRetries {
				resets++
				return false
			}
			p.stats.upstreamFailures.Add(1)
			ex.localUpstreamReply(resetBeforeHeader)
		}
		return true
	}
	if p.roundRobin.Load() {
		// The baseline kvroute is compared with: the filter's choice is ignored and
		// members take turns.
		for _, ep := range p.inTurn() {
			if try(ep) {
				return
			}
		}
		p.stats.upstreamFailures.Add(1)
		ex.localUpstreamReply(failure)
		return
	}
	for _, ep := range p.fromHeader(h.Get(p.header)) {
		if !tried[ep] && try(ep) {
			return
		}
	}
	fellBack := false
	for {
		ep := p.leastOutstanding(tried)
		if ep == nil {
			break
		}
		if !fellBack {
			fellBack = true
			p.stats.fallbacks.Add(1)
		}
		if try(ep) {
			return
		}
	}
	p.stats.upstreamFailures.Add(1)
	if attempts == 0 {
		failure = noHealthyUpstream
	}
	ex.localUpstreamReply(failure)
}

// fromHeader parses "ip:port,ip:port" into cluster members, in order, without repeats.
func (p *Proxy) fromHeader(v string) []*endpoint {
	if v == "" {
		return nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []*endpoint
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		ep, ok := p.byAddr[a]
		if !ok {
			p.stats.unknownEndpoints.Add(1) // override_host only picks hosts of the cluster
			continue
		}
		out = append(out, ep)
	}
	return out
}

// inTurn lists the members starting with the next one in round-robin order.
func (p *Proxy) inTurn() []*endpoint {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := len(p.endpoints)
	if n == 0 {
		return nil
	}
	first := int(p.turn.Add(1) % uint64(n))
	out := make([]*endpoint, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, p.endpoints[(first+i)%n])
	}
	return out
}

// leastOutstanding is the least_request fallback: the member with the fewest requests in
// flight (a full scan, where Envoy samples two), ties broken round robin.
func (p *Proxy) leastOutstanding(skip map[*endpoint]bool) *endpoint {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := len(p.endpoints)
	if n == 0 {
		return nil
	}
	first := int(p.rotate.Add(1) % uint64(n))
	var best *endpoint
	for i := 0; i < n; i++ {
		ep := p.endpoints[(first+i)%n]
		if skip[ep] {
			continue
		}
		if best == nil || ep.outstanding.Load() < best.outstanding.Load() {
			best = ep
		}
	}
	return best
}

// attemptResult says what became of one attempt.
type attemptResult int

const (
	answered attemptResult = iota // a response (or the proxy's own error reply) went downstream
	refused                       // the connection was refused: nothing reached the endpoint
	reset                         // the endpoint closed or reset the connection before any response header
)

// attempt sends the request to one endpoint. The URL is built from the endpoint's address
// and the matched route and query alone: nothing the client sent can name another host.
func (ex *exchange) attempt(ep *endpoint, route, query string, h host.Headers, noBody bool, start time.Time) attemptResult {
	p := ex.p
	body := ex.body.reader()
	u := &url.URL{Scheme: "http", Host: ep.addr, Path: route, RawQuery: query}
	req, err := http.NewRequestWithContext(ex.upstreamCtx, h.Get(":method"), u.String(), nil)
	if err != nil || req.URL.Host != ep.addr {
		ex.localUpstreamReply(resetBeforeHeader)
		return answered
	}
	req.Host = h.Get(":authority")
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] || kv[0] == "content-length" {
			continue
		}
		req.Header.Add(kv[0], kv[1])
	}
	if !noBody {
		req.Body = body
		req.ContentLength = -1
		if n, complete := ex.body.complete(); complete && len(ex.r.Trailer) == 0 {
			req.ContentLength = int64(n) // the filter released everything: send a length
			if n == 0 {
				req.Body = http.NoBody
			}
		}
		req.GetBody = func() (io.ReadCloser, error) { return ex.body.reader(), nil }
		if keys := ex.r.Trailer; len(keys) > 0 {
			req.Trailer = http.Header{}
			for k := range keys {
				req.Trailer[k] = nil
			}
			body.trailerInto = req.Trailer
		}
	}
	ep.outstanding.Add(1)
	// The upstream request is over once its response is read: release the endpoint and
	// take the time before the last bytes go on, so whoever sees the response complete
	// also sees the counters.
	var once sync.Once
	complete := func(forwarded bool) {
		once.Do(func() {
			ep.outstanding.Add(-1)
			if forwarded {
				p.stats.upstream.add(time.Since(start))
			}
		})
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		complete(false)
		var de *dialError
		switch {
		case errors.As(err, &de) && body.consumed() == 0:
			return refused
		case ex.upstreamCtx.Err() != nil:
			return answered // the client went away: nobody to answer
		case ex.body.replayable():
			// A dead engine's pooled connection, or an engine that died mid-prefill:
			// no response byte has gone downstream, so another endpoint may answer.
			return reset
		}
		ep.forwards.Add(1)
		ex.localUpstreamReply(resetBeforeHeader)
		return answered
	}
	defer resp.Body.Close()
	defer complete(true)
	ep.forwards.Add(1)
	ex.s.SetUpstreamAddress(ep.addr)
	ex.relayResponse(resp, func() { complete(true) })
	return answered
}

// relayResponse sends the upstream response through the filter as it arrives; done runs
// once the upstream response has been read completely.
func (ex *exchange) relayResponse(resp *http.Response, done func()) {
	s := ex.s
	hdrs := append(host.Headers{{":status", strconv.Itoa(resp.StatusCode)}}, host.HeadersFromHTTP(resp.Header)...)
	noBody := resp.Body == http.NoBody || resp.ContentLength == 0
	if noBody {
		done()
	}
	if _, err := s.SendResponseHeaders(hdrs, noBody); err != nil || noBody {
		return
	}
	buf := getBuffer()
	defer putBuffer(buf)
	var total int64
	for {
		n, err := resp.Body.Read(buf)
		total += int64(n)
		end := err == io.EOF || (resp.ContentLength > 0 && total >= resp.ContentLength)
		if err != nil && err != io.EOF {
			done()
			if ex.upstreamCtx.Err() == nil {
				s.Reset("upstream reset: " + err.Error())
			}
			return
		}
		if n == 0 && !end {
			continue
		}
		chunk := append([]byte(nil), buf[:n]...)
		if end {
			done()
			if t := host.HeadersFromHTTP(resp.Trailer); nonEmpty(t) {
				if n > 0 {
					if _, err := s.SendResponseBody(chunk, false); err != nil {
						return
					}
				}
				_, _ = s.SendResponseTrailers(t)
				return
			}
			_, _ = s.SendResponseBody(chunk, true)
			return
		}
		if _, err := s.SendResponseBody(chunk, false); err != nil {
			return // the filter answered locally or the stream is gone
		}
	}
}

// localUpstreamReply is the router's own answer when no upstream could take the request;
// like any response it goes through the filter.
func (ex *exchange) localUpstreamReply(msg string) {
	_ = ex.localReply(http.StatusServiceUnavailable, msg)
}

// localReply is a response the proxy makes itself (Envoy's sendLocalReply), passed through
// the filter's response callbacks like any other.
func (ex *exchange) localReply(status int, msg string) error {
	h := host.Headers{{":status", strconv.Itoa(status)}, {"content-length", strconv.Itoa(len(msg))}}
	if msg == "" {
		_, err := ex.s.SendResponseHeaders(h, true)
		return err
	}
	h = append(h, [2]string{"content-type", "text/plain"})
	if _, err := ex.s.SendResponseHeaders(h, false); err != nil {
		return err
	}
	_, err := ex.s.SendResponseBody([]byte(msg), true)
	return err
}

// bodyBuffer holds the request body as the filter released it, so an attempt that was
// refused or reset can be replayed to the next endpoint.
type bodyBuffer struct {
	mu       sync.Mutex
	changed  *sync.Cond
	data     []byte
	done     bool
	err      error
	trailers host.Headers
}

func newBodyBuffer() *bodyBuffer {
	b := &bodyBuffer{}
	b.changed = sync.NewCond(&b.mu)
	return b
}

func (b *bodyBuffer) append(p []byte) {
	b.mu.Lock()
	b.data = append(b.data, p...)
	b.mu.Unlock()
	b.changed.Broadcast()
}

func (b *bodyBuffer) finish(trailers host.Headers) {
	b.mu.Lock()
	b.done, b.trailers = true, trailers
	b.mu.Unlock()
	b.changed.Broadcast()
}

func (b *bodyBuffer) fail(err error) {
	b.mu.Lock()
	if !b.done {
		b.err = err
	}
	b.done = true
	b.mu.Unlock()
	b.changed.Broadcast()
}

// replayable: the whole body is held (it always is once released: nothing is dropped
// while a request is in flight), so it can be sent again.
func (b *bodyBuffer) replayable() bool {
	_, ok := b.complete()
	return ok
}

func (b *bodyBuffer) complete() (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.data), b.done && b.err == nil
}

func (b *bodyBuffer) reader() *bodyReader { return &bodyReader{b: b} }

// bodyReader reads a bodyBuffer from the start, waiting for data the filter has not
// released yet.
type bodyReader struct {
	b           *bodyBuffer
	off         int
	closed      bool
	trailerInto http.Header
}

func (r *bodyReader) Read(p []byte) (int, error) {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for r.off >= len(b.data) && !b.done && !r.closed {
		b.changed.Wait()
	}
	if r.closed {
		return 0, io.ErrClosedPipe
	}
	if r.off < len(b.data) {
		n := copy(p, b.data[r.off:])
		r.off += n
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	for _, kv := range b.trailers {
		if r.trailerInto != nil {
			r.trailerInto.Add(kv[0], kv[1])
		}
	}
	return 0, io.EOF
}

func (r *bodyReader) Close() error {
	r.b.mu.Lock()
	r.closed = true
	r.b.mu.Unlock()
	r.b.changed.Broadcast()
	return nil
}

func (r *bodyReader) consumed() int {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	return r.off
}
