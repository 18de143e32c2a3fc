//go:build !wasm

package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
)

// parityConfig is testConfig with a model header, and near ties broken only on exact
// equality so that the filter's random tie-break seed cannot make the two differ.
const parityConfig = `{
	"control_plane": {"cluster": "outbound|8080||cp.kvroute.svc.cluster.local", "authority": "cp.kvroute.svc.cluster.local", "poll_ms": 100, "report_ms": 100},
	"tenants": {"source": "header", "header": "x-tenant", "secret": "s3cret", "policies": {"acme": "isolated"}, "inject_cache_salt": true},
	"adapters": {"llama-sql-lora": "llama"},
	"model_header": "x-model",
	"guards": {"tie_epsilon": 0.000001},
	"max_body_bytes": 65536
}`

// TestFilterAndSimulatorRouteAlike feeds the filter (natively and compiled) and the fleet
// simulator's proxy (wasmtest/fleet/kvroute.Proxy, what kvroute-bench's kvroute row runs)
// the same table and the same requests, and requires the same endpoints, forwarded
// bodies, placement reports and counters. The sequence covers parse errors, a body
// without a prompt, oversized bodies, unknown models, LoRA adapters (by body and by model
// header), isolated tenants (cache_salt injected), a client's cache_salt, prompts with
// bytes that are not UTF-8 (an isolated tenant's among them), token prompts, and a burst
// whose ledger makes the owner spill.
//
// A simulator with its own copy of the sequence fails it at the first difference: an
// unparsable body routed least-queued by one and left unrouted by the other
// ("10.1.0.1:8000,..." vs ""), a LoRA request unrouted, an isolated tenant's request
// that keeps its body and chain (no salt), counters that differ.
func TestFilterAndSimulatorRouteAlike(t *testing.T) {
	held := chat(system, "Where is order 1?")
	lora := strings.Replace(chat(system, "Write SQL for order 1."), `"model":"llama"`, `"model":"llama-sql-lora"`, 1)
	tokens := make([]string, 300)
	for i := range tokens {
		tokens[i] = fmt.Sprint(1000 + i)
	}
	type step struct {
		name    string
		path    string
		headers [][2]string
		body    string
	}
	steps := []step{
		{name: "owner", body: chat(system, "Cancel order 2.")},
		{name: "unparsable", body: `{"model":"llama","messages":[{"role":"user","content":"x"}`},
		{name: "no prompt", body: `{"model":"llama"}`},
		{name: "unknown model", body: strings.Replace(held, `"llama"`, `"mistral"`, 1)},
		{name: "lora by body", body: lora},
		{name: "lora by header", headers: [][2]string{{"x-model", "llama-sql-lora"}}, body: chat(system, "Write SQL for order 2.")},
		{name: "isolated tenant", headers: [][2]string{{"x-tenant", "acme"}}, body: chat(system, "Refund order 3.")},
		{name: "isolated tenant again", headers: [][2]string{{"x-tenant", "acme"}}, body: chat(system, "Refund order 4.")},
		{name: "shared tenant", headers: [][2]string{{"x-tenant", "globex"}}, body: chat(system, "Where is order 5?")},
		{name: "client cache_salt", body: strings.Replace(chat(system, "Order 6?"), `"stream":false`, `"stream":false,"cache_salt":"c-1"`, 1)},
		{name: "not UTF-8", body: strings.Replace(chat(system, "Order 7?"), "Order 7?", "Order 7\xff\xc0\xed\xa0\x80?", 1)},
		{name: "not UTF-8, isolated tenant", headers: [][2]string{{"x-tenant", "acme"}}, body: strings.Replace(chat(system, "Order 8?"), "Order 8?", "Order 8\xff\xe2\x82?", 1)},
		{name: "oversized", body: chat(strings.Repeat("Long attachment text. ", 4000), "Summarise.")},
		{name: "token prompt", path: "/v1/completions", body: `{"model":"llama","prompt":[` + strings.Join(tokens, ",") + `]}`},
	}
	for i := 0; i < 20; i++ { // a burst on the owner: its ledger grows until it spills (12 did before the spill paid for evictions)
		question := fmt.Sprint("Question ", i, ": ", strings.Repeat("with a long attached document, ", 100))
		steps = append(steps, step{name: fmt.Sprint("burst ", i), body: chat(system, question)})
	}

	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, parityConfig)
		tb := fleet(t, 5, 4, []uint64{6000, 2000, 4000, 9000}, map[uint32][]string{2: {held}})
		frame := table.EncodeFull(tb)
		h.serveTable(frame)
		sim := simProxy(t, parityConfig, frame)

		var simReports []api.Report
		for i, s := range steps {
			path := s.path
			if path == "" {
				path = "/v1/chat/completions"
			}
			var id uint32
			var hs [][2]string
			if s.name == "oversized" {
				// One chunk, as a small body-buffer limit would deliver it: the filter sees
				// all of it and so does the simulator's proxy.
				id = h.InitializeHttpContext()
				h.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", path}, {":authority", "llm"}}, false)
				h.CallOnRequestBody(id, []byte(s.body), true)
				hs = h.GetCurrentRequestHeaders(id)
			} else {
				id, hs = h.send(request{path: path, headers: s.headers, body: s.body})
			}
			req := &route.Request{ID: uint64(i + 1), Schema: prompt.Chat, Body: []byte(s.body)}
			if path == "/v1/completions" {
				req.Schema = prompt.Completions
			}
			for _, kv := range s.headers {
				switch kv[0] {
				case "x-model":
					req.ModelHeader = kv[1]
				case "x-tenant":
					req.Tenant = kv[1]
				}
			}
			d, res := sim.Route(req, time.Now())
			assert.Equal(t, endpoint(hs), d.Header(), "step %q: endpoints", s.name)
			wantBody := s.body
			if res.Body != nil {
				wantBody = string(res.Body)
			}
			assert.True(t, wantBody == string(h.GetCurrentRequestBody(id)), "step %q: forwarded bodies differ (cache_salt)", s.name)
			if res.Action == route.Placed {
				simReports = append(simReports, res.Placement)
			}
		}

		got := h.reports()
		require.Len(t, got, len(simReports), "placement reports")
		for i := range got {
			got[i].AtMs, simReports[i].AtMs = 0, 0
		}
		for i := range got {
			assert.True(t, assert.ObjectsAreEqual(simReports[i], got[i]), "placement report %d differs: %s vs %s", i,
				simReports[i].Replica, got[i].Replica)
		}

		c := sim.Stats()
		for name, want := range map[string]int{
			"kvroute_decisions_total":           c.Decisions,
			"kvroute_predicted_hits_total":      c.PredictedHits,
			"kvroute_spills_total":              c.Spills,
			"kvroute_fallbacks_total":           c.Fallbacks,
			"kvroute_unrouted_total":            c.Unrouted,
			"kvroute_parse_errors_total":        c.ParseErrors,
			"kvroute_oversized_bodies_total":    c.Oversized,
			"kvroute_cache_salt_injected_total": c.SaltInjected,
		} {
			n, err := h.GetCounterMetric(name)
			if err != nil {
				n = 0
			}
			assert.Equal(t, uint64(want), n, name)
		}
		assert.Positive(t, c.Spills, "the burst made the owner spill")
		assert.Positive(t, c.Fallbacks, "requests without a prompt went least-queued")
	})
}

