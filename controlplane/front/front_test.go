package front

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echo answers with what the handler saw: method, URI, the headers it can see, body.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s host=%s auth=%q kind=%q other=%q body=%q",
		r.Method, r.URL.RequestURI(), r.Host, r.Header.Get("Authorization"), r.Header.Get("X-Kind"),
		r.Header.Get("X-Other"), body)
})

var testRoutes = []Route{{"GET", "/v1/table"}, {"POST", "/v1/reports"}}

// startFront serves h on loopback through a Front whose lean answers say "Served-By:
// lean" and whose fallback's say "net/http".
func startFront(t *testing.T, h http.Handler, tune func(*Front)) *Front {
	t.Helper()
	by := func(name string, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Served-By", name)
			h.ServeHTTP(w, r)
		})
	}
	f := &Front{
		HandedOff: func(why HandOff) {
			handOffsMu.Lock()
			handOffs = append(handOffs, why)
			handOffsMu.Unlock()
		},
		Handler:  by("lean", h),
		Fallback: &http.Server{Handler: by("net/http", h), ReadHeaderTimeout: 5 * time.Second},
		Routes:   testRoutes,
		Headers:  []string{"Authorization", "X-Kind"},
	}
	if tune != nil {
		tune(f)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- f.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, f.Shutdown(ctx))
		assert.ErrorIs(t, <-served, http.ErrServerClosed)
	})
	require.Eventually(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.ln != nil }, 5*time.Second, time.Millisecond)
	return f
}

// handOffs are the reasons every test front reported, in order (tests run one at a time).
var (
	handOffsMu sync.Mutex
	handOffs   []HandOff
)

func takeHandOffs() []HandOff {
	handOffsMu.Lock()
	defer handOffsMu.Unlock()
	h := handOffs
	handOffs = nil
	return h
}

