package host

import "strconv"

// How a stream ends early or at its close: a local reply, fail-open after a VM trap, a
// reset, and proxy_on_log, proxy_on_done, proxy_on_delete.

type localReply struct {
	status  int
	headers Headers
	body    []byte
	details string
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
