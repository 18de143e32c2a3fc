package host_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// The filter dates a table from when its poll left, plus how long the control plane
// says it held the poll, minus the version's age (api.TableBuilt): the answer's way back
// (here 200 ms of the cluster's latency) is not counted as the version's. Counted, it
// dates the queue numbers later than they were measured, and the ledger keeps a request
// that started in between queued (route.Ledger): the next request for its prefix may go
// to another replica. A control plane that does not say how long it held a long poll
// leaves the answer's arrival as the date.
func TestKvrouteDatesTheTableFromWhenItsPollLeft(t *testing.T) {
	const latency, ageMs = 200 * time.Millisecond, 100
	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	for _, c := range []struct {
		name   string
		config string
		heldMs string // "" for no held header
		aged   bool   // the way back counts in the table's age
	}{
		{"poll on the tick", `{"control_plane":{"cluster":"` + kvCluster + `","authority":"cp","poll_ms":100,"report_ms":100,"wait_ms":-1}}`, "", true},
		{"long poll answered at once", string(kvConfig), "0", true},
		{"long poll held until the answer", string(kvConfig), strconv.Itoa(int(latency / time.Millisecond)), false},
		{"long poll, no held header", string(kvConfig), "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cp := &quietControlPlane{frame: table.EncodeFull(kvTable(t)), ageMs: strconv.Itoa(ageMs), heldMs: c.heldMs}
			clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
			h, err := host.Load(context.Background(), path, host.Config{Clock: clk, PluginConfig: []byte(c.config),
				Clusters: map[string]host.Cluster{kvCluster: {Handler: cp, Latency: latency}}})
			require.NoError(t, err)
			t.Cleanup(func() { h.Close(context.Background()) })
			clk.Advance(2 * time.Second)
			m, ok := h.Metric("kvroute_table_age_ms")
			require.True(t, ok)
			// The gauge is read on a tick, up to a tick (100 ms) after the last answer.
			age := time.Duration(m.Value) * time.Millisecond
			if c.aged {
				assert.GreaterOrEqual(t, age, ageMs*time.Millisecond+latency, "dated from when the poll left")
			} else {
				assert.GreaterOrEqual(t, age, ageMs*time.Millisecond)
				assert.Less(t, age, ageMs*time.Millisecond+latency, "dated from when the answer left the control plane")
			}
		})
	}
}