type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, f *Front) *client {
	c, err := net.Dial("tcp", f.ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(raw string) {
	_, err := io.WriteString(c.c, raw)
	require.NoError(c.t, err)
}

// answer reads one response: its status, who served it, its body.
func (c *client) answer() (status int, by, body string, resp *http.Response) {
	return c.answerTo("GET")
}

// answerTo reads the final response to a request of method (a HEAD's has no body).
func (c *client) answerTo(method string) (status int, by, body string, resp *http.Response) {
	var err error
	for resp == nil || resp.StatusCode < 200 {
		resp, err = http.ReadResponse(c.r, &http.Request{Method: method})
		require.NoError(c.t, err)
	}
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, resp.Header.Get("Served-By"), string(b), resp
}

func get(path string, extra ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: cp\r\n" + strings.Join(extra, "") + "\r\n"
}

func TestLeanServesItsRoutesOnOneConnection(t *testing.T) {
	f := startFront(t, echo, nil)
	c := dial(t, f)
	for i := range 3 {
		c.send(get(fmt.Sprintf("/v1/table?version=%d&wait_ms=0", i), "authorization: Bearer x\r\n", "X-KIND: poll\r\n", "x-other: dropped\r\n"))
		status, by, body, resp := c.answer()
		assert.Equal(t, 200, status)
		assert.Equal(t, "lean", by)
		assert.Equal(t, fmt.Sprintf(`GET /v1/table?version=%d&wait_ms=0 host=cp auth="Bearer x" kind="poll" other="" body=""`, i), body,
			"the handler sees the listed headers under canonical names, and no other")
		assert.NotEmpty(t, resp.Header.Get("Date"))
		assert.Equal(t, int64(len(body)), resp.ContentLength, "Content-Length framed, not chunked")
		assert.Empty(t, resp.TransferEncoding)
	}
}

func TestLeanServesPipelinedRequestsInOrder(t *testing.T) {
	f := startFront(t, echo, nil)
	c := dial(t, f)
	c.send(get("/v1/table?a=1") + "POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 5\r\n\r\nhello" + get("/v1/table?a=3"))
	for _, want := range []string{"GET /v1/table?a=1", "POST /v1/reports", "GET /v1/table?a=3"} {
		_, by, body, _ := c.answer()
		assert.Equal(t, "lean", by)
		assert.True(t, strings.HasPrefix(body, want), body)
	}
}

// Every request the lean loop does not fully understand goes, with the connection, to
// net/http, which answers it as a plain net/http server does.
func TestHandsNetHTTPWhatItDoesNotServe(t *testing.T) {
	long := strings.Repeat("a", DefaultBufferSize)
	for _, tc := range []struct{ name, raw string }{
		{"another path", get("/metrics")},
		{"a path that needs cleaning", get("/v1//table")},
		{"HEAD", "HEAD /v1/table HTTP/1.1\r\nHost: cp\r\n\r\n"},
		{"HTTP/1.0", "GET /v1/table HTTP/1.0\r\n\r\n"},
		{"an absolute target", "GET http://cp/v1/table HTTP/1.1\r\nHost: cp\r\n\r\n"},
		{"chunked body", "POST /v1/reports HTTP/1.1\r\nHost: cp\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{"expect continue", "POST /v1/reports HTTP/1.1\r\nHost: cp\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"},
		{"a head longer than the buffer", get("/v1/table", "X-Long: "+long+"\r\n")},
		{"no Host", "GET /v1/table HTTP/1.1\r\n\r\n"},
		{"two Hosts", get("/v1/table", "Host: other\r\n")},
		{"an odd Host", "GET /v1/table HTTP/1.1\r\nHost: cp@x\r\n\r\n"},
		{"a bad Content-Length", "POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 1x\r\n\r\n"},
		{"two Content-Lengths", "POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"},
		{"a control byte in a value", get("/v1/table", "X-Kind: a\x01b\r\n")},
		{"a byte past ASCII in a value", get("/v1/table", "X-Kind: caf\xc3\xa9\r\n")},
		{"a space before the colon", get("/v1/table", "X-Kind : a\r\n")},
		{"a folded line", get("/v1/table", "X-Kind: a\r\n b\r\n")},
		{"bare line feeds", "GET /v1/table HTTP/1.1\nHost: cp\n\n"},
		{"a repeated kept header", get("/v1/table", "X-Kind: a\r\nX-Kind: b\r\n")},
		{"Connection: upgrade", get("/v1/table", "Connection: upgrade\r\nUpgrade: x\r\n")},
		{"a fragment", get("/v1/table#x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, _, _ := strings.Cut(tc.raw, " ")
			wantStatus, _, wantBody := plainAnswer(t, tc.raw, method)
			c := dial(t, startFront(t, echo, nil))
			c.send(tc.raw)
			status, by, body, _ := c.answerTo(method)
			assert.Equal(t, wantStatus, status, body)
			assert.Equal(t, wantBody, body)
			if status < 400 {
				assert.Equal(t, "net/http", by)
			}
		})
	}
}

// plainAnswer is a plain net/http server's answer to raw, with echo.
func plainAnswer(t *testing.T, raw, method string) (status int, by, body string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Served-By", "net/http")
		echo(w, r)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cl := &client{t: t, c: c, r: bufio.NewReader(c)}
	cl.send(raw)
	status, by, body, _ = cl.answerTo(method)
	return status, by, body
}

func TestHandsOverAConnectionAfterLeanRequests(t *testing.T) {
	f := startFront(t, echo, nil)
	c := dial(t, f)
	c.send(get("/v1/table?a=1"))
	_, by, _, _ := c.answer()
	assert.Equal(t, "lean", by)
	c.send(get("/healthz") + get("/v1/table?a=2")) // pipelined: the second's bytes go along
	_, by, body, _ := c.answer()
	assert.Equal(t, "net/http", by)
	assert.True(t, strings.HasPrefix(body, "GET /healthz"), body)
	_, by, body, _ = c.answer()
	assert.Equal(t, "net/http", by, "net/http keeps the connection")
	assert.True(t, strings.HasPrefix(body, "GET /v1/table?a=2"), body)
}

func TestBodies(t *testing.T) {
	f := startFront(t, echo, nil)
	c := dial(t, f)
	c.send("POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 11\r\n\r\nhello")
	c.send(" world")
	_, by, body, _ := c.answer()
	assert.Equal(t, "lean", by)
	assert.Contains(t, body, `body="hello world"`)

	// A handler that reads no body: the rest is read past, and the connection kept.
	ignore := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	f = startFront(t, ignore, nil)
	c = dial(t, f)
	c.send("POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 4\r\n\r\nabcd" + get("/v1/table"))
	for range 2 {
		status, by, body, _ := c.answer()
		assert.Equal(t, 200, status)
		assert.Equal(t, "lean", by)
		assert.Equal(t, "ok", body)
	}
	// More unread body than maxDrain: answered, then closed.
	c = dial(t, f)
	c.send(fmt.Sprintf("POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: %d\r\n\r\n", maxDrain+1))
	_, _, _, resp := c.answer()
	assert.True(t, resp.Close, "Connection: close on the answer")
	_, err := c.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF)

	// A body cut short by the client: the handler's read fails.
	f = startFront(t, echo, nil)
	c = dial(t, f)
	c.send("POST /v1/reports HTTP/1.1\r\nHost: cp\r\nContent-Length: 10\r\n\r\nabc")
	c.c.(*net.TCPConn).CloseWrite()
	status, _, body, _ := c.answer()
	assert.Equal(t, 400, status)
	assert.Contains(t, body, "unexpected EOF")
}

func TestAnswersAreFramed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("case") {
		case "sniff":
			io.WriteString(w, "<html>hi</html>")
		case "big":
			w.Header().Set("Content-Length", "100000")
			w.Write(bytes.Repeat([]byte("b"), 100000))
		case "short":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "abc")
		case "304":
			w.WriteHeader(http.StatusNotModified)
		}
	})
	f := startFront(t, h, nil)
	c := dial(t, f)
	c.send(get("/v1/table?case=sniff"))
	_, _, body, resp := c.answer()
	assert.Equal(t, "<html>hi</html>", body)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), "sniffed as net/http does")
	c.send(get("/v1/table?case=big"))
	_, _, body, _ = c.answer()
	assert.Len(t, body, 100000)
	c.send(get("/v1/table?case=304"))
	status, _, body, resp := c.answer()
	assert.Equal(t, 304, status)
	assert.Empty(t, body)
	assert.Empty(t, resp.Header.Get("Content-Length"))
	c.send(get("/v1/table?case=short"))
	_, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err)
	_, err = io.ReadAll(c.r)
	assert.NoError(t, err, "the connection is closed after a body shorter than declared")
}

