//go:build !wasm

package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// Sharding by model (shards.go): one control plane per model; the filter polls
// each, routes a request on its model's shard's table and reports to that shard.

const (
	llamaCluster = "outbound|8080||kvroute-controlplane-llama.kvroute-system.svc.cluster.local"
	qwenCluster  = "outbound|8080||kvroute-controlplane-qwen.kvroute-system.svc.cluster.local"
)

// shardedConfig: llama (and its adapter) on one control plane, qwen on another; polls on
// the tick (wait_ms -1) as in testConfig.
const shardedConfig = `{
	"shards": [
		{"name": "llama", "models": ["llama"], "control_plane": {"cluster": "` + llamaCluster + `",
			"authority": "kvroute-controlplane-llama.kvroute-system.svc.cluster.local", "token": "tok-llama", "poll_ms": 100, "report_ms": 100, "wait_ms": -1}},
		{"name": "qwen", "models": ["qwen"], "control_plane": {"cluster": "` + qwenCluster + `",
			"authority": "kvroute-controlplane-qwen.kvroute-system.svc.cluster.local", "poll_ms": 100, "report_ms": 100, "wait_ms": -1}}
	],
	"model_header": "x-model",
	"adapters": {"llama-sql-lora": "llama"},
	"max_body_bytes": 65536
}`

func chatModel(model, system, question string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, model, system, question)
}

// controlPlane answers one shard's calls in a round: its table poll (nil: 304; a status
// of 0: the call fails with no response, as Envoy delivers a reset) and its report
// posts, whose reports it keeps.
type controlPlane struct {
	status  int
	frame   []byte
	ageMs   string
	polls   []string // the :path of every poll
	reports []api.Report
	auth    []string // the authorization header of every table poll and report post
	// affinityPolls are the affinity polls it got (answered 404: not served).
	affinityPolls int
}

// round ticks the filter once and answers every call it made, each by the control plane
// of the cluster it went to. Calls are answered after the tick, highest id first: the
// emulator numbers a call by how many are outstanding, and nothing is dispatched from
// a callback with wait_ms -1.
func (h host) round(cps map[string]*controlPlane) {
	h.t.Helper()
	n := len(h.callouts())
	h.Tick()
	calls := slices.Clone(h.callouts()[n:])
	slices.SortFunc(calls, func(a, b proxytest.HttpCalloutAttribute) int { return int(b.CalloutID) - int(a.CalloutID) })
	for _, c := range calls {
		cp, ok := cps[c.Upstream]
		require.True(h.t, ok, "a call to %q, a cluster of no shard", c.Upstream)
		path := pathOf(c)
		if strings.HasPrefix(path, api.AffinityPath) {
			cp.affinityPolls++
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "404"}}, nil, nil)
			continue
		}
		auth, _ := header(c.Headers, "authorization")
		cp.auth = append(cp.auth, auth)
		if path == api.ReportsPath {
			rb, _, err := api.ParseReportBatch(c.Body)
			require.NoError(h.t, err)
			cp.reports = append(cp.reports, rb.Reports...)
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "204"}}, nil, nil)
			continue
		}
		require.True(h.t, strings.HasPrefix(path, api.TablePath), path)
		cp.polls = append(cp.polls, path)
		switch {
		case cp.status == 0:
			h.CallOnHttpCallResponse(c.CalloutID, nil, nil, nil)
		case cp.status == 200 && cp.frame != nil:
			hs := [][2]string{{":status", "200"}}
			if cp.ageMs != "" {
				hs = append(hs, [2]string{api.TableAgeHeader, cp.ageMs})
			}
			h.CallOnHttpCallResponse(c.CalloutID, hs, nil, cp.frame)
			cp.frame = nil // then 304s
		case cp.status == 200:
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "304"}}, nil, nil)
		default:
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", fmt.Sprint(cp.status)}}, nil, nil)
		}
	}
}

func counter(h host, name string) uint64 {
	v, _ := h.GetCounterMetric(name)
	return v
}

func gauge(h host, name string) uint64 {
	v, _ := h.GetGaugeMetric(name)
	return v
}

// A configuration without shards keeps the keys, queue and metrics it always had: the
// table under kvroute/head and kvroute/base/, no shard keys, one control plane polled.
func TestConfigWithoutShardsKeepsItsKeysAndControlPlane(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		body := chat(system, "q")
		h.serveTable(table.EncodeFull(fleet(t, 3, 3, nil, map[uint32][]string{1: {body}})))
		hd, err := decodeHead(readShared(t, "kvroute/head"), nil)
		require.NoError(t, err)
		assert.Equal(t, uint64(3), hd.version())
		readShared(t, fmt.Sprintf("kvroute/base/%d/0", hd.baseSlot))
		_, _, err = proxywasm.GetSharedData("kvroute/shard/llama/head")
		assert.Equal(t, types.ErrorStatusNotFound, err)
		assert.Equal(t, uint64(3), gauge(h, "kvroute_table_version"))

		h.Tick()
		_, hs := h.send(request{body: body})
		assert.Equal(t, "10.1.0.2:8000", strings.Split(endpoint(hs), ",")[0])
		_, hs = h.send(request{body: chatModel("qwen", system, "q")})
		assert.Empty(t, endpoint(hs), "a model the table does not have: unrouted as before")
		assert.Zero(t, counter(h, "kvroute_unserved_model_total"), "every model is served: the table just lacks it")
		rs := h.reports()
		require.Len(t, rs, 1)
		p, ok := h.lastCallout(api.ReportsPath)
		require.True(t, ok)
		assert.Equal(t, "outbound|8080||cp.kvroute.svc.cluster.local", p.Upstream)
	})
}

