package host

import (
	"context"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// abiModule is the import module of the proxy-wasm host functions.
const abiModule = "env"

// status is a proxy-wasm WasmResult.
type status uint32

const (
	statusOK                  status = 0
	statusNotFound            status = 1
	statusBadArgument         status = 2
	statusInvalidMemoryAccess status = 6
	statusEmpty               status = 7
	statusCasMismatch         status = 8
	statusBrokenConnection    status = 11
	statusUnimplemented       status = 12
)

func (s status) String() string {
	switch s {
	case statusOK:
		return "ok"
	case statusNotFound:
		return "not found"
	case statusBadArgument:
		return "bad argument"
	case statusInvalidMemoryAccess:
		return "invalid memory access"
	case statusEmpty:
		return "empty"
	case statusCasMismatch:
		return "CAS mismatch"
	case statusBrokenConnection:
		return "broken connection"
	case statusUnimplemented:
		return "unimplemented"
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// Header map and buffer types of the ABI.
const (
	mapRequestHeaders       = 0
	mapRequestTrailers      = 1
	mapResponseHeaders      = 2
	mapResponseTrailers     = 3
	mapCallResponseHeaders  = 6
	mapCallResponseTrailers = 7
	mapMax                  = 7

	bufRequestBody      = 0
	bufResponseBody     = 1
	bufCallResponseBody = 4
	bufVMConfiguration  = 6
	bufPluginConfig     = 7
	bufMax              = 8
)

type hostFunc struct {
	name   string
	params []api.ValueType
	call   func(vm *VM, a []uint64) status
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func params(n int) []api.ValueType {
	p := make([]api.ValueType, n)
	for i := range p {
		p[i] = i32
	}
	return p
}

// instantiateABI registers every host function the Go SDK imports (its
// internal/abi_hostcalls.go), plus three more from cpp-host that other SDKs use.
func (h *Host) instantiateABI(ctx context.Context) (api.Module, error) {
	b := h.runtime.NewHostModuleBuilder(abiModule)
	for _, f := range hostFuncs() {
		call, types := f.call, f.params
		qualified := abiModule + "." + f.name
		calls, timer := h.hostCallCounter(qualified), h.hostCallTimer(qualified)
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
				// The upper half of an i32 on wazero's stack is undefined: clear it once here.
				for i, t := range types {
					if t == i32 {
						stack[i] = uint64(uint32(stack[i]))
					}
				}
				vm := ctx.Value(vmKey{}).(*VM)
				vm.checkRestricted(qualified)
				calls.Add(1)
				start := timer.begin()
				stack[0] = uint64(call(vm, stack))
				timer.end(start)
			}), f.params, []api.ValueType{i32}).
			WithName(f.name).
			Export(f.name)
	}
	return b.Instantiate(ctx)
}

func hostFuncs() []hostFunc {
	return []hostFunc{
		{"proxy_log", params(3), hostLog},
		{"proxy_get_log_level", params(1), hostGetLogLevel},
		{"proxy_get_current_time_nanoseconds", params(1), hostGetCurrentTime},
		{"proxy_get_status", params(3), hostGetStatus},
		{"proxy_send_local_response", params(8), hostSendLocalResponse},
		{"proxy_get_shared_data", params(5), hostGetSharedData},
		{"proxy_set_shared_data", params(5), hostSetSharedData},
		{"proxy_register_shared_queue", params(3), hostRegisterSharedQueue},
		{"proxy_resolve_shared_queue", params(5), hostResolveSharedQueue},
		{"proxy_dequeue_shared_queue", params(3), hostDequeueSharedQueue},
		{"proxy_enqueue_shared_queue", params(3), hostEnqueueSharedQueue},
		{"proxy_get_header_map_value", params(5), hostGetHeaderMapValue},
		{"proxy_add_header_map_value", params(5), hostAddHeaderMapValue},
		{"proxy_replace_header_map_value", params(5), hostReplaceHeaderMapValue},
		{"proxy_remove_header_map_value", params(3), hostRemoveHeaderMapValue},
		{"proxy_get_header_map_pairs", params(3), hostGetHeaderMapPairs},
		{"proxy_set_header_map_pairs", params(3), hostSetHeaderMapPairs},
		{"proxy_get_buffer_bytes", params(5), hostGetBufferBytes},
		{"proxy_set_buffer_bytes", params(5), hostSetBufferBytes},
		{"proxy_continue_stream", params(1), hostContinueStream},
		{"proxy_close_stream", params(1), hostCloseStream},
		{"proxy_http_call", params(10), hostHTTPCall},
		{"proxy_call_foreign_function", params(6), hostCallForeignFunction},
		{"proxy_set_tick_period_milliseconds", params(1), hostSetTickPeriod},
		{"proxy_set_effective_context", params(1), hostSetEffectiveContext},
		{"proxy_done", params(0), func(*VM, []uint64) status { return statusOK }},
		{"proxy_define_metric", params(4), hostDefineMetric},
		{"proxy_increment_metric", []api.ValueType{i32, i64}, hostIncrementMetric},
		{"proxy_record_metric", []api.ValueType{i32, i64}, hostRecordMetric},
		{"proxy_get_metric", params(2), hostGetMetric},
		{"proxy_get_property", params(4), hostGetProperty},
		{"proxy_set_property", params(4), hostSetProperty},
	}
}

// Guest memory. Reads are copied: a later allocation may grow (and move) the memory.

func (vm *VM) read(ptr, size uint64) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	b, ok := vm.mem.Read(uint32(ptr), uint32(size))
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func (vm *VM) readString(ptr, size uint64) (string, bool) {
	b, ok := vm.read(ptr, size)
	return string(b), ok
}

// copyOut allocates guest memory with proxy_on_memory_allocate, copies data in and writes
// the address and size, as cpp-host's copyToPointerSize does (nothing allocated for empty).
func (vm *VM) copyOut(data []byte, ptrPtr, sizePtr uint64) status {
	var addr uint32
	if len(data) > 0 {
		vm.allocStack[0] = uint64(len(data))
		// cpp-host include/proxy-wasm/wasm.h allocMemory: malloc runs with restricted
		// callbacks; a trap in it fails the VM (the Go allocator may run a GC cycle here).
		outer := vm.allowed
		vm.allowed = vm.host.profile.allocAllow
		err := vm.fn.malloc.CallWithStack(vm.ctx, vm.allocStack[:])
		vm.allowed = outer
		if err != nil {
			vm.fail(fmt.Errorf("%s: %w", vm.fn.malloc.Definition().Name(), err))
			return statusInvalidMemoryAccess
		}
		addr = uint32(vm.allocStack[0])
		if addr == 0 || !vm.mem.Write(addr, data) {
			return statusInvalidMemoryAccess
		}
	}
	if !vm.mem.WriteUint32Le(uint32(ptrPtr), addr) || !vm.mem.WriteUint32Le(uint32(sizePtr), uint32(len(data))) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func (vm *VM) writeU32(ptr uint64, v uint32) status {
	if !vm.mem.WriteUint32Le(uint32(ptr), v) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}

func (vm *VM) writeU64(ptr uint64, v uint64) status {
	if !vm.mem.WriteUint64Le(uint32(ptr), v) {
		return statusInvalidMemoryAccess
	}
	return statusOK
}
