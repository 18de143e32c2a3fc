package mesh_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// The official openai npm client (testdata/openai, installed by `make testdeps`, which
// `make test` runs) sends a non-streaming and two streaming chat requests through the
// proxy, one of them without stream_options: the engines force usage into it (as
// manifests/vllm does), and the client reads the extra usage chunk, whose choices are
// empty, without trouble; kvroute gets its outcome. This is why the filter does not ask
// for usage itself nor strip that chunk (manifests/README.md, "Outcomes of streamed
// requests").
// Under `make test` (KVROUTE_REQUIRE_NODE=1) a missing Node or package fails the test;
// a plain `go test` skips it.
func TestOpenAINodeClient(t *testing.T) {
	node := nodeClients(t, "openai")
	m := start(t, mesh.Options{})
	out := node(m, "client.mjs")
	type usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	var got struct {
		Plain struct {
			Content, Finish string
			Usage           usage
		}
		Stream struct {
			Content string
			Chunks  int
			Usage   *usage
		}
		Unasked struct {
			Content      string
			Chunks       int
			Usage        *usage
			EmptyChoices int
		}
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.NotEmpty(t, got.Plain.Content)
	assert.Equal(t, "length", got.Plain.Finish)
	assert.Equal(t, 8, got.Plain.Usage.CompletionTokens)
	assert.Positive(t, got.Plain.Usage.PromptTokens)
	assert.NotEmpty(t, got.Stream.Content)
	assert.Greater(t, got.Stream.Chunks, 2, "the stream arrived in chunks")
	require.NotNil(t, got.Stream.Usage, "usage in the last chunk")
	assert.Equal(t, got.Plain.Usage.PromptTokens, got.Stream.Usage.PromptTokens)
	assert.Equal(t, got.Stream.Content, got.Unasked.Content, "the unasked stream reads the same")
	require.NotNil(t, got.Unasked.Usage, "forced usage")
	assert.Equal(t, 1, got.Unasked.EmptyChoices, "one usage chunk without choices")
	assert.Equal(t, got.Plain.Usage.PromptTokens, got.Unasked.Usage.PromptTokens)
	assert.Equal(t, int64(3), metric(m, "kvroute_decisions_total"))
	waitFor(t, "three outcomes", func() bool { return m.Summary().Outcomes == 3 })
	assert.Zero(t, metric(m, "kvroute_outcomes_without_usage_total"))
	assert.Equal(t, int64(3), m.Proxy.Stats().Requests)
}

// nodeClients returns a runner of the Node scripts in testdata/openai, whose
// node_modules (`make testdeps`) must hold packages; under `make test`
// (KVROUTE_REQUIRE_NODE=1) a missing Node or package fails the test, a plain `go test`
// skips it. The runner passes the mesh's URL and returns the script's output.
func nodeClients(t *testing.T, packages ...string) func(m *mesh.Mesh, script string) []byte {
	t.Helper()
	dir := filepath.Join("testdata", "openai")
	node, err := exec.LookPath("node")
	for _, p := range packages {
		if _, modErr := os.Stat(filepath.Join(dir, "node_modules", p)); err == nil && modErr != nil {
			err = modErr
		}
	}
	if err != nil {
		if os.Getenv("KVROUTE_REQUIRE_NODE") == "1" {
			t.Fatalf("node or the packages %v missing (%v): run `make testdeps`", packages, err)
		}
		t.Skipf("node or the packages %v in testdata/openai/node_modules missing: run `make testdeps`", packages)
	}
	return func(m *mesh.Mesh, script string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, node, filepath.Join(dir, script), m.URL()).Output()
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("%s failed: %v\n%s", script, err, ee.Stderr)
		}
		require.NoError(t, err)
		return out
	}
}
