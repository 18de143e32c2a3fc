package host

import (
	"context"
	"sync/atomic"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// withCallCounters compiles a listener into the guest functions named by Config.CountCalls
// (and only those, so the rest of the module runs at full speed).
func (h *Host) withCallCounters(ctx context.Context) context.Context {
	if len(h.cfg.CountCalls) == 0 {
		return ctx
	}
	h.calls = map[string]*atomic.Int64{}
	for _, name := range h.cfg.CountCalls {
		h.calls[name] = new(atomic.Int64)
	}
	return experimental.WithFunctionListenerFactory(ctx, callCounters(h.calls))
}

// The compiled module (and its listeners) is shared by every host that loads the same
// module with the same counted names (compileCache), so the listener finds the counters
// of the calling VM's host through the call's context rather than holding its own.

// Calls returns how often the guest function name (one of Config.CountCalls) has been
// called, over all VMs; -1 for a name that is not counted.
func (h *Host) Calls(name string) int64 {
	c, ok := h.calls[name]
	if !ok {
		return -1
	}
	return c.Load()
}

type callCounters map[string]*atomic.Int64

func (c callCounters) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	if _, ok := c[def.Name()]; ok {
		return callCounter{}
	}
	return nil
}

type callCounter struct{}

func (callCounter) Before(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
	if vm, ok := ctx.Value(vmKey{}).(*VM); ok {
		if n := vm.host.calls[def.Name()]; n != nil {
			n.Add(1)
		}
	}
}
func (callCounter) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {}
func (callCounter) Abort(context.Context, api.Module, api.FunctionDefinition, error)    {}
