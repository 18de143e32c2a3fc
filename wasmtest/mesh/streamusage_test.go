package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// Streamed requests that do not ask for usage (most chat clients stream without
// stream_options) report their outcomes when the engines force usage into every stream,
// as vLLM's --enable-force-include-usage does in manifests/vllm and in `make run`. Without
// it, their outcomes are lost, and kvroute_outcomes_without_usage_total says so.
func TestStreamsWithoutIncludeUsageGiveOutcomes(t *testing.T) {
	for _, c := range []struct {
		name                   string
		opts                   mesh.Options
		outcomes, withoutUsage int64
	}{
		{"as make run starts the engines", mesh.Options{}, 10, 0},
		{"engines that do not force usage", mesh.Options{NoForcedUsage: true}, 0, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := start(t, c.opts)
			for i := range 10 {
				body, err := json.Marshal(map[string]any{
					"model": "llama", "stream": true, "max_tokens": 4,
					"messages": []map[string]string{{"role": "system", "content": mesh.SystemPrompt(i, 300)}, {"role": "user", "content": "Where is my order?"}},
				})
				require.NoError(t, err)
				u, _, err := m.Chat(context.Background(), client, body)
				if c.outcomes > 0 {
					require.NoError(t, err)
					assert.Positive(t, u.PromptTokens)
				} else {
					require.ErrorContains(t, err, "stream ended without usage", "the engine sends none")
				}
			}
			// As make run's summary shows them.
			waitFor(t, fmt.Sprintf("%d outcomes and %d answers without usage", c.outcomes, c.withoutUsage), func() bool {
				s := m.Summary()
				return s.Outcomes == c.outcomes && s.Filter.WithoutUsage == c.withoutUsage
			})
			assert.Equal(t, int64(10), m.Summary().Filter.Decisions, "every request was placed")
		})
	}
}