// simProxy is the fleet simulator's proxy with the filter's configuration cfgJSON and
// the table frame the filter was served.
func simProxy(t *testing.T, cfgJSON string, frame []byte) *kvroute.Proxy {
	cfg, err := api.ParseConfig([]byte(cfgJSON))
	require.NoError(t, err)
	sim := kvroute.NewProxy(cfg, cfg.RuleParams(), 1, nil)
	st := table.New()
	_, err = st.Apply(frame)
	require.NoError(t, err)
	sim.Load(st, time.Now())
	return sim
}

// The filter and the simulator's proxy shed the same requests: a burst of every class
// fills the ledger until the lower classes are refused, in the same order by both.
func TestFilterAndSimulatorShedAlike(t *testing.T) {
	classes := []string{"sheddable", "standard", "critical"}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		cfgJSON := strings.Replace(overloadConfig, `"tenants"`, `"guards": {"tie_epsilon": 0.000001}, "tenants"`, 1)
		h := start(t, vm, cfgJSON)
		frame := table.EncodeFull(fleet(t, 5, 3, []uint64{2000, 3000, 4000}, nil))
		h.serveTable(frame)
		sim := simProxy(t, cfgJSON, frame)

		shed := 0
		for i := range 30 {
			class := classes[i%3]
			body := chat(fmt.Sprint("Customer ", i, " ", system[:4000]), "q")
			id, _ := h.exchange(request{body: body, headers: [][2]string{{"x-class", class}}})
			d, res := sim.Route(&route.Request{ID: uint64(i + 1), Schema: prompt.Chat, Body: []byte(body), Class: class}, time.Now())
			reply := h.GetSentLocalResponse(id)
			require.Equal(t, res.Verdict.Shed(), reply != nil, "request %d (%s): shed alike", i, class)
			if reply != nil {
				shed++
				ra, _ := header(reply.Headers, "retry-after")
				assert.Equal(t, fmt.Sprint(res.Verdict.RetryAfter), ra, "request %d: Retry-After", i)
				continue
			}
			assert.Equal(t, d.Header(), endpoint(h.GetCurrentRequestHeaders(id)), "request %d: endpoints", i)
		}
		assert.Positive(t, shed, "the burst was shed in part")
		assert.Equal(t, shed, sim.Stats().Shed)
		var counted uint64
		for _, c := range classes {
			n, err := h.GetCounterMetric("kvroute_shed_" + c + "_wait_total")
			require.NoError(t, err)
			counted += n
			if c == "critical" {
				assert.Zero(t, n, "critical is never shed")
			}
		}
		assert.Equal(t, uint64(shed), counted)
	})
}
