//go:build !wasm

package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// The leader's long poll (leader.go): wait_ms on every poll, the next poll dispatched
// from the response callback when a newer version came (or the wait ran out), never two
// in flight, and failures wait for the tick. No requests run here, so no report posts
// share the emulator's callout ids with a poll (see testConfig).

func longPollConfig(pollMs int) string {
	return strings.Replace(testConfig, `"poll_ms": 100, "report_ms": 100, "wait_ms": -1`,
		`"poll_ms": `+strconv.Itoa(pollMs)+`, "report_ms": 100`, 1)
}

// polls returns the table polls made so far.
func (h host) polls() []proxytest.HttpCalloutAttribute {
	var out []proxytest.HttpCalloutAttribute
	for _, c := range h.callouts() {
		if p, _ := header(c.Headers, ":path"); strings.HasPrefix(p, api.TablePath) {
			out = append(out, c)
		}
	}
	return out
}

func pathOf(c proxytest.HttpCalloutAttribute) string {
	p, _ := header(c.Headers, ":path")
	return p
}

func answer(h host, c proxytest.HttpCalloutAttribute, status string, body []byte) {
	hs := [][2]string{{":status", status}}
	if status == "" {
		hs = nil // a reset: Envoy delivers no headers
	}
	h.CallOnHttpCallResponse(c.CalloutID, hs, nil, body)
}

func TestLongPollAsksAgainAsSoonAsAVersionArrives(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, longPollConfig(100))
		h.Tick()
		ps := h.polls()
		require.Len(t, ps, 1)
		assert.Equal(t, api.TablePath+"?version=0&wait_ms=1000", pathOf(ps[0]), "wait_ms in every poll")

		// While the control plane holds it, ticks send no second poll.
		for range 5 {
			h.Tick()
		}
		require.Len(t, h.polls(), 1, "one poll in flight")

		// A full frame: the next poll leaves from the callback, no tick needed.
		v3 := fleet(t, 3, 2, nil, nil)
		answer(h, ps[0], "200", table.EncodeFull(v3))
		ps = h.polls()
		require.Len(t, ps, 2, "the next poll is dispatched on the response")
		assert.Equal(t, api.TablePath+"?version=3&wait_ms=1000", pathOf(ps[1]))
		h.Tick()
		require.Len(t, h.polls(), 2, "still one in flight")

		// A delta: the same.
		v4 := fleet(t, 4, 2, []uint64{10, 0}, nil)
		answer(h, ps[1], "200", table.Encode(table.Diff(v3, v4)))
		ps = h.polls()
		require.Len(t, ps, 3)
		assert.Equal(t, api.TablePath+"?version=4&wait_ms=1000", pathOf(ps[2]))
		hd, err := decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.Equal(t, uint64(4), hd.version(), "published before asking again")

		// A 304 at once (a control plane that does not hold polls): the tick schedule,
		// as without long polls.
		answer(h, ps[2], "304", nil)
		require.Len(t, h.polls(), 3, "no poll straight after a quick 304")
		h.Tick()
		ps = h.polls()
		require.Len(t, ps, 4, "the next tick polls")
		assert.Equal(t, api.TablePath+"?version=4&wait_ms=1000", pathOf(ps[3]))
	})
}

// Native only: the emulator runs the module under wazero's fake clock, where time
// does not pass between callbacks.
func TestLongPollThatRanOutAsksAgainAtOnce(t *testing.T) {
	func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, longPollConfig(10)) // 10 ms ticks and poll interval
		h.Tick()
		ps := h.polls()
		require.Len(t, ps, 1)
		answer(h, ps[0], "200", table.EncodeFull(fleet(t, 5, 2, nil, nil)))
		ps = h.polls()
		require.Len(t, ps, 2)
		// The control plane held the poll longer than a poll interval and had nothing
		// new: ask again now rather than a tick later.
		sent := time.Now()
		for time.Since(sent) < 20*time.Millisecond {
			time.Sleep(time.Until(sent.Add(20 * time.Millisecond)))
		}
		answer(h, ps[1], "304", nil)
		ps = h.polls()
		require.Len(t, ps, 3, "a long poll that ran out is followed at once")
		assert.Equal(t, api.TablePath+"?version=5&wait_ms=1000", pathOf(ps[2]))
	}(t, &vmContext{})
}

func TestLongPollFailuresWaitForTheTick(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, longPollConfig(100))
		h.Tick()
		v3 := table.EncodeFull(fleet(t, 3, 2, nil, nil))
		bad := append([]byte(nil), v3...)
		bad[len(bad)/2] ^= 0xff
		errs := uint64(0)
		for _, c := range []struct {
			name, status string
			body         []byte
		}{{"503", "503", nil}, {"reset", "", nil}, {"corrupt frame", "200", bad}} {
			ps := h.polls()
			n := len(ps)
			answer(h, ps[n-1], c.status, c.body)
			errs++
			got, _ := h.GetCounterMetric("kvroute_table_poll_errors_total")
			require.Equal(t, errs, got, c.name)
			require.Len(t, h.polls(), n, "%s: no poll from the callback after a failure", c.name)
			// Backoff: at least one tick passes without a poll, then the tick polls.
			h.Tick()
			require.Len(t, h.polls(), n, "%s: backing off", c.name)
			for i := 0; len(h.polls()) == n; i++ {
				require.Less(t, i, 40, "%s: the tick polls again after the backoff", c.name)
				h.Tick()
			}
			require.Len(t, h.polls(), n+1, c.name)
		}
		// Recovered: a good answer resumes the long poll at once.
		ps := h.polls()
		answer(h, ps[len(ps)-1], "200", v3)
		require.Len(t, h.polls(), len(ps)+1)
	})
}
