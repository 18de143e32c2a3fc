//go:build !wasm

package main

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cpaffinity "github.com/kvroute/kvroute/controlplane/affinity"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// startAs starts the filter as the proxy whose Envoy node id is node.
func startAs(t *testing.T, vm types.VMContext, cfg, node string) host {
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"node", "id"}, []byte(node))
	emu, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	require.Equal(t, types.OnPluginStartStatusOK, emu.StartPlugin(), "errors: %v", emu.GetCriticalLogs())
	return host{emu, t}
}

// tickWith ticks the filter and answers its calls as a control plane holding m: report
// batches go into m, affinity polls get m's answer, table polls frame (304 when nil).
// It returns the affinity polls' paths.
func (h host) tickWith(m *cpaffinity.Map, frame []byte, now time.Time) (polls []string) {
	h.t.Helper()
	n := len(h.callouts())
	h.Tick()
	for _, c := range h.callouts()[n:] {
		p := pathOf(c)
		switch {
		case p == api.ReportsPath:
			rb, _, err := api.ParseReportBatch(c.Body)
			require.NoError(h.t, err)
			m.Add(&rb, now)
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "204"}}, nil, nil)
		case strings.HasPrefix(p, api.AffinityPath):
			polls = append(polls, p)
			q, err := url.ParseQuery(strings.SplitN(p, "?", 2)[1])
			require.NoError(h.t, err)
			num := func(k string) uint64 { v, _ := strconv.ParseUint(q.Get(k), 10, 64); return v }
			body, _ := m.Answer(nil, num("since"), num("epoch"), num("proxy"), now)
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}, {"content-type", api.AffinityContentType}}, nil, body)
		case frame != nil:
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}, {"content-type", api.TableContentType}}, nil, frame)
		default:
			h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "304"}}, nil, nil)
		}
	}
	return polls
}

// Proxy A forwards a Responses answer and reports it; the control plane's map (the real
// one) serves the entry to proxy B, whose follow-up naming the response then goes to
// the replica that stored it though the rule would pick another, while A is not sent
// its own entry back. Only the id's hash and the replica's address cross.
func TestFollowUpOnAnotherProxyGoesToTheReplicaTheFirstLearned(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		m := cpaffinity.New(7, 0, 0, cpaffinity.Counts{})
		now := time.Now()
		var answered string
		t.Run("proxy A learns", func(t *testing.T) {
			a := startAs(t, vm, testConfig, "proxy-a")
			a.tickWith(m, table.EncodeFull(fleet(t, 5, 4, []uint64{9000, 6000, 3000, 0}, nil)), now)
			id, hs := a.send(request{path: "/v1/responses", body: responsesBody(system, "Open a ticket.")})
			answered = first(hs)
			a.answer(id, "200", "application/json", `{"id":"resp_on_a","created_at":1,"object":"response","output":[]}`)
			for range 3 {
				a.tickWith(m, nil, now)
			}
			require.Equal(t, 1, m.Len(), "the outcome report carried the response's key")
			body, n := m.Answer(nil, 0, 0, api.ProxyKey("proxy-a"), now)
			assert.Zero(t, n, "not echoed to A")
			assert.NotContains(t, string(body), "resp_on_a", "the id never leaves the proxy")
		})
		require.Equal(t, "10.1.0.4:8000", answered)

		b := startAs(t, vm, testConfig, "proxy-b")
		// On B's table the replica that answered is now the most queued.
		polls := b.tickWith(m, table.EncodeFull(fleet(t, 6, 4, []uint64{3000, 3000, 3000, 90000}, nil)), now)
		require.Len(t, polls, 1, "the leader asks for the other proxies' entries")
		assert.Contains(t, polls[0], "since=0")
		learned, _ := b.GetCounterMetric("kvroute_affinity_learned_total")
		assert.Equal(t, uint64(1), learned)
		_, hs := b.send(request{path: "/v1/responses", body: followUpBody("resp_on_a", "done")})
		assert.Equal(t, answered, first(hs), "to the replica that stored the response")
		followed, _ := b.GetCounterMetric("kvroute_follow_ups_affine_total")
		assert.Equal(t, uint64(1), followed)

		// The next poll moves on from the cursor and learns nothing twice.
		polls = append(polls, b.tickWith(m, nil, now)...)
		require.Len(t, polls, 2)
		assert.NotContains(t, polls[1], "since=0&")
		assert.Contains(t, polls[1], "epoch=7")
		learned, _ = b.GetCounterMetric("kvroute_affinity_learned_total")
		assert.Equal(t, uint64(1), learned)

		// A restarted control plane (another epoch, its cursors from 1 again) answers B's
		// cursor of the old epoch with everything it holds, and B's cursor starts over.
		restarted := cpaffinity.New(9, 0, 0, cpaffinity.Counts{})
		restarted.Add(&api.ReportBatch{Proxy: "proxy-c", Reports: []api.Report{{Kind: api.KindOutcome, Model: "llama",
			Replica: "10.1.0.2:8000", Status: 200, Affinity: api.AffinityKey(api.AffinityResponse, "", []byte("resp_on_c"))}}}, now)
		polls = b.tickWith(restarted, nil, now)
		require.Len(t, polls, 1)
		assert.Contains(t, polls[0], "since=1&epoch=7&")
		_, hs = b.send(request{path: "/v1/responses", body: followUpBody("resp_on_c", "done")})
		assert.Equal(t, "10.1.0.2:8000", first(hs))
		polls = b.tickWith(restarted, nil, now)
		assert.Contains(t, polls[0], "since=1&epoch=9&")
	})
}

// What is not an answer teaches nothing and is counted: an answer longer than any
// control plane sends (left unread), and a 404 from a control plane that predates the
// path, after which the leader leaves it alone for a minute of ticks.
func TestAffinityPollCountsWhatIsNotAnAnswer(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		answer := func(status string, body []byte) int {
			n := len(h.callouts())
			h.Tick()
			polls := 0
			for _, c := range h.callouts()[n:] {
				if strings.HasPrefix(pathOf(c), api.AffinityPath) {
					polls++
					h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", status}}, nil, body)
				} else {
					h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "304"}}, nil, nil)
				}
			}
			return polls
		}
		huge := api.AppendAffinityHead(nil, 1, 1)
		for len(huge) <= api.MaxAffinityAnswerBytes {
			huge = api.AppendAffinityEntry(huge, uint64(len(huge)), 0, strings.Repeat("1", 255))
		}
		require.Equal(t, 1, answer("200", huge))
		require.Equal(t, 1, answer("404", nil))
		for range 20 {
			require.Zero(t, answer("404", nil), "not asked again soon")
		}
		errs, _ := h.GetCounterMetric("kvroute_affinity_poll_errors_total")
		learned, _ := h.GetCounterMetric("kvroute_affinity_learned_total")
		assert.Equal(t, []uint64{2, 0}, []uint64{errs, learned})
	})
}
