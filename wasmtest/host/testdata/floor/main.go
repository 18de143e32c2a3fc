// Command floor is the least a body-routing filter written with kvroute's SDK does: it
// holds the request's headers until the body is in, sets the endpoint header to a fixed
// address, and reads the response's status. BenchmarkKvrouteRequestPath -args -floor runs
// it beside kvroute, request for request, so the guest time the SDK's callbacks and this
// host cost by themselves is measured, not guessed: what kvroute's own work could at best
// come down to. It reads no body (kvroute's body read is one host call: -args -hostcalls
// shows its time).
package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vm{}) }

func main() {}

type vm struct{ types.DefaultVMContext }

func (*vm) NewPluginContext(uint32) types.PluginContext { return &plugin{} }

type plugin struct{ types.DefaultPluginContext }

func (*plugin) NewHttpContext(uint32) types.HttpContext { return &stream{} }

type stream struct {
	types.DefaultHttpContext
	status string
}

func (*stream) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if endOfStream {
		return types.ActionContinue
	}
	return types.ActionPause
}

func (*stream) OnHttpRequestBody(_ int, endOfStream bool) types.Action {
	if !endOfStream {
		return types.ActionPause
	}
	_ = proxywasm.ReplaceHttpRequestHeader("x-gateway-destination-endpoint", "127.0.0.1:9002")
	return types.ActionContinue
}

func (s *stream) OnHttpResponseHeaders(int, bool) types.Action {
	s.status, _ = proxywasm.GetHttpResponseHeader(":status")
	return types.ActionContinue
}
