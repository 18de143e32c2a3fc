package mesh_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// A replica restarted the way a vLLM process restarts: empty cache, a new KV-event
// publisher whose sequence starts at 0, and no AllBlocksCleared (only
// reset_prefix_cache sends one, vllm/v1/core/block_pool.py @c59cb794). The control
// plane cannot know until the new process publishes; its first batch (seq 0, below
// the last one seen) is the restart signal, and the replica's old entries go, both
// domains, leaving only what the new process stored.
//
// Before the simulator restarted this way it sent AllBlocksCleared, so this path
// (the subscriber's sequence-reset Restart) was not what the mesh tests exercised:
// here the entries were already gone before the new process published anything
// ("still indexed until the new process publishes" failed).
func TestProcessRestartSeenAsSequenceReset(t *testing.T) {
	m := start(t, mesh.Options{})
	system := mesh.SystemPrompt(9, 1500)
	owner := send(t, m, system, "q0").addr
	waitFor(t, "the control plane indexes the owner's blocks", func() bool {
		d := debugState(t, m)[owner]
		return d.TokenKeys > 4 && d.TextKeys > 0
	})
	i := engineAt(t, m, owner)
	before := debugState(t, m)[owner]

	m.Engines[i].Restart()
	assert.Zero(t, m.Engines[i].Replica().Publisher().NextSeq(), "a new publisher sequence")
	assert.Zero(t, m.Engines[i].Replica().State().CachedBlocks, "an empty cache")
	after := debugState(t, m)[owner]
	assert.Equal(t, before.TokenKeys, after.TokenKeys, "still indexed until the new process publishes")

	// The new process serves one small request of its own: 64 token ids, 4 blocks,
	// one checkpoint key at stride 4. Its BlockStored batch has seq 0.
	ids := make([]string, 64)
	for j := range ids {
		ids[j] = "7"
	}
	resp, err := http.Post(m.Engines[i].URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"llama","prompt":[`+strings.Join(ids, ",")+`],"max_tokens":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	waitFor(t, "the sequence reset drops the old entries", func() bool {
		d := debugState(t, m)[owner]
		return d.TextKeys == 0 && d.TokenKeys == 1
	})
}
