package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Message is an HTTP message in the filter's terms.
type Message struct {
	Headers  Headers
	Body     []byte
	Trailers Headers
}

// Recorder collects what passes the filter on one stream. Pass Hooks() to NewStream and
// read it from any goroutine.
type Recorder struct {
	mu       sync.Mutex
	changed  chan struct{} // closed on every event
	req      Message
	resp     Message
	chunks   [][]byte
	reqSent  bool // request headers passed the filter
	reqDone  bool
	respSent bool
	respDone bool
	local    int
	reset    string
	isReset  bool
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

func (r *Recorder) update(f func()) {
	r.mu.Lock()
	f()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// Hooks returns stream hooks that record into r.
func (r *Recorder) Hooks() StreamHooks {
	return StreamHooks{
		RequestHeaders: func(h Headers, eos bool) {
			r.update(func() { r.req.Headers, r.reqSent, r.reqDone = h, true, eos })
		},
		RequestData: func(b []byte, eos bool) {
			r.update(func() { r.req.Body = append(r.req.Body, b...); r.reqDone = eos })
		},
		RequestTrailers: func(t Headers) {
			r.update(func() { r.req.Trailers, r.reqDone = t, true })
		},
		ResponseHeaders: func(h Headers, eos bool) {
			r.update(func() { r.resp.Headers, r.respSent, r.respDone = h, true, eos })
		},
		ResponseData: func(b []byte, eos bool) {
			r.update(func() {
				r.resp.Body = append(r.resp.Body, b...)
				if len(b) > 0 {
					r.chunks = append(r.chunks, append([]byte(nil), b...))
				}
				r.respDone = eos
			})
		},
		ResponseTrailers: func(t Headers) {
			r.update(func() { r.resp.Trailers, r.respDone = t, true })
		},
		LocalReply: func(status int) {
			r.update(func() { r.local = status })
		},
		Reset: func(reason string) {
			r.update(func() { r.reset, r.isReset = reason, true })
		},
	}
}

// Request returns the request as it left the filter so far; sent reports whether its
// headers did, complete whether its end of stream did.
func (r *Recorder) Request() (m Message, sent, complete bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneMessage(r.req), r.reqSent, r.reqDone
}

// Response returns the response as it left the filter so far.
func (r *Recorder) Response() (m Message, sent, complete bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cloneMessage(r.resp), r.respSent, r.respDone
}

// ResponseChunks returns the non-empty response body chunks as the filter passed them.
func (r *Recorder) ResponseChunks() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.chunks...)
}

// LocalReply returns the status of the local reply, 0 if there was none.
func (r *Recorder) LocalReply() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.local
}

// Reset returns the reset reason and whether the stream was reset.
func (r *Recorder) Reset() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reset, r.isReset
}

// WaitRequest waits until the request has left the filter completely, or was answered
// locally, or the stream was reset.
func (r *Recorder) WaitRequest(ctx context.Context) error {
	return r.wait(ctx, func() bool { return r.reqDone || r.local != 0 || r.isReset })
}

// WaitResponse waits until the response has left the filter completely or the stream was
// reset.
func (r *Recorder) WaitResponse(ctx context.Context) error {
	return r.wait(ctx, func() bool { return r.respDone || r.isReset })
}

