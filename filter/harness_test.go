//go:build !wasm

// The tests run on the build machine; the compiled module runs under wazero there.

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// Every filter test runs twice: natively (the plugin's Go code calling the SDK's host
// emulator) and on the compiled kvroute.wasm under wazero behind the same emulator. The
// emulator's host state is in this process either way, so tests read and write shared
// data through the SDK's own functions.

var (
	wasmOnce sync.Once
	wasmVM   proxytest.WasmVMContext
	wasmErr  error
)

// compiledVM compiles the module once per test binary (about a second); each test gets
// a fresh emulator, and with it a fresh root context, on top of it.
func compiledVM(t *testing.T) types.VMContext {
	wasmOnce.Do(func() {
		var path string
		if path, wasmErr = wasmbuild.Filter(); wasmErr != nil {
			return
		}
		var b []byte
		if b, wasmErr = os.ReadFile(path); wasmErr != nil {
			return
		}
		wasmVM, wasmErr = proxytest.NewWasmVMContext(b)
	})
	require.NoError(t, wasmErr)
	return wasmVM
}

func eachRuntime(t *testing.T, f func(t *testing.T, vm types.VMContext)) {
	t.Run("native", func(t *testing.T) { f(t, &vmContext{}) })
	t.Run("wasm", func(t *testing.T) { f(t, compiledVM(t)) })
}

// testConfig polls on the tick (wait_ms -1): the emulator numbers a call by how many are
// outstanding, so a poll dispatched from a response callback can share its id with a
// later report post. The long poll has its own tests (longpoll_test.go).
const testConfig = `{
	"control_plane": {"cluster": "outbound|8080||cp.kvroute.svc.cluster.local", "authority": "cp.kvroute.svc.cluster.local", "poll_ms": 100, "report_ms": 100, "wait_ms": -1},
	"tenants": {"source": "header", "header": "x-tenant", "secret": "s3cret", "policies": {"acme": "isolated"}, "inject_cache_salt": true},
	"adapters": {"llama-sql-lora": "llama"},
	"max_body_bytes": 65536
}`

// neverHold is cfg with first_table_wait_ms -1: a request before the first table is
// left to Envoy at once, as the tests of that path want (held_test.go holds them).
func neverHold(cfg string) string {
	return strings.Replace(cfg, "{", `{"first_table_wait_ms": -1,`, 1)
}

type host struct {
	proxytest.HostEmulator
	t *testing.T
}

func start(t *testing.T, vm types.VMContext, cfg string) host {
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
	h, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	require.Equal(t, types.OnPluginStartStatusOK, h.StartPlugin(), "errors: %v", h.GetCriticalLogs())
	return host{h, t}
}

// callouts returns the http calls the root context made so far.
func (h host) callouts() []proxytest.HttpCalloutAttribute {
	return h.GetCalloutAttributesFromContext(proxytest.PluginContextID)
}

func header(hs [][2]string, name string) (string, bool) {
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// lastCallout returns the newest call to path (query ignored).
func (h host) lastCallout(path string) (proxytest.HttpCalloutAttribute, bool) {
	cs := h.callouts()
	for i := len(cs) - 1; i >= 0; i-- {
		p, _ := header(cs[i].Headers, ":path")
		if strings.SplitN(p, "?", 2)[0] == path {
			return cs[i], true
		}
	}
	return proxytest.HttpCalloutAttribute{}, false
}

// serveTable makes the filter's leader poll and answers with frame.
func (h host) serveTable(frame []byte) {
	h.t.Helper()
	n := len(h.callouts())
	h.Tick()
	cs := h.callouts()
	require.Greater(h.t, len(cs), n, "the leader polls on its tick")
	var poll *proxytest.HttpCalloutAttribute
	for i := n; i < len(cs); i++ {
		if p, _ := header(cs[i].Headers, ":path"); strings.HasPrefix(p, api.TablePath) {
			poll = &cs[i]
		}
	}
	require.NotNil(h.t, poll, "a table poll among the calls")
	h.refuseAffinity(n)
	if frame == nil {
		h.CallOnHttpCallResponse(poll.CalloutID, [][2]string{{":status", "304"}}, nil, nil)
		return
	}
	h.CallOnHttpCallResponse(poll.CalloutID, [][2]string{{":status", "200"}, {"content-type", api.TableContentType}}, nil, frame)
}

// refuseAffinity answers the affinity polls among the calls made since the first n as a
// control plane that does not serve them (404): the leader then leaves them for a minute,
// and tests of other things see only their own calls.
func (h host) refuseAffinity(n int) {
	for _, c := range h.callouts()[n:] {
		if p, _ := header(c.Headers, ":path"); strings.HasPrefix(p, api.AffinityPath) {
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "404"}}, nil, nil)
		}
	}
}

