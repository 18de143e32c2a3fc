package proxy

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// Headers between the client and the filter: what the filter chain is given of a request,
// and what the client is sent of the response the filter released.

// hopByHop are connection-level headers a proxy does not pass on (RFC 9110 7.6.1).
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"te": true, "trailer": true, "transfer-encoding": true, "upgrade": true}

func (ex *exchange) writeHeaders(h host.Headers) {
	status, err := strconv.Atoi(h.Get(":status"))
	if err != nil || status < 100 {
		status = http.StatusBadGateway
	}
	out := ex.w.Header()
	for _, kv := range h {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] {
			continue
		}
		out.Add(kv[0], kv[1])
	}
	if !ex.pumpEnded.Load() {
		// Answered before the client finished sending (a 413, a local reply): like Envoy,
		// do not reuse a connection whose request body was not read to its end.
		out.Set("Connection", "close")
	}
	ex.wroteHeaders = true
	ex.w.WriteHeader(status)
}

// requestHeaders is what Envoy's connection manager hands the filter chain: pseudo-headers,
// lower-case names, no hop-by-hop headers, x-request-id and x-forwarded-proto added.
func requestHeaders(r *http.Request, t target) host.Headers {
	h := host.Headers{{":method", r.Method}, {":path", t.path}, {":authority", t.authority}, {":scheme", "http"}}
	hasID := false
	for _, kv := range host.HeadersFromHTTP(r.Header) {
		if hopByHop[kv[0]] || kv[0] == "x-forwarded-proto" {
			continue
		}
		hasID = hasID || kv[0] == "x-request-id"
		h = append(h, kv)
	}
	h = append(h, [2]string{"x-forwarded-proto", "http"})
	if !hasID {
		h = append(h, [2]string{"x-request-id", requestID()})
	}
	return h
}

func requestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func nonEmpty(t host.Headers) bool {
	for _, kv := range t {
		if kv[1] != "" {
			return true
		}
	}
	return false
}
