package fleet

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUOnlyVariantAndTiersTable(t *testing.T) {
	names, err := ParsePolicies("kvroute," + GPUOnlyName)
	require.NoError(t, err)
	assert.Equal(t, []string{"kvroute", GPUOnlyName}, names)
	assert.NotContains(t, Policies, GPUOnlyName, "only with a CPU tier")

	o := tinyOptions()
	o.CPUTierTokens = 50_000
	res, err := Compare(tinySeed(t), names, o)
	require.NoError(t, err)
	require.Len(t, res, 2)
	assert.Equal(t, GPUOnlyName, res[1].Policy)
	var buf bytes.Buffer
	require.NoError(t, WriteTiers(&buf, res))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3)
	for _, col := range []string{"cached", "GPU hits", "CPU-tier hits", "TTFT p50 s", "p95 s", "p99 s"} {
		assert.Contains(t, lines[0], col)
	}
}
