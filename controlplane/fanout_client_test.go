package controlplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawPoller is one simulated proxy's connection to the control plane, its requests
// written and its answers read at the socket (BenchmarkFanout -fanout.client raw). Go's
// HTTP client runs two goroutines per connection and costs this 2-core machine about as
// much as the control plane it measures: with it, 2,000 proxies drew only 77% of the
// answers the control plane would give them. The requests carry the headers a filter's
// poll carries through Envoy's HTTP/1.1 codec (filter/leader.go: accept and the formats
// header; Envoy adds the timeout header), so the server parses as much as it would.
type rawPoller struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
	req  []byte
	body []byte
}

var errAnswer = errors.New("malformed answer")

// get sends GET path and reads the answer: its status, whether X-Kvroute-Frame says
// delta, and its body (valid until the next get). Any error closes the connection; the
// next get dials again.
func (p *rawPoller) get(path string, deadline time.Time) (status int, delta bool, body []byte, err error) {
	if p.c == nil {
		if p.c, err = net.Dial("tcp", p.addr); err != nil {
			return 0, false, nil, err
		}
		p.r = bufio.NewReaderSize(p.c, 16<<10)
	}
	defer func() {
		if err != nil {
			p.c.Close()
			p.c = nil
		}
	}()
	p.c.SetDeadline(deadline)
	p.req = fmt.Appendf(p.req[:0], "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: %s\r\nX-Envoy-Expected-Rq-Timeout-Ms: 5000\r\n",
		path, p.addr, api.TableContentType)
	if *fanoutFormats != "" {
		p.req = fmt.Appendf(p.req, "%s: %s\r\n", api.TableFormatsHeader, *fanoutFormats)
	}
	p.req = append(p.req, "\r\n"...)
	if _, err = p.c.Write(p.req); err != nil {
		return 0, false, nil, err
	}
	line, err := p.r.ReadSlice('\n')
	if err != nil {
		return 0, false, nil, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, nil, errAnswer
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, nil, errAnswer
	}
	length := 0
	for {
		line, err = p.r.ReadSlice('\n')
		if err != nil {
			return 0, false, nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(": "))
		switch {
		case !ok:
			return 0, false, nil, errAnswer
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 || length > 64<<20 {
				return 0, false, nil, errAnswer
			}
		case bytes.EqualFold(name, []byte("X-Kvroute-Frame")):
			delta = string(value) == "delta"
		case bytes.EqualFold(name, []byte("Transfer-Encoding")), bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			return 0, false, nil, errAnswer // not what the server answers a poll with
		}
	}
	if cap(p.body) < length {
		p.body = make([]byte, length)
	}
	p.body = p.body[:length]
	if _, err = io.ReadFull(p.r, p.body); err != nil {
		return 0, false, nil, err
	}
	return status, delta, p.body, nil
}

// close ends the connection.
func (p *rawPoller) close() {
	if p.c != nil {
		p.c.Close()
	}
}

// TestRawPoller: BenchmarkFanout's socket-level poller reads a delta and a 304 on one
// connection, and treats a chunked answer (which the control plane never sends a
// poll) as an error and dials again.
func TestRawPoller(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("version") {
		case "1":
			w.Header().Set("X-Kvroute-Frame", "delta")
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "KVRT!")
		case "2":
			w.WriteHeader(http.StatusNotModified)
		default:
			w.(http.Flusher).Flush() // no length: chunked
			io.WriteString(w, "KVRT?")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p := &rawPoller{addr: srv.Listener.Addr().String()}
	defer p.close()
	deadline := time.Now().Add(5 * time.Second)

	status, delta, body, err := p.get(api.TablePath+"?version=1", deadline)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.True(t, delta)
	assert.Equal(t, "KVRT!", string(body))
	status, delta, body, err = p.get(api.TablePath+"?version=2", deadline)
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotModified, status)
	assert.False(t, delta)
	assert.Empty(t, body)
	assert.Equal(t, int32(1), conns.Load(), "one kept-alive connection")

	_, _, _, err = p.get(api.TablePath+"?version=3", deadline)
	assert.ErrorIs(t, err, errAnswer)
	_, _, _, err = p.get(api.TablePath+"?version=1", deadline)
	require.NoError(t, err)
	assert.Equal(t, int32(2), conns.Load(), "a new connection after the malformed answer")
}
