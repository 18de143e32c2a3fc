package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/radix"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
)

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := parse([]string{"--help"}, &out)
	require.True(t, errors.Is(err, flag.ErrHelp))
	var o options
	newFlagSet(&o, &out).VisitAll(func(f *flag.Flag) {
		assert.Contains(t, out.String(), "-"+f.Name, "flag %s is documented", f.Name)
		assert.NotEmpty(t, f.Usage, f.Name)
	})
	for _, s := range []string{"/admin/restart", "/admin/fail-fraction", "--time-scale", "--kv-events-config", "--num-gpu-blocks", "--replicas"} {
		assert.Contains(t, out.String(), s)
	}
}

func TestParseDefaults(t *testing.T) {
	cfgs, err := parse(nil, &bytes.Buffer{})
	require.NoError(t, err)
	require.Len(t, cfgs, 1)
	c := cfgs[0]
	assert.Equal(t, "127.0.0.1", c.Host, "loopback by default")
	assert.Equal(t, 8000, c.Port)
	assert.Equal(t, "meta-llama/Llama-3.3-70B-Instruct", c.ModelName)
	assert.Equal(t, "seed000", c.Replica.Engine.Profile.Name)
	assert.Equal(t, 34882, c.Replica.Engine.Profile.NumGPUBlocks())
	assert.Equal(t, 1.0, c.Replica.TimeScale)
	assert.False(t, c.Replica.Events.Enabled())
}

