//go:build !wasm

package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

func followUpBody(prev, question string) string {
	return fmt.Sprintf(`{"model":"llama","previous_response_id":%q,"input":[{"type":"function_call_output","call_id":"c1","output":%q}]}`, prev, question)
}

// answer sends a response through the response callbacks, body in one chunk.
func (h host) answer(id uint32, status, contentType string, chunks ...string) {
	h.CallOnResponseHeaders(id, [][2]string{{":status", status}, {"content-type", contentType}}, false)
	for i, c := range chunks {
		require.Equal(h.t, types.ActionContinue, h.CallOnResponseBody(id, []byte(c), i == len(chunks)-1), "never held")
	}
	h.CompleteHttpContext(id)
}

func first(hs [][2]string) string { return strings.Split(endpoint(hs), ",")[0] }

// A Responses answer's id is learned from its first bytes (a JSON body, or a stream's
// response.created event) with the replica that answered; a follow-up naming it goes
// there first though the rule would pick another replica, and an id nobody answered,
// or one whose replica left the table, goes where the rule says and is counted.
func TestResponsesFollowUpsGoToTheReplicaThatAnswered(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.serveTable(table.EncodeFull(fleet(t, 5, 4, []uint64{9000, 6000, 3000, 0}, nil)))

		id, hs := h.send(request{path: "/v1/responses", body: responsesBody(system, "Open a ticket.")})
		answered := first(hs)
		assert.Equal(t, "10.1.0.4:8000", answered, "the least queued")
		h.answer(id, "200", "application/json", `{"id":"resp_0a1b","created_at":1,"object":"response","output":[]}`)

		id, hs = h.send(request{path: "/v1/responses", body: responsesBody(system, "Open another.")})
		h.answer(id, "200", "text/event-stream",
			"event: response.created\ndata: {\"response\":{\"id\":\"resp_streamed\",\"object\":\"response\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n",
			"event: response.completed\ndata: {}\n\n")
		streamed := first(hs)

		// Now the replica that answered is the most queued.
		h.serveTable(table.EncodeFull(fleet(t, 6, 4, []uint64{3000, 3000, 3000, 90000}, nil)))
		_, hs = h.send(request{path: "/v1/responses", body: followUpBody("resp_0a1b", "done")})
		assert.Equal(t, answered, first(hs), "to the replica that stored the response")
		assert.Len(t, strings.Split(endpoint(hs), ","), 3, "retry targets kept")
		_, hs = h.send(request{path: "/v1/responses", body: followUpBody("resp_streamed", "done")})
		assert.Equal(t, streamed, first(hs))
		n, _ := h.GetCounterMetric("kvroute_follow_ups_affine_total")
		assert.Equal(t, uint64(2), n)

		_, hs = h.send(request{path: "/v1/responses", body: followUpBody("resp_nobody", "done")})
		assert.NotEqual(t, "10.1.0.4:8000", first(hs), "the rule's pick")
		lost, _ := h.GetCounterMetric("kvroute_follow_ups_lost_total")
		assert.Equal(t, uint64(1), lost)

		// Another tenant's request naming the same id does not follow it.
		_, hs = h.send(request{path: "/v1/responses", headers: [][2]string{{"x-tenant", "other"}}, body: followUpBody("resp_0a1b", "done")})
		assert.NotEqual(t, answered, first(hs))

		// An error answer teaches nothing.
		id, _ = h.send(request{path: "/v1/responses", body: responsesBody(system, "x")})
		h.answer(id, "404", "application/json", `{"error":{"message":"Response with id 'resp_x' not found.","type":"invalid_request_error","param":"response_id","code":404}}`)
		missed, _ := h.GetCounterMetric("kvroute_response_ids_missed_total")
		assert.Zero(t, missed)
	})
}

// The map is shared data: an entry another worker VM wrote is followed, and an entry
// older than responseMaxAge is not. (The compiled module's clock under wazero is not
// the test's, so the old entry is older than both.)
func TestFollowUpsFindASiblingVMsEntry(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.serveTable(table.EncodeFull(fleet(t, 5, 4, []uint64{0, 6000, 6000, 6000}, nil)))
		var sibling affinity
		sibling.value, sibling.names = &hostBuf{}, &names{}
		sibling.remember(api.AffinityKey(api.AffinityResponse, "", []byte("resp_sib")), "10.1.0.3:8000", 0, time.Now())
		sibling.remember(api.AffinityKey(api.AffinityResponse, "", []byte("resp_old")), "10.1.0.3:8000", 0, time.Unix(0, 0)) // older than any VM's clock
		_, hs := h.send(request{path: "/v1/responses", body: followUpBody("resp_sib", "go")})
		assert.Equal(t, "10.1.0.3:8000", first(hs))
		_, hs = h.send(request{path: "/v1/responses", body: followUpBody("resp_old", "something else entirely")})
		assert.Equal(t, "10.1.0.1:8000", first(hs), "too old: the rule's pick")
		n, _ := h.GetCounterMetric("kvroute_follow_ups_affine_total")
		lost, _ := h.GetCounterMetric("kvroute_follow_ups_lost_total")
		assert.Equal(t, []uint64{1, 1}, []uint64{n, lost})
	})
}

