package host

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// VM is one worker VM: a module instance with its root context. It runs one callback at a
// time; different VMs run in parallel, as Envoy's worker threads do.
type VM struct {
	host  *Host
	index int
	mod   api.Module
	mem   api.Memory
	ctx   context.Context // carries the VM to the host functions
	fn    guestFuncs
	err   *lineWriter // guest stderr
	rand  io.Reader   // WASI random_get

	mu          sync.Mutex // one callback at a time; guards everything below
	stack       [8]uint64
	allocStack  [1]uint64
	failed      error
	stopped     bool
	rootID      uint32
	nextID      uint32
	streams     map[uint32]*Stream
	effective   uint32            // context the host functions act on (proxy_set_effective_context)
	lastCall    time.Duration     // duration of the last guest callback
	after       []afterAction     // stream work deferred until the callback returns (cpp-host addAfterVmCallAction)
	callResp    *callResponse     // the HTTP-call response being delivered
	configuring bool              // inside proxy_on_configure: the plugin configuration is readable
	status      callStatus        // proxy_get_status: outcome of the last HTTP call delivered
	tickPeriod  time.Duration     // per root context (one root context per VM here)
	tickTimer   clock.Timer       //
	tickGen     uint64            // bumped on every period change, so a stale timer does nothing
	nextCallout uint32            //
	callouts    map[uint32]func() // pending HTTP calls -> cancel
	metricIDs   map[uint32]*metric
	metricSeq   uint32
	allowed     map[string]bool // host calls allowed in a restricted callback; nil: all
	ticks       atomic.Uint64   // proxy_on_tick calls delivered
	callStarts  []time.Time     // entry times of the timed guest calls in progress (Config.TimeCalls)
	tickTimes   []time.Duration // how long each proxy_on_tick ran (the first maxTickTimes)
}

type vmKey struct{}

type guestFuncs struct {
	initialize, vmStart, contextCreate, configure, done, delete, log api.Function
	requestHeaders, requestBody, requestTrailers                     api.Function
	responseHeaders, responseBody, responseTrailers                  api.Function
	httpCallResponse, queueReady, tick, malloc                       api.Function
}

type callStatus struct {
	code    uint32
	message string
}

// afterAction is stream work a host function asked for during a callback.
type afterAction struct {
	stream *Stream
	ev     streamEvent
}

func (h *Host) newVM(ctx context.Context, compiled wazero.CompiledModule, i int) (*VM, error) {
	vm := &VM{
		host:      h,
		index:     i,
		rootID:    1,
		nextID:    2,
		streams:   map[uint32]*Stream{},
		callouts:  map[uint32]func(){},
		metricIDs: map[uint32]*metric{},
	}
	vm.ctx = context.WithValue(context.Background(), vmKey{}, vm)
	// fd_write logs each call itself (wasi.go); this only keeps what the guest last wrote
	// to stderr, for the message of a VM that fails.
	vm.err = &lineWriter{}
	vm.rand = h.cfg.Rand(i)

	mc := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("vm-%d", i)).
		WithStartFunctions() // _initialize runs below, under the VM lock, with failures reported
	mod, err := h.runtime.InstantiateModule(withReservedMemory(ctx), compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("vm %d: instantiate: %w", i, err)
	}
	vm.mod = mod
	vm.mem = mod.Memory()
	if vm.mem == nil {
		return nil, fmt.Errorf("vm %d: plugin exports no memory", i)
	}
	f := mod.ExportedFunction
	vm.fn = guestFuncs{
		initialize:       f("_initialize"),
		vmStart:          f("proxy_on_vm_start"),
		contextCreate:    f("proxy_on_context_create"),
		configure:        f("proxy_on_configure"),
		done:             f("proxy_on_done"),
		delete:           f("proxy_on_delete"),
		log:              f("proxy_on_log"),
		requestHeaders:   f("proxy_on_request_headers"),
		requestBody:      f("proxy_on_request_body"),
		requestTrailers:  f("proxy_on_request_trailers"),
		responseHeaders:  f("proxy_on_response_headers"),
		responseBody:     f("proxy_on_response_body"),
		responseTrailers: f("proxy_on_response_trailers"),
		httpCallResponse: f("proxy_on_http_call_response"),
		queueReady:       f("proxy_on_queue_ready"),
		tick:             f("proxy_on_tick"),
		malloc:           f("proxy_on_memory_allocate"),
	}
	if vm.fn.malloc == nil {
		vm.fn.malloc = f("malloc")
	}
	if vm.fn.malloc == nil {
		return nil, fmt.Errorf("vm %d: plugin exports neither proxy_on_memory_allocate nor malloc", i)
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	// cpp-host src/wasm.cc startVm: _initialize runs with restricted callbacks.
	vm.allowed = h.profile.startAllow
	_, err = vm.invoke(vm.fn.initialize, 0)
	vm.allowed = nil
	if err != nil {
		return nil, fmt.Errorf("vm %d: _initialize: %w", i, vm.failed)
	}
	return vm, nil
}

