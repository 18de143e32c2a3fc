//go:build !wasm

package main

import (
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// The leader's failover between control-plane replicas (leader.go): a failed poll goes
// to the next replica on the next tick, the poll names the epoch its version is counted
// in, and the backoff starts only once every replica failed in turn.

const (
	replicaA = "outbound|8080||cp.kvroute.svc.cluster.local"
	replicaB = "outbound|8080||cp-1.kvroute.svc.cluster.local"
)

var failoverConfig = strings.Replace(testConfig, `"authority": "cp.kvroute.svc.cluster.local",`,
	`"authority": "cp.kvroute.svc.cluster.local", "failover": [{"cluster": "`+replicaB+`", "authority": "cp-1.kvroute.svc.cluster.local"}],`, 1)

// answerEpoch answers a poll with a full frame of epoch.
func answerEpoch(h host, c proxytest.HttpCalloutAttribute, body []byte, epoch string) {
	h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}, {"x-kvroute-epoch", epoch}}, nil, body)
}

func TestFailoverMovesToTheNextReplicaOnTheNextTick(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, failoverConfig)
		lastPoll := func() proxytest.HttpCalloutAttribute {
			ps := h.polls()
			require.NotEmpty(t, ps)
			return ps[len(ps)-1]
		}
		h.Tick()
		p := lastPoll()
		assert.Equal(t, replicaA, p.Upstream, "the first replica first")
		answerEpoch(h, p, table.EncodeFull(fleet(t, 3, 2, nil, nil)), "11")

		h.Tick()
		p = lastPoll()
		assert.Equal(t, api.TablePath+"?version=3&epoch=11", pathOf(p), "the poll names its version's epoch")
		answer(h, p, "", nil) // A is gone: a reset
		n := len(h.polls())
		h.Tick()
		require.Len(t, h.polls(), n+1, "the next tick asks the next replica, no backoff")
		p = lastPoll()
		assert.Equal(t, replicaB, p.Upstream)
		authority, _ := header(p.Headers, ":authority")
		assert.Equal(t, "cp-1.kvroute.svc.cluster.local", authority)
		assert.Equal(t, api.TablePath+"?version=3&epoch=11", pathOf(p))
		failovers, _ := h.GetCounterMetric("kvroute_table_failovers_total")
		assert.Equal(t, uint64(1), failovers)

		// B counts versions of its own, lower ones included: its full table replaces A's.
		answerEpoch(h, p, table.EncodeFull(fleet(t, 2, 3, nil, nil)), "22")
		hd, err := decodeHead(readShared(t, rootKeys.head), nil)
		require.NoError(t, err)
		assert.Equal(t, uint64(2), hd.version())
		assert.Equal(t, uint64(22), hd.epoch)
		h.Tick()
		p = lastPoll()
		assert.Equal(t, replicaB, p.Upstream, "the leader stays with the replica that answers")
		assert.Equal(t, api.TablePath+"?version=2&epoch=22", pathOf(p))

		// Both fail in turn: then, and only then, the backoff.
		answer(h, p, "503", nil)
		h.Tick()
		p = lastPoll()
		assert.Equal(t, replicaA, p.Upstream)
		answer(h, p, "", nil)
		n = len(h.polls())
		h.Tick()
		require.Len(t, h.polls(), n, "every replica failed: backing off")
		for i := 0; len(h.polls()) == n; i++ {
			require.Less(t, i, 40, "the tick polls again after the backoff")
			h.Tick()
		}
		assert.Equal(t, replicaB, lastPoll().Upstream)
	})
}

// A poll the host never answers (a callback lost) counts as a failure after the call's
// timeout, and the leader moves on.
func TestFailoverAfterAPollWithoutAnswer(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, failoverConfig)
		h.Tick()
		ps := h.polls()
		require.Len(t, ps, 1)
		assert.Equal(t, replicaA, ps[0].Upstream)
		// timeout_ms 1000 at 100 ms ticks, and ten ticks of grace.
		for i := 0; len(h.polls()) == 1; i++ {
			require.Less(t, i, 30, "the leader gives the call up")
			h.Tick()
		}
		assert.Equal(t, replicaB, h.polls()[1].Upstream)
	})
}

// Every replica builds its own table from the reports: each batch goes to the replica
// the leader polls and a copy to each other one.
func TestFailoverPostsReportsToEveryReplica(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, failoverConfig)
		h.Tick()
		answer(h, h.polls()[0], "", nil)
		h.Tick()
		ps := h.polls()
		require.Equal(t, replicaB, ps[len(ps)-1].Upstream)
		answerEpoch(h, ps[len(ps)-1], table.EncodeFull(fleet(t, 5, 2, nil, map[uint32][]string{1: {chat("sys", "q")}})), "7")
		h.send(request{body: chat("sys", "q2")})
		n := len(h.callouts())
		h.Tick()
		posted := map[string][]byte{}
		for _, c := range h.callouts()[n:] {
			if p, _ := header(c.Headers, ":path"); p == api.ReportsPath {
				authority, _ := header(c.Headers, ":authority")
				posted[c.Upstream+" "+authority] = c.Body
				h.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "204"}}, nil, nil)
			}
		}
		require.Len(t, posted, 2, "the placement is posted to both replicas: %v", posted)
		a, b := posted[replicaA+" cp.kvroute.svc.cluster.local"], posted[replicaB+" cp-1.kvroute.svc.cluster.local"]
		assert.NotEmpty(t, a)
		assert.Equal(t, a, b, "the same batch")
		sent, _ := h.GetCounterMetric("kvroute_reports_sent_total")
		copies, _ := h.GetCounterMetric("kvroute_report_copies_sent_total")
		assert.Positive(t, sent)
		assert.Equal(t, sent, copies)
	})
}
