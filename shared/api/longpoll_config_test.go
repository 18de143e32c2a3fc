package api

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigLongPollWaitAndTimeout(t *testing.T) {
	parse := func(cp string) (ControlPlane, error) {
		c, err := ParseConfig([]byte(`{"control_plane": {"cluster": "c", "authority": "a"` + cp + `}}`))
		return c.ControlPlane, err
	}
	c, err := parse(``)
	require.NoError(t, err)
	assert.Equal(t, 1000, c.WaitMs, "long polls by default")
	assert.Equal(t, 2000, c.TimeoutMs, "the call outlives the wait")

	c, err = parse(`, "wait_ms": 5000`)
	require.NoError(t, err)
	assert.Equal(t, 6000, c.TimeoutMs)

	c, err = parse(`, "wait_ms": -1`)
	require.NoError(t, err)
	assert.Equal(t, 1000, c.TimeoutMs, "long polls off: the old default")

	_, err = parse(`, "wait_ms": 2000, "timeout_ms": 1500`)
	assert.ErrorContains(t, err, "control_plane.timeout_ms 1500 must exceed wait_ms 2000")
	_, err = parse(`, "wait_ms": 1000, "timeout_ms": 1000`)
	assert.ErrorContains(t, err, "must exceed wait_ms")
	_, err = parse(`, "wait_ms": 40000, "timeout_ms": 50000`)
	assert.ErrorContains(t, err, "wait_ms 40000 is above 30000")
}
