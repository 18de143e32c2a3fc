package front

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Route is a request the lean loop serves: its method and exact path.
type Route struct{ Method, Path string }

// HandOff is why a connection went to Fallback.
type HandOff uint8

const (
	Elsewhere HandOff = iota
	OddHead
	LongHead
	Full
)

func (h HandOff) String() string {
	return [...]string{"elsewhere", "odd_head", "long_head", "full"}[h]
}

// Defaults.
const (
	DefaultMaxConns         = 16384
	DefaultMaxFallbackConns = 4096
	DefaultBufferSize       = 8 << 10
)

// Front serves a listener: Routes in the lean loop, through Handler, every other
// connection by Fallback. Set the fields, then call Serve once; Shutdown ends both.
type Front struct {
	Handler  http.Handler
	Fallback *http.Server // its Handler serves what the lean loop hands over
	Routes   []Route
	// Headers are the request headers, canonical names, a lean request's handler sees;
	// it sees no other.
	Headers []string
	// MaxConns bounds the lean loop's connections (DefaultMaxConns); more go to Fallback.
	MaxConns int
	// MaxFallbackConns bounds the connections Fallback holds (DefaultMaxFallbackConns).
	// A connection neither may take is answered 503 at once and closed, unread, and
	// reported to Refused: a flood of connections costs nothing held.
	MaxFallbackConns int
	// Refused, when set, is told each connection refused past both bounds.
	Refused func()
	// BufferSize is each lean connection's buffer, the longest head it reads
	// (DefaultBufferSize); a longer one is handed to Fallback.
	BufferSize int
	// IdleTimeout ends a connection without a request (default Fallback's, else 2 min);
	// ReadHeaderTimeout bounds reading a head once it starts (default Fallback's, else
	// 10 s); BodyTimeout bounds reading a body, WriteTimeout writing an answer (30 s).
	IdleTimeout, ReadHeaderTimeout, BodyTimeout, WriteTimeout time.Duration
	// BaseContext is every lean request's context's parent; Shutdown cancels their
	// contexts, so long polls answer at once.
	BaseContext context.Context
	// HandedOff, when set, is told each connection given to Fallback and why: Elsewhere
	// (a request for another endpoint: the usual), OddHead (a route's request the lean
	// loop does not read: a header, a body encoding, a version), LongHead (a head above
	// BufferSize) or Full (MaxConns). Polls that land in net/http cost it more.
	HandedOff func(why HandOff)

	ctx          context.Context
	cancel       context.CancelFunc
	handoff      *handoff
	closing      atomic.Bool
	served       chan error // Fallback.Serve's result, read once into fallbackErr
	fallbackOnce sync.Once
	fallbackErr  error
	wg           sync.WaitGroup
	mu           sync.Mutex
	ln           net.Listener
	conns        map[*conn]struct{}
	fallbackN    atomic.Int64 // connections Fallback holds (handedConn)
}

func (f *Front) bufferSize() int {
	if f.BufferSize > 0 {
		return f.BufferSize
	}
	return DefaultBufferSize
}

func (f *Front) init(ln net.Listener) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln != nil {
		return errors.New("front: Serve called twice")
	}
	if f.closing.Load() {
		return http.ErrServerClosed
	}
	if f.Handler == nil || f.Fallback == nil {
		return errors.New("front: Handler and Fallback must be set")
	}
	f.ln = ln
	if f.MaxConns <= 0 {
		f.MaxConns = DefaultMaxConns
	}
	if f.MaxFallbackConns <= 0 {
		f.MaxFallbackConns = DefaultMaxFallbackConns
	}
	f.IdleTimeout = orDefault(f.IdleTimeout, f.Fallback.IdleTimeout, 2*time.Minute)
	f.ReadHeaderTimeout = orDefault(f.ReadHeaderTimeout, f.Fallback.ReadHeaderTimeout, 10*time.Second)
	f.BodyTimeout = orDefault(f.BodyTimeout, 0, 30*time.Second)
	f.WriteTimeout = orDefault(f.WriteTimeout, 0, 30*time.Second)
	base := f.BaseContext
	if base == nil {
		base = context.Background()
	}
	f.ctx, f.cancel = context.WithCancel(base)
	f.handoff = &handoff{addr: ln.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
	f.conns = make(map[*conn]struct{})
	f.served = make(chan error, 1)
	return nil
}

