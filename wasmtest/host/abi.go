package host

import (
	"context"
	"fmt"
	"strings"
	"time"

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
				stack[0] = uint64(call(vm, stack))
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

// Logging, time, status.

func hostLog(vm *VM, a []uint64) status {
	level := LogLevel(uint32(a[0]))
	if level > LevelCritical {
		return statusBadArgument
	}
	msg, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	vm.host.logs.add(vm.host.clock.Now(), vm.index, level, msg)
	return statusOK
}

// hostGetLogLevel reports trace: the host keeps every line.
func hostGetLogLevel(vm *VM, a []uint64) status {
	return vm.writeU32(a[0], uint32(LevelTrace))
}

func hostGetCurrentTime(vm *VM, a []uint64) status {
	return vm.writeU64(a[0], uint64(vm.host.clock.Now().UnixNano()))
}

func hostGetStatus(vm *VM, a []uint64) status {
	if st := vm.writeU32(a[0], vm.status.code); st != statusOK {
		return st
	}
	return vm.copyOut([]byte(vm.status.message), a[1], a[2])
}

// Local reply and stream control: deferred until the callback returns, like cpp-host's
// addAfterVmCallAction.

func hostSendLocalResponse(vm *VM, a []uint64) status {
	s := vm.effectiveStream()
	if s == nil {
		return statusUnimplemented
	}
	details, ok1 := vm.readString(a[1], a[2])
	body, ok2 := vm.read(a[3], a[4])
	raw, ok3 := vm.read(a[5], a[6])
	if !ok1 || !ok2 || !ok3 {
		return statusInvalidMemoryAccess
	}
	hdrs, _ := decodePairs(raw) // cpp-host ignores malformed pairs
	s.localRequested = true
	vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evLocalReply,
		reply: &localReply{status: int(uint32(a[0])), headers: hdrs, body: body, details: details}}})
	return statusOK
}

func hostContinueStream(vm *VM, a []uint64) status {
	typ := uint32(a[0])
	if typ > 3 {
		return statusBadArgument
	}
	s := vm.effectiveStream()
	if s == nil || typ > 1 {
		return statusOK // no HTTP stream to continue (Envoy does nothing either)
	}
	d := direction(typ)
	hf := s.half(d)
	// Envoy releases the maps at once; the stream moves on after the callback.
	hf.headersOpen, hf.bodyOpen, hf.trailersOpen = false, false, false
	vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evContinue, dir: d}})
	return statusOK
}

func hostCloseStream(vm *VM, a []uint64) status {
	typ := uint32(a[0])
	if typ > 3 {
		return statusBadArgument
	}
	if s := vm.effectiveStream(); s != nil && typ <= 1 {
		vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evReset, reason: "closed by the filter"}})
	}
	return statusOK
}

func hostSetEffectiveContext(vm *VM, a []uint64) status {
	id := uint32(a[0])
	if id != vm.rootID && vm.streams[id] == nil {
		return statusBadArgument
	}
	vm.effective = id
	return statusOK
}

func hostSetTickPeriod(vm *VM, a []uint64) status {
	vm.setTickPeriod(time.Duration(uint32(a[0])) * time.Millisecond)
	return statusOK
}

// clear_route_cache is the one foreign function Envoy offers that matters here; the host
// has no route cache, so it succeeds and does nothing.
func hostCallForeignFunction(vm *VM, a []uint64) status {
	name, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	if name != "clear_route_cache" {
		return statusNotFound
	}
	if a[4] != 0 {
		if st := vm.writeU32(a[4], 0); st != statusOK {
			return st
		}
	}
	if a[5] != 0 {
		return vm.writeU32(a[5], 0)
	}
	return statusOK
}

// Shared data and queues.

func hostGetSharedData(vm *VM, a []uint64) status {
	key, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	value, cas, found := vm.host.store.get(key)
	if !found {
		return statusNotFound
	}
	if st := vm.copyOut(value, a[2], a[3]); st != statusOK {
		return st
	}
	return vm.writeU32(a[4], cas)
}