// keepFresh is one tick of a control plane that has nothing new: table polls get 304,
// report posts get 204, and it serves neither affinity nor shares (404).
func (h host) keepFresh() { h.tickAnswering(nil) }

// tickAnswering is keepFresh with each shares post (api.SharesPath) answered, when shares
// is set, with the status it returns for the post's body and an empty fleet.
func (h host) tickAnswering(shares func(body []byte) string) {
	n := len(h.callouts())
	h.Tick()
	for _, c := range h.callouts()[n:] {
		status := "204"
		var body []byte
		switch p, _ := header(c.Headers, ":path"); {
		case strings.HasPrefix(p, api.TablePath):
			status = "304"
		case strings.HasPrefix(p, api.AffinityPath), p == api.SharesPath && shares == nil:
			status = "404" // a control plane without it: not asked again for a minute
		case p == api.SharesPath:
			status, body = shares(c.Body), api.AppendShares(nil, nil)
		}
		h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", status}}, nil, body)
	}
}

// reports makes the leader post queued reports and returns them.
func (h host) reports() []api.Report {
	h.t.Helper()
	n := len(h.callouts())
	h.Tick()
	var out []api.Report
	for _, c := range h.callouts()[n:] {
		if p, _ := header(c.Headers, ":path"); p != api.ReportsPath {
			continue
		}
		rb, rejected, err := api.ParseReportBatch(c.Body)
		require.NoError(h.t, err, "the filter posts report batches")
		require.Empty(h.t, rejected, "the filter posts only valid reports")
		out = append(out, rb.Reports...)
		h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "204"}}, nil, nil)
	}
	return out
}

type request struct {
	path, method string
	headers      [][2]string
	body         string
	// declaredOversized: headers carry a content-length above max_body_bytes, so the
	// filter does not hold them.
	declaredOversized bool
}

