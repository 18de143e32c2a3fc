//go:build !wasm

package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

var system = strings.Repeat("You are the support assistant of ACME Corp. Follow the refund policy. ", 400) // ~28 KB

func TestInvalidConfigFailsStartWithAClearLog(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for name, cfg := range map[string]string{
			"empty":         ``,
			"unknown field": `{"control_plane":{"cluster":"c","authority":"a"},"max_body":1}`,
			"no secret":     `{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"default_policy":"isolated"}}`,
		} {
			t.Run(name, func(t *testing.T) {
				opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
				h, reset := proxytest.NewHostEmulator(opt)
				defer reset()
				assert.Equal(t, types.OnPluginStartStatusFailed, h.StartPlugin())
				logs := strings.Join(h.GetCriticalLogs(), "\n")
				assert.Contains(t, logs, "invalid plugin configuration")
			})
		}
	})
}

func TestClientSentRoutingHeaderIsStripped(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, neverHold(testConfig))
		spoof := [][2]string{{api.DefaultEndpointHeader, "10.9.9.9:8000"}}
		// On a path kvroute does not route ...
		_, hs := h.send(request{method: "GET", path: "/v1/models", headers: spoof})
		assert.Empty(t, endpoint(hs))
		// ... and on one it does, with no table yet: the header stays unset (Envoy's
		// fallback balancer decides), never the client's value.
		_, hs = h.send(request{headers: spoof, body: chat("sys", "q")})
		assert.Empty(t, endpoint(hs))
		n, err := h.GetCounterMetric("kvroute_unrouted_total")
		require.NoError(t, err)
		assert.Equal(t, uint64(1), n)
	})
}

func TestRoutesToTheReplicaHoldingThePrefix(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		earlier := chat(system, "Where is order 1?")
		h.serveTable(table.EncodeFull(fleet(t, 5, 4, []uint64{3000, 3000, 3000, 3000}, map[uint32][]string{2: {earlier}})))

		_, hs := h.send(request{body: chat(system, "Cancel order 2.")})
		addrs := strings.Split(endpoint(hs), ",")
		require.Len(t, addrs, 3)
		assert.Equal(t, "10.1.0.3:8000", addrs[0], "slot 2 holds the system prompt")

		n, _ := h.GetCounterMetric("kvroute_predicted_hits_total")
		assert.Equal(t, uint64(1), n)

		reports := h.reports()
		require.Len(t, reports, 1)
		r := reports[0]
		assert.Equal(t, api.KindPlacement, r.Kind)
		assert.Equal(t, "10.1.0.3:8000", r.Replica)
		assert.Equal(t, prefix.Text, r.Domain)
		assert.Equal(t, 4, r.Stride)
		want := checkpointsOf(t, table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4}, chat(system, "Cancel order 2."), "")
		assert.Equal(t, want, r.Keys, "the report carries the request's checkpoint keys")
		assert.Greater(t, r.PredictedCachedTokens, 6000)
		assert.NotContains(t, mustJSON(r), "ACME", "no prompt text in reports")
	})
}

// The spill of docs/rule.md's worked example: the owner keeps the prefix while its extra queue is under the
// tokens a hit saves plus the spill's charge (shared/rule: the saving times 1/3, the 3
// replicas, plus the target's KV usage, 0.4 in fleet), and loses it above.
func TestOwnerSpillsWhenItsQueueIsDeeperThanTheSaving(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		prior := chat(system, "q0")
		saving := float64(len(system)) / 4 // cached tokens of the system prompt at 4 bytes/token
		spillAt := saving + saving*(1.0/3+0.4)
		for _, c := range []struct {
			extra     float64
			ownerKeep bool
		}{{spillAt - 1000, true}, {spillAt + 1000, false}} {
			t.Run(fmt.Sprint(c.ownerKeep), func(t *testing.T) { spillCase(t, vm, prior, saving, c.extra, c.ownerKeep) })
		}
	})
}

