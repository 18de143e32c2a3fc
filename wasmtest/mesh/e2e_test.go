package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// End-to-end: simulated vLLM replicas, the control plane and the real kvroute.wasm in
// the proxy, all on loopback. Engines run at a tenth of real time (docs/rule.md's timing),
// and each replica's KV pool holds 20,000 tokens.

const timeScale = 0.1

func start(t *testing.T, o mesh.Options) *mesh.Mesh {
	t.Helper()
	if o.Replicas == 0 {
		o.Replicas = 4
	}
	if o.TimeScale == 0 {
		o.TimeScale = timeScale
	}
	if o.KVBlocks == 0 {
		o.KVBlocks = 1250
	}
	o.ProxyAddr = "127.0.0.1:0"
	m, err := mesh.Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(m.Close)
	waitFor(t, "the filter has a table", func() bool { return m.Summary().TableVersion > 0 })
	return m
}

// waitFor polls cond until it holds; the deadline only guards against a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

type reply struct {
	mesh.Usage
	addr string // the replica that answered
}

// send runs one chat request and says which replica served it (requests must not overlap
// for that: it compares the proxy's per-endpoint counters).
func send(t *testing.T, m *mesh.Mesh, system, user string, headers ...string) reply {
	t.Helper()
	return sendModel(t, m, "llama", system, user, headers...)
}

// sendModel is send for a request of model.
func sendModel(t *testing.T, m *mesh.Mesh, model, system, user string, headers ...string) reply {
	t.Helper()
	before := m.Proxy.Stats().Forwards
	u, _, err := m.Chat(context.Background(), client, mesh.ChatBody(model, system, user, 8), headers...)
	require.NoError(t, err)
	after := m.Proxy.Stats().Forwards
	for a, n := range after {
		if n > before[a] {
			return reply{u, a}
		}
	}
	t.Fatal("no forward recorded")
	return reply{}
}

type debugReplica struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Healthy   bool   `json:"healthy"`
	TextKeys  int    `json:"text_keys"`
	TokenKeys int    `json:"token_keys"`
}

func debugState(t *testing.T, m *mesh.Mesh) map[string]debugReplica {
	_, rs := debugStateAt(t, m)
	return rs
}

// debugStateAt returns the control plane's version and its replicas by address.
func debugStateAt(t *testing.T, m *mesh.Mesh) (int64, map[string]debugReplica) {
	return stateAt(t, m.ControlPlaneURL())
}

// stateAt returns the version and replicas of the control plane at base URL cp.
func stateAt(t *testing.T, cp string) (int64, map[string]debugReplica) {
	resp, err := http.Get(cp + "/debug/state")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st struct {
		Version  int64
		Replicas []debugReplica
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	out := map[string]debugReplica{}
	for _, r := range st.Replicas {
		out[r.Address] = r
	}
	return st.Version, out
}

// known waits until the control plane lists addr as holding text keys and every proxy VM
// has caught up with that table version (the leader polls every 100 ms and the other VMs
// read shared data on their 100 ms tick).
func known(t *testing.T, m *mesh.Mesh, addr string) {
	t.Helper()
	var v int64
	waitFor(t, "the control plane learns where the prefix is", func() bool {
		version, rs := debugStateAt(t, m)
		v = version
		return rs[addr].TextKeys > 0
	})
	waitFor(t, "the filter's leader has that version", func() bool { return metric(m, "kvroute_table_version") >= v })
	nextTicks(t, m)
}

// settled waits until the table every proxy VM routes on lists addr with no queued
// prefill: a scrape taken while the last request was still queued can reach a table
// dated after that request started, and the filter then counts its prefill until the
// next scrape's table corrects it. Tests that freeze the table (a control-plane outage)
// wait for the correction first.
func settled(t *testing.T, m *mesh.Mesh, addr string) {
	t.Helper()
	published(t, m, addr+" with nothing queued", func(r table.Replica) bool { return r.Addr != addr || r.Queued == 0 })
}

// published waits until the control plane's table holds ok for every replica and every
// proxy VM routes on that version.
func published(t *testing.T, m *mesh.Mesh, what string, ok func(table.Replica) bool) {
	t.Helper()
	var v int64
	waitFor(t, "the control plane publishes "+what, func() bool {
		req, err := http.NewRequest("GET", m.ControlPlaneURL()+"/v1/table", nil)
		require.NoError(t, err)
		req.Header.Set(api.TableFormatsHeader, "1,2,3")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false // the control plane is starting
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			return false
		}
		tab := table.New()
		f, err := tab.Apply(b)
		require.NoError(t, err)
		v = int64(f.Version)
		n := 0
		for _, md := range tab.Models {
			for _, r := range md.Replicas {
				if !ok(r) {
					return false
				}
				n++
			}
		}
		return n > 0
	})
	waitFor(t, "the filter's leader has that version", func() bool { return metric(m, "kvroute_table_version") >= v })
	nextTicks(t, m)
}

