package host

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	// PeerURISAN is the first URI SAN of the downstream's TLS certificate
	// (connection.uri_san_peer_certificate; "" for a plaintext downstream, which Envoy
	// answers NotFound).
	PeerURISAN string
	// BufferLimit caps what the filter may hold while it pauses (Envoy's
	// per_connection_buffer_limit_bytes, 1 MiB by default there); 0 means no limit. Above
	// it the request gets a local 413, a response whose headers are not sent yet a 500.
	BufferLimit int
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