func spillCase(t *testing.T, vm types.VMContext, prior string, saving, extra float64, ownerKeeps bool) {
	h := start(t, vm, testConfig)
	q := []uint64{1000, 1000 + uint64(extra), 1000}
	h.serveTable(table.EncodeFull(fleet(t, 1, 3, q, map[uint32][]string{1: {prior}})))
	_, hs := h.send(request{body: chat(system, "q1")})
	first := strings.Split(endpoint(hs), ",")[0]
	assert.Equal(t, ownerKeeps, first == "10.1.0.2:8000", "extra queue %.0f, saving %.0f: %s", extra, saving, first)
	spills, _ := h.GetCounterMetric("kvroute_spills_total")
	assert.Equal(t, !ownerKeeps, spills == 1)
}

func TestEveryPromptFormRoutes(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		tokens := make([]string, 64)
		for i := range tokens {
			tokens[i] = fmt.Sprint(1000 + i)
		}
		tokenBody := `{"model":"llama","prompt":[` + strings.Join(tokens, ",") + `]}`
		h.serveTable(table.EncodeFull(fleet(t, 1, 3, nil, map[uint32][]string{1: {tokenBody}, 2: {`{"model":"llama","prompt":"` + system + `"}`}})))
		cases := []struct {
			name, path, body, want string
		}{
			{"completion string", "/v1/completions", `{"model":"llama","prompt":"` + system + `tail"}`, "10.1.0.3:8000"},
			{"completion list of strings", "/v1/completions", `{"model":"llama","prompt":["` + system + `x","other"]}`, "10.1.0.3:8000"},
			{"token ids", "/v1/completions", tokenBody, "10.1.0.2:8000"},
			{"list of token-id lists", "/v1/completions", `{"model":"llama","prompt":[[` + strings.Join(tokens, ",") + `,7],[1,2]]}`, "10.1.0.2:8000"},
			{"chat, array content", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x"}}]}]}`, ""},
			{"chat, tools", "/v1/chat/completions", `{"model":"llama","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`, ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				_, hs := h.send(request{path: c.path, body: c.body})
				got := endpoint(hs)
				require.NotEmpty(t, got, "every parsable request gets an endpoint list")
				if c.want != "" {
					assert.Equal(t, c.want, strings.Split(got, ",")[0])
				}
			})
		}
		n, _ := h.GetCounterMetric("kvroute_decisions_total")
		assert.Equal(t, uint64(len(cases)), n)
	})
}

