package workload

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prompt"
)

// inferenceExtensionInput is what the Gateway API inference extension's approximate
// prefix producer hashes for a body (getUserInputBytes in
// pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/hashing.go at
// v1.5.0, df9f8909), computed its way: the body decoded into its request types and the
// parts it reads marshalled again with encoding/json. v1.5.0 has no parser for the
// Messages API (it answers such a body 400); the stand-in reads its messages array.
func inferenceExtensionInput(t *testing.T, schema prompt.Schema, body []byte) []byte {
	t.Helper()
	var out []byte
	var err error
	switch schema {
	case prompt.Responses:
		var req struct {
			Input        any `json:"input,omitempty"`
			Instructions any `json:"instructions,omitempty"`
			Tools        any `json:"tools,omitempty"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		var parts []map[string]any
		if req.Instructions != nil {
			parts = append(parts, map[string]any{"instructions": req.Instructions})
		}
		if req.Tools != nil {
			parts = append(parts, map[string]any{"tools": req.Tools})
		}
		out, err = json.Marshal(append(parts, map[string]any{"input": req.Input}))
	case prompt.Messages:
		var req struct {
			Messages json.RawMessage `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		out = req.Messages
	default:
		var req struct {
			Messages []struct {
				Role    string `json:"role,omitempty"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		out, err = json.Marshal(req.Messages)
	}
	require.NoError(t, err)
	return out
}

// Every form the agent workload sends hashes, for weighted-scorers, the bytes the
// inference extension would: a Responses first turn's instructions (the app's system
// prompt) before its input, a follow-up's input as re-marshalled.
func TestAgentPrefixInputIsTheInferenceExtensions(t *testing.T) {
	c := DefaultAgent()
	c.Rate, c.Turns, c.MessagesShare = 2, 3, 0.5
	c.SystemTokens, c.FirstUserTokens, c.UserTokens, c.OutputTokens = 200, 100, 50, 10
	w, err := NewAgent(c)
	require.NoError(t, err)
	src := w.NewSource()
	forms := map[[2]bool]int{}
	for i := range min(w.Len(), 200) {
		r := src.Request(i)
		require.Equal(t, string(inferenceExtensionInput(t, r.Schema, r.Body)), string(r.PrefixInput), "request %d (%v)", i, r.Schema)
		forms[[2]bool{r.Schema == prompt.Messages, r.Previous != 0}]++
	}
	require.Len(t, forms, 3, "Messages, Responses first turns and follow-ups")
}