// With session_header set, a session's requests keep the replica of its previous one
// while the rule's cost allows, even for a prefix the table does not know there; without
// the header configured, a client's session header is ignored.
func TestSessionHeaderKeepsTheSessionsReplica(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		cfg := strings.Replace(testConfig, `"max_body_bytes": 65536`, `"max_body_bytes": 65536, "session_header": "X-Session-Id"`, 1)
		for _, c := range []struct {
			cfg    string
			stays  bool
			reason string
		}{{cfg, true, "configured"}, {testConfig, false, "not configured: ignored"}} {
			t.Run(c.reason, func(t *testing.T) { sessionTwoSteps(t, vm, c.cfg, c.stays) })
		}
	})
}

func sessionTwoSteps(t *testing.T, vm types.VMContext, cfg string, stays bool) {
	{
		{
			h := start(t, vm, cfg)
			h.serveTable(table.EncodeFull(fleet(t, 5, 3, []uint64{3000, 3000, 0}, nil)))
			sess := [][2]string{{"x-session-id", "agent-7"}}
			_, hs := h.send(request{headers: sess, body: chat(system, "step 1")})
			assert.Equal(t, "10.1.0.3:8000", first(hs))
			// A prefix neither the table nor the proxy's own placements know (a body read
			// differently, say), and the session's replica is now the most queued.
			h.serveTable(table.EncodeFull(fleet(t, 6, 3, []uint64{3000, 3000, 4000}, nil)))
			_, hs = h.send(request{headers: sess, body: chat(strings.ToUpper(system), "step 2")})
			if stays {
				assert.Equal(t, "10.1.0.3:8000", first(hs))
			} else {
				assert.NotEqual(t, "10.1.0.3:8000", first(hs))
			}
		}
	}
}

// A bucket keeps its affinityWays newest entries: an entry survives until that many
// newer ones land on its bucket, and rewriting a key keeps one entry for it.
func TestAffinityBucketKeepsItsNewestEntries(t *testing.T) {
	start(t, &vmContext{}, testConfig) // the emulator's shared data
	a := affinity{value: &hostBuf{}, names: &names{}}
	now := time.Now()
	key := func(i int) uint64 { return uint64(7 + affinityBuckets*i) } // one bucket
	for i := range affinityWays {
		a.remember(key(i), fmt.Sprintf("10.0.0.%d:8000", i), i, now)
	}
	a.remember(key(3), "10.0.0.33:8000", 33, now) // rewritten: still 8 entries
	for i := range affinityWays {
		addr, _, ok := a.lookup(key(i), time.Hour, now)
		require.True(t, ok, "entry %d", i)
		if i == 3 {
			assert.Equal(t, "10.0.0.33:8000", addr)
		}
	}
	a.remember(key(affinityWays), "10.0.0.99:8000", 0, now)
	_, _, ok := a.lookup(key(0), time.Hour, now)
	assert.False(t, ok, "the oldest goes")
	addr, blocks, ok := a.lookup(key(1), time.Hour, now)
	assert.True(t, ok)
	assert.Equal(t, "10.0.0.1:8000", addr)
	assert.Equal(t, 1, blocks)
	_, _, ok = a.lookup(key(affinityWays+1), time.Hour, now)
	assert.False(t, ok, "a key never written")
}

// Responses follow-ups in steady state, each naming the response before it: learning an
// answer's id and looking a follow-up's up allocate nothing in the guest.
func TestFollowUpPathGuestAllocs(t *testing.T) {
	clk := time.Unix(1_800_000_000, 0)
	h, reset := benchHost(t, &clockedVM{now: func() time.Time { return clk }})
	defer reset()
	const warm, n, every, gap = 6000, 512, 32, 400 * time.Microsecond
	reqs := make([][]byte, warm+n)
	resps := make([][]byte, warm+n)
	tool := strings.Repeat("exit status 0; 3 files changed. ", 64)
	for i := range reqs {
		reqs[i] = []byte(followUpBody(fmt.Sprintf("resp_%08d", i-1), tool))
		resps[i] = []byte(fmt.Sprintf(`{"id":"resp_%08d","object":"response","output":[],"usage":{"input_tokens":8000,"input_tokens_details":{"cached_tokens":5984},"output_tokens":1,"total_tokens":8001}}`, i))
	}
	reqHeaders := [][2]string{{":method", "POST"}, {":path", "/v1/responses"}, {":authority", "llm"}, {"content-type", "application/json"}}
	respHeaders := [][2]string{{":status", "200"}, {"content-type", "application/json"}}
	var first string
	one := func(i int) {
		id := h.InitializeHttpContext()
		h.CallOnRequestHeaders(id, reqHeaders, false)
		h.CallOnRequestBody(id, reqs[i], true)
		if i == warm {
			first = endpoint(h.GetCurrentRequestHeaders(id))
		}
		h.CallOnResponseHeaders(id, respHeaders, false)
		h.CallOnResponseBody(id, resps[i], true)
		h.CompleteHttpContext(id)
		clk = clk.Add(gap)
		if i%every == every-1 {
			h.keepFresh()
		}
	}
	for i := range warm {
		one(i)
	}
	sites := measureAllocs(func() {
		for i := warm; i < warm+n; i++ {
			one(i)
		}
	})
	var guest int64
	for _, s := range sites {
		if s.guest && !s.tick && !s.sdk {
			guest += s.objects
			t.Logf("guest %8.3f allocs/req %9.0f B/req  %s", float64(s.objects)/n, float64(s.bytes)/n, s.where)
		}
	}
	assert.NotEmpty(t, first)
	followed, _ := h.GetCounterMetric("kvroute_follow_ups_affine_total")
	assert.Equal(t, uint64(warm+n-1), followed, "every follow-up but the first found its replica")
	assert.LessOrEqual(t, float64(guest)/n, 0.01, "the follow-up path allocated %d objects over %d requests", guest, n)
}