func TestFailOpen(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		leastQueued := "10.1.0.2:8000,10.1.0.3:8000,10.1.0.1:8000"
		cases := []struct {
			name, body, want, metric string
		}{
			{"not JSON", "hello, engine", leastQueued, "kvroute_parse_errors_total"},
			{"truncated JSON", `{"model":"llama","messages":[{"role":"user","content":"ab`, leastQueued, "kvroute_parse_errors_total"},
			{"deep nesting", `{"model":"llama","x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `,"messages":[]}`, leastQueued, "kvroute_parse_errors_total"},
			{"invalid UTF-8 is fine", "{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", "", "kvroute_decisions_total"},
			{"oversized body", `{"model":"llama","prompt":"` + strings.Repeat("x", 70000) + `"}`, leastQueued, "kvroute_oversized_bodies_total"},
			{"unknown model", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, "", "kvroute_unrouted_total"},
			{"no prompt", `{"model":"llama"}`, leastQueued, "kvroute_fallbacks_total"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				// A fresh proxy per case: each routed request adds to the ledger.
				h := start(t, vm, testConfig)
				h.serveTable(table.EncodeFull(fleet(t, 1, 3, []uint64{900, 100, 500}, nil)))
				before, _ := h.GetCounterMetric(c.metric)
				_, hs := h.send(request{body: c.body})
				if c.want != "" {
					assert.Equal(t, c.want, endpoint(hs))
				}
				after, _ := h.GetCounterMetric(c.metric)
				assert.Equal(t, before+1, after, c.metric)
			})
		}
	})
}

func TestIsolatedTenantGetsCacheSaltAndItsOwnChain(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		body := chat(system, "q")
		// Replica 1 holds the shared (unsalted) chain of this very prompt.
		h.serveTable(table.EncodeFull(fleet(t, 1, 3, []uint64{0, 5000, 0}, map[uint32][]string{1: {body}})))

		id, hs := h.send(request{headers: [][2]string{{"x-tenant", "globex"}}, body: body})
		assert.Equal(t, "10.1.0.2:8000", strings.Split(endpoint(hs), ",")[0], "a shared tenant uses the shared chain")
		assert.NotContains(t, string(h.GetCurrentRequestBody(id)), "cache_salt")

		id, hs = h.send(request{headers: [][2]string{{"x-tenant", "acme"}}, body: body})
		assert.NotEqual(t, "10.1.0.2:8000", strings.Split(endpoint(hs), ",")[0], "an isolated tenant does not hit the shared chain")
		var sent map[string]any
		require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
		salt := prefix.TenantSalt([]byte("s3cret"), "acme")
		assert.Equal(t, salt.CacheSalt(), sent["cache_salt"], "vLLM gets the tenant's cache_salt")
		cl, _ := header(hs, "content-length")
		assert.Equal(t, fmt.Sprint(len(h.GetCurrentRequestBody(id))), cl)

		reports := h.reports()
		require.Len(t, reports, 2)
		assert.NotEqual(t, reports[0].Keys, reports[1].Keys, "the tenants' chains differ")
		assert.Equal(t, checkpointsOf(t, table.ModelConfig{BlockBytes: 64, Stride: 4}, body, salt.CacheSalt()), reports[1].Keys)
	})
}

func TestOutcomeReportsReadUsage(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.serveTable(table.EncodeFull(fleet(t, 1, 2, nil, nil)))
		sse := [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}}
		// A Messages stream longer than the tail the filter keeps, whose message_delta
		// counts output tokens only (as Anthropic's may): the prompt's are in message_start.
		longMessages := []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":44,\"cache_read_input_tokens\":256,\"output_tokens\":1}}}\n\n"}
		for range 40 {
			longMessages = append(longMessages, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""+strings.Repeat("word ", 200)+"\"}}\n\n")
		}
		longMessages = append(longMessages, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":900}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		cases := []struct {
			name    string
			path    string // "": chat
			headers [][2]string
			chunks  []string
			prompt  int
			cached  int
			noUsage int64 // kvroute_outcomes_without_usage_total counts it
		}{
			{"json", "", [][2]string{{":status", "200"}, {"content-type", "application/json"}},
				[]string{`{"id":"1","choices":[{"message":{"content":"ok"}}],`, `"usage":{"prompt_tokens":8000,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":5984}}}`},
				8000, 5984, 0},
			{"sse", "", [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}},
				[]string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
					"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n",
					"data: [DONE]\n\n"},
				120, 96, 0},
			{"sse without usage", "", [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}},
				[]string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "data: [DONE]\n\n"},
				0, -1, 1},
			{"error status", "", [][2]string{{":status", "503"}}, []string{`{"error":"overloaded"}`}, 0, -1, 0},
			{"responses stream", "/v1/responses", sse,
				[]string{"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ok\"}\n\n",
					"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[],\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":96},\"output_tokens\":1,\"total_tokens\":121}}}\n\n"},
				120, 96, 0},
			{"messages from vLLM", "/v1/messages", [][2]string{{":status", "200"}, {"content-type", "application/json"}},
				[]string{`{"id":"msg_1","type":"message","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":300,"output_tokens":2}}`},
				300, -1, 0},
			{"messages stream past the tail", "/v1/messages", sse, longMessages, 300, 256, 0},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				body := chat("sys", "q")
				switch c.path {
				case "/v1/responses":
					body = responsesBody("sys", "q")
				case "/v1/messages":
					body = messagesBody("sys", "q")
				}
				id, hs := h.send(request{path: c.path, body: body})
				require.NotEmpty(t, endpoint(hs))
				placed := h.reports()
				require.Len(t, placed, 1)
				require.True(t, placed[0].Starts, "the placement says its start is reported")
				before, _ := h.GetCounterMetric("kvroute_outcomes_without_usage_total")
				h.CallOnResponseHeaders(id, c.headers, false)
				for i, ch := range c.chunks {
					assert.Equal(t, types.ActionContinue, h.CallOnResponseBody(id, []byte(ch), i == len(c.chunks)-1),
						"responses stream through, never held")
				}
				h.CompleteHttpContext(id)
				rs := h.reports()
				require.Len(t, rs, 2, "one start, however many chunks, and the outcome")
				start := rs[0]
				assert.Equal(t, api.KindStart, start.Kind)
				assert.Equal(t, placed[0].PlacementID(), start.Placement)
				assert.Equal(t, placed[0].Replica, start.Replica)
				r := rs[1]
				assert.Equal(t, api.KindOutcome, r.Kind)
				assert.Equal(t, placed[0].PlacementID(), r.PlacementID())
				assert.Equal(t, c.prompt, r.PromptTokens)
				assert.Equal(t, c.cached, r.CachedTokens)
				st, _ := header(c.headers, ":status")
				assert.Equal(t, st, fmt.Sprint(r.Status))
				after, _ := h.GetCounterMetric("kvroute_outcomes_without_usage_total")
				assert.Equal(t, c.noUsage, int64(after-before), "kvroute_outcomes_without_usage_total")
			})
		}
	})
}

