package workload

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prompt"
)

// An agent session's follow-ups name the previous turn's response and carry only the new
// tool result, while the engine's prompt extends the previous turn's; a Messages session
// resends the history, which renders the same engine prompt.
func TestAgentTurns(t *testing.T) {
	c := DefaultAgent()
	c.Rate, c.Duration, c.Think, c.Turns, c.MessagesShare = 4, time.Minute, 5*time.Second, 4, 0.5
	c.SystemTokens, c.FirstUserTokens, c.UserTokens, c.OutputTokens = 200, 100, 50, 10
	w, err := NewAgent(c)
	require.NoError(t, err)
	src := w.NewSource()
	last := map[int]*Request{}
	forms := map[prompt.Schema]int{}
	for i := range w.Len() {
		r := src.Request(i)
		var body map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &body), "request %d's body is JSON", i)
		prev := last[r.Group]
		forms[r.Schema]++
		switch {
		case r.Schema == prompt.Messages:
			_, k := w.Turn(i)
			assert.Zero(t, r.Previous)
			assert.Len(t, body["messages"], 1+2*k, "the whole history")
		case prev == nil:
			assert.Zero(t, r.Previous)
			assert.Contains(t, body, "instructions")
		default:
			assert.Equal(t, prev.ID, r.Previous)
			assert.Equal(t, ResponseID(prev.ID), body["previous_response_id"])
			assert.Len(t, body["input"], 1, "only the new tool result")
		}
		if prev != nil {
			// All but the last token: the stand-in tokenizer's 4-byte chunks meet the
			// generation prompt's end differently once the answer follows it.
			n := len(prev.Tokens) - 1
			assert.Equal(t, prev.Tokens[:n], r.Tokens[:n], "the engine's prompt extends the previous turn's")
		}
		last[r.Group] = r
	}
	assert.Positive(t, forms[prompt.Messages])
	assert.Positive(t, forms[prompt.Responses])
}
