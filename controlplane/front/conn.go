package front

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sync/atomic"
	"time"
)

// maxDrain is how much of a body the handler left unread is read past to keep the
// connection (net/http's figure); a larger rest closes it.
const maxDrain = 256 << 10

// conn is one connection in the lean loop. Its request, URL, header maps and buffers are
// reused from one request to the next: a handler must not keep them (net/http's rule).
type conn struct {
	f          *Front
	nc         net.Conn
	buf        []byte // received bytes; buf[off:] not yet consumed
	off        int
	head       head
	req        http.Request // reset from base for each request
	base       *http.Request
	url        url.URL
	header     http.Header
	values     [][1]string // each kept header's value, reused when it repeats
	host       string
	remote     string
	body       body
	w          response
	closeAfter bool
	handed     bool    // given to net/http: not this loop's to close
	why        HandOff // with handOff from readHead: the reason
	served     bool    // a request has been answered
	// idle is set while the loop waits for a request's first byte; Shutdown closes idle
	// connections, and whichever of the two clears it first decides.
	idle atomic.Bool
}

func newConn(f *Front, nc net.Conn, ctx context.Context) *conn {
	c := &conn{f: f, nc: nc, buf: make([]byte, 0, f.bufferSize()), remote: nc.RemoteAddr().String()}
	c.base = (&http.Request{}).WithContext(ctx)
	c.head.kept = make([][]byte, len(f.Headers))
	c.header = make(http.Header, len(f.Headers))
	c.values = make([][1]string, len(f.Headers))
	c.body.c = c
	c.w = response{c: c, header: make(http.Header)}
	return c
}

// serve runs the loop until the connection ends or is handed to net/http.
func (c *conn) serve() {
	defer func() {
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			c.f.logf("front: panic serving %s: %v\n%s", c.remote, p, buf)
		}
		c.f.drop(c)
		if !c.handed {
			c.nc.Close()
		}
	}()
	for {
		switch c.readHead() {
		case needMore: // the connection ended, or Shutdown closed it
			return
		case handOff:
			c.f.drop(c) // before the report: whoever hears it sees the connection gone
			c.handed = true
			// net/http sets its read deadlines, but a write deadline only with a
			// WriteTimeout: the lean answers' one must not stay.
			c.nc.SetDeadline(time.Time{})
			c.f.toFallback(c.nc, c.buf[c.off:], c.why)
			return
		}
		if !c.serveOne() || c.f.closing.Load() {
			return
		}
	}
}

// readHead reads until a whole head is buffered (lean), the bytes are not the lean shape
// or do not fit the buffer (handOff), or the connection ends (needMore).
func (c *conn) readHead() verdict {
	if c.off == len(c.buf) {
		c.buf, c.off = c.buf[:0], 0
	} else if c.off > 0 {
		c.buf = c.buf[:copy(c.buf, c.buf[c.off:])] // a pipelined request's start
		c.off = 0
	}
	c.idle.Store(true)
	if c.f.closing.Load() {
		return needMore
	}
	if len(c.buf) == 0 {
		// A new connection has ReadHeaderTimeout to send its first request, as with
		// net/http; between requests it may idle for IdleTimeout.
		wait := c.f.IdleTimeout
		if !c.served {
			wait = c.f.ReadHeaderTimeout
		}
		c.nc.SetReadDeadline(time.Now().Add(wait))
		if !c.fill() {
			return needMore
		}
	}
	// Shutdown may have closed this idle connection as its bytes came: it cleared idle
	// first, and the request is left unserved, as net/http leaves it.
	if !c.idle.CompareAndSwap(true, false) {
		return needMore
	}
	for deadline := false; ; {
		if v := parseHead(c.buf, c.f.Routes, c.f.Headers, &c.head); v != needMore {
			c.why = OddHead
			if c.head.elsewhere {
				c.why = Elsewhere
			}
			return v
		}
		if len(c.buf) == cap(c.buf) {
			c.why = LongHead
			return handOff // a head longer than the buffer: net/http has a larger limit
		}
		if !deadline {
			c.nc.SetReadDeadline(time.Now().Add(c.f.ReadHeaderTimeout))
			deadline = true
		}
		if !c.fill() {
			return needMore
		}
	}
}

