//go:build !wasm

package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// The fleet of the sizing example at its affinity size: 22 replicas, 200 customer prefixes of
// 6,000 tokens (about 24 KB each), every prefix held by one or two replicas. The request
// is an 8,000-token chat body (about 32 KB) that shares one of the prefixes.
func benchFleet(b testing.TB) (*table.Table, string) {
	tb, system, question := benchConversation(b)
	return tb, chat(system, question)
}

// benchConversation is benchFleet's fleet and its request's system prompt and question.
func benchConversation(b testing.TB) (*table.Table, string, string) {
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	rs := make([]table.Replica, 22)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), ID: fmt.Sprint("vllm-", i), Addr: fmt.Sprintf("10.1.0.%d:8000", i+1),
			Speed: 14025, Queued: uint64(i * 700 % 9000), KVUsage: 0.5, StateAgeMs: 40, Healthy: true}
	}
	m, err := table.NewModel("llama", cfg, rs)
	if err != nil {
		b.Fatal(err)
	}
	prefixOf := func(c int) string {
		return fmt.Sprintf("Customer %03d system prompt and tool schemas. ", c) + strings.Repeat(fmt.Sprintf("Policy clause for customer %03d. ", c), 750)
	}
	for c := 0; c < 200; c++ {
		for _, k := range checkpointsOf(&testing.T{}, cfg, chat(prefixOf(c), ""), "") {
			slots := []uint32{uint32(c % 22)}
			if c%5 == 0 {
				slots = append(slots, uint32((c+7)%22))
			}
			_ = m.Set(k, slots...)
		}
	}
	tb := table.New()
	tb.Version = 1
	tb.Models["llama"] = m
	question := strings.Repeat("Here is the customer's long ticket history and question. ", 140)
	return tb, prefixOf(42), question
}

// BenchmarkRequestPath: the 32 KB request and its answer through the SDK's emulator
// (headers, body, response headers and body, done), ticking every 32 requests. ns/op is
// the whole loop, the emulator's work included; filter-µs/op is the time inside the
// filter's callbacks alone (timedVM).
//
//	go test ./filter -run '^$' -bench RequestPath -benchmem
func BenchmarkRequestPath(b *testing.B) {
	tb, system, question := benchConversation(b)
	frame := table.EncodeFull(tb)
	// The same conversation in each API's form, side by side; a Responses answer's id is
	// learned from its first bytes (filter/affinity.go).
	apis := []struct{ name, path, body, resp string }{
		{"chat", "/v1/chat/completions", chat(system, question),
			`{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":8000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":5984}}}`},
		{"responses", "/v1/responses", responsesBody(system, question),
			`{"id":"resp_0123456789abcdef0123456789abcdef","object":"response","output":[],"usage":{"input_tokens":8000,"input_tokens_details":{"cached_tokens":5984},"output_tokens":1,"total_tokens":8001}}`},
		{"messages", "/v1/messages", messagesBody(system, question),
			`{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"model":"llama","stop_reason":"max_tokens","usage":{"input_tokens":8000,"output_tokens":1}}`},
	}
	for _, rt := range []string{"native", "wasm"} {
		for _, api := range apis {
			b.Run(rt+"/"+api.name, func(b *testing.B) { benchRequestPath(b, rt, frame, api.path, api.body, api.resp) })
		}
	}
}

// benchRequestPath is one sub-benchmark: the request on path with body, answered with
// respBody, through the runtime rt.
func benchRequestPath(b *testing.B, rt string, frame []byte, path, body, respBody string) {
	var vm types.VMContext = &vmContext{}
	if rt == "wasm" {
		vm = compiledVM(&testing.T{})
		if wasmErr != nil {
			b.Fatal(wasmErr)
		}
	}
	var spent time.Duration // in the filter's callbacks (timedVM)
	opt := proxytest.NewEmulatorOption().WithVMContext(timedVM{vm, &spent}).WithPluginConfiguration([]byte(testConfig))
	h, reset := proxytest.NewHostEmulator(opt)
	defer reset()
	if h.StartPlugin() != types.OnPluginStartStatusOK {
		b.Fatal("plugin did not start")
	}
	hh := host{h, &testing.T{}}
	hh.serveTable(frame)
	reqHeaders := [][2]string{{":method", "POST"}, {":path", path}, {":authority", "llm"}, {"content-type", "application/json"}}
	respHeaders := [][2]string{{":status", "200"}, {"content-type", "application/json"}}
	resp := []byte(respBody)
	bodyBytes := []byte(body)
	b.SetBytes(int64(len(bodyBytes)))
	b.ReportAllocs()
	var id uint32
	n := 0
	for i := 0; b.Loop(); i++ {
		if i == 0 {
			spent = 0
		}
		n++
		id = h.InitializeHttpContext()
		h.CallOnRequestHeaders(id, reqHeaders, false)
		h.CallOnRequestBody(id, bodyBytes, true)
		h.CallOnResponseHeaders(id, respHeaders, false)
		h.CallOnResponseBody(id, resp, true)
		h.CompleteHttpContext(id)
		if i%32 == 31 {
			// Envoy ticks every 100 ms: the leader drains the reports and the
			// control plane confirms the table (under the compiled module the
			// emulator's clock advances 1 ms per read, so this matters).
			b.StopTimer()
			hh.keepFresh()
			b.StartTimer()
		}
	}
	if got := endpoint(h.GetCurrentRequestHeaders(id)); !strings.HasPrefix(got, "10.1.0.21:8000") {
		b.Fatalf("routed to %q, want the owner of prefix 42 (slot 20) first", got)
	}
	b.ReportMetric(float64(spent.Nanoseconds())/1e3/float64(n), "filter-µs/op")
}

// BenchmarkLeaderTick: the leader's tick with the reports of 256 requests (768 reports:
// a placement, a start and an outcome each; what 2,600 requests/s queue in 100 ms, less
// than a fifth of them) waiting: it drains them and posts them. tick-p99-µs is over the ticks timed.
func BenchmarkLeaderTick(b *testing.B) {
	for _, rt := range []string{"native", "wasm"} {
		b.Run(rt, func(b *testing.B) {
			var vm types.VMContext = &vmContext{}
			if rt == "wasm" {
				vm = compiledVM(&testing.T{})
			}
			h, reset := benchHost(b, vm)
			defer reset()
			_, body := benchFleet(b)
			l := newRequestLoop(h, body)
			var times []time.Duration
			for b.Loop() {
				b.StopTimer()
				for range 256 {
					l.one()
				}
				n := len(h.callouts())
				b.StartTimer()
				start := time.Now()
				h.Tick()
				times = append(times, time.Since(start))
				b.StopTimer()
				for _, c := range h.callouts()[n:] {
					status := "204"
					if p, _ := header(c.Headers, ":path"); strings.HasPrefix(p, api.TablePath) {
						status = "304"
					}
					h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", status}}, nil, nil)
				}
				b.StartTimer()
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "tick-p99-µs")
		})
	}
}
