package mesh_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// One SGLang stand-in (SGLang main: page size 1, SHA-256 page hashes, radix-tree
// events, SGLang's metric names) beside vLLM ones: the control plane scrapes it with
// SGLang's names, indexes its KV events, and the filter sends a repeated prompt back to
// it, where it hits.
func TestSGLangReplicaBesideVLLM(t *testing.T) {
	m := start(t, mesh.Options{Replicas: 3, SGLangReplicas: 1})
	var sglang string
	for _, e := range m.EngineList() {
		if e.Kind == replica.EngineSGLang {
			require.Empty(t, sglang, "one SGLang replica")
			sglang = e.Addr
		}
	}
	require.NotEmpty(t, sglang)
	waitFor(t, "the control plane scrapes the SGLang replica", func() bool { return debugState(t, m)[sglang].Healthy })

	// New prefixes go to the least-loaded replica; send distinct ones until one lands
	// on SGLang.
	var system string
	for i := 0; i < 40 && system == ""; i++ {
		s := fmt.Sprintf("SGLang tenant %d. %s", i, strings.Repeat("Answer in full sentences. ", 40))
		if r := send(t, m, s, "hello"); r.addr == sglang {
			system = s
		}
	}
	require.NotEmpty(t, system, "no request reached the SGLang replica")
	waitFor(t, "the control plane indexes the SGLang replica's KV events", func() bool {
		return debugState(t, m)[sglang].TokenKeys > 0
	})
	known(t, m, sglang)
	r := send(t, m, system, "hello again")
	assert.Equal(t, sglang, r.addr, "the prefix's owner gets its repeat")
	assert.Positive(t, r.CachedTokens, "SGLang's radix cache serves the shared prefix")
}