// fill reads more bytes into the buffer: false when the connection ended.
func (c *conn) fill() bool {
	for {
		n, err := c.nc.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+n]
		if n > 0 {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// serveOne answers the head read: false when the connection must close.
func (c *conn) serveOne() bool {
	h := &c.head
	c.off += h.size
	c.closeAfter = h.close
	route := c.f.Routes[h.route]

	c.req = *c.base // keeps base's context
	r := &c.req
	r.Method, r.Proto, r.ProtoMajor, r.ProtoMinor = route.Method, "HTTP/1.1", 1, 1
	r.RequestURI = string(h.target)
	c.url = url.URL{Path: route.Path, RawQuery: r.RequestURI[len(r.RequestURI)-len(h.query):]}
	r.URL = &c.url
	r.Header = c.header
	clear(c.header)
	for i, v := range h.kept {
		if v == nil {
			continue
		}
		if string(v) != c.values[i][0] {
			c.values[i][0] = string(v)
		}
		r.Header[c.f.Headers[i]] = c.values[i][:]
	}
	if string(h.host) != c.host {
		c.host = string(h.host)
	}
	r.Host = c.host
	r.RemoteAddr = c.remote
	r.Close = h.close
	r.ContentLength = h.contentLength
	r.Body = http.NoBody
	c.body.left = h.contentLength
	if h.contentLength > 0 {
		r.Body = &c.body
		c.nc.SetReadDeadline(time.Now().Add(c.f.BodyTimeout))
	}

	c.w.reset()
	c.f.Handler.ServeHTTP(&c.w, r)
	if c.body.left > 0 {
		if c.body.left > maxDrain {
			c.closeAfter = true
		} else if _, err := io.Copy(io.Discard, &c.body); err != nil {
			c.closeAfter = true
		}
	}
	c.w.finish()
	c.served = true
	if cap(c.w.out) > 4*smallAnswer {
		c.w.out = nil // one large answer does not pin its buffer to the connection
	}
	if cap(c.w.body) > 4*smallAnswer {
		c.w.body = nil
	}
	return !c.w.broken && !c.closeAfter
}

// write sends a, then b if any, under the write deadline. An error breaks the
// connection: the loop closes it after the handler returns.
func (c *conn) write(a, b []byte) error {
	c.nc.SetWriteDeadline(time.Now().Add(c.f.WriteTimeout))
	_, err := c.nc.Write(a)
	if err == nil && b != nil {
		_, err = c.nc.Write(b)
	}
	if err != nil {
		c.w.broken = true
	}
	return err
}

// body is a request body: the buffered bytes past the head, then the connection, up to
// Content-Length.
type body struct {
	c    *conn
	left int64
}

func (b *body) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	c := b.c
	var n int
	var err error
	if c.off < len(c.buf) {
		n = copy(p, c.buf[c.off:])
		c.off += n
	} else {
		n, err = c.nc.Read(p)
	}
	b.left -= int64(n)
	if errors.Is(err, io.EOF) && b.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.closeAfter = true
	}
	return n, err
}

func (b *body) Close() error { return nil }

// handedConn is a connection handed to net/http: the bytes the lean loop had read come
// first, and closing it frees its place under MaxFallbackConns.
type handedConn struct {
	net.Conn
	pending []byte
	f       *Front
	closed  atomic.Bool
}

func (h *handedConn) Read(p []byte) (int, error) {
	if len(h.pending) > 0 {
		n := copy(p, h.pending)
		h.pending = h.pending[n:]
		return n, nil
	}
	return h.Conn.Read(p)
}

func (h *handedConn) Close() error {
	if h.closed.CompareAndSwap(false, true) {
		h.f.fallbackN.Add(-1)
	}
	return h.Conn.Close()
}
