//go:build !wasm

package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// overloadConfig is testConfig with three classes: critical (2 s), standard (6 s) and
// sheddable (60 s), whose shed limits are 2/3 and 1/3 of critical's budget.
var overloadConfig = strings.Replace(testConfig, `"max_body_bytes"`, `"overload": {
		"classes": [{"name": "critical", "ttft_budget_ms": 2000, "critical": true},
			{"name": "standard", "ttft_budget_ms": 6000}, {"name": "sheddable", "ttft_budget_ms": 60000}],
		"class_header": "x-class", "default_class": "standard", "tenant_classes": {"batch": "sheddable"}},
	"max_body_bytes"`, 1)

// Past capacity a request whose class would miss its budget is answered at once with
// 429 and Retry-After (an Envoy local reply), counted by class and reason; critical
// requests, and every request the filter cannot place, go on.
func TestOverloadShedsWithA429AndRetryAfter(t *testing.T) {
	// At 14,025 tokens/s (the test fleet's speed) 10,000 queued tokens are 0.71 s, and with
	// the ~7,000-token prompt a 1.21 s wait.
	queued := []uint64{10_000, 10_000, 10_000}
	cases := []struct {
		name    string
		headers [][2]string
		queued  []uint64
		status  uint32 // 0: forwarded
		metric  string
	}{
		{"sheddable by header, past its 0.67 s", [][2]string{{"x-class", "sheddable"}}, queued, 429, "kvroute_shed_sheddable_wait_total"},
		{"sheddable by tenant", [][2]string{{"x-tenant", "batch"}}, queued, 429, "kvroute_shed_sheddable_wait_total"},
		{"standard (the default) within its 1.33 s", nil, queued, 0, ""},
		{"critical is never shed", [][2]string{{"x-class", "critical"}}, []uint64{1e7, 1e7, 1e7}, 0, ""},
		{"an empty fleet sheds nothing", [][2]string{{"x-class", "sheddable"}}, nil, 0, ""},
	}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				h := start(t, vm, overloadConfig)
				h.serveTable(table.EncodeFull(fleet(t, 1, 3, c.queued, nil)))
				id, action := h.exchange(request{body: chat(system, "q"), headers: c.headers})
				reply := h.GetSentLocalResponse(id)
				if c.status == 0 {
					require.Nil(t, reply)
					assert.Equal(t, types.ActionContinue, action)
					assert.NotEmpty(t, endpoint(h.GetCurrentRequestHeaders(id)), "routed")
					return
				}
				require.NotNil(t, reply, "refused with a local reply")
				assert.Equal(t, types.ActionPause, action, "and not forwarded")
				assert.Equal(t, c.status, reply.StatusCode)
				ra, ok := header(reply.Headers, "retry-after")
				require.True(t, ok, "with Retry-After")
				assert.Equal(t, "1", ra, "0.71 s against 0.67 s: the queue drains to the limit within a second")
				assert.NotContains(t, string(reply.Data), "ACME", "the reply names no prompt text")
				n, err := h.GetCounterMetric(c.metric)
				require.NoError(t, err)
				assert.Equal(t, uint64(1), n)
			})
		}
	})
}

// Before the first table the filter cannot predict a wait: every class is admitted
// (Envoy's fallback load balancer decides, as without classes).
func TestOverloadAdmitsWithoutATable(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, neverHold(overloadConfig))
		id, action := h.exchange(request{body: chat(system, "q"), headers: [][2]string{{"x-class", "sheddable"}}})
		assert.Nil(t, h.GetSentLocalResponse(id))
		assert.Equal(t, types.ActionContinue, action)
		n, err := h.GetCounterMetric("kvroute_unrouted_total")
		require.NoError(t, err)
		assert.Equal(t, uint64(1), n)
	})
}

// While the fleet is saturated (the wait past the lowest class limit) a tenant above its
// weight's share of the admitted prefill tokens is refused, with reason "fairness";
// another tenant at the same wait is admitted.
func TestOverloadHoldsATenantToItsShare(t *testing.T) {
	// 0.36 s of queue on each: saturated (past half the lowest limit, 0.33 s), and within
	// standard's 1.33 s.
	queued := []uint64{5000, 5000, 5000, 5000, 5000, 5000}
	steps := []struct {
		tenant string
		shed   bool
	}{
		{"noisy", false}, // no share yet
		{"quiet", false}, // below its half
		{"noisy", false}, // at its half
		{"noisy", true},  // two thirds of the tokens: above its half
		{"quiet", false},
	}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, overloadConfig)
		h.serveTable(table.EncodeFull(fleet(t, 1, len(queued), queued, nil)))
		for i, s := range steps {
			body := chat(strconv.Itoa(i)+system, "q") // a prefix of its own: a cold prefill each
			id, _ := h.exchange(request{body: body, headers: [][2]string{{"x-tenant", s.tenant}}})
			reply := h.GetSentLocalResponse(id)
			require.Equal(t, s.shed, reply != nil, "step %d (%s)", i, s.tenant)
		}
		n, err := h.GetCounterMetric("kvroute_shed_standard_fairness_total")
		require.NoError(t, err)
		assert.Equal(t, uint64(1), n)
		n, err = h.GetCounterMetric("kvroute_shed_standard_wait_total")
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}

