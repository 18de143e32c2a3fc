package host

import (
	"context"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// withCallCounters compiles a listener into the guest functions named by Config.CountCalls
// and Config.TimeCalls (and only those, so the rest of the module runs at full speed).
func (h *Host) withCallCounters(ctx context.Context) context.Context {
	if len(h.cfg.CountCalls) == 0 && len(h.cfg.TimeCalls) == 0 && len(h.cfg.CallSites) == 0 {
		return ctx
	}
	h.calls = map[string]*atomic.Int64{}
	for _, name := range h.cfg.CountCalls {
		h.calls[name] = new(atomic.Int64)
	}
	h.timed = map[string]*callTime{}
	h.sites = map[string]map[string]int64{}
	sited := map[string]bool{}
	for _, name := range h.cfg.CallSites {
		sited[nameSection.Replace(name)] = true
	}
	return experimental.WithFunctionListenerFactory(ctx, listenerFactory{counted: h.calls, timed: h.cfg.TimeCalls, sited: sited, host: h})
}

// hostCallCounter is the counter of the host function qualified ("env.proxy_log").
func (h *Host) hostCallCounter(qualified string) *atomic.Int64 {
	if h.hostCalls == nil {
		h.hostCalls = map[string]*atomic.Int64{}
	}
	c := h.hostCalls[qualified]
	if c == nil {
		c = new(atomic.Int64)
		h.hostCalls[qualified] = c
	}
	return c
}

// hostCallTimer is the timer of the host function qualified, nil unless
// Config.TimeHostCalls.
func (h *Host) hostCallTimer(qualified string) *callTime {
	if !h.cfg.TimeHostCalls {
		return nil
	}
	if h.hostTimes == nil {
		h.hostTimes = map[string]*callTime{}
	}
	t := h.hostTimes[qualified]
	if t == nil {
		t = &callTime{}
		h.hostTimes[qualified] = t
	}
	return t
}

// begin and end time one host call; a nil timer (not timing) does nothing.
func (t *callTime) begin() time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Now()
}

func (t *callTime) end(start time.Time) {
	if t != nil {
		t.add(time.Since(start))
	}
}

// add counts one call of d.
func (t *callTime) add(d time.Duration) {
	t.calls.Add(1)
	t.nanos.Add(int64(d))
	for m := t.max.Load(); int64(d) > m && !t.max.CompareAndSwap(m, int64(d)); m = t.max.Load() {
	}
}

// HostCallTimes returns the calls and time of every host function called so far (with
// Config.TimeHostCalls), by qualified name, most time first.
func (h *Host) HostCallTimes() []CallTime {
	var out []CallTime
	for name, t := range h.hostTimes {
		if n := t.calls.Load(); n > 0 {
			out = append(out, CallTime{Name: name, Calls: n, Total: time.Duration(t.nanos.Load()), Max: time.Duration(t.max.Load())})
		}
	}
	sortCallTimes(out)
	return out
}

// HostCalls returns how often the guest has called each host function so far, over all
// VMs, by qualified name ("env.proxy_get_shared_data", "wasi_snapshot_preview1.clock_time_get");
// functions never called are left out. The host's own calls into the guest (callbacks,
// proxy_on_memory_allocate) are not host functions: count those with Config.CountCalls.
func (h *Host) HostCalls() map[string]int64 {
	out := map[string]int64{}
	for name, c := range h.hostCalls {
		if n := c.Load(); n > 0 {
			out[name] = n
		}
	}
	return out
}

// CallSites returns, for the guest function name (one of Config.CallSites, as the
// module's name section spells it or as Go does), how often each call site called it:
// the site is the innermost three frames outside the Go runtime and the SDK's
// allocation callback, callee first ("main.(*placed).share < main.(*httpContext).route < ...").
func (h *Host) CallSites(name string) map[string]int64 {
	h.sitesMu.Lock()
	defer h.sitesMu.Unlock()
	out := map[string]int64{}
	for site, n := range h.sites[nameSection.Replace(name)] {
		out[site] = n
	}
	return out
}

// ResetCallSites zeroes the CallSites (e.g. after a warm-up).
func (h *Host) ResetCallSites() {
	h.sitesMu.Lock()
	defer h.sitesMu.Unlock()
	clear(h.sites)
}

// site names the call site of the current call: the innermost siteFrames frames below
// it that are not the Go runtime's (or the stack's bottom, the export the host called).
func site(it experimental.StackIterator) string {
	const siteFrames = 3
	var b strings.Builder
	n := 0
	it.Next() // the called function itself
	last := ""
	for it.Next() {
		name := it.Function().Definition().Name()
		last = name
		if strings.HasPrefix(name, "runtime.") || strings.HasPrefix(name, "internal_") || strings.HasPrefix(name, "internal/") {
			continue
		}
		if n > 0 {
			b.WriteString(" < ")
		}
		b.WriteString(name)
		if n++; n == siteFrames {
			break
		}
	}
	if n == 0 {
		return last // the runtime's own (a GC worker, a callback's wrapper)
	}
	return b.String()
}