func hostSetSharedData(vm *VM, a []uint64) status {
	key, ok1 := vm.readString(a[0], a[1])
	value, ok2 := vm.read(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	return vm.host.store.set(key, value, uint32(a[4]))
}

func hostRegisterSharedQueue(vm *VM, a []uint64) status {
	name, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	// proxy_on_queue_ready goes to the root context even if a stream registers the queue.
	return vm.writeU32(a[2], vm.host.store.register(name, vm, vm.rootID))
}

func hostResolveSharedQueue(vm *VM, a []uint64) status {
	vmID, ok1 := vm.readString(a[0], a[1])
	name, ok2 := vm.readString(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	if vmID != vm.host.cfg.VMID {
		return statusNotFound
	}
	id := vm.host.store.resolve(name)
	if id == 0 {
		return statusNotFound
	}
	return vm.writeU32(a[4], id)
}

func hostDequeueSharedQueue(vm *VM, a []uint64) status {
	item, st := vm.host.store.dequeue(uint32(a[0]))
	if st != statusOK {
		return st
	}
	return vm.copyOut(item, a[1], a[2])
}

// hostEnqueueSharedQueue wakes the registering VM later, through the clock: never inside
// the enqueuing callback, even when that VM is the one enqueuing.
func hostEnqueueSharedQueue(vm *VM, a []uint64) status {
	item, ok := vm.read(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	token := uint32(a[0])
	target, contextID, st := vm.host.store.enqueue(token, item)
	if st != statusOK {
		return st
	}
	if target != nil {
		vm.host.clock.AfterFunc(0, func() { target.deliverQueueReady(contextID, token) })
	}
	return statusOK
}

// Header maps.

// headerMap returns the map the current context may use, following which maps Envoy holds
// at that moment; write asks for a mutable one (the log phase and call responses are
// read-only).
func (vm *VM) headerMap(typ uint32, write bool) (*Headers, status) {
	if r := vm.callResp; r != nil && (typ == mapCallResponseHeaders || typ == mapCallResponseTrailers) {
		if write {
			return nil, statusBadArgument
		}
		if typ == mapCallResponseHeaders {
			return &r.headers, statusOK
		}
		return &r.trailers, statusOK
	}
	s := vm.effectiveStream()
	if s == nil {
		return nil, statusBadArgument
	}
	var hf *half
	switch typ {
	case mapRequestHeaders, mapRequestTrailers:
		hf = &s.req
	case mapResponseHeaders, mapResponseTrailers:
		hf = &s.resp
	default:
		return nil, statusBadArgument
	}
	trailers := typ == mapRequestTrailers || typ == mapResponseTrailers
	if s.logPhase {
		if write || (typ == mapRequestTrailers) {
			return nil, statusBadArgument
		}
		if trailers {
			return &hf.trailers, statusOK
		}
		return &hf.headers, statusOK
	}
	if trailers {
		if !hf.trailersOpen {
			return nil, statusBadArgument
		}
		return &hf.trailers, statusOK
	}
	if !hf.headersOpen {
		return nil, statusBadArgument
	}
	return &hf.headers, statusOK
}

func hostGetHeaderMapValue(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), false)
	if st != statusOK {
		return st
	}
	v, found := m.Lookup(key)
	if !found {
		return statusNotFound
	}
	return vm.copyOut([]byte(v), a[3], a[4])
}

func hostAddHeaderMapValue(vm *VM, a []uint64) status {
	return editHeaderMap(vm, a, func(m *Headers, k, v string) { m.add(k, v) })
}

func hostReplaceHeaderMapValue(vm *VM, a []uint64) status {
	return editHeaderMap(vm, a, func(m *Headers, k, v string) { m.set(k, v) })
}

func editHeaderMap(vm *VM, a []uint64, edit func(m *Headers, k, v string)) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok1 := vm.readString(a[1], a[2])
	value, ok2 := vm.readString(a[3], a[4])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	edit(m, key, value)
	return statusOK
}

func hostRemoveHeaderMapValue(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	m.remove(key)
	return statusOK
}

// hostGetHeaderMapPairs answers an unavailable map with no pairs, as Envoy does.
func hostGetHeaderMapPairs(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	m, st := vm.headerMap(uint32(a[0]), false)
	if st != statusOK || len(*m) == 0 {
		return vm.copyOut(nil, a[1], a[2])
	}
	return vm.copyOut(encodePairs(*m), a[1], a[2])
}

