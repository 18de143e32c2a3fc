package host

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// Action is what a filter callback returned.
type Action uint32

const (
	// ActionContinue lets the headers, body or trailers go on.
	ActionContinue Action = 0
	// ActionPause stops iteration: headers are held (Envoy >= 1.35 with
	// allow_on_headers_stop_iteration), body data is buffered and the next body callback
	// gets the whole buffer, until a callback continues or proxy_continue_stream.
	ActionPause Action = 1
)

func (a Action) String() string {
	switch a {
	case ActionContinue:
		return "continue"
	case ActionPause:
		return "pause"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// ErrStreamEnded is returned for events sent to a stream that can no longer take them: the
// filter answered locally, the stream was reset or closed, or that direction is complete.
var ErrStreamEnded = errors.New("host: stream ended")

// StreamInfo is what the host knows about a stream's connection; it feeds properties and
// the buffer limit.
type StreamInfo struct {
	SourceAddress      string // downstream peer "ip:port" (source.address, source.port)
	DestinationAddress string // local "ip:port" the request arrived on (destination.*)
	Protocol           string // request.protocol, default "HTTP/1.1"
	ConnectionID       uint64 // connection.id
	// BufferLimit caps what the filter may hold while it pauses (Envoy's
	// per_connection_buffer_limit_bytes, 1 MiB by default there); 0 means no limit. Above
	// it the request gets a local 413, a response whose headers are not sent yet a 500.
	BufferLimit int
}

// StreamHooks receive what passes the filter, in order. They run on whichever goroutine is
// driving the stream at that moment (the caller of a Send method, or the goroutine that
// delivered the HTTP-call response that resumed it), with no host lock held. They must not
// block for long and must not call the stream's methods. Nil hooks are skipped.
type StreamHooks struct {
	RequestHeaders   func(h Headers, endOfStream bool)
	RequestData      func(b []byte, endOfStream bool)
	RequestTrailers  func(t Headers)
	ResponseHeaders  func(h Headers, endOfStream bool)
	ResponseData     func(b []byte, endOfStream bool)
	ResponseTrailers func(t Headers)
	// LocalReply announces that the request is answered locally (proxy_send_local_response,
	// or the host's 413 for a body over the limit): stop sending the request and drop any
	// upstream response. The reply itself follows through the response hooks, after the
	// filter's own response callbacks have seen it, as in Envoy.
	LocalReply func(status int)
	// Reset announces a stream reset: proxy_close_stream, or a local reply after the
	// response headers had already gone out.
	Reset func(reason string)
}

// Stream is one HTTP stream (an Envoy filter context) on a VM. Feed it with the Send
// methods in HTTP order; what passes the filter comes out of the hooks. Close it when done:
// that runs proxy_on_log, proxy_on_done and proxy_on_delete.
type Stream struct {
	vm    *VM
	id    uint32
	info  StreamInfo
	hooks StreamHooks

	mbox     sync.Mutex // events are handled one at a time, in order
	queue    []streamEvent
	draining bool

	filterNanos atomic.Int64
	failedOpen  atomic.Bool

	// guarded by vm.mu
	req, resp      half
	created        bool // proxy_on_context_create done
	bypass         bool // the filter is skipped: its VM failed (FAIL_OPEN)
	local          bool // the response is a local reply
	localCount     int
	localRequested bool // proxy_send_local_response during the current callback
	ended          bool // reset or closed
	closed         bool
	logPhase       bool
	upstream       string
	props          map[string][]byte
	started        time.Time
}

type direction uint8

const (
	dirRequest direction = iota
	dirResponse
)

// half is one direction of a stream as Envoy's filter manager sees it for this filter.
type half struct {
	dir            direction
	headers        Headers
	trailers       Headers
	body           []byte // the buffered body, or the current chunk during a body callback
	started        bool   // headers received
	endedAtHeaders bool
	ended          bool // end of stream received
	gotTrailers    bool
	headersPassed  bool
	done           bool // end of stream passed on
	stopped        bool // the filter stopped iteration: headers held and/or body buffered
	stopAll        bool // StopAllIteration: body and trailers are held without callbacks
	buffering      bool // the last body callback paused: Envoy buffers the next chunk before the filter sees it
	// What the filter can touch now (Envoy nulls the maps it has released).
	headersOpen, bodyOpen, trailersOpen bool
}

type eventKind uint8

const (
	evHeaders eventKind = iota
	evData
	evTrailers
	evContinue
	evLocalReply
	evFailOpen
	evReset
	evClose
)

type streamEvent struct {
	kind    eventKind
	dir     direction
	headers Headers
	data    []byte
	eos     bool
	reply   *localReply
	reason  string
	done    chan result
}

type result struct {
	action Action
	err    error
}

type localReply struct {
	status  int
	headers Headers
	body    []byte
	details string
}

// NewStream opens an HTTP stream on this VM. The filter's context is created when the
// first event arrives, as Envoy does on decodeHeaders.
func (vm *VM) NewStream(info StreamInfo, hooks StreamHooks) *Stream {
	if info.Protocol == "" {
		info.Protocol = "HTTP/1.1"
	}
	s := &Stream{vm: vm, info: info, hooks: hooks, req: half{dir: dirRequest}, resp: half{dir: dirResponse}}
	s.started = vm.host.clock.Now()
	vm.mu.Lock()
	s.id = vm.nextID
	vm.nextID++
	vm.streams[s.id] = s
	if vm.failed != nil {
		s.bypass = true
		s.markFailOpen()
	}
	vm.mu.Unlock()
	return s
}

// ID returns the stream's context id in its VM.
func (s *Stream) ID() uint32 { return s.id }

// VM returns the VM the stream runs on.
func (s *Stream) VM() *VM { return s.vm }

// FilterTime returns the time spent inside the filter's callbacks for this stream.
func (s *Stream) FilterTime() time.Duration { return time.Duration(s.filterNanos.Load()) }

// FailedOpen reports whether the stream bypassed the filter because its VM had failed.
func (s *Stream) FailedOpen() bool { return s.failedOpen.Load() }

// SetUpstreamAddress records the upstream host chosen for the request ("ip:port"), for the
// upstream.address and upstream.port properties of the response callbacks.
func (s *Stream) SetUpstreamAddress(addr string) {
	s.vm.mu.Lock()
	s.upstream = addr
	s.vm.mu.Unlock()
}

// SendRequestHeaders delivers the request headers (proxy_on_request_headers).
func (s *Stream) SendRequestHeaders(h Headers, endOfStream bool) (Action, error) {
	return s.send(streamEvent{kind: evHeaders, dir: dirRequest, headers: h.lower(), eos: endOfStream})
}

// SendRequestBody delivers a chunk of request body (proxy_on_request_body). While the filter
// pauses, chunks accumulate and the callback sees the whole buffer.
func (s *Stream) SendRequestBody(b []byte, endOfStream bool) (Action, error) {
	return s.send(streamEvent{kind: evData, dir: dirRequest, data: b, eos: endOfStream})
}

// SendRequestTrailers delivers the request trailers, ending the request.
func (s *Stream) SendRequestTrailers(t Headers) (Action, error) {
	return s.send(streamEvent{kind: evTrailers, dir: dirRequest, headers: t.lower()})
}

// SendResponseHeaders delivers the upstream response headers (with ":status").
func (s *Stream) SendResponseHeaders(h Headers, endOfStream bool) (Action, error) {
	return s.send(streamEvent{kind: evHeaders, dir: dirResponse, headers: h.lower(), eos: endOfStream})
}

// SendResponseBody delivers a chunk of response body.
func (s *Stream) SendResponseBody(b []byte, endOfStream bool) (Action, error) {
	return s.send(streamEvent{kind: evData, dir: dirResponse, data: b, eos: endOfStream})
}

// SendResponseTrailers delivers the response trailers, ending the response.
func (s *Stream) SendResponseTrailers(t Headers) (Action, error) {
	return s.send(streamEvent{kind: evTrailers, dir: dirResponse, headers: t.lower()})
}

// Reset resets the stream from outside (the upstream broke mid-response, the client went
// away): the Reset hook fires and later events return ErrStreamEnded.
func (s *Stream) Reset(reason string) {
	_, _ = s.send(streamEvent{kind: evReset, reason: reason})
}

// Close ends the stream: proxy_on_log (with the final headers readable), proxy_on_done and
// proxy_on_delete. Later events return ErrStreamEnded.
func (s *Stream) Close() {
	_, _ = s.send(streamEvent{kind: evClose})
}

func (s *Stream) send(ev streamEvent) (Action, error) {
	ev.done = make(chan result, 1)
	s.post(ev)
	r := <-ev.done
	return r.action, r.err
}

// post queues an event; if nobody is handling this stream's events, the caller handles
// them all now, so a caller that posts from a single goroutine sees the result at once.
func (s *Stream) post(ev streamEvent) {
	s.mbox.Lock()
	s.queue = append(s.queue, ev)
	if s.draining {
		s.mbox.Unlock()
		return
	}
	s.draining = true
	s.mbox.Unlock()
	for {
		s.mbox.Lock()
		if len(s.queue) == 0 {
			s.draining = false
			s.queue = nil
			s.mbox.Unlock()
			return
		}
		next := s.queue[0]
		s.queue[0] = streamEvent{}
		s.queue = s.queue[1:]
		s.mbox.Unlock()
		s.handle(next)
	}
}

// handle applies one event, then the work the filter deferred for this stream during it
// (a continue, a local reply), then reports the result.
func (s *Stream) handle(ev streamEvent) {
	res, own := s.step(ev)
	for len(own) > 0 {
		next := own[0]
		own = own[1:]
		_, more := s.step(next)
		own = append(own, more...)
	}
	if ev.done != nil {
		ev.done <- res
	}
}

func (s *Stream) step(ev streamEvent) (result, []streamEvent) {
	var out emissions
	vm := s.vm
	vm.mu.Lock()
	res := s.apply(ev, &out)
	acts := vm.takeAfter()
	vm.mu.Unlock()
	out.run(&s.hooks)
	return res, runAfter(acts, s)
}

// apply runs under vm.mu.
func (s *Stream) apply(ev streamEvent, out *emissions) result {
	if s.closed {
		return result{err: ErrStreamEnded}
	}
	switch ev.kind {
	case evHeaders, evData, evTrailers:
		hf := s.half(ev.dir)
		if err := s.accepts(hf, ev); err != nil {
			return result{err: err}
		}
		switch ev.kind {
		case evHeaders:
			return result{action: s.onHeaders(hf, ev.headers, ev.eos, out)}
		case evData:
			return result{action: s.onData(hf, ev.data, ev.eos, out)}
		default:
			return result{action: s.onTrailers(hf, ev.headers, out)}
		}
	case evContinue:
		if !s.ended {
			s.resume(s.half(ev.dir), out)
		}
	case evLocalReply:
		s.sendLocalReply(ev.reply, out)
	case evFailOpen:
		s.failOpen(out)
	case evReset:
		s.reset(ev.reason, out)
	case evClose:
		s.close()
	}
	return result{}
}

func (s *Stream) half(d direction) *half {
	if d == dirRequest {
		return &s.req
	}
	return &s.resp
}

// accepts checks that an event from the caller fits the stream's state.
func (s *Stream) accepts(hf *half, ev streamEvent) error {
	switch {
	case s.ended, s.local:
		return ErrStreamEnded
	case ev.kind == evHeaders && hf.started:
		return errors.New("host: headers sent twice")
	case ev.kind != evHeaders && !hf.started:
		return errors.New("host: body or trailers before headers")
	case ev.kind != evHeaders && hf.ended:
		return ErrStreamEnded
	}
	return nil
}

func (s *Stream) fns(d direction) (headers, body, trailers api.Function) {
	f := &s.vm.fn
	if d == dirRequest {
		return f.requestHeaders, f.requestBody, f.requestTrailers
	}
	return f.responseHeaders, f.responseBody, f.responseTrailers
}

// call runs a stream callback. ran is false when the filter was skipped (failed VM), which
// counts as Continue, as with Envoy's FAIL_OPEN.
func (s *Stream) call(fn api.Function, args ...uint64) (act Action, ran bool) {
	vm := s.vm
	if !s.filterActive() {
		return ActionContinue, false
	}
	if !s.created {
		s.created = true
		_, err := vm.invoke(vm.fn.contextCreate, s.id, uint64(s.id), uint64(vm.rootID))
		s.filterNanos.Add(int64(vm.lastCall))
		if err != nil {
			s.goBypass()
			return ActionContinue, false
		}
	}
	r, err := vm.invoke(fn, s.id, args...)
	s.filterNanos.Add(int64(vm.lastCall))
	if err != nil {
		s.goBypass()
		return ActionContinue, false
	}
	return Action(uint32(r)), true
}

func (s *Stream) filterActive() bool {
	if s.bypass {
		return false
	}
	if s.vm.failed != nil {
		s.goBypass()
		return false
	}
	return true
}

func (s *Stream) goBypass() {
	if !s.bypass {
		s.bypass = true
		s.markFailOpen()
	}
}

func (s *Stream) markFailOpen() {
	if !s.failedOpen.Swap(true) {
		s.vm.host.stats.failOpenStreams.Add(1)
	}
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func (s *Stream) onHeaders(hf *half, h Headers, eos bool, out *emissions) Action {
	hf.started = true
	hf.headers = h
	hf.ended = eos
	hf.endedAtHeaders = eos
	hf.headersOpen = true
	fn, _, _ := s.fns(hf.dir)
	s.localRequested = false
	act, ran := s.call(fn, uint64(s.id), uint64(len(h)), boolArg(eos))
	if s.localRequested {
		return ActionPause // cpp-host stops iteration after a local response
	}
	if !ran || act == ActionContinue {
		hf.headersOpen = false // Envoy releases the header map once headers continue
		s.flush(hf, out)
		return ActionContinue
	}
	hf.stopped = true
	// 3 and 4 are StopAllIterationAndBuffer/Watermark; without the Envoy >= 1.35 knob a
	// plain StopIteration is converted to StopAll as well.
	if act >= 3 || s.vm.host.cfg.DisallowHeadersStopIteration {
		hf.stopAll = true
	}
	return act
}

func (s *Stream) onData(hf *half, b []byte, eos bool, out *emissions) Action {
	hf.ended = eos
	if hf.stopped || hf.stopAll {
		hf.body = append(hf.body, b...)
	} else {
		hf.body = append([]byte(nil), b...)
	}
	if !s.filterActive() {
		s.flush(hf, out)
		return ActionContinue
	}
	if hf.stopAll || (hf.buffering && s.overLimit(hf)) {
		// A filter whose last body callback buffered gets the next chunk only after Envoy
		// has added it to the buffer (Context::decodeData and encodeData in
		// source/extensions/common/wasm/context.cc call addDecodedData/addEncodedData
		// first when buffering_request_body_ is set); past the limit Envoy answers right
		// there (FilterManager requestDataTooLarge/responseDataTooLarge in
		// source/common/http/filter_manager.cc), and the filter never sees the chunk.
		if s.overLimit(hf) {
			s.overflow(hf, out)
		}
		return ActionPause
	}
	_, fn, _ := s.fns(hf.dir)
	hf.bodyOpen = true
	s.localRequested = false
	act, ran := s.call(fn, uint64(s.id), uint64(len(hf.body)), boolArg(eos))
	if s.localRequested {
		return ActionPause
	}
	if !ran || act == ActionContinue {
		hf.bodyOpen = false
		s.flush(hf, out)
		return ActionContinue
	}
	hf.stopped = true
	hf.buffering = true
	if s.overLimit(hf) {
		s.overflow(hf, out)
	}
	return ActionPause
}

func (s *Stream) onTrailers(hf *half, t Headers, out *emissions) Action {
	hf.ended = true
	hf.gotTrailers = true
	hf.trailers = t
	if !s.filterActive() {
		s.flush(hf, out)
		return ActionContinue
	}
	if hf.stopAll {
		return ActionPause
	}
	_, _, fn := s.fns(hf.dir)
	hf.trailersOpen = true
	s.localRequested = false
	act, ran := s.call(fn, uint64(s.id), uint64(len(t)))
	if s.localRequested {
		return ActionPause
	}
	if !ran || act == ActionContinue {
		hf.trailersOpen = false
		s.flush(hf, out)
		return ActionContinue
	}
	hf.stopped = true
	return act
}

// flush passes on everything the filter held in this direction.
func (s *Stream) flush(hf *half, out *emissions) {
	hf.stopped, hf.stopAll, hf.buffering = false, false, false
	if hf.done {
		return
	}
	if !hf.headersPassed {
		hf.headersPassed = true
		out.add(emission{kind: evHeaders, dir: hf.dir, headers: hf.headers.Clone(), eos: hf.endedAtHeaders})
		if hf.endedAtHeaders {
			hf.done = true
			return
		}
	}
	if len(hf.body) > 0 || (hf.ended && !hf.gotTrailers) {
		eos := hf.ended && !hf.gotTrailers
		out.add(emission{kind: evData, dir: hf.dir, data: hf.body, eos: eos})
		hf.body = nil
		if eos {
			hf.done = true
			return
		}
	}
	if hf.gotTrailers {
		out.add(emission{kind: evTrailers, dir: hf.dir, headers: hf.trailers.Clone()})
		hf.done = true
	}
}

// resume is proxy_continue_stream, run after the callback that asked for it.
func (s *Stream) resume(hf *half, out *emissions) {
	if hf.started && (hf.stopped || hf.stopAll) {
		s.flush(hf, out)
	}
	hf.headersOpen, hf.bodyOpen, hf.trailersOpen = false, false, false
}

func (s *Stream) overLimit(hf *half) bool {
	return s.info.BufferLimit > 0 && len(hf.body) > s.info.BufferLimit
}

// overflow is Envoy's answer to a filter buffering more than the limit.
func (s *Stream) overflow(hf *half, out *emissions) {
	if hf.dir == dirRequest {
		s.sendLocalReply(&localReply{status: 413, body: []byte("Payload Too Large"), details: "request_payload_too_large"}, out)
		return
	}
	if !hf.headersPassed {
		s.sendLocalReply(&localReply{status: 500, body: []byte("Internal Server Error"), details: "response_payload_too_large"}, out)
		return
	}
	s.reset("response_payload_too_large", out)
}

// sendLocalReply ends the request with a reply built here. As in Envoy the reply goes
// through the filter's response callbacks; a second local reply, or one after the response
// headers went out, resets the stream instead.
func (s *Stream) sendLocalReply(r *localReply, out *emissions) {
	if s.ended || s.logPhase {
		return
	}
	s.localCount++
	if s.resp.headersPassed || s.localCount > 2 {
		s.reset("local reply after the response started", out)
		return
	}
	s.local = true
	s.req.done, s.req.stopped, s.req.stopAll = true, false, false
	s.req.ended = true
	s.req.headersOpen, s.req.bodyOpen, s.req.trailersOpen = false, false, false
	out.add(emission{kind: evLocalReply, status: r.status})
	h := Headers{{":status", strconv.Itoa(r.status)}}
	if len(r.body) > 0 {
		h = append(h, [2]string{"content-length", strconv.Itoa(len(r.body))}, [2]string{"content-type", "text/plain"})
	}
	h = append(h, r.headers.lower()...)
	s.resp = half{dir: dirResponse}
	s.onHeaders(&s.resp, h, len(r.body) == 0, out)
	if len(r.body) > 0 && !s.ended && !s.localRequested {
		s.onData(&s.resp, r.body, true, out)
	}
}

// failOpen lets a stream held by a failed VM go on without the filter.
func (s *Stream) failOpen(out *emissions) {
	s.goBypass()
	if s.ended {
		return
	}
	for _, hf := range []*half{&s.req, &s.resp} {
		if hf.started && (hf.stopped || hf.stopAll) {
			s.flush(hf, out)
		}
	}
}

func (s *Stream) reset(reason string, out *emissions) {
	if s.ended {
		return
	}
	s.ended = true
	out.add(emission{kind: evReset, reason: reason})
}

func (s *Stream) close() {
	vm := s.vm
	if s.created && !s.bypass && vm.failed == nil {
		s.logPhase = true
		s.call(vm.fn.log, uint64(s.id))
		s.call(vm.fn.done, uint64(s.id))
		s.call(vm.fn.delete, uint64(s.id))
		s.logPhase = false
	}
	s.closed, s.ended = true, true
	delete(vm.streams, s.id)
}

// emission is one thing that passed the filter, handed to the hooks after the VM is free.
type emission struct {
	kind    eventKind
	dir     direction
	headers Headers
	data    []byte
	eos     bool
	status  int
	reason  string
}

type emissions []emission

func (o *emissions) add(e emission) { *o = append(*o, e) }

func (o emissions) run(h *StreamHooks) {
	for _, e := range o {
		req := e.dir == dirRequest
		switch e.kind {
		case evHeaders:
			f := h.ResponseHeaders
			if req {
				f = h.RequestHeaders
			}
			if f != nil {
				f(e.headers, e.eos)
			}
		case evData:
			f := h.ResponseData
			if req {
				f = h.RequestData
			}
			if f != nil {
				f(e.data, e.eos)
			}
		case evTrailers:
			f := h.ResponseTrailers
			if req {
				f = h.RequestTrailers
			}
			if f != nil {
				f(e.headers)
			}
		case evLocalReply:
			if h.LocalReply != nil {
				h.LocalReply(e.status)
			}
		case evReset:
			if h.Reset != nil {
				h.Reset(e.reason)
			}
		}
	}
}
