package controlplane

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/table"
)

// A replica's numbers are as old as the engine's measurement, which comes after the
// scrape was sent and before its answer is read. A slow answer (a busy engine, a loaded
// control plane) must not make them look newer than they are: a proxy's ledger takes a
// request off a snapshot's queue only when it started after the snapshot was taken, so
// numbers stamped when the answer was read leave a request that started in the meantime
// queued, and the next request for its prefix goes elsewhere (under CPU load,
// wasmtest/mesh's TestTwentyRepeatsAtZeroSpacingAllHit lost 13 of 19 repeats so).
func TestStateAgeCountsFromWhenTheScrapeWasSent(t *testing.T) {
	const slow = 300 * time.Millisecond // from the measurement to the end of the answer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.37\n"+
			"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\",engine=\"0\"} 1\n")
		w.(http.Flusher).Flush()
		time.Sleep(slow) // a slow peer: the body ends when the handler returns
	}))
	t.Cleanup(srv.Close)
	_, base := startControlPlane(t, Options{
		Engines:         []discovery.Engine{{ID: "e1", Model: "m", Addr: "10.0.0.1:8000", Metrics: srv.URL + "/metrics"}},
		PublishInterval: 10 * time.Millisecond,
	})
	p := &poller{t: t, base: base, tab: table.New()}
	var rep table.Replica
	awaitCond(t, "a table with the engine's numbers", func() bool {
		p.poll()
		if m := p.tab.Models["m"]; m != nil && len(m.Replicas) == 1 {
			rep = m.Replicas[0]
		}
		return rep.KVUsage == 0.37
	})
	if age := time.Duration(rep.StateAgeMs) * time.Millisecond; age < slow {
		t.Fatalf("the first table with a scrape's numbers says they are %v old; they were taken at least %v before it was built", age, slow)
	}
}
