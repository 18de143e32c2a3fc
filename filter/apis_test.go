//go:build !wasm

package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// A conversation sent through the Responses or the Messages API routes to the replica
// that holds it from chat requests, and reports the chat form's keys: the three APIs
// share one chain.
func TestResponsesAndMessagesRouteLikeChat(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for _, c := range []struct {
			path string
			body func(system, question string) string
		}{{"/v1/responses", responsesBody}, {"/v1/messages", messagesBody}} {
			t.Run(c.path, func(t *testing.T) {
				h := start(t, vm, testConfig)
				earlier := chat(system, "Where is order 1?")
				h.serveTable(table.EncodeFull(fleet(t, 5, 4, []uint64{3000, 3000, 3000, 3000}, map[uint32][]string{2: {earlier}})))

				_, hs := h.send(request{path: c.path, body: c.body(system, "Cancel order 2.")})
				assert.Equal(t, "10.1.0.3:8000", strings.Split(endpoint(hs), ",")[0], "slot 2 holds the system prompt")
				n, _ := h.GetCounterMetric("kvroute_predicted_hits_total")
				assert.Equal(t, uint64(1), n)

				reports := h.reports()
				require.Len(t, reports, 1)
				want := checkpointsOf(t, table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4}, chat(system, "Cancel order 2."), "")
				assert.Equal(t, want, reports[0].Keys, "the chat form's checkpoint keys")
			})
		}
	})
}

// An isolated tenant's Responses body gets vLLM's cache_salt, as chat's does; its
// Messages body, which has none, is forwarded only when tenants.unsalted_paths lists
// /v1/messages, and then as it is (TestIsolatedTenantUnsaltableBodiesAreRefused has the
// refusal otherwise); so is any listed path.
func TestIsolatedTenantOnTheNewAPIs(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		cfg := strings.Replace(testConfig, `"inject_cache_salt": true`, `"inject_cache_salt": true, "unsalted_paths": ["/v1/messages", "/v1/embeddings"]`, 1)
		h := start(t, vm, cfg)
		h.serveTable(table.EncodeFull(fleet(t, 1, 3, nil, nil)))
		acme := [][2]string{{"x-tenant", "acme"}}

		id, hs := h.send(request{path: "/v1/responses", headers: acme, body: responsesBody(system, "q")})
		require.NotEmpty(t, endpoint(hs))
		var sent map[string]any
		require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
		assert.Equal(t, prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt(), sent["cache_salt"])

		body := messagesBody(system, "q")
		id, hs = h.send(request{path: "/v1/messages", headers: acme, body: body})
		require.NotEmpty(t, endpoint(hs), "routed")
		assert.Equal(t, body, string(h.GetCurrentRequestBody(id)), "and not rewritten")

		// The path is matched as sent, not as the tenant header read after it left the
		// guest's header buffer.
		id, action := h.exchange(request{path: "/v1/embeddings", headers: acme, body: `{"model":"llama","input":"q"}`})
		assert.Nil(t, h.GetSentLocalResponse(id), "a listed path passes unsalted")
		assert.Equal(t, types.ActionContinue, action)
	})
}
