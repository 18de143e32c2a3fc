package host

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
	// Released follows each batch of the above that one step of the stream let through
	// (a callback's return, a resumption): headers and the body released with them come
	// in one batch, as Envoy's filter manager hands them to the router in one call stack.
	Released func()
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
	if len(o) > 0 && h.Released != nil {
		h.Released()
	}
}