// The compiled module (and its listeners) is shared by every host that loads the same
// module with the same listened functions (compileCache: wazero's module id covers which
// functions have a listener), so the listener finds the counters of the calling VM's host
// through the call's context rather than holding its own.

// Calls returns how often the guest function name (one of Config.CountCalls) has been
// called, over all VMs; -1 for a name that is not counted.
func (h *Host) Calls(name string) int64 {
	c, ok := h.calls[name]
	if !ok {
		return -1
	}
	return c.Load()
}

// CallTime is what Host.CallTimes reports for one guest function of Config.TimeCalls.
type CallTime struct {
	Name  string
	Calls int64
	// Total is the wall time from entry to return, callees included (a recursive
	// function counts its nested calls again).
	Total time.Duration
	// Max is the longest single call: what a tail (a tick's p99) is made of.
	Max time.Duration
}

type callTime struct{ calls, nanos, max atomic.Int64 }

// CallTimes returns the calls and inclusive time of every guest function of
// Config.TimeCalls called so far (named as in the module's name section), over all VMs,
// most time first: a profile of where the
// guest spends its time, for the functions chosen (e.g. a callback's top-level steps,
// or "runtime.mallocgc" and "runtime.gcStart" for the allocator and the GC).
func (h *Host) CallTimes() []CallTime {
	h.timedMu.Lock()
	defer h.timedMu.Unlock()
	out := make([]CallTime, 0, len(h.timed))
	for name, t := range h.timed {
		out = append(out, CallTime{Name: name, Calls: t.calls.Load(), Total: time.Duration(t.nanos.Load()), Max: time.Duration(t.max.Load())})
	}
	sortCallTimes(out)
	return out
}

func sortCallTimes(out []CallTime) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Total != out[j].Total {
			return out[i].Total > out[j].Total
		}
		return out[i].Name < out[j].Name
	})
}

// ResetCallTimes zeroes the CallTimes (e.g. after a warm-up).
func (h *Host) ResetCallTimes() {
	h.timedMu.Lock()
	defer h.timedMu.Unlock()
	for _, t := range h.timed {
		t.reset()
	}
	for _, t := range h.hostTimes {
		t.reset()
	}
}

func (t *callTime) reset() {
	t.calls.Store(0)
	t.nanos.Store(0)
	t.max.Store(0)
}

type listenerFactory struct {
	counted map[string]*atomic.Int64
	timed   []string // names, or prefixes ending in "*"
	sited   map[string]bool
	host    *Host
}

// nameSection spells a Go function name as Go's wasm linker writes it in the module's
// name section: "github.com/x/y.(*T).M" is "github.com_x_y.__T_.M".
var nameSection = strings.NewReplacer("/", "_", "(*", "__", ")", "_", "(", "_")

func (f listenerFactory) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	name := def.Name()
	l := callListener{}
	_, l.count = f.counted[name]
	l.site = f.sited[name]
	for _, t := range f.timed {
		t = nameSection.Replace(t)
		if t == name || strings.HasSuffix(t, "*") && strings.HasPrefix(name, t[:len(t)-1]) {
			l.time = true
			break
		}
	}
	if !l.count && !l.time && !l.site {
		return nil
	}
	return l
}

type callListener struct{ count, time, site bool }

func (l callListener) Before(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, it experimental.StackIterator) {
	vm, ok := ctx.Value(vmKey{}).(*VM)
	if !ok {
		return
	}
	if l.count {
		if n := vm.host.calls[def.Name()]; n != nil {
			n.Add(1)
		}
	}
	if l.site {
		s := site(it)
		h := vm.host
		h.sitesMu.Lock()
		m := h.sites[def.Name()]
		if m == nil {
			m = map[string]int64{}
			h.sites[def.Name()] = m
		}
		m[s]++
		h.sitesMu.Unlock()
	}
	if l.time {
		// A VM runs one callback at a time (vm.mu), so its calls nest on one stack.
		vm.callStarts = append(vm.callStarts, time.Now())
	}
}

func (l callListener) After(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64) {
	if l.time {
		l.done(ctx, def)
	}
}

func (l callListener) Abort(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ error) {
	if l.time {
		l.done(ctx, def)
	}
}

func (callListener) done(ctx context.Context, def api.FunctionDefinition) {
	vm, ok := ctx.Value(vmKey{}).(*VM)
	if !ok || len(vm.callStarts) == 0 {
		return
	}
	start := vm.callStarts[len(vm.callStarts)-1]
	vm.callStarts = vm.callStarts[:len(vm.callStarts)-1]
	vm.host.timer(def.Name()).add(time.Since(start))
}

func (h *Host) timer(name string) *callTime {
	h.timedMu.Lock()
	defer h.timedMu.Unlock()
	t := h.timed[name]
	if t == nil {
		t = new(callTime)
		h.timed[name] = t
	}
	return t
}
