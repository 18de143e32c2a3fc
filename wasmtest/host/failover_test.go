package host_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// epochControlPlane is one control-plane replica: a full table of its own epoch, 304 to a
// poll that names its version and epoch.
type epochControlPlane struct {
	frame   []byte
	version string
	epoch   string
}

func (c *epochControlPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != api.TablePath {
		w.WriteHeader(http.StatusNoContent) // reports
		return
	}
	w.Header().Set(api.TableEpochHeader, c.epoch)
	q := r.URL.Query()
	if q.Get("version") == c.version && q.Get("epoch") == c.epoch {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("content-type", api.TableContentType)
	w.Write(c.frame)
}

// The compiled filter with two control-plane replicas, on two worker VMs: when the
// replica it polls refuses connections, the leader asks the other on its next tick, and
// every VM routes on the other's table within a poll interval or two, although both
// replicas number their tables v1: the version is counted in its replica's epoch, in
// the poll and in shared data.
func TestKvrouteFailsOverToTheNextControlPlaneReplica(t *testing.T) {
	const replicaB = "outbound|8080||kvroute-controlplane-1.kvroute-system.svc.cluster.local"
	cfg := strings.Replace(string(kvConfig), `"authority":"kvroute-controlplane",`,
		`"authority":"kvroute-controlplane","failover":[{"cluster":"`+replicaB+`","authority":"kvroute-controlplane-1"}],`, 1)
	a := &epochControlPlane{frame: table.EncodeFull(kvTable(t)), version: "1", epoch: "101"}
	// B's v1 lists other addresses: whichever comes first names the table it came from.
	b := &epochControlPlane{frame: table.EncodeFull(otherFleet(t)), version: "1", epoch: "202"}
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	h, err := host.Load(context.Background(), path, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(3),
		PluginConfig: []byte(cfg),
		Clusters:     map[string]host.Cluster{kvCluster: {Handler: a}, replicaB: {Handler: b}}})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(context.Background()) })

	first := func() []string {
		var out []string
		for i := range 2 {
			res, err := h.Do(context.Background(), host.Request{VM: h.VM(i),
				Headers: host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}},
				Body:    [][]byte{kvChat(kvSystem, fmt.Sprint("question ", i))}})
			require.NoError(t, err)
			out = append(out, strings.Split(endpointOf(res.Forwarded), ",")[0])
		}
		return out
	}
	clk.Advance(300 * time.Millisecond)
	for _, e := range first() {
		require.True(t, strings.HasPrefix(e, "127.0.0.1:"), "both VMs route on replica A's table: %s", e)
	}

	// A goes away: its port refuses connections.
	h.SetCluster(kvCluster, host.Cluster{URL: "http://127.0.0.1:1"})
	for step := 1; ; step++ {
		clk.Advance(100 * time.Millisecond)
		if got := first(); strings.HasPrefix(got[0], "127.0.0.2:") && strings.HasPrefix(got[1], "127.0.0.2:") {
			// The refused poll, then B's full table on the next tick.
			require.LessOrEqual(t, step, 3, "switched within %d ticks of 100 ms", step)
			break
		}
		require.Less(t, step, 30, "every VM routes on replica B's table")
	}
	v, ok := h.Metric("kvroute_table_failovers_total")
	require.True(t, ok)
	require.Equal(t, int64(1), v.Value)
	age, _ := h.Metric("kvroute_table_age_ms")
	require.Less(t, age.Value, int64(500), "the table stays fresh")
}

// otherFleet is a v1 of three replicas at 127.0.0.2, holding nothing.
func otherFleet(t *testing.T) *table.Table {
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	var rs []table.Replica
	for i := range 3 {
		rs = append(rs, table.Replica{Slot: uint32(i), ID: fmt.Sprint("b", i), Addr: fmt.Sprintf("127.0.0.2:%d", 9001+i),
			Queued: uint64(1000 * (i + 1)), Healthy: true, StateAgeMs: 20})
	}
	m, err := table.NewModel("llama", cfg, rs)
	require.NoError(t, err)
	tb := table.New()
	tb.Version = 1
	tb.Models["llama"] = m
	return tb
}