// nextTicks waits until every proxy VM has ticked (read the shared table) since the call.
func nextTicks(t *testing.T, m *mesh.Mesh) {
	t.Helper()
	vms := m.Host.VMs()
	seen := make([]uint64, len(vms))
	for i, vm := range vms {
		seen[i] = vm.Ticks()
	}
	waitFor(t, "every proxy VM ticks again", func() bool {
		for i, vm := range vms {
			if vm.Ticks() <= seen[i] {
				return false
			}
		}
		return true
	})
}

func engineAt(t *testing.T, m *mesh.Mesh, addr string) int {
	for i, e := range m.Engines {
		if e.Addr() == addr {
			return i
		}
	}
	t.Fatalf("no engine at %s", addr)
	return -1
}

func metric(m *mesh.Mesh, name string) int64 {
	v, _ := m.Host.Metric(name)
	return v.Value
}

// Requests sharing a system prompt land on the replica that holds it, and the engines'
// own cached_tokens confirm the hits; an isolated tenant gets no hits on another
// tenant's blocks, and its cache_salt reaches the engine.
func TestAffinityAndTenantIsolation(t *testing.T) {
	m := start(t, mesh.Options{Filter: api.Config{Tenants: api.Tenants{
		Source: api.SourceHeader, Header: "x-tenant", Secret: "s3cret", Policies: map[string]string{"acme": api.PolicyIsolated}, InjectCacheSalt: true}}})
	salt := prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt()
	var mu sync.Mutex
	var salts []string
	for _, e := range m.Engines {
		e.Replica().ObserveEvents(func(b kvevents.Batch) {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range b.Events {
				if ev.Kind == kvevents.BlockStored && len(ev.ExtraKeys) > 0 && !ev.HasParent {
					salts = append(salts, ev.ExtraKeys[0]...)
				}
			}
		})
	}
	system := mesh.SystemPrompt(3, 1500)

	first := send(t, m, system, "where is order 1", "x-tenant", "globex")
	assert.Zero(t, first.CachedTokens, "cold")
	known(t, m, first.addr)

	var prompt, cached int
	for i := 0; i < 8; i++ {
		r := send(t, m, system, fmt.Sprintf("where is order %d", 100+i), "x-tenant", "globex")
		assert.Equal(t, first.addr, r.addr, "request %d goes to the replica holding the prefix", i)
		prompt += r.PromptTokens
		cached += r.CachedTokens
	}
	rate := float64(cached) / float64(prompt)
	t.Logf("shared tenant: %d of %d prompt tokens cached (%.1f%%)", cached, prompt, 100*rate)
	assert.Greater(t, rate, 0.85, "the system prompt is 1,500 of about 1,620 tokens")

	a1 := send(t, m, system, "where is order 7", "x-tenant", "acme")
	assert.Zero(t, a1.CachedTokens, "an isolated tenant gets no hits on another tenant's blocks")
	known(t, m, a1.addr)
	a2 := send(t, m, system, "where is order 8", "x-tenant", "acme")
	assert.Equal(t, a1.addr, a2.addr, "acme's own (salted) prefix routes to where acme sent it")
	assert.Greater(t, a2.CachedTokens, 1000, "acme hits its own salted blocks")
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, salts, salt, "the engine saw acme's cache_salt in its first block")
	assert.Equal(t, int64(2), metric(m, "kvroute_cache_salt_injected_total"))
}

