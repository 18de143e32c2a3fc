package api

import (
	"strings"
	"testing"
	"time"

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

// control_plane.failover: more replicas of the same control plane, each with a cluster
// and an authority, none listed twice; the block without it keeps its one target.
func TestConfigFailoverTargets(t *testing.T) {
	parse := func(cp string) (ControlPlane, error) {
		c, err := ParseConfig([]byte(`{"control_plane": {"cluster": "a", "authority": "a.svc"` + cp + `}}`))
		return c.ControlPlane, err
	}
	c, err := parse(``)
	require.NoError(t, err)
	assert.Equal(t, []Endpoint{{Cluster: "a", Authority: "a.svc"}}, c.Targets())

	c, err = parse(`, "failover": [{"cluster": "b", "authority": "b.svc"}]`)
	require.NoError(t, err)
	assert.Equal(t, []Endpoint{{Cluster: "a", Authority: "a.svc"}, {Cluster: "b", Authority: "b.svc"}}, c.Targets())

	_, err = parse(`, "failover": [{"cluster": "b"}]`)
	assert.ErrorContains(t, err, "control_plane.failover[0]: cluster and authority are required")
	_, err = parse(`, "failover": [{"cluster": "a", "authority": "x"}]`)
	assert.ErrorContains(t, err, `control_plane.failover[0].cluster "a" is listed twice`)
	_, err = parse(`, "failover": [` + strings.Repeat(`{"cluster": "b", "authority": "b"},`, 9) + `{"cluster": "c", "authority": "c"}]`)
	assert.ErrorContains(t, err, "control_plane.failover: 10 endpoints, at most 8")

	// Shards: a failover cluster is one control plane's, never another shard's.
	_, err = ParseConfig([]byte(`{"shards": [
		{"name": "x", "models": ["m1"], "control_plane": {"cluster": "a", "authority": "a", "failover": [{"cluster": "b", "authority": "b"}]}},
		{"name": "y", "models": ["m2"], "control_plane": {"cluster": "b", "authority": "b"}}]}`))
	assert.ErrorContains(t, err, `control_plane.cluster "b" is also shards[0] (x)'s`)
}

// first_table_wait_ms: 500 by default, negative turns holding off, at most 10 s.
func TestConfigFirstTableWait(t *testing.T) {
	parse := func(extra string) (Config, error) {
		return ParseConfig([]byte(`{"control_plane": {"cluster": "c", "authority": "a"}` + extra + `}`))
	}
	c, err := parse(``)
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, c.FirstTableWait())
	c, err = parse(`, "first_table_wait_ms": -1`)
	require.NoError(t, err)
	assert.Zero(t, c.FirstTableWait(), "never held")
	c, err = parse(`, "first_table_wait_ms": 10000`)
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, c.FirstTableWait())
	_, err = parse(`, "first_table_wait_ms": 10001`)
	assert.ErrorContains(t, err, "first_table_wait_ms 10001 above 10000")
}
