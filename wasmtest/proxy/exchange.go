package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// An exchange is one request in flight: the filter's stream, the handler goroutine that
// applies the stream's events in order, and the end of the request.

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
	// heldHeaders are the request headers the filter released, until the end of their
	// batch (hooks). The hooks of one stream run one at a time.
	heldHeaders *event
}

func (ex *exchange) hooks() host.StreamHooks {
	q := ex.events
	return host.StreamHooks{
		// The headers' event waits for the end of their batch (Released), so the upstream
		// attempt sees the body the filter released with them: a body whole by then is
		// sent with its length, whichever goroutine gets there first.
		RequestHeaders: func(h host.Headers, eos bool) {
			if eos {
				ex.body.finish(nil)
			}
			ex.heldHeaders = &event{kind: evRequestHeaders, headers: h, eos: eos}
		},
		Released: func() {
			if e := ex.heldHeaders; e != nil {
				ex.heldHeaders = nil
				q.push(*e)
			}
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
