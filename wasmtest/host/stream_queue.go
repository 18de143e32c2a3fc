package host

import "errors"

// Events reach a stream from the caller's Send methods, from a continue or local reply the
// filter asked for, and from a failing VM; they are applied one at a time, in order.

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