func chat(system, question string) string {
	return fmt.Sprintf(`{"model":"llama","stream":false,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, question)
}

// responsesBody and messagesBody are chat(system, question) in the Responses and the
// Messages API's forms.
func responsesBody(system, question string) string {
	return fmt.Sprintf(`{"model":"llama","instructions":%q,"input":[{"role":"user","content":[{"type":"input_text","text":%q}]}]}`, system, question)
}

func messagesBody(system, question string) string {
	return fmt.Sprintf(`{"model":"llama","max_tokens":64,"system":[{"type":"text","text":%q}],"messages":[{"role":"user","content":%q}]}`, system, question)
}

// send runs a request through the request callbacks, the body in chunks as Envoy
// would deliver it, and returns the context id and the final request headers.
func (h host) send(r request) (uint32, [][2]string) {
	h.t.Helper()
	id, action := h.exchange(r)
	require.Equal(h.t, types.ActionContinue, action, "the request continues")
	return id, h.GetCurrentRequestHeaders(id)
}

// exchange sends r's headers and body, in 16 KiB chunks, and returns the last action: a
// request refused with a local reply ends paused (GetSentLocalResponse has the reply).
func (h host) exchange(r request) (uint32, types.Action) {
	h.t.Helper()
	if r.method == "" {
		r.method = "POST"
	}
	if r.path == "" {
		r.path = "/v1/chat/completions"
	}
	id := h.InitializeHttpContext()
	hs := append([][2]string{{":method", r.method}, {":path", r.path}, {":authority", "llm"}, {"content-type", "application/json"}}, r.headers...)
	action := h.CallOnRequestHeaders(id, hs, r.body == "")
	if r.body == "" || h.GetSentLocalResponse(id) != nil {
		return id, action
	}
	if _, routable := prompt.SchemaForPath(r.path); routable && r.method == "POST" && !r.declaredOversized {
		require.Equal(h.t, types.ActionPause, action, "headers are held until the body is in")
	}
	b := []byte(r.body)
	const chunk = 16 << 10
	for off := 0; off < len(b); off += chunk {
		end := min(off+chunk, len(b))
		action = h.CallOnRequestBody(id, b[off:end], end == len(b))
		if h.GetSentLocalResponse(id) != nil {
			break
		}
		if end < len(b) && action == types.ActionContinue {
			break // the filter stopped buffering (oversized body)
		}
	}
	return id, action
}

func endpoint(hs [][2]string) string {
	v, _ := header(hs, api.DefaultEndpointHeader)
	return v
}

// fleet builds a table of n replicas of model "llama"; hold lists, per slot, the chat
// bodies whose prefixes that replica holds (as placement reports would record them).
func fleet(t *testing.T, version uint64, n int, queued []uint64, hold map[uint32][]string) *table.Table {
	return modelTable(t, newTable(version), "llama", 1, n, queued, hold)
}

func newTable(version uint64) *table.Table {
	tb := table.New()
	tb.Version, tb.GeneratedMs = version, time.Now().UnixMilli()
	return tb
}

// modelTable adds model's n replicas, at 10.<net>.0.<i+1>:8000, to tb: queued tokens
// per replica (nil: none) and, per slot, the bodies whose prefixes it holds.
func modelTable(t *testing.T, tb *table.Table, model string, net, n int, queued []uint64, hold map[uint32][]string) *table.Table {
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	rs := make([]table.Replica, n)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), ID: fmt.Sprint("vllm-", i), Addr: fmt.Sprintf("10.%d.0.%d:8000", net, i+1),
			Speed: 14025, StateAgeMs: 30, KVUsage: 0.4, Healthy: true}
		if queued != nil {
			rs[i].Queued = queued[i]
		}
	}
	m, err := table.NewModel(model, cfg, rs)
	require.NoError(t, err)
	for slot, bodies := range hold {
		for _, body := range bodies {
			for _, k := range checkpointsFor(t, cfg, model, body, "") {
				require.NoError(t, m.Set(k, append(m.Lookup(k), slot)...))
			}
		}
	}
	tb.Models[model] = m
	return tb
}

func checkpointsOf(t *testing.T, cfg table.ModelConfig, body, tenantCacheSalt string) []uint64 {
	return checkpointsFor(t, cfg, "llama", body, tenantCacheSalt)
}

func checkpointsFor(t *testing.T, cfg table.ModelConfig, model, body, tenantCacheSalt string) []uint64 {
	var p prompt.Parser
	a := prompt.Chat
	if strings.Contains(body, `"prompt"`) {
		a = prompt.Completions
	}
	req, err := p.Parse(a, []byte(body), prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 64})
	require.NoError(t, err)
	c := route.NewChain(cfg, route.Identity{Model: model, Salt: prefix.SaltFromCacheSalt(tenantCacheSalt)}, &req, nil)
	return prefix.Checkpoints(nil, c.Keys, int(cfg.Stride))
}

func readShared(t *testing.T, key string) []byte {
	b, _, err := proxywasm.GetSharedData(key)
	require.NoError(t, err, key)
	return b
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