func TestMaxConnsSendsTheRestToNetHTTP(t *testing.T) {
	f := startFront(t, echo, func(f *Front) { f.MaxConns = 1 })
	a, b := dial(t, f), dial(t, f)
	a.send(get("/v1/table"))
	_, byA, _, _ := a.answer()
	b.send(get("/v1/table"))
	_, byB, _, _ := b.answer()
	assert.Equal(t, []string{"lean", "net/http"}, []string{byA, byB})
}

// Past MaxConns (lean) and MaxFallbackConns (net/http) a connection is answered 503 at
// once, unread, and closed, and reported; a place net/http frees is taken again, and a
// lean connection handed over while net/http is full is refused the same way.
func TestConnectionsPastBothBoundsAreRefused(t *testing.T) {
	var refused atomic.Int64
	f := startFront(t, echo, func(f *Front) { f.MaxConns, f.MaxFallbackConns, f.Refused = 1, 1, func() { refused.Add(1) } })
	lean, slow := dial(t, f), dial(t, f)
	lean.send(get("/v1/table"))
	slow.send(get("/v1/table"))
	_, byLean, _, _ := lean.answer()
	_, bySlow, _, _ := slow.answer()
	assert.Equal(t, []string{"lean", "net/http"}, []string{byLean, bySlow})

	over := dial(t, f) // sends nothing: the refusal does not wait for a request
	status, _, body, resp := over.answer()
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, body, "too many connections")
	assert.True(t, resp.Close, "the refusal says the connection closes")
	_, err := over.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	assert.EqualValues(t, 1, refused.Load())

	lean.send(get("/metrics")) // the lean connection goes to net/http, which is full
	status, _, _, _ = lean.answer()
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.EqualValues(t, 2, refused.Load())

	slow.c.Close() // net/http's place is free again
	require.Eventually(t, func() bool { return f.fallbackN.Load() == 0 }, 5*time.Second, time.Millisecond)
	lean = dial(t, f)
	lean.send(get("/v1/table"))
	_, byLean, _, _ = lean.answer()
	again := dial(t, f)
	again.send(get("/v1/table"))
	status, by, _, _ := again.answer()
	assert.Equal(t, []any{"lean", 200, "net/http"}, []any{byLean, status, by})
}

func TestSlowPeersAreCut(t *testing.T) {
	f := startFront(t, echo, func(f *Front) { f.ReadHeaderTimeout = 50 * time.Millisecond; f.IdleTimeout = 200 * time.Millisecond })
	c := dial(t, f)
	c.send("GET /v1/table HTTP/1.1\r\nHo") // and nothing more
	_, err := c.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "a head not finished within ReadHeaderTimeout closes the connection")
	c = dial(t, f)
	c.send(get("/v1/table"))
	c.answer()
	_, err = c.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "an idle connection is closed after IdleTimeout")

	f = startFront(t, echo, func(f *Front) { f.ReadHeaderTimeout = 50 * time.Millisecond; f.IdleTimeout = time.Hour })
	c = dial(t, f)
	_, err = c.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "a connection that never sends a request is closed after ReadHeaderTimeout")
}