func TestParseReplicasAndEvents(t *testing.T) {
	cfgs, err := parse([]string{
		"--port", "9000", "--replicas", "3", "--profile", "fast", "--num-gpu-blocks", "100", "--time-scale", "0.001",
		"--served-model-name", "llama", "--lora-modules", "alice=/a bob=/b", "--kv-events-encoding", "array",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600","topic":"kv"}`,
	}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Len(t, cfgs, 3)
	for i, c := range cfgs {
		assert.Equal(t, 9000+i, c.Port)
		assert.Equal(t, "llama", c.ModelName)
		assert.Len(t, c.LoRAModules, 2)
		assert.Equal(t, 100, c.Replica.Engine.NumGPUBlocks)
		assert.Equal(t, kvevents.Array, c.Replica.EventsOptions.Encoding)
		assert.Equal(t, "127.0.0.1", c.Replica.EventsOptions.BindHost)
	}
	assert.Equal(t, "tcp://*:5557", cfgs[0].Replica.Events.Endpoint)
	assert.Equal(t, "tcp://*:5559", cfgs[2].Replica.Events.Endpoint)
	assert.Equal(t, "tcp://*:5601", cfgs[1].Replica.Events.ReplayEndpoint)
}

// With vLLM's usual ports (5557 for events, 5558 for replay) a second replica's events
// would take the first one's replay port: refused up front, naming the port, instead of
// "address already in use" once the first replica runs.
func TestParseRefusesReplicasOnOnePort(t *testing.T) {
	const usual = `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`
	_, err := parse([]string{"--port", "8000", "--kv-events-config", usual}, &bytes.Buffer{})
	require.NoError(t, err, "one replica")
	_, err = parse([]string{"--port", "8000", "--replicas", "2", "--kv-events-config", usual}, &bytes.Buffer{})
	require.ErrorContains(t, err, "replica 1's KV events endpoint (port 5558) is replica 0's replay endpoint")
	_, err = parse([]string{"--port", "5557", "--replicas", "2", "--kv-events-config", strings.Replace(usual, "5558", "5567", 1)}, &bytes.Buffer{})
	require.ErrorContains(t, err, "port 5557")
	_, err = parse([]string{"--port", "8000", "--replicas", "2", "--kv-events-config", strings.Replace(usual, "5558", "5567", 1)}, &bytes.Buffer{})
	require.NoError(t, err, "docs/testing.md's example with --replicas 2")
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--profile", "a100"},
		{"--time-scale", "0"},
		{"--replicas", "0"},
		{"--kv-events-encoding", "json"},
		{"--kv-events-config", "{"},
		{"--prefix-caching-hash-algo", "md5"},
		{"--max-num-seqs", "-1"},
		{"--lora-modules", "nopath"},
		{"--enable-prefix-caching=false"},
		{"extra"},
	} {
		_, err := parse(args, &bytes.Buffer{})
		assert.Error(t, err, "%v", args)
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	cfgs, err := parse([]string{"--port", "0", "--replicas", "2", "--profile", "fast", "--log-level", "error",
		"--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:0"}`}, &bytes.Buffer{})
	require.NoError(t, err)
	// Start the first replica directly to learn its port, then check run() stops cleanly.
	s, err := server.Start(cfgs[0])
	require.NoError(t, err)
	resp, err := http.Get(s.URL() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	require.NoError(t, s.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfgs) }()
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// --vllm-version picks the event layout, the replay shape and the error envelope;
// the explicit flags still override it.
func TestVLLMVersionSelectsBehaviours(t *testing.T) {
	for _, c := range []struct {
		args   []string
		enc    kvevents.Encoding
		legacy bool
		ver    string
	}{
		{nil, kvevents.Map, false, "0.26.0"},
		{[]string{"--vllm-version", "0.10.0"}, kvevents.ArrayV010, true, "0.10.0"},
		{[]string{"--vllm-version", "0.23.1"}, kvevents.Array, true, "0.23.1"},
		{[]string{"--vllm-version", "0.25.0"}, kvevents.Map, true, "0.25.0"},
		{[]string{"--vllm-version", "0.25.0", "--kv-events-legacy-replay=false", "--kv-events-encoding", "array"}, kvevents.Array, false, "0.25.0"},
	} {
		cfgs, err := parse(c.args, &bytes.Buffer{})
		require.NoError(t, err, c.args)
		assert.Equal(t, c.enc, cfgs[0].Replica.EventsOptions.Encoding, c.args)
		assert.Equal(t, c.legacy, cfgs[0].Replica.EventsOptions.LegacyReplay, c.args)
		assert.Equal(t, c.ver, cfgs[0].Version.String(), c.args)
	}
	_, err := parse([]string{"--vllm-version", "0.11.0"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "not modelled")
	_, err = parse([]string{"--vllm-version", "0.11.0", "--kv-events-encoding", "array-v0.10"}, &bytes.Buffer{})
	assert.NoError(t, err)
}

func TestParseSGLangEngine(t *testing.T) {
	cfgs, err := parse([]string{"--engine", "sglang", "--profile", "fast", "--sglang-page-size", "4"}, &bytes.Buffer{})
	require.NoError(t, err)
	c := cfgs[0].Replica
	assert.Equal(t, replica.EngineSGLang, c.Kind)
	assert.Equal(t, kvevents.SGLang, c.EventsOptions.Encoding, "SGLang's layout by default")
	assert.True(t, c.EventsOptions.LegacyReplay, "SGLang replays [seq, payload]")
	assert.Equal(t, 4, c.Engine.Profile.BlockSize, "SGLang caches pages")
	require.NotNil(t, c.Engine.Radix)
	assert.Equal(t, radix.Options{PageSize: 4, Scheme: radix.SchemeSHA256, Medium: "GPU", RemovePerNode: true}, *c.Engine.Radix, "main by default")
	cfgs, err = parse([]string{"--engine", "sglang", "--sglang-version", "0.5.0rc0"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, radix.Options{PageSize: 1, Scheme: radix.SchemeTuple, SplitEvents: true}, *cfgs[0].Replica.Engine.Radix)
	cfgs, err = parse([]string{"--engine", "sglang", "--kv-events-encoding", "map"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, kvevents.Map, cfgs[0].Replica.EventsOptions.Encoding, "an explicit layout wins")

	// SGLang's own --kv-events-config publishes; without "publisher":"zmq" it does not,
	// whatever vLLM's enable_kv_cache_events says.
	cfgs, err = parse([]string{"--engine", "sglang", "--kv-events-config", `{"publisher":"zmq","endpoint":"tcp://*:5557"}`}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.True(t, cfgs[0].Replica.Events.Enabled())
	cfgs, err = parse([]string{"--engine", "sglang", "--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557"}`}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.False(t, cfgs[0].Replica.Events.Enabled(), "SGLang's publisher defaults to null")

	for _, args := range [][]string{{"--engine", "trtllm"}, {"--engine", "sglang", "--sglang-page-size", "0"},
		{"--engine", "sglang", "--sglang-version", "0.5.2"}, {"--engine", "sglang", "--block-size", "16", "--sglang-page-size", "4"},
		{"--engine", "sglang", "--kv-events-config", `{"publisher":"kafka"}`}} {
		_, err := parse(args, &bytes.Buffer{})
		assert.Error(t, err, "%v", args)
	}
}