func (r *Recorder) wait(ctx context.Context, done func() bool) error {
	for {
		r.mu.Lock()
		ok, ch := done(), r.changed
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func cloneMessage(m Message) Message {
	return Message{Headers: m.Headers.Clone(), Body: append([]byte(nil), m.Body...), Trailers: m.Trailers.Clone()}
}

// Request is one client request for Host.Do.
type Request struct {
	// Headers must carry :method, :path and :authority (and usually :scheme).
	Headers Headers
	// Body is sent as these chunks, one proxy_on_request_body each.
	Body     [][]byte
	Trailers Headers
	Info     StreamInfo
	// VM runs the request; nil picks round robin.
	VM *VM
	// UpstreamAddress is what upstream.address reads in the response callbacks
	// (default "127.0.0.1:0").
	UpstreamAddress string
	// Upstream answers the request as it left the filter; nil answers 200 with no body.
	Upstream func(forwarded Message) Response
}

// Response is an upstream answer for Host.Do.
type Response struct {
	Headers  Headers // must carry :status
	Body     [][]byte
	Trailers Headers
}

// Result is what Host.Do saw.
type Result struct {
	VM int
	// Actions are the filter's answers to each event sent, request then response.
	Actions []Action
	// Forwarded is the request as it left the filter (what the upstream got).
	Forwarded Message
	// Response is the response as it left the filter (what the client got).
	Response Message
	// ResponseChunks are the response body chunks as the filter passed them.
	ResponseChunks [][]byte
	LocalReply     int    // status of a local reply, 0 if none
	Reset          string // reset reason, "" if none
	FailedOpen     bool   // the filter was skipped: its VM had failed
	FilterTime     time.Duration
}

// Do runs one request through a VM, the way the proxy would but without sockets: request
// headers, body chunks and trailers go through the filter; if the filter holds the
// request (waiting for an HTTP call, say) Do waits for it to be released, then asks
// Upstream for the response and sends that back through the filter. Under a virtual clock,
// something must Advance the clock while Do waits for a held request.
func (h *Host) Do(ctx context.Context, req Request) (*Result, error) {
	vm := req.VM
	if vm == nil {
		vm = h.NextVM()
	}
	rec := NewRecorder()
	s := vm.NewStream(req.Info, rec.Hooks())
	defer s.Close()
	res := &Result{VM: vm.index}
	step := func(a Action, err error) error {
		if errors.Is(err, ErrStreamEnded) {
			return errStop
		}
		if err != nil {
			return err
		}
		res.Actions = append(res.Actions, a)
		return nil
	}
	err := step(s.SendRequestHeaders(req.Headers, len(req.Body) == 0 && req.Trailers == nil))
	for i := 0; err == nil && i < len(req.Body); i++ {
		err = step(s.SendRequestBody(req.Body[i], i == len(req.Body)-1 && req.Trailers == nil))
	}
	if err == nil && req.Trailers != nil {
		err = step(s.SendRequestTrailers(req.Trailers))
	}
	if err != nil && err != errStop {
		return nil, err
	}
	if err := rec.WaitRequest(ctx); err != nil {
		return nil, fmt.Errorf("request held by the filter: %w", err)
	}
	res.Forwarded, _, _ = rec.Request()
	if rec.LocalReply() == 0 {
		if _, isReset := rec.Reset(); !isReset {
			answer := Response{Headers: Headers{{":status", "200"}}}
			if req.Upstream != nil {
				answer = req.Upstream(res.Forwarded)
			}
			addr := req.UpstreamAddress
			if addr == "" {
				addr = "127.0.0.1:0"
			}
			s.SetUpstreamAddress(addr)
			err := step(s.SendResponseHeaders(answer.Headers, len(answer.Body) == 0 && answer.Trailers == nil))
			for i := 0; err == nil && i < len(answer.Body); i++ {
				err = step(s.SendResponseBody(answer.Body[i], i == len(answer.Body)-1 && answer.Trailers == nil))
			}
			if err == nil && answer.Trailers != nil {
				err = step(s.SendResponseTrailers(answer.Trailers))
			}
			if err != nil && err != errStop {
				return nil, err
			}
		}
	}
	if err := rec.WaitResponse(ctx); err != nil {
		return nil, fmt.Errorf("response held by the filter: %w", err)
	}
	res.Response, _, _ = rec.Response()
	res.ResponseChunks = rec.ResponseChunks()
	res.LocalReply = rec.LocalReply()
	res.Reset, _ = rec.Reset()
	res.FailedOpen = s.FailedOpen()
	s.Close()
	res.FilterTime = s.FilterTime()
	return res, nil
}

var errStop = errors.New("stream ended")
