package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// The HTTP stream context: each request header switches one behaviour (see the package doc).

type stream struct {
	types.DefaultHttpContext
	root       *root
	id         uint32
	upper      bool
	bufferResp bool
	finished   bool
	chunks     int
}

func (s *stream) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	r := s.root
	r.requests.Increment(1)
	r.inflight.Add(1)
	hdrs, err := proxywasm.GetHttpRequestHeaders()
	if err != nil || len(hdrs) != numHeaders {
		addHeader("x-test-error", fmt.Sprintf("headers: %d pairs, callback said %d (%v)", len(hdrs), numHeaders, err))
	}
	if has("x-panic") {
		panic("test plugin: panic requested")
	}
	if v, err := proxywasm.GetHttpRequestHeader("x-count"); err == nil {
		// A shared counter bumped with CAS loops from every VM at once: no update may be lost.
		n, _ := strconv.Atoi(v)
		for i := 0; i < n; i++ {
			casIncrement(r)
		}
	}
	if has("x-bad-call") {
		// Envoy refuses an HTTP call without :authority.
		_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, [][2]string{{":method", "GET"}, {":path", "/"}}, nil, nil, 100,
			func(int, int, int) {})
		addHeader("x-test-error", fmt.Sprintf("bad call: %v", err))
	}
	if has("x-local-reply") {
		if err := proxywasm.SendHttpResponse(418, [][2]string{{"x-test-local", "1"}}, []byte("teapot"), -1); err != nil {
			proxywasm.LogErrorf("local reply: %v", err)
		}
		return types.ActionPause
	}
	_ = proxywasm.RemoveHttpRequestHeader("x-remove-me")
	_ = proxywasm.ReplaceHttpRequestHeader("x-replace-me", "replaced")
	_ = proxywasm.AddHttpRequestHeader("x-added", "1")
	// A client must not choose the endpoint: only this filter writes the routing header.
	_ = proxywasm.RemoveHttpRequestHeader(r.cfg.RoutingHeader)

	for _, p := range []struct{ header, path string }{
		{"x-test-path", "request.path"}, {"x-test-method", "request.method"},
		{"x-test-source", "source.address"}, {"x-test-plugin", "plugin_name"},
		{"x-test-node", "node.id"}, {"x-test-ua", "request.headers.user-agent"},
	} {
		v, err := proxywasm.GetProperty(strings.Split(p.path, "."))
		if err != nil {
			v = []byte("error: " + err.Error())
		}
		_ = proxywasm.ReplaceHttpRequestHeader(p.header, string(v))
	}
	if err := proxywasm.SetProperty([]string{"test_state"}, []byte("headers-seen")); err != nil {
		addHeader("x-test-error", "set property: "+err.Error())
	}
	state, _ := proxywasm.GetProperty([]string{"test_state"})
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-state", string(state))
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-vm", r.token)
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-requests-seen", strconv.FormatUint(r.requests.Value(), 10))
	if table, _, err := proxywasm.GetSharedData("test/table"); err == nil {
		_ = proxywasm.ReplaceHttpRequestHeader("x-test-table", string(table))
	}
	s.upper = has("x-upper-response")
	s.bufferResp = has("x-buffer-response")
	if endOfStream {
		s.finish(nil)
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause // keep buffering: the next call sees the whole body so far
	}
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil && bodySize > 0 {
		addHeader("x-test-error", "body: "+err.Error())
	}
	if len(body) != bodySize {
		addHeader("x-test-error", fmt.Sprintf("body is %d bytes, callback said %d", len(body), bodySize))
	}
	return s.finish(body)
}

func (s *stream) OnHttpRequestTrailers(numTrailers int) types.Action {
	trailers, _ := proxywasm.GetHttpRequestTrailers()
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-trailers", strconv.Itoa(len(trailers)))
	_ = proxywasm.AddHttpRequestTrailer("x-trailer-seen", strconv.Itoa(numTrailers))
	// With trailers the body callback never sees end of stream: decide here.
	body, _ := proxywasm.GetHttpRequestBody(0, 1<<30)
	return s.finish(body)
}

