package main

import (
	"runtime"
	"strings"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
)

// warmUp runs the request path's own code on made-up requests once, at plugin start, on
// a router of its own that is then dropped: nothing reaches the VM's router, its shared
// data, its metrics or a control plane.
//
// Envoy's V8 compiles a wasm function with TurboFan when it is first called
// (proxy-wasm-cpp-host src/v8/v8.cc sets --no-liftoff, and V8 compiles wasm lazily), so
// without this a VM's first routed request would compile the parser, the hasher, the
// match and the rule on the way, inside a user's request, on every worker of every proxy
// after each restart or plugin update. What is left for the first request is the
// filter's callbacks and host calls, which need a real stream (wasmtest/v8host, which
// sets the same flags, logs the first request's guest time: TestFilterOnCppHost3930b7b).
func warmUp(cfg api.Config) {
	const model = "kvroute-warmup"
	m, err := table.NewModel(model, table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4},
		[]table.Replica{
			{Slot: 0, ID: "a", Addr: "192.0.2.1:8000", Queued: 100, Speed: 20000, Healthy: true, StateAgeMs: 20},
			{Slot: 1, ID: "b", Addr: "192.0.2.2:8000", Queued: 900, Speed: 20000, Healthy: true, StateAgeMs: 20},
		})
	if err != nil {
		return
	}
	tb := table.New()
	tb.Models[model] = m
	r := route.NewRouter(cfg.RuleParams(), 1)
	r.Config = cfg
	r.Reuse = true
	system := strings.Repeat("Warm-up system prompt line, escaped \\\"quotes\\\" and a newline.\\n", 64)
	chat := func(q string) []byte {
		return []byte(`{"model":"` + model + `","stream":true,"messages":[{"role":"system","content":"` +
			system + `"},{"role":"user","content":"` + q + `"}]}`)
	}
	now := time.Unix(1_700_000_000, 0)
	// A new prompt, its repeat (the memos' hits) and one sharing its start, then a token
	// prompt: each a placement the next one matches through Local.
	bodies := []struct {
		schema prompt.Schema
		body   []byte
	}{
		{prompt.Chat, chat("a first question")},
		{prompt.Chat, chat("a first question")},
		{prompt.Chat, chat("a second, longer question that ends in another block of its own")},
		{prompt.Completions, []byte(`{"model":"` + model + `","prompt":[` + strings.Repeat("17,", 95) + `17]}`)},
		// The other APIs' parsers, on the same conversation.
		{prompt.Responses, []byte(`{"model":"` + model + `","instructions":"` + system + `","input":[{"role":"user","content":[{"type":"input_text","text":"a first question"}]}]}`)},
		{prompt.Messages, []byte(`{"model":"` + model + `","max_tokens":8,"system":[{"type":"text","text":"` + system + `"}],"messages":[{"role":"user","content":"a first question"}]}`)},
	}
	var buf []byte
	for i, b := range bodies {
		req := route.Request{ID: uint64(i + 1), Schema: b.schema, Body: b.body}
		d, res := r.Route(tb, &req, 0, now)
		if len(d.Addrs) > 0 {
			buf = res.Placement.AppendBinary(buf[:0])
			r.Started(req.ID, now)
		}
		now = now.Add(time.Millisecond)
	}
	var usage prompt.Parser
	usage.FindUsage([]byte(`data: {"usage":{"prompt_tokens":300,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":256}}}`))
	// The collector's code too: in the V8 host the VM's first collection, a few hundred
	// requests in, would spend nearly all its time compiling the runtime's GC and
	// large-allocation paths (node --cpu-prof: gcStart, gcDrainN, gcMarkDone,
	// gcMarkTermination, mallocgcLarge). A large allocation and a collection here
	// compile them, and the collection takes the warm-up's garbage with it.
	sink = make([]byte, 64<<10)
	sink = nil
	runtime.GC()
}

// sink keeps the warm-up's large allocation from being optimized away.
//
//lint:ignore U1000 written, never read: the write is what keeps the allocation
var sink []byte
