package proxy

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Server is a Proxy listening on a local address.
type Server struct {
	*Proxy
	// URL is the base URL clients use, e.g. "http://127.0.0.1:41234".
	URL string
	srv *http.Server
	ln  net.Listener
}

// Listen starts a proxy for cfg on addr ("" picks a free port on 127.0.0.1).
func Listen(addr string, cfg Config) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s, err := Serve(ln, cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return s, nil
}

// Serve starts a proxy for cfg on a listener the caller opened (so a caller can hold its
// port before starting anything else). The server owns ln from then on.
func Serve(ln net.Listener, cfg Config) (*Server, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{Proxy: p, URL: "http://" + ln.Addr().String(), ln: ln}
	s.srv = &http.Server{
		Handler:        p,
		MaxHeaderBytes: DefaultMaxHeaderBytes,
		// "OPTIONS *" goes to the route table (Envoy has no built-in answer for it).
		DisableGeneralOptionsHandler: true,
		// The request-headers and idle timeouts are the proxy's own (connTimers, below): Go's
		// ReadHeaderTimeout closes without a status where Envoy answers 408.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*trackedConn); ok {
				return context.WithValue(ctx, connKey{}, tc.st)
			}
			return ctx
		},
		ConnState: p.connState,
	}
	go func() { _ = s.srv.Serve(&trackedListener{Listener: ln, p: p}) }()
	return s, nil
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server at once and drops idle upstream connections.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.Proxy.Close()
	return err
}

// Shutdown stops the server once in-flight requests are done.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.Proxy.Close()
	return err
}

// connKey finds a connection's state from a request's context.
type connKey struct{}

// Connection phases, as Envoy's connection manager times them.
const (
	phaseWaiting = iota // no request in flight: the idle timeout runs
	phaseHeaders        // a request's first byte came: the request-headers timeout runs
	phaseServing        // the headers are complete: the stream's own timeouts run
	phaseClosed
)

// connTimers is one downstream connection's idle and request-headers timers.
type connTimers struct {
	p     *Proxy
	conn  net.Conn
	mu    sync.Mutex
	phase int
	timer *time.Timer
}

type trackedListener struct {
	net.Listener
	p *Proxy
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	st := &connTimers{p: l.p, conn: c}
	st.waitIdle()
	return &trackedConn{Conn: c, st: st}, nil
}

type trackedConn struct {
	net.Conn
	st *connTimers
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.st.sawBytes()
	}
	return n, err
}

// waitIdle starts the idle timeout: no request is in flight.
func (st *connTimers) waitIdle() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase == phaseClosed {
		return
	}
	st.phase = phaseWaiting
	st.arm(st.p.timeouts.idle, func() {
		if st.expire(phaseWaiting) {
			st.p.stats.idleClosed.Add(1)
			st.conn.Close() // Envoy closes an idle HTTP/1 connection without a response
		}
	})
}

// sawBytes: a request has started; its headers must be complete within the
// request-headers timeout (Envoy arms it at the first byte of the headers).
func (st *connTimers) sawBytes() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase != phaseWaiting {
		return
	}
	st.phase = phaseHeaders
	st.arm(st.p.timeouts.headers, func() {
		if st.expire(phaseHeaders) {
			st.p.stats.headerTimeouts.Add(1)
			// ConnectionManagerImpl::ActiveStream::onRequestHeaderTimeout: a local 408
			// "request header timeout"; the HTTP/1 connection cannot be reused.
			writeRaw(st.conn, http.StatusRequestTimeout, "request header timeout")
			st.conn.Close()
		}
	})
}

// serving: the headers are complete; false if the connection already timed out.
func (st *connTimers) serving() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase == phaseClosed {
		return false
	}
	st.phase = phaseServing
	st.arm(0, nil)
	return true
}

func (st *connTimers) closed() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.phase = phaseClosed
	st.arm(0, nil)
}

// arm replaces the running timer (d <= 0: none). Callers hold mu.
func (st *connTimers) arm(d time.Duration, f func()) {
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	if d > 0 && f != nil {
		st.timer = time.AfterFunc(d, f)
	}
}

// expire moves a connection still in phase to closed; false if it moved on meanwhile.
func (st *connTimers) expire(phase int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase != phase {
		return false
	}
	st.phase = phaseClosed
	st.timer = nil
	return true
}

func (p *Proxy) connState(c net.Conn, state http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	switch state {
	case http.StateNew:
		p.stats.openConns.Add(1)
	case http.StateIdle:
		tc.st.waitIdle()
	case http.StateHijacked, http.StateClosed:
		p.stats.openConns.Add(-1)
		tc.st.closed()
	}
}

// writeRaw writes a whole local response on a connection no handler owns.
func writeRaw(c net.Conn, status int, body string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write([]byte("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) +
		"\r\ncontent-length: " + strconv.Itoa(len(body)) + "\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n" + body))
}
