package host_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// The filter's warm-up at plugin start (filter/warmup.go) routes made-up requests on a
// router of its own: none of it reaches what the VMs share (placement records), count
// (metrics) or send (reports), and the first real request is the first of everything.
func TestKvrouteWarmUpLeavesNoTrace(t *testing.T) {
	cp := &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(5),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}}})

	started := 0
	for _, l := range h.Logs() {
		if strings.Contains(l.Message, "kvroute: started") && strings.Contains(l.Message, "warm-up") {
			started++
		}
	}
	assert.Equal(t, 2, started, "each VM logs its start with the warm-up's time")

	clk.Advance(time.Second) // ten ticks: anything queued would be posted and shared
	placedKeys := func() (n int) {
		for _, k := range h.SharedDataKeys() {
			if strings.HasPrefix(k, "kvroute/placed/") {
				n++
			}
		}
		return n
	}
	assert.Zero(t, placedKeys(), "no placement record in shared data")
	assert.Empty(t, cp.reports(), "no report at the control plane")
	for _, m := range h.Metrics() {
		// The leader's polls and loads of the table are counted from the first tick.
		if strings.HasSuffix(m.Name, "_total") && !strings.HasPrefix(m.Name, "kvroute_table_") {
			assert.Zero(t, m.Value, "%s before any request", m.Name)
		}
	}

	// The same checks see the first real request: they are not blind.
	res, err := h.Do(context.Background(), kvRequest(kvChat(kvSystem, "the first real question")))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9002", strings.Split(endpointOf(res.Forwarded), ",")[0])
	clk.Advance(500 * time.Millisecond)
	assert.Positive(t, placedKeys(), "the placement is shared with the other VM")
	assert.Len(t, cp.reports(), 3, "its placement, start and outcome, nothing else")
	assert.Equal(t, int64(1), metricValue(h, "kvroute_decisions_total"))
}