func TestShutdownAnswersLongPollsAndClosesIdleConnections(t *testing.T) {
	waiting := make(chan struct{})
	poll := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(waiting)
		<-r.Context().Done()
		w.WriteHeader(http.StatusNotModified)
	})
	f := startFront(t, poll, nil)
	idle, busy := dial(t, f), dial(t, f)
	busy.send(get("/v1/table?wait_ms=30000"))
	<-waiting
	require.Eventually(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.conns) == 2 }, 5*time.Second, time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- f.Shutdown(context.Background()) }()
	status, by, _, _ := busy.answer()
	assert.Equal(t, 304, status, "the long poll is answered at once")
	assert.Equal(t, "lean", by)
	_, err := idle.r.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	assert.NoError(t, <-done)
}

func TestHandlerPanicClosesOnlyItsConnection(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "panic" {
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, "ok")
	})
	f := startFront(t, h, nil)
	c := dial(t, f)
	c.send(get("/v1/table?panic"))
	_, err := c.r.ReadByte()
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || err != nil)
	c = dial(t, f)
	c.send(get("/v1/table"))
	_, _, body, _ := c.answer()
	assert.Equal(t, "ok", body)
}

// A connection handed to net/http after lean answers keeps none of their deadlines:
// net/http without a WriteTimeout sets no write deadline of its own. (Before, the lean
// answer's write deadline stayed, and net/http's answer after it failed.)
func TestHandedOverConnectionsKeepNoDeadline(t *testing.T) {
	f := startFront(t, echo, func(f *Front) { f.WriteTimeout = 30 * time.Millisecond })
	c := dial(t, f)
	c.send(get("/v1/table"))
	_, by, _, _ := c.answer()
	assert.Equal(t, "lean", by)
	time.Sleep(100 * time.Millisecond) // past the lean answer's write deadline: what this test is about
	c.send(get("/metrics"))
	status, by, _, _ := c.answer()
	assert.Equal(t, 200, status)
	assert.Equal(t, "net/http", by)
}

// Each connection given to net/http is reported with its reason, so an operator can tell
// filters' polls falling off the lean path from the usual other endpoints.
func TestHandOffsAreReportedWithTheirReason(t *testing.T) {
	f := startFront(t, echo, func(f *Front) { f.MaxConns = 3 })
	takeHandOffs()
	for _, tc := range []struct {
		raw  string
		want HandOff
	}{
		{get("/metrics"), Elsewhere},
		{get("/v1/table", "X-Kind: a\r\n b\r\n"), OddHead},
		{get("/v1/table", "X-Long: "+strings.Repeat("a", DefaultBufferSize)+"\r\n"), LongHead},
	} {
		c := dial(t, f)
		c.send(tc.raw)
		c.answer()
		require.Eventually(t, func() bool { handOffsMu.Lock(); defer handOffsMu.Unlock(); return len(handOffs) == 1 }, 5*time.Second, time.Millisecond)
		assert.Equal(t, []HandOff{tc.want}, takeHandOffs(), "%q", tc.raw)
	}
	// Three connections held open fill MaxConns; the fourth goes to net/http whole.
	for range 3 {
		c := dial(t, f)
		c.send(get("/v1/table"))
		c.answer()
	}
	c := dial(t, f)
	c.send(get("/v1/table"))
	_, by, _, _ := c.answer()
	assert.Equal(t, "net/http", by)
	assert.Equal(t, []HandOff{Full}, takeHandOffs())
}

// Write reports the bytes of p it wrote, never the head that went out with them
// (io.Writer's contract: io.Copy fails on a count above len(p)).
func TestWriteCountsOnlyTheBody(t *testing.T) {
	counts := make(chan int, 2)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "6")
		n1, _ := w.Write([]byte("abc"))
		n2, _ := w.Write([]byte("def"))
		counts <- n1
		counts <- n2
	})
	f := startFront(t, h, nil)
	c := dial(t, f)
	c.send(get("/v1/table"))
	_, by, body, _ := c.answer()
	assert.Equal(t, "lean", by)
	assert.Equal(t, "abcdef", body)
	assert.Equal(t, []int{3, 3}, []int{<-counts, <-counts})
}
