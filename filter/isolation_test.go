//go:build !wasm

package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// nested is a chat body with one extra field nested depth arrays deep: valid JSON that
// vLLM accepts, above the filter's max_json_depth.
func nested(depth int) string {
	b := chat(system, "q")
	return b[:len(b)-1] + `,"extra":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "}"
}

// padded is a chat body with an extra field that makes it n bytes long.
func padded(n int) string {
	b := chat(system, "q")
	pad := n - len(b) - len(`,"pad":""`)
	return b[:len(b)-1] + `,"pad":"` + strings.Repeat("x", max(pad, 0)) + `"}`
}

// An isolated tenant's request that the filter cannot salt is answered locally, never
// forwarded: with vLLM's cache_salt missing, the engine would cache its prompt where any
// other tenant can hit it. A shared tenant's same bodies are forwarded as before.
func TestIsolatedTenantUnsaltableBodiesAreRefused(t *testing.T) {
	oversized := padded(70000) // testConfig's max_body_bytes is 65536
	cases := []struct {
		name   string
		req    request
		status uint32
		metric string
	}{
		{"nested above max_json_depth", request{body: nested(70)}, 400, "kvroute_unsalted_refused_unparsable_total"},
		{"not JSON", request{body: `{"model":"llama","messages":[`}, 400, "kvroute_unsalted_refused_unparsable_total"},
		{"streamed past max_body_bytes", request{body: oversized}, 413, "kvroute_unsalted_refused_oversized_total"},
		{"content-length above max_body_bytes", request{body: oversized, declaredOversized: true,
			headers: [][2]string{{"content-length", fmt.Sprint(len(oversized))}}}, 413, "kvroute_unsalted_refused_oversized_total"},
		{"a path the filter does not parse", request{path: "/v1/embeddings", body: `{"model":"llama","input":"hi"}`},
			403, "kvroute_unsalted_refused_path_total"},
		{"a path whose engine request has no cache_salt", request{path: "/v1/messages", body: messagesBody(system, "q")},
			403, "kvroute_unsalted_refused_path_total"},
	}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				h := start(t, vm, testConfig)
				h.serveTable(table.EncodeFull(fleet(t, 1, 3, nil, nil)))

				acme := c.req
				acme.headers = append(append([][2]string{}, c.req.headers...), [2]string{"x-tenant", "acme"})
				id, action := h.exchange(acme)
				reply := h.GetSentLocalResponse(id)
				require.NotNil(t, reply, "an unsaltable body of an isolated tenant is answered locally")
				assert.Equal(t, types.ActionPause, action, "and not forwarded")
				assert.Equal(t, c.status, reply.StatusCode)
				assert.Contains(t, string(reply.Data), "kvroute:")
				assert.NotContains(t, string(reply.Data), "ACME Corp", "the reply names no prompt text")
				n, err := h.GetCounterMetric(c.metric)
				require.NoError(t, err)
				assert.Equal(t, uint64(1), n, c.metric)

				globex := c.req
				globex.headers = append(append([][2]string{}, c.req.headers...), [2]string{"x-tenant", "globex"})
				id, action = h.exchange(globex)
				assert.Nil(t, h.GetSentLocalResponse(id), "a shared tenant's body is forwarded as it is")
				assert.Equal(t, types.ActionContinue, action)
			})
		}
	})
}

// An isolated tenant's request is salted even when there is no table to route on (the
// control plane unreachable since the proxy started): the engine caches it either way.
func TestIsolatedTenantIsSaltedWithoutATable(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, neverHold(testConfig))
		id, hs := h.send(request{headers: [][2]string{{"x-tenant", "acme"}}, body: chat(system, "q")})
		assert.Empty(t, endpoint(hs), "no table: Envoy's fallback picks the replica")
		var sent map[string]any
		require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
		assert.Equal(t, prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt(), sent["cache_salt"])

		// And a body without a prompt, which the engine will answer itself.
		id, _ = h.send(request{headers: [][2]string{{"x-tenant", "acme"}}, body: `{"model":"llama"}`})
		require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
		assert.Equal(t, prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt(), sent["cache_salt"])
	})
}

// tenantConfig is testConfig with acme isolated and the tenant taken from source.
func tenantConfig(source string) string {
	header := ""
	if source == "header" {
		header = `"header": "x-tenant", `
	}
	return strings.Replace(testConfig, `"tenants": {"source": "header", "header": "x-tenant", `,
		fmt.Sprintf(`"tenants": {"source": %q, %s`, source, header), 1)
}

// The tenant comes from where tenants.source says, and a client's header names no tenant
// unless the header source was chosen: a client of a shared namespace that sends
// "x-tenant: acme" gets the shared chain and no cache_salt, not acme's.
func TestTenantSource(t *testing.T) {
	acmeSalt := prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt()
	body := chat(system, "q")
	cases := []struct {
		name      string
		config    string
		props     map[string]string // node or connection properties, dotted
		header    string            // the client's x-tenant
		wantSalt  string            // cache_salt the engine gets ("" for none)
		wantChain string            // the salt the placement report's keys were made with
	}{
		{"workload: acme's namespace", tenantConfig("workload"), map[string]string{"node.metadata.NAMESPACE": "acme"}, "", acmeSalt, acmeSalt},
		{"workload: a forged header", tenantConfig("workload"), map[string]string{"node.metadata.NAMESPACE": "globex"}, "acme", "", ""},
		{"workload: no metadata", tenantConfig("workload"), nil, "acme", "", ""},
		{"peer: acme's identity", tenantConfig("peer"), map[string]string{"connection.uri_san_peer_certificate": "acme"}, "", acmeSalt, acmeSalt},
		{"peer: a forged header", tenantConfig("peer"), map[string]string{"connection.uri_san_peer_certificate": "spiffe://cluster.local/ns/globex/sa/app"}, "acme", "", ""},
		{"header, chosen explicitly", tenantConfig("header"), nil, "acme", acmeSalt, acmeSalt},
	}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(c.config))
				for k, v := range c.props {
					opt = opt.WithProperty(strings.Split(k, "."), []byte(v))
				}
				emu, reset := proxytest.NewHostEmulator(opt)
				t.Cleanup(reset)
				require.Equal(t, types.OnPluginStartStatusOK, emu.StartPlugin(), "errors: %v", emu.GetCriticalLogs())
				h := host{emu, t}
				h.serveTable(table.EncodeFull(fleet(t, 1, 3, nil, nil)))

				var hs [][2]string
				if c.header != "" {
					hs = [][2]string{{"x-tenant", c.header}}
				}
				id, _ := h.send(request{headers: hs, body: body})
				var sent map[string]any
				require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
				if c.wantSalt == "" {
					assert.NotContains(t, sent, "cache_salt")
				} else {
					assert.Equal(t, c.wantSalt, sent["cache_salt"])
				}
				reports := h.reports()
				require.Len(t, reports, 1)
				assert.Equal(t, checkpointsOf(t, table.ModelConfig{BlockBytes: 64, Stride: 4}, body, c.wantChain), reports[0].Keys)
			})
		}
	})
}