// Without classes a class header is not read and nothing is refused, however long the
// queues; no shed counter exists.
func TestWithoutClassesNothingIsShed(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.serveTable(table.EncodeFull(fleet(t, 1, 3, []uint64{1e7, 1e7, 1e7}, nil)))
		id, action := h.exchange(request{body: chat(system, "q"), headers: [][2]string{{"x-class", "sheddable"}}})
		assert.Nil(t, h.GetSentLocalResponse(id))
		assert.Equal(t, types.ActionContinue, action)
		assert.NotEmpty(t, endpoint(h.GetCurrentRequestHeaders(id)))
		_, err := h.GetCounterMetric("kvroute_shed_sheddable_wait_total")
		assert.Error(t, err, "no shed counters without classes")
	})
}

// The VMs' admitted tokens per tenant go to the control plane (api.SharesPath) and its
// answer, the fleet's totals, into the admission: a tenant this proxy has not admitted yet
// but that holds most of the fleet's tokens through other proxies is refused while the
// fleet is saturated.
func TestOverloadHoldsATenantToItsFleetShare(t *testing.T) {
	queued := []uint64{5000, 5000, 5000, 5000, 5000, 5000} // saturated, as above
	fleetAnswer := api.AppendShares(nil, []api.ShareEntry{{Key: api.TenantKey("noisy"), Tokens: 1e6}, {Key: api.TenantKey("quiet"), Tokens: 100_000}})
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, overloadConfig)
		posted := false // a post named quiet's tokens
		answer := func(from int) {
			for _, c := range h.callouts()[from:] {
				if p, _ := header(c.Headers, ":path"); p != api.SharesPath {
					continue
				}
				es, err := api.ParseShares(nil, c.Body, api.MaxSharePost)
				require.NoError(t, err, "the leader posts a shares body")
				for _, e := range es {
					posted = posted || e.Key == api.TenantKey("quiet") && e.Tokens > 0
				}
				h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}, {"content-type", api.SharesContentType}}, nil, fleetAnswer)
			}
		}
		n := len(h.callouts())
		h.serveTable(table.EncodeFull(fleet(t, 1, len(queued), queued, nil)))
		answer(n)
		id, _ := h.exchange(request{body: chat("0"+system, "q"), headers: [][2]string{{"x-tenant", "quiet"}}})
		require.Nil(t, h.GetSentLocalResponse(id), "quiet: admitted")
		for i := 0; i < 50 && !posted; i++ {
			n = len(h.callouts())
			h.Tick()
			answer(n)
		}
		require.True(t, posted, "quiet's admitted tokens were posted")
		n = len(h.callouts())
		h.Tick() // the VM reads the fleet's totals
		answer(n)
		id, _ = h.exchange(request{body: chat("1"+system, "q"), headers: [][2]string{{"x-tenant", "noisy"}}})
		require.NotNil(t, h.GetSentLocalResponse(id), "noisy: over its share of the fleet's tokens")
		c, err := h.GetCounterMetric("kvroute_shed_standard_fairness_total")
		require.NoError(t, err)
		assert.Equal(t, uint64(1), c)
	})
}

// A control plane without the path (404) is left alone for a minute; the tokens the VMs
// admitted meanwhile are not the next interval's work, and the next post leaves them out.
func TestOverloadSharesAfterA404LeaveOutTheMinuteBefore(t *testing.T) {
	queued := []uint64{5000, 5000, 5000, 5000, 5000, 5000}
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, overloadConfig)
		// tick answers a tick's calls, the shares posts with status, and returns the
		// tokens those posts named for quiet (-1: no post).
		tick := func(status string) float32 {
			quiet := float32(-1)
			h.tickAnswering(func(body []byte) string {
				es, err := api.ParseShares(nil, body, api.MaxSharePost)
				require.NoError(t, err)
				quiet = 0
				for _, e := range es {
					if e.Key == api.TenantKey("quiet") {
						quiet = e.Tokens
					}
				}
				return status
			})
			return quiet
		}
		n := len(h.callouts())
		h.serveTable(table.EncodeFull(fleet(t, 1, len(queued), queued, nil)))
		for _, c := range h.callouts()[n:] {
			if p, _ := header(c.Headers, ":path"); p == api.SharesPath {
				h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "404"}}, nil, nil)
			}
		}
		id, _ := h.exchange(request{body: chat("0"+system, "q"), headers: [][2]string{{"x-tenant", "quiet"}}})
		require.Nil(t, h.GetSentLocalResponse(id))
		next := func(status string) float32 {
			for range 100_000 {
				if q := tick(status); q >= 0 {
					return q
				}
			}
			t.Fatal("no shares post")
			return 0
		}
		assert.Zero(t, next("200"), "the post after the minute leaves out what was admitted during it")
		id, _ = h.exchange(request{body: chat("1"+system, "q"), headers: [][2]string{{"x-tenant", "quiet"}}})
		require.Nil(t, h.GetSentLocalResponse(id))
		// The leader posts on a tick before its VM adds what it admitted: within two posts.
		assert.Positive(t, next("200")+next("200"), "the next interval's tokens are posted")
	})
}