func hostSetHeaderMapPairs(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	raw, ok := vm.read(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	pairs, _ := decodePairs(raw)
	*m = pairs.lower()
	return statusOK
}

// Buffers.

// buffer returns the buffer the current context may use and whether it may change it.
func (vm *VM) buffer(typ uint32) (*[]byte, bool, status) {
	switch typ {
	case bufRequestBody, bufResponseBody:
		s := vm.effectiveStream()
		if s == nil {
			return nil, false, statusNotFound
		}
		hf := &s.req
		if typ == bufResponseBody {
			hf = &s.resp
		}
		if !hf.bodyOpen {
			return nil, false, statusNotFound
		}
		return &hf.body, true, statusOK
	case bufCallResponseBody:
		if vm.callResp == nil {
			return nil, false, statusNotFound
		}
		return &vm.callResp.body, false, statusOK
	case bufVMConfiguration:
		return &vm.host.cfg.VMConfig, false, statusOK
	case bufPluginConfig:
		if !vm.configuring {
			return nil, false, statusNotFound // Envoy only hands it out inside proxy_on_configure
		}
		return &vm.host.cfg.PluginConfig, false, statusOK
	}
	return nil, false, statusNotFound
}

func hostGetBufferBytes(vm *VM, a []uint64) status {
	if a[0] > bufMax {
		return statusBadArgument
	}
	buf, _, st := vm.buffer(uint32(a[0]))
	if st != statusOK {
		return st
	}
	start, length := uint64(uint32(a[1])), uint64(uint32(a[2]))
	size := uint64(len(*buf))
	if start > size {
		return statusOK // nothing to return; the SDK reports NotFound
	}
	if start+length > size {
		length = size - start
	}
	if length == 0 {
		return statusOK
	}
	return vm.copyOut((*buf)[start:start+length], a[3], a[4])
}

// hostSetBufferBytes follows Envoy's Buffer::copyFrom: (0, 0) prepends, (0, >= size)
// replaces, (>= size, _) appends; anything else is a bad argument.
func hostSetBufferBytes(vm *VM, a []uint64) status {
	if a[0] > bufMax {
		return statusBadArgument
	}
	buf, writable, st := vm.buffer(uint32(a[0]))
	if st != statusOK {
		return st
	}
	if !writable {
		return statusBadArgument
	}
	data, ok := vm.read(a[3], a[4])
	if !ok {
		return statusInvalidMemoryAccess
	}
	start, length := uint64(uint32(a[1])), uint64(uint32(a[2]))
	size := uint64(len(*buf))
	switch {
	case start == 0 && length == 0:
		*buf = append(data, *buf...)
	case start == 0 && length >= size:
		*buf = data
	case start >= size:
		*buf = append(*buf, data...)
	default:
		return statusBadArgument
	}
	return statusOK
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

// Metrics: ids carry their type in the low two bits, as Envoy's do.

func hostDefineMetric(vm *VM, a []uint64) status {
	typ := MetricType(uint32(a[0]))
	if typ > Histogram {
		return statusBadArgument
	}
	name, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m := vm.host.metrics.define(name, typ)
	if m == nil {
		return statusBadArgument
	}
	vm.metricSeq++
	id := vm.metricSeq<<2 | uint32(typ)
	vm.metricIDs[id] = m
	return vm.writeU32(a[3], id)
}

func hostIncrementMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	return vm.host.metrics.increment(m, int64(a[1]))
}

func hostRecordMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	return vm.host.metrics.record(m, a[1])
}

func hostGetMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	v, st := vm.host.metrics.read(m)
	if st != statusOK {
		return st
	}
	return vm.writeU64(a[1], v)
}

// Properties.

func hostGetProperty(vm *VM, a []uint64) status {
	raw, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	v, st := vm.property(strings.Split(raw, "\x00"))
	if st != statusOK {
		return st
	}
	return vm.copyOut(v, a[2], a[3])
}

// hostSetProperty stores a per-stream value (Envoy keeps it as "wasm."-prefixed filter
// state); the root context has no stream to hold it.
func hostSetProperty(vm *VM, a []uint64) status {
	path, ok1 := vm.readString(a[0], a[1])
	value, ok2 := vm.read(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	s := vm.effectiveStream()
	if s == nil {
		return statusNotFound
	}
	if s.props == nil {
		s.props = map[string][]byte{}
	}
	s.props[path] = value
	return statusOK
}