func TestLeaderLeaseAndTablePublishThroughSharedData(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		// Another VM holds a live lease: this one must not poll.
		other := binary.LittleEndian.AppendUint64(nil, 42)
		other = binary.LittleEndian.AppendUint64(other, uint64(time.Now().Add(time.Hour).UnixMilli()))
		require.NoError(t, proxywasm.SetSharedData(leaseKey, other, 0))
		h.Tick()
		_, polled := h.lastCallout(api.TablePath)
		assert.False(t, polled, "no poll without the lease")

		// The other VM's table, published in shared data, reaches this VM on its tick.
		tb := fleet(t, 7, 3, nil, map[uint32][]string{0: {chat(system, "a")}})
		require.NoError(t, rootKeys.publishFull(table.EncodeFull(tb), tb.Version, 0, time.Now()))
		h.Tick()
		_, hs := h.send(request{body: chat(system, "b")})
		assert.Equal(t, "10.1.0.1:8000", strings.Split(endpoint(hs), ",")[0], "routed on the table from shared data")

		// The lease expires: this VM takes over and polls with the version it holds.
		_, cas, err := proxywasm.GetSharedData(leaseKey)
		require.NoError(t, err)
		expired := binary.LittleEndian.AppendUint64(nil, 42)
		expired = binary.LittleEndian.AppendUint64(expired, 0)
		require.NoError(t, proxywasm.SetSharedData(leaseKey, expired, cas))
		h.Tick()
		poll, polled := h.lastCallout(api.TablePath)
		require.True(t, polled, "the new leader polls")
		path, _ := header(poll.Headers, ":path")
		assert.Equal(t, api.TablePath+"?version=7", path)
		auth, _ := header(poll.Headers, ":authority")
		assert.Equal(t, "cp.kvroute.svc.cluster.local", auth)
		assert.Equal(t, "outbound|8080||cp.kvroute.svc.cluster.local", poll.Upstream)

		// A delta from the control plane becomes the first link of the chain.
		next := fleet(t, 8, 3, nil, map[uint32][]string{0: {chat(system, "a")}, 2: {chat("other prompt "+system, "c")}})
		delta := table.Encode(table.Diff(tb, next))
		h.CallOnHttpCallResponse(poll.CalloutID, [][2]string{{":status", "200"}}, nil, delta)
		hd, err := decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.Equal(t, uint64(8), hd.version())
		assert.Equal(t, uint64(7), hd.base)
		assert.Equal(t, delta, readShared(t, rootKeys.delta(1)))

		// Another VM that is at v7 catches up through the chain.
		behind := newView()
		m := defineMetrics()
		behind.sync(&rootKeys, &m, time.Now())
		require.True(t, behind.loaded)
		assert.Equal(t, table.EncodeFull(next), table.EncodeFull(behind.t))

		// The control plane composes deltas across versions (8 -> 10): versions skip,
		// and VMs at 8 and at 7 still catch up.
		at8 := newView()
		at8.sync(&rootKeys, &m, time.Now())
		h.Tick()
		poll, polled = h.lastCallout(api.TablePath)
		require.True(t, polled)
		path, _ = header(poll.Headers, ":path")
		require.Equal(t, api.TablePath+"?version=8", path)
		v10 := fleet(t, 10, 3, []uint64{0, 777, 0}, map[uint32][]string{0: {chat(system, "a")}, 2: {chat("other prompt "+system, "c")}})
		composed := table.Encode(table.Diff(next, v10))
		h.CallOnHttpCallResponse(poll.CalloutID, [][2]string{{":status", "200"}}, nil, composed)
		hd, err = decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.Equal(t, []uint64{8, 10}, hd.chain)
		for name, v := range map[string]*view{"from v8": &at8, "from v7": func() *view { v := newView(); return &v }()} {
			v.sync(&rootKeys, &m, time.Now())
			assert.Equal(t, uint64(10), v.t.Version, name)
			assert.Equal(t, uint64(777), v.t.Models["llama"].Replicas[1].Queued, name)
		}
		got, err := rootKeys.loadBase(hd)
		require.NoError(t, err)
		require.NoError(t, rootKeys.applyDeltas(got, hd, 1))
		assert.Equal(t, table.EncodeFull(v10), table.EncodeFull(got))

		// 304: the table is confirmed current.
		before := hd.confirmedMs
		h.serveTable(nil)
		hd, err = decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, hd.confirmedMs, before)
		assert.Equal(t, uint64(10), hd.version())
	})
}

