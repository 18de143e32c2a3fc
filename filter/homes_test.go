//go:build !wasm

package main

import (
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/table"
)

// homedFleet is fleet past capacity (every replica busy 95% of the time) with nothing
// listed, slot 0 the home of earlier's prefix and 3,000 tokens queued there, the others
// without a queue.
func homedFleet(t *testing.T, earlier string) *table.Table {
	tb := fleet(t, 5, 3, []uint64{3000, 0, 0}, nil)
	m := tb.Models["llama"]
	for i := range m.Replicas {
		m.Replicas[i].Busy = 0.95
	}
	for _, k := range checkpointsOf(t, m.Config, earlier, "") {
		require.NoError(t, m.SetHome(k, 0))
	}
	return tb
}

// A prefix every cache let go goes back to its home, the replica that held it last, as
// the control plane's format-4 table names it, over a shorter queue elsewhere; the same
// table in format 3 (an older control plane) has no homes, and the request is placed as
// new, on one of the idle replicas.
func TestRoutesAPrefixListedNowhereToItsHome(t *testing.T) {
	for _, format := range []uint8{table.FormatHomes, table.FormatLoad} {
		eachRuntime(t, func(t *testing.T, vm types.VMContext) {
			h := start(t, vm, testConfig)
			earlier := chat(system, "Where is order 1?")
			h.serveTable(table.EncodeFullFormat(homedFleet(t, earlier), format))
			_, hs := h.send(request{body: chat(system, "Cancel order 2.")})
			first := strings.Split(endpoint(hs), ",")[0]
			if format == table.FormatHomes {
				assert.Equal(t, "10.1.0.1:8000", first, "home")
			} else {
				assert.NotEqual(t, "10.1.0.1:8000", first, "no homes in format 3")
			}
		})
	}
}