func orDefault(d ...time.Duration) time.Duration {
	for _, v := range d {
		if v > 0 {
			return v
		}
	}
	return 0
}

// Serve accepts connections until Shutdown (then it returns http.ErrServerClosed) or a
// listener error.
func (f *Front) Serve(ln net.Listener) error {
	if err := f.init(ln); err != nil {
		return err
	}
	go func() { f.served <- f.Fallback.Serve(f.handoff) }()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if f.closing.Load() {
				return http.ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors and the like: wait and retry, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			f.logf("front: accept: %v; retrying in %v", err, delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if c := f.admit(nc); c != nil {
			go c.serve()
		} else {
			f.toFallback(nc, nil, Full)
		}
	}
}

// admit registers a lean connection, or returns nil at MaxConns or after Shutdown.
func (f *Front) admit(nc net.Conn) *conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.conns) >= f.MaxConns || f.closing.Load() {
		return nil
	}
	c := newConn(f, nc, f.ctx)
	f.conns[c] = struct{}{}
	f.wg.Add(1)
	return c
}

func (f *Front) drop(c *conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.conns[c]; ok {
		delete(f.conns, c)
		f.wg.Done()
	}
}

// Shutdown stops accepting, cancels the lean requests' contexts (a long poll answers
// at once), closes idle lean connections, lets the others finish their answer, and
// shuts Fallback down. At ctx's end it closes what is left and returns ctx's error.
func (f *Front) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	started := f.ln != nil
	f.closing.Store(true)
	f.mu.Unlock()
	if !started {
		return f.Fallback.Shutdown(ctx)
	}
	f.ln.Close()
	f.cancel()
	f.closeConns(false)
	err := f.Fallback.Shutdown(ctx)
	f.handoff.Close() // a lean connection handed over from now on is closed
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		f.closeConns(true)
		<-done
		if err == nil {
			err = ctx.Err()
		}
	}
	f.fallbackOnce.Do(func() { f.fallbackErr = <-f.served })
	if serr := f.fallbackErr; err == nil && serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = serr
	}
	return err
}

// closeConns closes the idle lean connections, or all of them.
func (f *Front) closeConns(all bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		if c.idle.CompareAndSwap(true, false) || all {
			c.nc.Close()
		}
	}
}

// toFallback gives nc, with the bytes already read from it, to Fallback, or refuses it
// when Fallback holds MaxFallbackConns.
func (f *Front) toFallback(nc net.Conn, pending []byte, why HandOff) {
	if f.fallbackN.Add(1) > int64(f.MaxFallbackConns) {
		f.fallbackN.Add(-1)
		f.refuse(nc)
		return
	}
	f.handedOff(why)
	f.handoff.give(&handedConn{Conn: nc, pending: pending, f: f})
}

// refusal is the answer to a connection past both bounds, in the API's error format.
var refusal = func() []byte {
	body := `{"error":"too many connections: retry later","status":503}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n" +
		"Retry-After: 1\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// refuseWrite bounds writing the refusal: a new connection's send buffer takes it at
// once, so the accept loop never waits on it.
const refuseWrite = 100 * time.Millisecond

// refuse answers nc 503 and closes it without reading it. (A request already received
// makes the close a reset, which a client may see instead of the answer.)
func (f *Front) refuse(nc net.Conn) {
	if f.Refused != nil {
		f.Refused() // first: whoever reads the answer finds it counted
	}
	nc.SetWriteDeadline(time.Now().Add(refuseWrite))
	nc.Write(refusal)
	nc.Close()
}

func (f *Front) handedOff(why HandOff) {
	if f.HandedOff != nil {
		f.HandedOff(why)
	}
}

func (f *Front) logf(format string, args ...any) {
	if l := f.Fallback.ErrorLog; l != nil {
		l.Printf(format, args...)
		return
	}
	log.Printf(format, args...) // as net/http without an ErrorLog
}

// handoff is the listener Fallback serves: the connections the lean loop gives it.
type handoff struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoff) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

// give hands c to Fallback, or closes it once Fallback has stopped accepting.
func (h *handoff) give(c net.Conn) {
	select {
	case h.conns <- c:
	case <-h.done:
		c.Close()
	}
}