// Each request routes on its model's shard: a llama prompt to the llama replica that
// holds it, a qwen prompt to the qwen replica that holds it, even though the llama
// control plane's table also lists a "qwen" (an unfiltered control plane); the model
// header and an adapter pick the shard too; reports go to the request's shard; a model
// no shard serves fails open and is counted.
func TestShardedRequestsRouteOnTheirModelsShard(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, shardedConfig)
		sys2 := strings.Repeat("You translate legal contracts from German into plain English. ", 400)
		llamaTable := modelTable(t, newTable(5), "llama", 1, 3, nil, map[uint32][]string{2: {chatModel("llama", system, "a")}})
		modelTable(t, llamaTable, "qwen", 9, 2, nil, map[uint32][]string{0: {chatModel("qwen", sys2, "a")}})
		qwenTable := modelTable(t, newTable(40), "qwen", 2, 3, nil, map[uint32][]string{1: {chatModel("qwen", sys2, "a")}})
		cps := map[string]*controlPlane{
			llamaCluster: {status: 200, frame: table.EncodeFull(llamaTable)},
			qwenCluster:  {status: 200, frame: table.EncodeFull(qwenTable)},
		}
		h.round(cps)
		for cl, cp := range cps {
			assert.Equal(t, []string{api.TablePath + "?version=0"}, cp.polls, "one poll to %s", cl)
			assert.Equal(t, 1, cp.affinityPolls, "%s is asked for the other proxies' affinity", cl)
		}
		assert.Equal(t, []string{"Bearer tok-llama"}, cps[llamaCluster].auth, "each shard's own token")
		assert.Equal(t, []string{""}, cps[qwenCluster].auth)

		// Each shard's table in its own keys; none in the unsharded ones.
		for name, v := range map[string]uint64{"llama": 5, "qwen": 40} {
			hd, err := decodeHead(readShared(t, "kvroute/shard/"+name+"/head"), nil)
			require.NoError(t, err)
			assert.Equal(t, v, hd.version(), name)
			assert.Equal(t, v, gauge(h, "kvroute_shard_"+name+"_table_version"), name)
		}
		_, _, err := proxywasm.GetSharedData("kvroute/head")
		assert.Equal(t, types.ErrorStatusNotFound, err)
		assert.Equal(t, uint64(5), gauge(h, "kvroute_table_version"), "the lowest shard's")

		h.round(cps) // the VM reads the heads
		_, hs := h.send(request{body: chatModel("llama", system, "b")})
		assert.Equal(t, "10.1.0.3:8000", strings.Split(endpoint(hs), ",")[0], "llama: the llama shard's prefix owner")
		_, hs = h.send(request{body: chatModel("qwen", sys2, "b")})
		assert.Equal(t, "10.2.0.2:8000", strings.Split(endpoint(hs), ",")[0], "qwen: the qwen shard's owner, not the llama table's qwen")
		_, hs = h.send(request{body: chatModel("llama", sys2, "c"), headers: [][2]string{{"x-model", "qwen"}}})
		assert.Equal(t, "10.2.0.2:8000", strings.Split(endpoint(hs), ",")[0], "model_header picks the shard")
		_, hs = h.send(request{body: chatModel("llama-sql-lora", "short", "d")})
		assert.Contains(t, endpoint(hs), "10.1.0.", "an adapter routes on its base model's shard")
		assert.Zero(t, counter(h, "kvroute_unserved_model_total"))

		// A model no shard serves, and a body naming none: no header, counted, never dropped.
		for _, body := range []string{chatModel("mistral", system, "e"), `{"messages":[{"role":"user","content":"hi"}]}`} {
			_, hs = h.send(request{body: body})
			assert.Empty(t, endpoint(hs))
		}
		assert.Equal(t, uint64(2), counter(h, "kvroute_unserved_model_total"))
		assert.Equal(t, uint64(2), counter(h, "kvroute_unrouted_total"))

		// Reports go to the request's shard.
		h.round(cps)
		models := func(cp *controlPlane) (out []string) {
			for _, r := range cp.reports {
				out = append(out, r.Model+" "+r.Replica[:5])
			}
			return out
		}
		assert.ElementsMatch(t, []string{"llama 10.1.", "llama 10.1."}, models(cps[llamaCluster]))
		assert.ElementsMatch(t, []string{"qwen 10.2.", "qwen 10.2."}, models(cps[qwenCluster]))
	})
}