// checkRestricted traps a host call that the current restricted callback does not allow,
// as cpp-host's V8 integration does (src/v8/v8.cc: trap("restricted_callback")).
func (vm *VM) checkRestricted(qualified string) {
	if vm.allowed != nil && !vm.allowed[qualified] {
		panic(fmt.Sprintf("restricted_callback: %s is not allowed here (host profile %s)", qualified, vm.host.profile))
	}
}

// start runs the plugin lifecycle Envoy runs on each worker when the plugin is configured:
// proxy_on_context_create for the root context, then proxy_on_vm_start with the root
// context's id (cpp-host src/context.cc ContextBase::onStart), then proxy_on_configure
// (ContextBase::onConfigure).
func (vm *VM) start() error {
	h := vm.host
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if _, err := vm.invoke(vm.fn.contextCreate, vm.rootID, uint64(vm.rootID), 0); err != nil {
		return fmt.Errorf("vm %d: proxy_on_context_create (root): %w", vm.index, vm.failed)
	}
	ok, err := vm.invoke(vm.fn.vmStart, vm.rootID, uint64(vm.rootID), uint64(len(h.cfg.VMConfig)))
	if err != nil {
		return fmt.Errorf("vm %d: proxy_on_vm_start: %w", vm.index, vm.failed)
	}
	if vm.fn.vmStart != nil && uint32(ok) == 0 {
		return fmt.Errorf("vm %d: proxy_on_vm_start returned false%s", vm.index, vm.logTail())
	}
	vm.configuring = true
	ok, err = vm.invoke(vm.fn.configure, vm.rootID, uint64(vm.rootID), uint64(len(h.cfg.PluginConfig)))
	vm.configuring = false
	if err != nil {
		return fmt.Errorf("vm %d: proxy_on_configure: %w", vm.index, vm.failed)
	}
	if vm.fn.configure != nil && uint32(ok) == 0 {
		return fmt.Errorf("vm %d: proxy_on_configure returned false%s", vm.index, vm.logTail())
	}
	vm.after = nil // no stream exists yet
	return nil
}

// stop ends the root context (proxy_on_done, proxy_on_delete) and all timers.
func (vm *VM) stop() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.stopped {
		return
	}
	vm.stopTimers()
	if vm.failed == nil {
		_, _ = vm.invoke(vm.fn.done, vm.rootID, uint64(vm.rootID))
		_, _ = vm.invoke(vm.fn.delete, vm.rootID, uint64(vm.rootID))
	}
	vm.stopped = true
	vm.after = nil
}

func (vm *VM) stopTimers() {
	vm.tickGen++
	vm.tickPeriod = 0
	if vm.tickTimer != nil {
		vm.tickTimer.Stop()
		vm.tickTimer = nil
	}
	for token, cancel := range vm.callouts {
		cancel()
		delete(vm.callouts, token)
	}
}

// Ticks returns how many proxy_on_tick callbacks the VM has run, so a test can wait for
// every VM's next tick instead of sleeping through a tick period.
func (vm *VM) Ticks() uint64 { return vm.ticks.Load() }

// maxTickTimes bounds TickDurations: about 27 minutes of 100 ms ticks.
const maxTickTimes = 1 << 14

// TickDurations returns how long each proxy_on_tick callback ran in the guest (the first
// 16,384 ticks), oldest first: a tick blocks its worker thread for that long.
func (vm *VM) TickDurations() []time.Duration {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]time.Duration(nil), vm.tickTimes...)
}

// Index returns the VM's position in the host.
func (vm *VM) Index() int { return vm.index }

// RootContextID returns the id of the VM's root (plugin) context.
func (vm *VM) RootContextID() uint32 { return vm.rootID }

// Failed returns why the VM failed, or nil while it is healthy.
func (vm *VM) Failed() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.failed
}

// invoke runs one guest callback. The caller holds vm.mu. A trap fails the VM for good.
func (vm *VM) invoke(fn api.Function, contextID uint32, args ...uint64) (uint64, error) {
	if vm.failed != nil {
		return 0, vm.failed
	}
	if fn == nil || vm.stopped {
		return 0, nil
	}
	stack := vm.stack[:]
	copy(stack, args)
	vm.effective = contextID
	var err error
	if vm.host.cfg.CPUTime {
		var c threadClock
		c.begin()
		err = fn.CallWithStack(vm.ctx, stack)
		vm.lastCall = c.end()
	} else {
		start := time.Now()
		err = fn.CallWithStack(vm.ctx, stack)
		vm.lastCall = time.Since(start)
	}
	vm.effective = 0
	vm.host.stats.callbacks.Add(1)
	if err != nil {
		vm.fail(fmt.Errorf("%s: %w", fn.Definition().Name(), err))
		return 0, vm.failed
	}
	return stack[0], nil
}

