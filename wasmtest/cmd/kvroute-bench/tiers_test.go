package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --cpu-tier-tokens adds kvroute-gpu-only beside kvroute and the GPU/CPU hit split.
func TestCPUTierFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	args := append(append([]string(nil), tiny...), "--policies", "least-queued,kvroute", "--cpu-tier-tokens", "100000", "--cpu-load-per-token", "2")
	require.NoError(t, run(args, &out, &errOut), errOut.String())
	s := out.String()
	assert.Contains(t, s, "CPU tier 100000 tokens a replica (2µs a token to load)")
	assert.Regexp(t, `(?m)^\s+kvroute-gpu-only\s+32\s`, s)
	assert.Contains(t, s, "GPU hits  CPU-tier hits")

	var bad bytes.Buffer
	assert.Error(t, run(append(append([]string(nil), tiny...), "--cpu-tier-tokens", "-5"), &bad, &bad))
}