// A hot prefix gains more than one owner once its owner's queue passes the prefill the
// cache saves, and its TTFT stays bounded. Real time here, and the profile's full KV pool
// (so the KV guard is not what spills): 30 requests a second share a 1,500-token prefix
// and each adds 1,000 tokens of its own, while one replica prefills about 14 of them a
// second.
func TestHotPrefixGainsOwners(t *testing.T) {
	m := start(t, mesh.Options{TimeScale: 1, KVBlocks: -1})
	system := mesh.SystemPrompt(0, 1500)
	owner := send(t, m, system, "warm up").addr
	known(t, m, owner)

	before := m.Proxy.Stats().Forwards
	res := m.RunLoad(context.Background(), mesh.Load{Customers: 1, PrefixTokens: 1500, QuestionTokens: 1000,
		MaxTokens: 8, Rate: 30, Duration: 3 * time.Second, Seed: 5})
	require.Zero(t, res.Errors)
	after := m.Proxy.Stats().Forwards
	owners := 0
	for a, n := range after {
		if n-before[a] > 0 {
			owners++
		}
		t.Logf("%s served %d of %d", a, n-before[a], res.Requests)
	}
	assert.GreaterOrEqual(t, owners, 2, "the hot prefix spilled to more owners")
	assert.Positive(t, metric(m, "kvroute_spills_total"))
	t.Logf("cached %.1f%%, TTFT p50 %s p95 %s", 100*res.CachedRate(), res.TTFTQuantile(0.5), res.TTFTQuantile(0.95))

	// TTFT in simulated seconds, from the engines' own histograms: one replica alone
	// would fall behind by half a second of prefill every second (30 x 1,000 tokens x
	// 71.3 us = 2.1 s of work per second); spread over the owners it stays bounded.
	worst := 0.0
	for _, e := range m.Engines {
		h := e.Replica().Metrics().TTFT
		for i := len(h.Counts) - 1; i >= 0; i-- {
			if h.Counts[i] > 0 {
				if i < len(h.Buckets) {
					worst = max(worst, h.Buckets[i])
				} else {
					worst = 1e9
				}
				break
			}
		}
	}
	t.Logf("slowest TTFT bucket: <= %.2f s", worst)
	assert.LessOrEqual(t, worst, 1.0)
}

// With the control plane down no request fails: routing goes on from the last table,
// then by least queued on local state once the table is stale; it recovers when the
// control plane is back.
func TestControlPlaneDown(t *testing.T) {
	m := start(t, mesh.Options{})
	system := mesh.SystemPrompt(5, 1500)
	owner := send(t, m, system, "q0").addr
	known(t, m, owner)

	settled(t, m, owner)

	m.StopControlPlane()
	fallbacks := metric(m, "kvroute_fallbacks_total")
	r := send(t, m, system, "q1")
	assert.Equal(t, owner, r.addr, "right after the outage the last table still routes")
	waitFor(t, "the table goes stale (2 s guard)", func() bool { return m.Summary().TableAge > 2200*time.Millisecond })
	stale := metric(m, "kvroute_stale_decisions_total")
	for i := 0; i < 10; i++ {
		send(t, m, mesh.SystemPrompt(10+i, 300), "q") // every one answered
	}
	assert.Equal(t, owner, send(t, m, system, "q-stale").addr, "a stale table still steers by its prefix entries")
	assert.GreaterOrEqual(t, metric(m, "kvroute_stale_decisions_total")-stale, int64(11), "stale table: the stale regime of the rule")
	assert.Equal(t, fallbacks, metric(m, "kvroute_fallbacks_total"), "a stale table is not a fallback")
	assert.Positive(t, metric(m, "kvroute_table_poll_errors_total"))

	require.NoError(t, m.StartControlPlane())
	published(t, m, "every replica scraped and healthy", func(r table.Replica) bool { return r.Healthy && r.StateAgeMs < 500 })
	waitFor(t, "the table is fresh again", func() bool { return m.Summary().TableAge < 300*time.Millisecond })
	stale = metric(m, "kvroute_stale_decisions_total")
	send(t, m, system, "q2")
	assert.Equal(t, stale, metric(m, "kvroute_stale_decisions_total"), "routing by the fresh rule again")
}