// fail marks the VM failed after a trap. Like Envoy with FAIL_OPEN, the streams it holds
// continue without the filter, and so will every later stream on it.
func (vm *VM) fail(err error) {
	if vm.failed != nil {
		return
	}
	vm.failed = fmt.Errorf("vm %d failed: %w%s", vm.index, err, vm.logTail())
	vm.host.stats.vmFailures.Add(1)
	vm.host.logs.add(vm.host.clock.Now(), vm.index, LevelCritical, vm.failed.Error())
	vm.stopTimers()
	for _, s := range vm.streams {
		vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evFailOpen}})
	}
}

// logTail returns the end of the guest's stderr (a Go panic message lands there).
func (vm *VM) logTail() string {
	if t := vm.err.tail(); t != "" {
		return "; guest stderr: " + t
	}
	return ""
}

func (vm *VM) takeAfter() []afterAction {
	acts := vm.after
	vm.after = nil
	return acts
}

// runAfter hands deferred stream work to the streams, now that the VM is free. Work for
// self is returned to the caller, which is already running that stream.
func runAfter(acts []afterAction, self *Stream) (own []streamEvent) {
	for _, a := range acts {
		if a.stream == self {
			own = append(own, a.ev)
			continue
		}
		a.stream.post(a.ev)
	}
	return own
}

// rootCallback runs f (which calls the guest on the root context) with the VM locked.
func (vm *VM) rootCallback(f func()) {
	vm.mu.Lock()
	if vm.failed != nil || vm.stopped {
		vm.mu.Unlock()
		return
	}
	f()
	acts := vm.takeAfter()
	vm.mu.Unlock()
	runAfter(acts, nil)
}

// setTickPeriod is proxy_set_tick_period_milliseconds: as in Envoy the first tick comes one
// period later and the timer is re-armed after each proxy_on_tick returns.
func (vm *VM) setTickPeriod(period time.Duration) {
	vm.tickGen++
	if vm.tickTimer != nil {
		vm.tickTimer.Stop()
		vm.tickTimer = nil
	}
	vm.tickPeriod = period
	if period > 0 {
		vm.armTick()
	}
}

func (vm *VM) armTick() {
	gen := vm.tickGen
	vm.tickTimer = vm.host.clock.AfterFunc(vm.tickPeriod, func() { vm.onTick(gen) })
}

func (vm *VM) onTick(gen uint64) {
	vm.rootCallback(func() {
		if gen != vm.tickGen || vm.tickPeriod <= 0 {
			return
		}
		vm.tickTimer = nil
		_, _ = vm.invoke(vm.fn.tick, vm.rootID, uint64(vm.rootID))
		vm.ticks.Add(1)
		if len(vm.tickTimes) < maxTickTimes {
			vm.tickTimes = append(vm.tickTimes, vm.lastCall)
		}
		if vm.failed == nil && !vm.stopped && gen == vm.tickGen && vm.tickPeriod > 0 {
			vm.armTick()
		}
	})
}

// deliverQueueReady is proxy_on_queue_ready on the context that registered the queue.
func (vm *VM) deliverQueueReady(contextID, token uint32) {
	vm.rootCallback(func() {
		if contextID != vm.rootID {
			return
		}
		_, _ = vm.invoke(vm.fn.queueReady, vm.rootID, uint64(contextID), uint64(token))
	})
}

// deliverCallResponse is proxy_on_http_call_response on the root context.
func (vm *VM) deliverCallResponse(token uint32, resp *callResponse) {
	vm.rootCallback(func() {
		if _, ok := vm.callouts[token]; !ok {
			return // cancelled
		}
		delete(vm.callouts, token)
		vm.callResp = resp
		vm.status = callStatus{}
		if resp.reset {
			vm.status = callStatus{code: uint32(statusBrokenConnection), message: "reset"}
		}
		_, _ = vm.invoke(vm.fn.httpCallResponse, vm.rootID, uint64(vm.rootID), uint64(token),
			uint64(len(resp.headers)), uint64(len(resp.body)), uint64(len(resp.trailers)))
		vm.callResp = nil
	})
}

// effectiveStream is the stream the current host call acts on, nil for the root context.
func (vm *VM) effectiveStream() *Stream {
	if vm.effective == vm.rootID {
		return nil
	}
	return vm.streams[vm.effective]
}

// nanotime is the guest's monotonic clock: host-clock time since the host started, plus
// one second because Go's runtime refuses a monotonic clock that reads zero.
func (h *Host) nanotime() int64 {
	return int64(h.clock.Now().Sub(h.start)) + int64(time.Second)
}
