package host

import "github.com/tetratelabs/wazero/api"

// One direction of a stream through the filter: its callbacks, what each returned action
// holds or releases, and the buffering and its limit, as Envoy's filter manager and
// proxy-wasm context do them.

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

func (s *Stream) half(d direction) *half {
	if d == dirRequest {
		return &s.req
	}
	return &s.resp
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
