package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCPUOffload(t *testing.T) {
	cfgs, err := parse([]string{"--profile", "fast", "--cpu-offload-tokens", "1000000", "--cpu-load-us-per-token", "1.64"}, &bytes.Buffer{})
	require.NoError(t, err)
	e := cfgs[0].Replica.Engine
	assert.Equal(t, 1000000, e.CPUTierTokens)
	assert.Equal(t, 1640*time.Nanosecond, e.CPULoadPerToken)

	cfgs, err = parse(nil, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Zero(t, cfgs[0].Replica.Engine.CPUTierTokens, "no CPU tier by default")

	for _, args := range [][]string{
		{"--cpu-offload-tokens", "-1"},
		{"--cpu-offload-tokens", "1000", "--cpu-load-us-per-token", "-2"},
		{"--cpu-offload-tokens", "1000", "--engine", "sglang"},
		{"--cpu-offload-tokens", "1000", "--kv-events-encoding", "array-v0.9"},
	} {
		_, err := parse(args, &bytes.Buffer{})
		assert.Error(t, err, "%v", args)
	}
}
