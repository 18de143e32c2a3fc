package api

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOffloadCostDefaultsToTheCPUDerivation(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"CPU": DefaultCPULoadCost}, c.Guards.OffloadCost)
	// Table tiers by the engines' medium strings; an unconfigured medium is uncached.
	assert.Equal(t, []float64{DefaultCPULoadCost, 1}, c.OffloadRatios([]string{"CPU", "DISK"}, nil))
}

func TestOffloadCostIsCaseBlindAndKeepsTheCPUDefault(t *testing.T) {
	c, err := ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"},"guards":{"offload_cost":{"disk":0.3,"Cpu_Pinned":0.05}}}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"CPU": DefaultCPULoadCost, "DISK": 0.3, "CPU_PINNED": 0.05}, c.Guards.OffloadCost)
	assert.Equal(t, []float64{0.3, 0.05}, c.OffloadRatios([]string{"Disk", "CPU_PINNED"}, nil))
	c, err = ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"},"guards":{"offload_cost":{"CPU":1}}}`))
	require.NoError(t, err)
	assert.Equal(t, []float64{1}, c.OffloadRatios([]string{"CPU"}, nil), "1 turns the tier off")
}

func TestOffloadCostValidation(t *testing.T) {
	for name, c := range map[string]struct{ cfg, want string }{
		"negative": {`{"CPU":-0.1}`, `guards.offload_cost["CPU"] -0.1 out of range [0, 1]`},
		"above 1":  {`{"DISK":1.5}`, `guards.offload_cost["DISK"] 1.5 out of range`},
		"GPU":      {`{"gpu":0.5}`, `medium "GPU": want a slower medium's name`},
		"empty":    {`{"":0.5}`, `medium "": want`},
		"long":     {`{"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":0.5}`, `want a slower medium's name of 1 to 32 bytes`},
		"not num":  {`{"CPU":"fast"}`, `cannot unmarshal string`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"},"guards":{"offload_cost":` + c.cfg + `}}`))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
