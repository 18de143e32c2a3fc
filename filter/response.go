package main

import (
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
)

var upstreamAddress = newPropertyPath("upstream", "address")

// tailBytes of the response are kept to find usage in: vLLM puts it at the end of a JSON
// body and, in a stream, in a last chunk of its own when the request asked for it
// (stream_options.include_usage) or the engine forces it (manifests/README.md, "Outcomes
// of streamed requests"); a Messages stream's first chunk is read for its message_start
// too. Requests and responses are never rewritten for it, nor held back.
const tailBytes = 16 << 10

func (h *httpContext) OnHttpResponseHeaders(_ int, endOfStream bool) types.Action {
	if !h.placed {
		return types.ActionContinue
	}
	if s, err := h.p.mem.value.responseHeader(":status"); err == nil {
		h.status, _ = strconv.Atoi(s)
	}
	if endOfStream {
		h.p.router.Done(h.reqID)
		h.started(time.Time{})
		h.finish()
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	if !h.decided || h.finished {
		return types.ActionContinue
	}
	// The first byte of the body means prefill is done: for a stream it is the first
	// token (vLLM, like most servers, sends the headers before prefill even starts).
	// Requests routed least-queued have a ledger entry too. The start is kept (Started,
	// not Done) until no snapshot measured before it is used, so such a snapshot, which
	// still counts this prefill as queued, is corrected (route.Ledger).
	now := h.p.now()
	h.p.router.Started(h.reqID, now)
	h.started(now)
	if !h.placed {
		return types.ActionContinue
	}
	if !h.startSent {
		// The control plane counts the placement queued until it hears of its start
		// (controlplane/index/placed.go): engines do not say which requests wait.
		h.startSent = true
		start := route.Start(&h.report, now)
		h.shard.reports.enqueue(&start)
	}
	if bodySize > 0 {
		if chunk, err := h.p.mem.chunk.responseBody(bodySize); err == nil {
			if h.schema == prompt.Messages && !h.headRead {
				// Anthropic's message_delta may count only output tokens; the prompt's
				// are in message_start, at the head of a stream the tail may not reach.
				h.head, h.headOK = h.p.usage.FindUsage(chunk)
				h.headRead = true
			}
			if h.schema == prompt.Responses {
				h.learnResponseID(chunk, now)
			}
			h.tail = keepTail(h.tail, chunk)
		}
	}
	if endOfStream {
		h.finish()
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpStreamDone() {
	if h.heldFor != nil {
		h.p.dropHeld(h) // the client went away while it was held
	}
	h.p.router.Done(h.reqID)
	h.started(time.Time{})
	if h.placed && !h.finished {
		h.finish() // reset or aborted stream: report what is known
	}
	h.p.recycle(h)
}

// started tells the sibling VMs that the placement's prefill is no longer queued: it
// started at at, or (zero) the request ended without a first byte; they record it as
// this VM's ledger does (Started, or Done).
func (h *httpContext) started(at time.Time) {
	if h.shared != 0 {
		h.p.placed.started(h.shared, at)
		h.shared = 0
	}
}

// keepTail appends chunk and keeps at most the last tailBytes, trimming only when twice
// that has accumulated so streaming costs O(chunk) per chunk.
func keepTail(tail, chunk []byte) []byte {
	tail = append(tail, chunk...)
	if len(tail) > 2*tailBytes {
		n := copy(tail, tail[len(tail)-tailBytes:])
		tail = tail[:n]
	}
	return tail
}

// finish sends the outcome: which replica answered, with what status, and how much of
// the prompt it really had cached.
func (h *httpContext) finish() {
	h.finished = true
	p := h.p
	served := h.served()
	if h.schema == prompt.Responses && h.idSought >= 0 && h.status >= 200 && h.status < 300 {
		p.metrics.responseIDsMissed.Increment(1)
	}
	u, ok := p.usage.FindUsage(h.tail)
	if !ok && h.headOK {
		u, ok = h.head, true
	}
	var usage *prompt.Usage
	if ok {
		usage = &u
		p.metrics.outcomes.Increment(1)
	} else if h.status >= 200 && h.status < 300 {
		p.metrics.outcomesWithoutUsage.Increment(1)
	}
	r := route.Outcome(h.report, served, h.status, usage, p.now())
	h.tail = h.tail[:0]
	h.shard.reports.enqueue(&r)
}

// served is the replica that answered: the pick, or a retry target or the fallback's
// choice (Envoy's upstream address).
func (h *httpContext) served() string {
	p := h.p
	if up, err := p.mem.value.property(upstreamAddress); err == nil && len(up) > 0 && string(up) != h.first {
		return p.names.keep(string(up))
	}
	return h.first
}

// maxIDSearch bounds how far into a Responses body its id is looked for: vLLM sends it
// first (the body's first member, or the first event's response's).
const maxIDSearch = 4 << 10

// learnResponseID records, from a successful Responses answer's first chunks, which
// replica holds the response (affinity.go), so its follow-ups go there, from this proxy
// at once and from the others once the outcome report has reached the control plane.
func (h *httpContext) learnResponseID(chunk []byte, now time.Time) {
	if h.idSought < 0 || h.status < 200 || h.status >= 300 {
		return
	}
	if id := responseID(chunk); id != nil {
		key := api.AffinityKey(api.AffinityResponse, h.tenant, id)
		h.p.affinity.remember(key, h.served(), 0, now)
		// The outcome report carries the key to the control plane, which shares it with
		// the other proxies (api.AffinityPath).
		h.report.Affinity = key
		h.idSought = -1
		return
	}
	if h.idSought += len(chunk); h.idSought >= maxIDSearch {
		h.p.metrics.responseIDsMissed.Increment(1)
		h.idSought = -1
	}
}
