// Command plugin is the host's conformance plugin: a proxy-wasm filter written with the same
// SDK as kvroute that touches every part of the ABI the SDK declares, so the host tests can
// check Envoy's semantics without the real filter. Behaviour is switched per request by
// headers (x-local-reply, x-panic, x-async, x-rewrite-body, x-upper-response,
// x-buffer-response, x-route); the root context elects a leader with a CAS lease, polls a
// cluster on tick, publishes the answer in shared data and drains a shared queue of reports.
package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

type config struct {
	TickMs        uint32 `json:"tick_ms"`
	LeaseKey      string `json:"lease_key"`
	LeaseTTLMs    int64  `json:"lease_ttl_ms"`
	Cluster       string `json:"cluster"`
	Queue         string `json:"queue"`
	RoutingHeader string `json:"routing_header"`
}

func init() {
	proxywasm.SetVMContext(&vm{})
}

func main() {}

type vm struct {
	types.DefaultVMContext
	vmConfig string
}

func (v *vm) OnVMStart(size int) types.OnVMStartStatus {
	if size > 0 {
		b, err := proxywasm.GetVMConfiguration()
		if err != nil {
			proxywasm.LogErrorf("vm configuration: %v", err)
			return types.OnVMStartStatusFailed
		}
		v.vmConfig = string(b)
	}
	return types.OnVMStartStatusOK
}

// NewPluginContext runs before OnVMStart: cpp-host creates the root context first
// (src/context.cc ContextBase::onStart), so the root reads the VM configuration later.
func (v *vm) NewPluginContext(id uint32) types.PluginContext {
	return &root{id: id, vm: v}
}
