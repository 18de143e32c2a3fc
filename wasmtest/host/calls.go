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
	if len(h.cfg.CountCalls) == 0 && len(h.cfg.TimeCalls) == 0 {
		return ctx
	}
	h.calls = map[string]*atomic.Int64{}
	for _, name := range h.cfg.CountCalls {
		h.calls[name] = new(atomic.Int64)
	}
	h.timed = map[string]*callTime{}
	return experimental.WithFunctionListenerFactory(ctx, listenerFactory{counted: h.calls, timed: h.cfg.TimeCalls, host: h})
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
}

type callTime struct{ calls, nanos atomic.Int64 }

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
		out = append(out, CallTime{Name: name, Calls: t.calls.Load(), Total: time.Duration(t.nanos.Load())})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Total != out[j].Total {
			return out[i].Total > out[j].Total
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// ResetCallTimes zeroes the CallTimes (e.g. after a warm-up).
func (h *Host) ResetCallTimes() {
	h.timedMu.Lock()
	defer h.timedMu.Unlock()
	for _, t := range h.timed {
		t.calls.Store(0)
		t.nanos.Store(0)
	}
}

type listenerFactory struct {
	counted map[string]*atomic.Int64
	timed   []string // names, or prefixes ending in "*"
	host    *Host
}

// nameSection spells a Go function name as Go's wasm linker writes it in the module's
// name section: "github.com/x/y.(*T).M" is "github.com_x_y.__T_.M".
var nameSection = strings.NewReplacer("/", "_", "(*", "__", ")", "_", "(", "_")

func (f listenerFactory) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	name := def.Name()
	l := callListener{}
	_, l.count = f.counted[name]
	for _, t := range f.timed {
		t = nameSection.Replace(t)
		if t == name || strings.HasSuffix(t, "*") && strings.HasPrefix(name, t[:len(t)-1]) {
			l.time = true
			break
		}
	}
	if !l.count && !l.time {
		return nil
	}
	return l
}

type callListener struct{ count, time bool }

func (l callListener) Before(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
	vm, ok := ctx.Value(vmKey{}).(*VM)
	if !ok {
		return
	}
	if l.count {
		if n := vm.host.calls[def.Name()]; n != nil {
			n.Add(1)
		}
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
	d := time.Since(start)
	t := vm.host.timer(def.Name())
	t.calls.Add(1)
	t.nanos.Add(int64(d))
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
