package mesh_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// Affinity from the first repeat, and through a control-plane outage. The
// mesh runs two proxy VMs, so a repeat may reach the VM that did not place the first
// request: these tests also cover the placements the VMs share (filter/placed.go).
//
// Run against a filter without local placements and with a stale table routed
// least-queued (KVROUTE_WASM=<that kvroute.wasm>), they fail: the printed curl's repeat
// gets 0 cached tokens, the 20 repeats hit 0 of 19 (every one arrives before the table
// knows the prefix), and during the outage the warm prefixes go least-queued (hits 2 of
// 12, the new prefix's repeat 0).

// curlChat sends the request `kvroute-mesh` prints (a non-streamed chat completion) and
// returns the usage and the replica that served it.
func curlChat(t *testing.T, m *mesh.Mesh, system, user string) reply {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"model": "llama", "max_tokens": 16,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	require.NoError(t, err)
	before := m.Proxy.Stats().Forwards
	resp, err := client.Post(m.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var out struct {
		Usage mesh.Usage `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(b, &out))
	u := out.Usage
	if u.Details != nil {
		u.CachedTokens = u.Details.CachedTokens
	}
	for a, n := range m.Proxy.Stats().Forwards {
		if n > before[a] {
			return reply{u, a}
		}
	}
	t.Fatal("no forward recorded")
	return reply{}
}

// The curl `make run` prints, sent twice back to back: the second finds its prefix
// cached, although the control plane cannot have published it yet.
func TestPrintedCurlRepeatedBackToBackHits(t *testing.T) {
	m := start(t, mesh.Options{})
	system := strings.ReplaceAll(mesh.SystemPrompt(7, 200), `"`, ``) // as kvroute-mesh prints it
	first := curlChat(t, m, system, "Where is my order 42?")
	second := curlChat(t, m, system, "Where is my order 42?")
	t.Logf("first: %d of %d cached on %s; second: %d cached on %s", first.CachedTokens, first.PromptTokens, first.addr,
		second.CachedTokens, second.addr)
	assert.Equal(t, first.addr, second.addr)
	assert.Greater(t, second.CachedTokens, second.PromptTokens/2, "the repeat finds the prompt cached")
}

// Twenty repeats of one new prompt with no gap: each after the first hits.
func TestTwentyRepeatsAtZeroSpacingAllHit(t *testing.T) {
	m := start(t, mesh.Options{})
	system := mesh.SystemPrompt(31, 1500)
	first := send(t, m, system, "Summarise my account.")
	hits := 0
	for i := 0; i < 19; i++ {
		r := send(t, m, system, "Summarise my account.")
		if r.addr == first.addr && r.CachedTokens > r.PromptTokens/2 {
			hits++
		}
	}
	t.Logf("%d of 19 repeats hit", hits)
	assert.Equal(t, 19, hits)
}

// outage is how long the control plane stays down in TestControlPlaneOutageKeepsAffinity:
// 8 s, four times the 2 s state-age guard (the fleet simulation runs 60 s,
// kvroute-bench --cp-outage 300:60; the suite affords seconds).
const outage = 8 * time.Second

// With the control plane down the table ages past the 2 s guard; the warm prefixes still
// go to their owners and hit, and a prefix first seen during the outage gains affinity
// from its first repeat (local placements). Every request is answered.
func TestControlPlaneOutageKeepsAffinity(t *testing.T) {
	m := start(t, mesh.Options{})
	owners := map[int]string{}
	for c := 40; c < 44; c++ {
		owners[c] = send(t, m, mesh.SystemPrompt(c, 1500), "warm up").addr
	}
	for _, addr := range owners {
		known(t, m, addr)
	}

	m.StopControlPlane()
	down := time.Now()
	t.Cleanup(func() { _ = m.StartControlPlane() })
	waitFor(t, "the table goes stale (2 s guard)", func() bool { return m.Summary().TableAge > 2200*time.Millisecond })
	stale := metric(m, "kvroute_stale_decisions_total")

	hits, total := 0, 0
	newFirst := send(t, m, mesh.SystemPrompt(77, 1500), "first seen during the outage")
	newRepeat := send(t, m, mesh.SystemPrompt(77, 1500), "first seen during the outage")
	for i := 0; time.Since(down) < outage; i++ {
		c := 40 + i%4
		r := send(t, m, mesh.SystemPrompt(c, 1500), fmt.Sprint("question ", i))
		total++
		if r.addr == owners[c] && r.CachedTokens > r.PromptTokens/2 {
			hits++
		}
	}
	t.Logf("outage of %v: %d of %d warm requests hit their owner; new prefix's repeat: %d of %d cached", time.Since(down).Round(time.Second),
		hits, total, newRepeat.CachedTokens, newRepeat.PromptTokens)
	assert.Equal(t, total, hits, "the last table's prefix entries still route")
	assert.Equal(t, newFirst.addr, newRepeat.addr)
	assert.Greater(t, newRepeat.CachedTokens, newRepeat.PromptTokens/2, "local placements")
	assert.GreaterOrEqual(t, metric(m, "kvroute_stale_decisions_total")-stale, int64(total), "decided by the stale regime")
	assert.Positive(t, metric(m, "kvroute_table_poll_errors_total"))
}
