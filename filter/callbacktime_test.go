//go:build !wasm

package main

import (
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// timedVM wraps a VM context so that the time spent inside its HTTP contexts' callbacks
// adds up in *spent: the filter's own time on the request path, the host calls it makes
// included (in Envoy the host copies bodies and headers too), the SDK emulator's work
// between the callbacks not. The emulator appends every request body into a fresh
// slice before the filter sees it, a large allocation for the 32 KB body whose pages
// fault in on the copy: in a CPU profile of BenchmarkRequestPath/native, proxytest's
// CallOnRequestBody spent 1.46 s copying against 1.71 s in the filter's whole
// OnHttpRequestBody, work no proxy does that way.
type timedVM struct {
	types.VMContext
	spent *time.Duration
}

func (v timedVM) NewPluginContext(id uint32) types.PluginContext {
	return timedPlugin{v.VMContext.NewPluginContext(id), v.spent}
}

type timedPlugin struct {
	types.PluginContext
	spent *time.Duration
}

func (p timedPlugin) NewHttpContext(id uint32) types.HttpContext {
	start := time.Now()
	h := p.PluginContext.NewHttpContext(id)
	*p.spent += time.Since(start)
	if h == nil {
		return nil
	}
	return timedHTTP{h, p.spent}
}

type timedHTTP struct {
	types.HttpContext
	spent *time.Duration
}

func (h timedHTTP) time(start time.Time) { *h.spent += time.Since(start) }

func (h timedHTTP) OnHttpRequestHeaders(n int, eos bool) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpRequestHeaders(n, eos)
}

func (h timedHTTP) OnHttpRequestBody(n int, eos bool) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpRequestBody(n, eos)
}

func (h timedHTTP) OnHttpRequestTrailers(n int) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpRequestTrailers(n)
}

func (h timedHTTP) OnHttpResponseHeaders(n int, eos bool) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpResponseHeaders(n, eos)
}

func (h timedHTTP) OnHttpResponseBody(n int, eos bool) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpResponseBody(n, eos)
}

func (h timedHTTP) OnHttpResponseTrailers(n int) types.Action {
	defer h.time(time.Now())
	return h.HttpContext.OnHttpResponseTrailers(n)
}

func (h timedHTTP) OnHttpStreamDone() {
	defer h.time(time.Now())
	h.HttpContext.OnHttpStreamDone()
}
