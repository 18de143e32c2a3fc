//go:build !wasm

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
)

// holdLong holds requests for the longest wait allowed, so that the tests that release
// them on a table never see one released by the clock (it is the wall clock).
var holdLong = strings.Replace(testConfig, "{", `{"first_table_wait_ms": 10000,`, 1)

// A request that arrives before the first table is held, its stream paused, and routed
// on the table once it comes: it gets the endpoint header and a placement report, where
// before it went wherever Envoy sent it and no control plane heard of its prefix.
func TestRequestBeforeTheFirstTableIsHeldUntilItComes(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, holdLong)
		id, action := h.exchange(request{body: chat(system, "held")})
		assert.Equal(t, types.ActionPause, action, "held for the first table")
		assert.Empty(t, endpoint(h.GetCurrentRequestHeaders(id)))
		assert.Equal(t, uint64(1), counter(h, "kvroute_held_for_table_total"))

		h.serveTable(table.EncodeFull(fleet(t, 1, 3, []uint64{9000, 0, 9000}, nil)))
		assert.Equal(t, types.ActionPause, h.GetCurrentHttpStreamAction(id), "released on the tick after the table")
		h.keepFresh()
		assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id), "resumed")
		assert.Equal(t, "10.1.0.2:8000", strings.Split(endpoint(h.GetCurrentRequestHeaders(id)), ",")[0],
			"routed on the table: the replica with no queue")
		assert.Zero(t, counter(h, "kvroute_unrouted_total"))
		assert.Equal(t, uint64(1), counter(h, "kvroute_decisions_total"))
		reps := h.reports()
		require.Len(t, reps, 1, "its placement is reported")
		assert.Equal(t, "10.1.0.2:8000", reps[0].Replica)
		assert.Nil(t, h.GetSentLocalResponse(id))
	})
}

// Once first_table_wait_ms has passed since the proxy started, a held request is left to
// Envoy as before, salted for its isolated tenant all the same, and later requests are
// not held at all: a control plane unreachable at start costs the wait once, not on every
// request. A request not whole when it is decided (a body past max_body_bytes, which
// streams on) is never held.
func TestHeldRequestIsLeftToEnvoyAfterTheWait(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, strings.Replace(testConfig, "{", `{"first_table_wait_ms": 2000,`, 1))
		id, action := h.exchange(request{headers: [][2]string{{"x-tenant", "acme"}}, body: chat(system, "q")})
		require.Equal(t, types.ActionPause, action, "held")

		_, action = h.exchange(request{body: chat(strings.Repeat("long document ", 6000), "q")})
		assert.Equal(t, types.ActionContinue, action, "an oversized body streams on, unrouted, never held")

		require.Eventually(t, func() bool {
			h.Tick()
			return h.GetCurrentHttpStreamAction(id) == types.ActionContinue
		}, 20*time.Second, 5*time.Millisecond, "released once the wait passed")
		assert.Empty(t, endpoint(h.GetCurrentRequestHeaders(id)), "no table: Envoy's fallback picks the replica")
		var sent map[string]any
		require.NoError(t, json.Unmarshal(h.GetCurrentRequestBody(id), &sent))
		assert.Equal(t, prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt(), sent["cache_salt"])

		_, hs := h.send(request{body: chat(system, "after the wait")})
		assert.Empty(t, endpoint(hs), "not held: left to Envoy at once")
		assert.Equal(t, uint64(1), counter(h, "kvroute_held_for_table_total"), "only the first was held")
		assert.Equal(t, uint64(3), counter(h, "kvroute_unrouted_total"))
	})
}

// A client that goes away while its request is held takes it off the list: the table's
// arrival resumes nothing, and the next request routes at once.
func TestHeldRequestWhoseClientLeftIsForgotten(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, holdLong)
		id, action := h.exchange(request{body: chat(system, "gone")})
		require.Equal(t, types.ActionPause, action)
		h.CompleteHttpContext(id)
		h.serveTable(table.EncodeFull(fleet(t, 1, 2, nil, nil)))
		h.keepFresh()
		for _, l := range h.GetWarnLogs() {
			assert.NotContains(t, l, "held", "nothing left to resume")
		}
		assert.Empty(t, h.GetCriticalLogs())
		assert.Zero(t, counter(h, "kvroute_decisions_total"), "the request that left was never routed")
		_, hs := h.send(request{body: chat(system, "next")})
		assert.NotEmpty(t, endpoint(hs))
	})
}

// At most route.MaxHeldForTable requests are held at a time: the next is left to Envoy
// at once, so a flood before the first table costs the worker a bounded list.
func TestHeldRequestsAreBounded(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, holdLong)
		ids := make([]uint32, route.MaxHeldForTable)
		for i := range ids {
			var action types.Action
			ids[i], action = h.exchange(request{body: chat(system, "q")})
			require.Equal(t, types.ActionPause, action)
		}
		_, hs := h.send(request{body: chat(system, "one too many")})
		assert.Empty(t, endpoint(hs), "left to Envoy")
		assert.Equal(t, uint64(route.MaxHeldForTable), counter(h, "kvroute_held_for_table_total"))
		assert.Equal(t, uint64(1), counter(h, "kvroute_unrouted_total"))

		h.serveTable(table.EncodeFull(fleet(t, 1, 2, nil, nil)))
		h.keepFresh()
		for _, id := range ids {
			require.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id))
			require.NotEmpty(t, endpoint(h.GetCurrentRequestHeaders(id)))
		}
	})
}

// A plugin that is done (a configuration update, or the proxy shutting down) ticks no
// more: the requests it holds go at once, to Envoy without a table.
func TestHeldRequestsGoWhenThePluginIsDone(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, holdLong)
		id, action := h.exchange(request{body: chat(system, "q")})
		require.Equal(t, types.ActionPause, action)
		assert.True(t, h.FinishVM())
		assert.Equal(t, types.ActionContinue, h.GetCurrentHttpStreamAction(id), "resumed")
		assert.Empty(t, endpoint(h.GetCurrentRequestHeaders(id)))
		assert.Equal(t, uint64(1), counter(h, "kvroute_unrouted_total"))
	})
}
