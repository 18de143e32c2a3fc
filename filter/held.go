package main

import (
	"slices"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/route"
)

// Requests held for their model's first table, within first_table_wait_ms of the
// plugin's start (shared/route/hold.go). A request is held only once it is whole (end of
// stream seen, in the headers, body or trailers callback), so the stream it pauses has
// no chunk left to arrive: resuming it with proxy_continue_stream is then the path Envoy
// handles without loss (the chunk loss request.go describes needs a chunk after the
// resume). Each tick, after the tables are caught up with shared data, every held
// request whose table arrived, or every one once the wait has passed, is routed on the
// effective context of its stream (whose headers and buffered body Envoy keeps while it
// is paused: Context::getMap and getBuffer in source/extensions/common/wasm/context.cc)
// and resumed; a stream that ends while held is dropped from the list
// (OnHttpStreamDone).

// holdForTable reports whether route holds h, whose routing found no table (res):
// whole, not refused, its model served by a shard whose table this worker has not
// loaded, and route.HoldForTable agrees. It adds h to the held list and counts it.
func (h *httpContext) holdForTable(res *route.Result, now time.Time) bool {
	p := h.p
	s := p.routed
	if !h.whole || res.Action != route.Unrouted || res.Refused != route.NotRefused || s == nil || s.view.loaded {
		return false
	}
	if !route.HoldForTable(now.Sub(p.started), p.cfg.FirstTableWait(), len(p.held), false) {
		return false
	}
	h.heldFor = s
	p.held = append(p.held, h)
	p.metrics.heldForTable.Increment(1)
	return true
}

// releaseHeld routes and resumes the held requests whose table arrived, or all of them
// once the wait since the plugin started passed (each tick, after shardSet.sync) or
// when all is set; the others stay held, in order.
func (p *plugin) releaseHeld(now time.Time, all bool) {
	if len(p.held) == 0 {
		return
	}
	expired := all || !route.HoldForTable(now.Sub(p.started), p.cfg.FirstTableWait(), 0, true)
	var due []*httpContext
	kept := p.held[:0]
	for _, h := range p.held {
		if expired || h.heldFor.view.loaded {
			due = append(due, h)
			continue
		}
		kept = append(kept, h)
	}
	clear(p.held[len(kept):])
	p.held = kept
	for _, h := range due {
		h.release()
	}
}

// release routes h, now off the held list, on its table or (the wait passed) leaves it
// to Envoy, and resumes its stream unless routing answered it locally.
func (h *httpContext) release() {
	h.heldFor = nil
	if err := proxywasm.SetEffectiveContext(h.contextID); err != nil {
		// The stream is gone without OnHttpStreamDone reaching us (it would have
		// dropped h from the list): nothing to resume.
		proxywasm.LogWarnf("kvroute: a request held for the first table has no stream to resume: %v", err)
		return
	}
	h.whole = false // routed now, on whatever table it finds
	body, err := h.wholeBody()
	if h.decide(body, err) {
		return // answered locally
	}
	if err := proxywasm.ResumeHttpRequest(); err != nil {
		proxywasm.LogCriticalf("kvroute: cannot resume a request held for the first table: %v", err)
	}
}

// OnPluginDone: the plugin is being removed (a configuration update, or the proxy
// shutting down) and its ticks end, so the requests it holds go now, routed on what it
// has, rather than wait for a tick that will not come.
func (p *plugin) OnPluginDone() bool {
	p.releaseHeld(p.now(), true)
	return true
}

// dropHeld takes h off the held list: its stream ended while held.
func (p *plugin) dropHeld(h *httpContext) {
	if i := slices.Index(p.held, h); i >= 0 {
		p.held = slices.Delete(p.held, i, i+1)
	}
}
