package mesh_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// overloadMesh is two replicas whose filter has classes from the x-class header:
// critical within 300 ms, sheddable within 3 s but refused past 100 ms of queue, in wall
// time (the engines run at timeScale, so a prefill token takes 71.3 us x timeScale).
func overloadMesh(t *testing.T) *mesh.Mesh {
	return start(t, mesh.Options{Replicas: 2, Filter: api.Config{Overload: api.Overload{
		Classes: []api.Class{
			{Name: "critical", TTFTBudgetMs: 300, Critical: true},
			{Name: "sheddable", TTFTBudgetMs: 3000, ShedAboveMs: 100},
		},
		ClassHeader: "x-class", DefaultClass: "sheddable",
		PrefillTokensPerSecond: api.DefaultPrefillTokensPerSecond / timeScale,
	}}})
}

// A flood of sheddable requests with prompts of their own, through the compiled filter
// in a proxy: the filter answers the flood's excess with 429 and Retry-After at once,
// serves the rest, counts the refusals by class and reason, and never refuses a critical
// request. The critical class's TTFT is logged, not asserted: here it is wall time on a
// shared machine. That it stays within its budget past capacity is asserted on the
// simulator's virtual clock, with the Go router and with the compiled filter
// (wasmtest/fleet TestSheddingKeepsCriticalWithinItsBudgetPastCapacity and
// TestCompiledFilterShedsPastCapacity).
func TestSheddableFloodIsRefusedAtTheProxy(t *testing.T) {
	m := overloadMesh(t)
	ctx := context.Background()
	system := mesh.SystemPrompt(1, 2000)
	critical := func(n int) []time.Duration {
		var ttfts []time.Duration
		for i := range n {
			_, ttft, err := m.Chat(ctx, client, mesh.ChatBody("llama", system, fmt.Sprint("order ", i), 8), "x-class", "critical")
			require.NoError(t, err, "critical requests are never refused")
			ttfts = append(ttfts, ttft)
		}
		slices.Sort(ttfts)
		return ttfts
	}
	quiet := critical(20)

	var (
		stop              atomic.Bool
		wg                sync.WaitGroup
		ok, shed, noRetry atomic.Int64
	)
	stopFlood := func() { stop.Store(true); wg.Wait() }
	t.Cleanup(stopFlood) // before the mesh closes, whatever fails
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				body := mesh.ChatBody("llama", mesh.SystemPrompt(1000+g*1000+i, 4000), "summarise", 64)
				status, retryAfter := postClass(t, m, body, "sheddable")
				switch status {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					shed.Add(1)
					if n, err := strconv.Atoi(retryAfter); err != nil || n < 1 {
						noRetry.Add(1)
					}
					time.Sleep(10 * time.Millisecond) // a flood, but not a spin: the proxy shares the cores
				default:
					t.Errorf("sheddable request: status %d", status)
					return
				}
			}
		}()
	}
	waitFor(t, "the flood is refused in part", func() bool { return shed.Load() > 50 })
	flooded := critical(40)
	stopFlood()

	p95 := func(d []time.Duration) time.Duration { return d[(len(d)*95+99)/100-1] }
	t.Logf("critical TTFT p95 %v quiet, %v under the flood; sheddable %d served, %d refused", p95(quiet), p95(flooded),
		ok.Load(), shed.Load())
	assert.Positive(t, ok.Load(), "the flood is served in part")
	assert.Zero(t, noRetry.Load(), "every refusal carries Retry-After")
	counted, _ := m.Host.Metric("kvroute_shed_sheddable_wait_total")
	assert.Positive(t, counted.Value, "counted by class and reason")
}

// postClass sends body with class and returns the status and Retry-After.
func postClass(t *testing.T, m *mesh.Mesh, body []byte, class string) (int, string) {
	req, err := http.NewRequestWithContext(context.Background(), "POST", m.URL()+"/v1/chat/completions", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-class", class)
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("post: %v", err)
		return 0, ""
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("retry-after")
}