// finish is the routing decision, made once the whole request is known.
func (s *stream) finish(body []byte) types.Action {
	if s.finished {
		return types.ActionContinue
	}
	s.finished = true
	r := s.root
	r.bodyBytes.Record(uint64(len(body)))
	_ = proxywasm.ReplaceHttpRequestHeader("x-test-body-size", strconv.Itoa(len(body)))
	route, _ := proxywasm.GetHttpRequestHeader("x-route")
	var parsed struct {
		Route string `json:"route"`
	}
	if len(body) > 0 && json.Unmarshal(body, &parsed) == nil && parsed.Route != "" {
		route = parsed.Route
	}
	if route != "" {
		_ = proxywasm.ReplaceHttpRequestHeader(r.cfg.RoutingHeader, route)
	}
	if has("x-set-pairs") {
		all, _ := proxywasm.GetHttpRequestHeaders()
		_ = proxywasm.ReplaceHttpRequestHeaders(append(all, [2]string{"x-pairs-set", strconv.Itoa(len(all))}))
	}
	// Envoy >= 1.33 keeps the route cache for ABI > 0.2.1; this SDK is 0.2.0, the call is harmless.
	if _, err := proxywasm.CallForeignFunction("clear_route_cache", nil); err != nil {
		addHeader("x-test-error", "clear_route_cache: "+err.Error())
	}
	if has("x-rewrite-body") {
		if err := proxywasm.ReplaceHttpRequestBody(append([]byte("rewritten:"), body...)); err != nil {
			addHeader("x-test-error", "replace body: "+err.Error())
		}
	}
	if qid, err := proxywasm.ResolveSharedQueue("", r.cfg.Queue); err != nil {
		r.dropped.Increment(1)
	} else if err := proxywasm.EnqueueSharedQueue(qid, []byte(fmt.Sprintf("report vm=%s stream=%d bytes=%d", r.token, s.id, len(body)))); err != nil {
		proxywasm.LogErrorf("enqueue: %v", err)
	}
	if !has("x-async") {
		return types.ActionContinue
	}
	headers := [][2]string{{":method", "GET"}, {":path", "/async"}, {":authority", "control"}}
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, nil, nil, 5000, func(numHeaders, bodySize, _ int) {
		status := callStatus()
		answer, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		// The request is still held: its headers can change until it is resumed.
		_ = proxywasm.ReplaceHttpRequestHeader("x-async-status", fmt.Sprintf("%s/%d", status, numHeaders))
		_ = proxywasm.ReplaceHttpRequestHeader("x-async-result", string(answer))
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogErrorf("resume: %v", err)
		}
	})
	if err != nil {
		addHeader("x-test-error", "dispatch: "+err.Error())
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *stream) OnHttpResponseHeaders(numHeaders int, endOfStream bool) types.Action {
	_ = proxywasm.AddHttpResponseHeader("x-test-filter", s.root.token)
	status, _ := proxywasm.GetHttpResponseHeader(":status")
	_ = proxywasm.ReplaceHttpResponseHeader("x-test-status-seen", status)
	// Envoy releases the request headers once the request went upstream.
	_, err := proxywasm.GetHttpRequestHeader(":path")
	seen := "ok"
	if err != nil {
		seen = err.Error()
	}
	_ = proxywasm.ReplaceHttpResponseHeader("x-test-request-headers-in-response", seen)
	if s.upper || s.bufferResp {
		_ = proxywasm.RemoveHttpResponseHeader("content-length")
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	if bodySize > 0 {
		s.chunks++
		s.root.chunks.Increment(1)
	}
	if s.bufferResp {
		if !endOfStream {
			return types.ActionPause
		}
		body, _ := proxywasm.GetHttpResponseBody(0, bodySize)
		_ = proxywasm.ReplaceHttpResponseBody([]byte(fmt.Sprintf("%s|buffered=%d", body, bodySize)))
		return types.ActionContinue
	}
	if s.upper && bodySize > 0 {
		body, err := proxywasm.GetHttpResponseBody(0, bodySize)
		if err == nil {
			_ = proxywasm.ReplaceHttpResponseBody(bytes.ToUpper(body))
		}
	}
	return types.ActionContinue
}

func (s *stream) OnHttpResponseTrailers(int) types.Action {
	_ = proxywasm.AddHttpResponseTrailer("x-test-trailer", "1")
	return types.ActionContinue
}

func (s *stream) OnHttpStreamDone() {
	s.root.inflight.Add(-1)
	proxywasm.LogDebugf("stream %d done after %d response chunks", s.id, s.chunks)
}

func casIncrement(r *root) {
	for {
		val, cas, _ := proxywasm.GetSharedData("test/counter")
		n, _ := strconv.Atoi(string(val))
		err := proxywasm.SetSharedData("test/counter", []byte(strconv.Itoa(n+1)), cas)
		if err == nil {
			return
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			addHeader("x-test-error", "counter: "+err.Error())
			return
		}
		r.casRetries.Increment(1)
	}
}

func has(name string) bool {
	_, err := proxywasm.GetHttpRequestHeader(name)
	return err == nil
}

func addHeader(name, value string) {
	_ = proxywasm.AddHttpRequestHeader(name, value)
}