// A restarted replica's entries (AllBlocksCleared, event sequence back to 0) leave the
// table at the next publish; requests for its prefixes go elsewhere or rebuild there.
func TestReplicaRestartClearsItsEntries(t *testing.T) {
	m := start(t, mesh.Options{})
	system := mesh.SystemPrompt(6, 1500)
	owner := send(t, m, system, "q0").addr
	known(t, m, owner)
	i := engineAt(t, m, owner)

	// A process restart: the control plane learns of it from the new process's first
	// KV-event batch (its sequence starts at 0 again), so the new process serves one small
	// request of its own first (TestProcessRestartSeenAsSequenceReset has the details).
	m.Engines[i].Restart()
	restarted := time.Now()
	resp, err := http.Post(m.Engines[i].URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"llama","prompt":[`+strings.Repeat("7,", 63)+`7],"max_tokens":1}`)) // 4 full blocks
	require.NoError(t, err)
	resp.Body.Close()
	var version int64
	waitFor(t, "its entries leave the table", func() bool {
		v, rs := debugStateAt(t, m)
		version = v
		return rs[owner].TextKeys == 0 && rs[owner].TokenKeys == 1 // the new process's own 4 blocks
	})
	t.Logf("entries gone %s after the restart's first batch (publish interval 50 ms)", time.Since(restarted).Round(time.Millisecond))
	waitFor(t, "the filter's leader has that version", func() bool { return metric(m, "kvroute_table_version") >= version })
	nextTicks(t, m)
	r := send(t, m, system, "q1")
	assert.Zero(t, r.CachedTokens, "nobody holds the prefix any more: rebuilt wherever it went")
}

// A killed replica: requests go to the next endpoint of the filter's list, none is lost.
func TestReplicaKilled(t *testing.T) {
	m := start(t, mesh.Options{})
	system := mesh.SystemPrompt(8, 1500)
	owner := send(t, m, system, "q0").addr
	known(t, m, owner)
	i := engineAt(t, m, owner)
	m.Engines[i].Close()

	retries := m.Proxy.Stats().Retries
	for j := 0; j < 10; j++ {
		r := send(t, m, system, fmt.Sprintf("after the kill %d", j))
		assert.NotEqual(t, owner, r.addr)
	}
	assert.Positive(t, m.Proxy.Stats().Retries-retries, "the dead owner was tried first and skipped")
	waitFor(t, "the control plane marks it unhealthy", func() bool { return !debugState(t, m)[owner].Healthy })
}

// Malformed and hostile input: every request gets the engine's answer or a clear error,
// and the proxy and the filter keep running.
func TestMalformedAndHostileInput(t *testing.T) {
	m := start(t, mesh.Options{})
	valid := string(mesh.ChatBody("llama", "You are terse.", "hi", 4))
	cases := []struct {
		name, ctype, body string
		headers           [][2]string
		want              []int
	}{
		{"not JSON", "application/json", "hello engine", nil, []int{400}},
		{"truncated JSON", "application/json", valid[:len(valid)/2], nil, []int{400}},
		{"deep nesting", "application/json", `{"model":"llama","x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, nil, []int{200, 400}},
		{"invalid UTF-8", "application/json", "{\"model\":\"llama\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xfd\"}]}", nil, []int{200}},
		{"wrong content type", "text/plain", valid, nil, []int{200, 400, 415}},
		// Above max_body_bytes (1 MiB, Envoy's buffer limit) the filter stops buffering:
		// the body streams to a least-queued replica, which answers (here: too long).
		{"above the filter's parse limit", "application/json", string(mesh.ChatBody("llama", strings.Repeat("long context ", 200000), "q", 2)), nil, []int{200, 400}},
		{"client-sent routing header", "application/json", valid, [][2]string{{api.DefaultEndpointHeader, "10.66.66.66:8000"}}, []int{200}},
		{"empty body", "application/json", "", nil, []int{400}},
		{"GET on a POST path", "", "", nil, []int{405, 404, 400}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := "POST"
			if strings.HasPrefix(c.name, "GET") {
				method = "GET"
			}
			req, err := http.NewRequest(method, m.URL()+"/v1/chat/completions", strings.NewReader(c.body))
			require.NoError(t, err)
			if c.ctype != "" {
				req.Header.Set("content-type", c.ctype)
			}
			for _, h := range c.headers {
				req.Header.Set(h[0], h[1])
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Contains(t, c.want, resp.StatusCode, "body: %.200s", b)
			if resp.StatusCode >= 400 {
				assert.NotEmpty(t, b, "errors say what is wrong")
			}
		})
	}
	// Everything still works.
	r := send(t, m, "You are terse.", "still there?")
	assert.Positive(t, r.PromptTokens)
	st := m.Host.Stats()
	assert.Zero(t, st.VMFailures, "no VM trapped")
	assert.Positive(t, metric(m, "kvroute_parse_errors_total"))
	assert.Positive(t, metric(m, "kvroute_oversized_bodies_total"))
}
