package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// The client's request body, fed to the filter as it arrives.

// pumpRequestBody feeds the client's body to the filter as it arrives.
func (ex *exchange) pumpRequestBody() {
	r := ex.r
	buf := getBuffer()
	defer putBuffer(buf)
	var total int64
	for {
		ex.pumpMu.Lock()
		if ex.pumpStop {
			ex.pumpMu.Unlock()
			return
		}
		ex.pumpReading = true
		ex.pumpMu.Unlock()
		n, err := r.Body.Read(buf)
		ex.pumpMu.Lock()
		ex.pumpReading = false
		ex.pumpMu.Unlock()
		total += int64(n)
		if n > 0 {
			ex.touch()
		}
		end := err == io.EOF || (r.ContentLength > 0 && total >= r.ContentLength)
		if err != nil && err != io.EOF {
			if framingError(err) {
				// Envoy's codec: a malformed chunk size is a protocol error, answered
				// 400 (HPE_INVALID_CHUNK_SIZE in source/common/http/http1/balsa_parser.cc).
				ex.p.stats.framingErrors.Add(1)
				ex.events.push(event{kind: evEdgeReply, status: http.StatusBadRequest, reason: "Bad Request"})
				return
			}
			ex.s.Reset("downstream request body: " + err.Error())
			return
		}
		chunk := append([]byte(nil), buf[:n]...)
		if end {
			ex.pumpEnded.Store(true)
			if t := host.HeadersFromHTTP(r.Trailer); len(t) > 0 && nonEmpty(t) {
				if n > 0 {
					if _, err := ex.s.SendRequestBody(chunk, false); err != nil {
						return
					}
				}
				_, _ = ex.s.SendRequestTrailers(t)
				return
			}
			_, _ = ex.s.SendRequestBody(chunk, true)
			return
		}
		if n > 0 {
			if _, err := ex.s.SendRequestBody(chunk, false); err != nil {
				return // answered locally or reset: stop reading
			}
		}
	}
}

// framingError tells a malformed request body (bad chunk framing) from a client that went
// away or a read cut short by the proxy itself.
func framingError(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &ne),
		errors.Is(err, http.ErrBodyReadAfterClose), errors.Is(err, syscall.ECONNRESET):
		return false
	}
	return true
}

// buffers are the read buffers of request and response bodies (chunks are copied out).
var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func getBuffer() []byte  { return *buffers.Get().(*[]byte) }
func putBuffer(b []byte) { buffers.Put(&b) }