// One shard's control plane down does not stale another's table: the failing shard
// backs off alone, the other keeps polling on its schedule and its table stays fresh
// (confirmed on every 304), so its requests are decided fresh while the failing shard's
// are decided stale; each shard's own gauges say which is down.
func TestOneShardDownLeavesTheOtherFresh(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, shardedConfig)
		sys2 := strings.Repeat("You translate legal contracts from German into plain English. ", 400)
		// The llama table is dated a second back, so its confirmations show.
		llama := &controlPlane{status: 200, ageMs: "1000", frame: table.EncodeFull(modelTable(t, newTable(5), "llama", 1, 3, nil,
			map[uint32][]string{2: {chatModel("llama", system, "a")}}))}
		// The qwen table is served built 2.5 s ago, then its control plane goes down: its
		// table is past the 2 s state-age guard for as long as it stays down.
		qwen := &controlPlane{status: 200, ageMs: "2500", frame: table.EncodeFull(modelTable(t, newTable(40), "qwen", 2, 3, nil,
			map[uint32][]string{1: {chatModel("qwen", sys2, "a")}}))}
		cps := map[string]*controlPlane{llamaCluster: llama, qwenCluster: qwen}
		h.round(cps)
		qwen.status = 0 // down: Envoy resets the calls
		llamaHead := func() int64 {
			hd, err := decodeHead(readShared(t, "kvroute/shard/llama/head"), nil)
			require.NoError(t, err)
			return hd.confirmedMs
		}
		before := llamaHead()
		const rounds = 20
		for range rounds {
			h.round(cps)
		}
		assert.Len(t, llama.polls, rounds+1, "the llama shard polls on every tick")
		assert.Less(t, len(qwen.polls), rounds/2, "the qwen shard backs off")
		assert.Greater(t, llamaHead(), before, "the llama table is confirmed current")
		assert.Zero(t, counter(h, "kvroute_shard_llama_table_poll_errors_total"))
		assert.Equal(t, uint64(len(qwen.polls)-1), counter(h, "kvroute_shard_qwen_table_poll_errors_total"))
		assert.Less(t, gauge(h, "kvroute_shard_llama_table_age_ms"), uint64(1000))
		assert.GreaterOrEqual(t, gauge(h, "kvroute_shard_qwen_table_age_ms"), uint64(2500))
		assert.Equal(t, gauge(h, "kvroute_shard_qwen_table_age_ms"), gauge(h, "kvroute_table_age_ms"), "the stalest shard's")

		_, hs := h.send(request{body: chatModel("llama", system, "b")})
		assert.Equal(t, "10.1.0.3:8000", strings.Split(endpoint(hs), ",")[0])
		assert.Zero(t, counter(h, "kvroute_stale_decisions_total"), "llama is decided on a fresh table")
		_, hs = h.send(request{body: chatModel("qwen", sys2, "b")})
		assert.Equal(t, "10.2.0.2:8000", strings.Split(endpoint(hs), ",")[0], "qwen still routes on its last table")
		assert.Equal(t, uint64(1), counter(h, "kvroute_stale_decisions_total"), "qwen's table is stale")
	})
}

// A shards configuration the filter cannot honour stops it at start, and the log names
// the problem (api.Config.Validate's message).
func TestInvalidShardsFailStartNamingTheProblem(t *testing.T) {
	shard := func(name, models, cluster string) string {
		return fmt.Sprintf(`{"name": %q, "models": %s, "control_plane": {"cluster": %q, "authority": "a"}}`, name, models, cluster)
	}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for cfg, want := range map[string]string{
			`{"shards": [` + shard("a", `["llama", "qwen"]`, "c1") + `,` + shard("b", `["qwen"]`, "c2") + `]}`:          `model "qwen" is in two shards: shards[0] (a) and shards[1] (b)`,
			`{"shards": [` + shard("a", `["llama"]`, "c1") + `,` + shard("b", `[]`, "c2") + `]}`:                        `shards[1] (b).models is empty`,
			`{"shards": [` + shard("a", `["llama"]`, "c1") + `,` + shard("b", `["qwen"]`, "c1") + `]}`:                  `shards[1] (b).control_plane.cluster "c1" is also shards[0] (a)'s`,
			`{"control_plane": {"cluster": "c0", "authority": "a"}, "shards": [` + shard("a", `["llama"]`, "c1") + `]}`: `control_plane and shards are exclusive`,
		} {
			opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
			h, reset := proxytest.NewHostEmulator(opt)
			assert.Equal(t, types.OnPluginStartStatusFailed, h.StartPlugin(), cfg)
			logs := strings.Join(h.GetCriticalLogs(), "\n")
			assert.Contains(t, logs, "invalid plugin configuration, filter not started")
			assert.Contains(t, logs, want)
			reset()
		}
	})
}
