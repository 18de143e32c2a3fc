package mesh_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// An agent's ten-turn conversation on the Responses API, each turn a follow-up by
// previous_response_id, through the official openai npm client (testdata/openai/agents.mjs):
// the engines keep responses in their own memory, as vLLM with
// VLLM_ENABLE_RESPONSES_API_STORE=1 does, so a follow-up on another replica would be a
// 404 and the client would throw. Every turn succeeds, reports cached tokens from turn 2
// (the stored conversation is a prefix of the next turn's prompt, on the same replica),
// and the filter counts nine follow-ups sent to the replica that stored their response.
// Then ten turns of the Messages API through @anthropic-ai/sdk, every other one
// streamed, each resending the growing history.
func TestAgentNodeClients(t *testing.T) {
	node := nodeClients(t, "openai", "@anthropic-ai/sdk")
	m := start(t, mesh.Options{})
	out := node(m, "agents.mjs")
	var got struct {
		Responses []struct {
			ID, Previous, Status, Text string
			InputTokens, CachedTokens  int
		}
		Messages []struct {
			ID, StopReason, Text      string
			InputTokens, OutputTokens int
		}
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)

	require.Len(t, got.Responses, 10, "every turn answered")
	for i, r := range got.Responses {
		assert.NotEmpty(t, r.Text, "turn %d", i+1)
		if i == 0 {
			continue
		}
		prev := got.Responses[i-1]
		assert.Equal(t, prev.ID, r.Previous, "turn %d follows turn %d", i+1, i)
		assert.Greater(t, r.InputTokens, prev.InputTokens, "turn %d carries the conversation", i+1)
		assert.Positive(t, r.CachedTokens, "turn %d hits the stored conversation's blocks", i+1)
	}
	assert.Equal(t, int64(9), metric(m, "kvroute_follow_ups_affine_total"))
	assert.Zero(t, metric(m, "kvroute_follow_ups_lost_total"))
	assert.Zero(t, metric(m, "kvroute_response_ids_missed_total"))

	require.Len(t, got.Messages, 10, "every turn answered")
	for i, msg := range got.Messages {
		assert.Equal(t, "max_tokens", msg.StopReason, "turn %d", i+1)
		assert.Equal(t, 8, msg.OutputTokens, "turn %d", i+1)
		assert.NotEmpty(t, msg.Text, "turn %d", i+1)
		if i > 0 {
			assert.Greater(t, msg.InputTokens, got.Messages[i-1].InputTokens, "turn %d resends the history", i+1)
		}
	}
	// Every answer's usage is read; vLLM's Messages usage has no cached count, so only
	// the Responses turns' outcomes carry one.
	waitFor(t, "twenty outcomes", func() bool { return metric(m, "kvroute_outcomes_total") == 20 })
	waitFor(t, "ten with cached tokens", func() bool { return m.Summary().Outcomes == 10 })
	assert.Zero(t, metric(m, "kvroute_outcomes_without_usage_total"))
}

// A session header steers only when the filter is configured to trust it (make run
// --session-header): then each session's second request, whose prefix no replica holds
// yet, stays on the replica of its first; unconfigured, the same client header changes
// nothing and the eight second requests spread over the idle replicas (all eight
// staying by chance: 1 in 65,536).
func TestSessionHeaderOnlyWhenTrusted(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		t.Run(fmt.Sprint("trusted=", trusted), func(t *testing.T) {
			o := mesh.Options{}
			if trusted {
				o.Filter.SessionHeader = "x-session-id"
			}
			m := start(t, o)
			const sessions = 16
			stayed := 0
			for s := range sessions {
				session := fmt.Sprint("agent-", s)
				task := strings.Repeat(fmt.Sprintf("Session %d works on its own task. ", s), 60)
				first := send(t, m, task, "step 1", "x-session-id", session)
				// The session's replica queues nothing by the table the proxy routes on: a
				// snapshot taken while step 1 prefilled would make staying dear, which the
				// rule's cost rightly weighs against the session's credit.
				settled(t, m, first.addr)
				// A prefix no replica has seen: only the session can keep it there.
				second := send(t, m, strings.ToUpper(task), "step 2", "x-session-id", session)
				if second.addr == first.addr {
					stayed++
				}
			}
			// Trusted, the session's replica is credited with the whole prompt and should
			// win every time, also where a worker VM that has not seen step 1 start still
			// counts it as queued: a near tie goes to the replica holding the prompt
			// (TestNearTiesGoToTheReplicaHoldingThePrompt in shared/rule), and the credit is
			// step 1's blocks at the bytes per token learned since
			// (TestSessionCreditSurvivesANewBytesPerToken in shared/route).
			// Untrusted, a new prefix goes to whichever replica the rule picks: 1 to 8 of 16
			// stayed in 20 runs.
			t.Logf("%d of %d sessions stayed", stayed, sessions)
			if trusted {
				assert.GreaterOrEqual(t, stayed, 11, "sessions keep their replica")
			} else {
				assert.LessOrEqual(t, stayed, 10, "an untrusted session header steers nothing")
			}
		})
	}
}
