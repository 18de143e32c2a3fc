//go:build !wasm

package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// The leader asks for table formats up to 4; a control plane that knows them sends the
// slower tiers, the replicas' load and the homes, one that does not ignores the header.
func TestPollListsTheTableFormatsItReads(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.Tick()
		poll, ok := h.lastCallout(api.TablePath)
		require.True(t, ok)
		v, _ := header(poll.Headers, api.TableFormatsHeader)
		assert.Equal(t, "1,2,3,4", v)
	})
}

// tieredFleet is fleet with slot 1 holding earlier's prefix in CPU memory only.
func tieredFleet(t *testing.T, earlier string) *table.Table {
	tb := fleet(t, 5, 3, []uint64{3000, 0, 0}, map[uint32][]string{0: {earlier}})
	m := tb.Models["llama"]
	require.NoError(t, m.SetTiers([]string{"CPU"}))
	for _, k := range checkpointsOf(t, m.Config, earlier, "") {
		require.NoError(t, m.Set(k, append(slices.Clone(m.Lookup(k)), table.Holder(1, 1))...))
	}
	return tb
}

// A newer filter with a format-2 table sends the request to the replica that holds its
// prefix in CPU memory when loading it costs less than the GPU owner's extra queue.
func TestRoutesToACPUTierHitAtItsLoadCost(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		earlier := chat(system, "Where is order 1?")
		h.serveTable(table.EncodeFullFormat(tieredFleet(t, earlier), table.FormatTiers))
		_, hs := h.send(request{body: chat(system, "Cancel order 2.")})
		addrs := strings.Split(endpoint(hs), ",")
		require.Len(t, addrs, 3)
		assert.Equal(t, "10.1.0.2:8000", addrs[0], "slot 1 loads the prefix from CPU memory")
		assert.Equal(t, "10.1.0.1:8000", addrs[1], "then the GPU owner, 3,000 tokens deeper")
	})
}

// The same holdings in format 1 (what an older control plane sends, or one answering an
// older filter): GPU only, so the owner keeps the request as before.
func TestFormat1TableRoutesOnGPUHoldersOnly(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		earlier := chat(system, "Where is order 1?")
		h.serveTable(table.EncodeFull(tieredFleet(t, earlier)))
		_, hs := h.send(request{body: chat(system, "Cancel order 2.")})
		assert.Equal(t, "10.1.0.1:8000", strings.Split(endpoint(hs), ",")[0])
	})
}