func TestCorruptTableIsRejectedAndTheOldOneKept(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		tb := fleet(t, 3, 2, []uint64{100, 0}, nil)
		h.serveTable(table.EncodeFull(tb))
		bad := table.EncodeFull(fleet(t, 4, 2, []uint64{0, 100}, nil))
		bad[len(bad)/2] ^= 0xff
		// The next poll is after the poll interval; make sure a tick triggers it.
		h.serveTable(bad)
		errs, _ := h.GetCounterMetric("kvroute_table_poll_errors_total")
		assert.Equal(t, uint64(1), errs)
		hd, err := decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.Equal(t, uint64(3), hd.version(), "the corrupt version is not published")
		_, hs := h.send(request{body: `not json`})
		assert.Equal(t, "10.1.0.2:8000,10.1.0.1:8000", endpoint(hs), "routing continues on v3")
	})
}

// The control plane says how old the version is; the filter dates the table from that,
// so a version built long ago is stale on arrival and routes least-queued.
func TestTableIsDatedFromWhenItWasBuilt(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		// Past max_state_age (2 s) the table is stale: the queue numbers are not used but
		// the prefix entries are (shared/rule's stale regime), so the owner keeps the
		// request and the decision counts as stale, where least-queued would pick 10.1.0.1.
		for _, c := range []struct {
			ageMs string
			stale bool
		}{{"100", false}, {"2500", true}} {
			t.Run(c.ageMs, func(t *testing.T) {
				h := start(t, vm, testConfig)
				n := len(h.callouts())
				h.Tick()
				poll, ok := h.lastCallout(api.TablePath)
				require.True(t, ok)
				require.Greater(t, len(h.callouts()), n)
				h.CallOnHttpCallResponse(poll.CalloutID, [][2]string{{":status", "200"}, {api.TableAgeHeader, c.ageMs}}, nil,
					table.EncodeFull(fleet(t, 1, 3, []uint64{0, 500, 900}, map[uint32][]string{2: {chat(system, "a")}})))
				h.Tick() // the VM reads the head
				_, hs := h.send(request{body: chat(system, "b")})
				first := strings.Split(endpoint(hs), ",")[0]
				fallbacks, _ := h.GetCounterMetric("kvroute_fallbacks_total")
				assert.Zero(t, fallbacks)
				stale, _ := h.GetCounterMetric("kvroute_stale_decisions_total")
				assert.Equal(t, c.stale, stale == 1)
				assert.Equal(t, "10.1.0.3:8000", first, "the prefix owner, fresh or stale")
			})
		}
	})
}
