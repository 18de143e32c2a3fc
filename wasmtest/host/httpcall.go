package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// callRequest is a proxy_http_call as the plugin made it.
type callRequest struct {
	headers  Headers
	body     []byte
	trailers Headers
	timeout  time.Duration // 0: none
}

// callResponse is what proxy_on_http_call_response delivers. Like Envoy's async client, a
// timeout or a connection failure arrive as a local 504/503 response; reset (zero headers,
// proxy_get_status BrokenConnection) is for a stream that broke after the headers.
type callResponse struct {
	headers  Headers
	body     []byte
	trailers Headers
	reset    bool
}

// Envoy's router answers these itself when the upstream cannot.
const (
	callTimeoutBody = "upstream request timeout"
	callConnectBody = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
	callResetBody   = "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
)

func localCallResponse(status int, body string) *callResponse {
	return &callResponse{
		headers: Headers{{":status", strconv.Itoa(status)}, {"content-length", strconv.Itoa(len(body))},
			{"content-type", "text/plain"}},
		body: []byte(body),
	}
}

// virtualGuard bounds, in wall time, an HTTP call made under a virtual clock: the call takes
// no virtual time, and the plugin's timeout is virtual, so only this stops a stuck upstream.
const virtualGuard = 30 * time.Second

// startCall starts an HTTP call and returns its cancel function. The response is delivered
// by deliverCallResponse, which waits for the VM: never inside the calling callback. Under
// the wall clock the call runs now on its own goroutine; under a virtual clock it runs
// inside Advance, at now+Latency (or at the timeout, if that comes first).
func (h *Host) startCall(vm *VM, token uint32, c Cluster, req callRequest) func() {
	if h.clock == clock.Wall() {
		ctx, cancel := context.WithCancel(h.ctx)
		if req.timeout > 0 {
			ctx, cancel = context.WithTimeout(h.ctx, req.timeout)
		}
		go func() {
			resp := h.perform(ctx, c, req)
			cancel()
			vm.deliverCallResponse(token, resp)
		}()
		return cancel
	}
	delay := c.Latency
	timedOut := req.timeout > 0 && delay >= req.timeout
	if timedOut {
		delay = req.timeout
	}
	t := h.clock.AfterFunc(delay, func() {
		ctx, cancel := context.WithTimeout(h.ctx, virtualGuard)
		defer cancel()
		resp := h.perform(ctx, c, req) // the upstream sees the call even if the caller gave up
		if timedOut {
			resp = localCallResponse(http.StatusGatewayTimeout, callTimeoutBody)
		}
		vm.deliverCallResponse(token, resp)
	})
	return func() { t.Stop() }
}

// perform makes the call against a base URL or an in-process handler.
func (h *Host) perform(ctx context.Context, c Cluster, req callRequest) *callResponse {
	method := req.headers.Get(":method")
	path := req.headers.Get(":path")
	authority := req.headers.Get(":authority")
	base := "http://" + authority
	if c.URL != "" {
		base = strings.TrimSuffix(c.URL, "/")
	}
	hreq, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(req.body))
	if err != nil {
		return localCallResponse(http.StatusServiceUnavailable, callResetBody)
	}
	hreq.Host = authority
	for _, kv := range req.headers {
		if !strings.HasPrefix(kv[0], ":") && kv[0] != "content-length" {
			hreq.Header.Add(kv[0], kv[1])
		}
	}
	if len(req.trailers) > 0 {
		hreq.Trailer = http.Header{}
		for _, kv := range req.trailers {
			hreq.Trailer.Add(kv[0], kv[1])
		}
	}
	if c.URL == "" && c.Handler != nil {
		return serveInProcess(ctx, c.Handler, hreq)
	}
	if c.URL == "" {
		return localCallResponse(http.StatusServiceUnavailable, "no healthy upstream")
	}
	resp, err := h.client.Do(hreq)
	if err != nil {
		return callError(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		// The headers were in: Envoy resets the stream and the plugin gets zero headers.
		return &callResponse{reset: true}
	}
	return &callResponse{headers: responseHeaders(resp.StatusCode, resp.Header), body: body,
		trailers: HeadersFromHTTP(resp.Trailer)}
}

func callError(ctx context.Context, err error) *callResponse {
	var op *net.OpError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return localCallResponse(http.StatusGatewayTimeout, callTimeoutBody)
	case errors.Is(ctx.Err(), context.Canceled):
		return &callResponse{reset: true}
	case errors.As(err, &op) && op.Op == "dial":
		return localCallResponse(http.StatusServiceUnavailable, callConnectBody)
	}
	return localCallResponse(http.StatusServiceUnavailable, callResetBody)
}

// responseHeaders turns a net/http status and header into Envoy's form: ":status" first,
// then lower-case names.
func responseHeaders(status int, hdr http.Header) Headers {
	return append(Headers{{":status", strconv.Itoa(status)}}, HeadersFromHTTP(hdr)...)
}

// serveInProcess runs a handler as the upstream. A handler that outlives the context
// counts as a timeout; one that panics as a reset.
func serveInProcess(ctx context.Context, handler http.Handler, req *http.Request) *callResponse {
	req.RequestURI = req.URL.RequestURI()
	req.RemoteAddr = "127.0.0.1:0"
	done := make(chan *callResponse, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- &callResponse{reset: true}
			}
		}()
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		res := rec.Result()
		body, _ := io.ReadAll(res.Body)
		done <- &callResponse{headers: responseHeaders(res.StatusCode, res.Header), body: body,
			trailers: HeadersFromHTTP(res.Trailer)}
	}()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		return callError(ctx, ctx.Err())
	}
}

// describe names a call for logs.
func (r callRequest) describe(cluster string) string {
	return fmt.Sprintf("%s %s%s", r.headers.Get(":method"), cluster, r.headers.Get(":path"))
}

// HTTP calls.

func hostHTTPCall(vm *VM, a []uint64) status {
	cluster, ok1 := vm.readString(a[0], a[1])
	rawHeaders, ok2 := vm.read(a[2], a[3])
	body, ok3 := vm.read(a[4], a[5])
	rawTrailers, ok4 := vm.read(a[6], a[7])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return statusInvalidMemoryAccess
	}
	headers, _ := decodePairs(rawHeaders)
	trailers, _ := decodePairs(rawTrailers)
	req := callRequest{headers: headers.lower(), body: body, trailers: trailers.lower(),
		timeout: time.Duration(uint32(a[8])) * time.Millisecond}
	c, found := vm.host.cluster(cluster)
	if !found {
		vm.host.logs.add(vm.host.clock.Now(), vm.index, LevelWarn, "http call to unknown cluster "+req.describe(cluster))
		return statusBadArgument
	}
	for _, h := range []string{":method", ":path", ":authority"} {
		if req.headers.Get(h) == "" {
			return statusBadArgument // Envoy requires all three
		}
	}
	if st := vm.writeU32(a[9], 0); st != statusOK {
		return st
	}
	vm.nextCallout++
	if vm.nextCallout == 0 {
		vm.nextCallout++
	}
	token := vm.nextCallout
	vm.callouts[token] = vm.host.startCall(vm, token, c, req)
	vm.host.stats.httpCalls.Add(1)
	return vm.writeU32(a[9], token)
}
