package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An existing configuration (a control_plane block, no shards) parses as it did and is
// one unnamed shard that serves every model, with the same control plane.
func TestConfigWithoutShardsIsOneShardServingEveryModel(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	require.NoError(t, err)
	assert.Empty(t, c.Shards)
	assert.Equal(t, ControlPlane{
		Cluster: "outbound|8080||cp.kvroute-system.svc.cluster.local", Authority: "cp.kvroute-system.svc.cluster.local",
		PollMs: 100, WaitMs: 1000, TimeoutMs: 2000, ReportMs: 100, MaxReportBatch: 512,
	}, c.ControlPlane, "the defaults it always had")
	assert.Equal(t, []Shard{{ControlPlane: c.ControlPlane}}, c.ShardList())

	// Marshalled and parsed again (the mesh and the manifests do), it is the same.
	b, err := json.Marshal(c)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "shards")
	again, err := ParseConfig(b)
	require.NoError(t, err)
	assert.Equal(t, c, again)
}

const twoShards = `{"shards": [
	{"name": "llama", "models": ["llama"], "control_plane": {"cluster": "outbound|8080||kvroute-controlplane-llama.kvroute-system.svc.cluster.local", "authority": "kvroute-controlplane-llama.kvroute-system.svc.cluster.local", "token": "t1"}},
	{"name": "qwen", "models": ["qwen", "qwen-instruct"], "control_plane": {"cluster": "outbound|8080||kvroute-controlplane-qwen.kvroute-system.svc.cluster.local", "authority": "kvroute-controlplane-qwen.kvroute-system.svc.cluster.local", "wait_ms": 5000}}
], "adapters": {"llama-sql-lora": "llama"}}`

func TestConfigShardsParseWithEachControlPlanesDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(twoShards))
	require.NoError(t, err)
	require.Len(t, c.ShardList(), 2)
	assert.Equal(t, ControlPlane{}, c.ControlPlane, "no control_plane besides the shards'")
	l, q := c.Shards[0], c.Shards[1]
	assert.Equal(t, "llama", l.Name)
	assert.Equal(t, []string{"qwen", "qwen-instruct"}, q.Models)
	assert.Equal(t, "t1", l.ControlPlane.Token)
	assert.Equal(t, 100, l.ControlPlane.PollMs)
	assert.Equal(t, 2000, l.ControlPlane.TimeoutMs)
	assert.Equal(t, 6000, q.ControlPlane.TimeoutMs, "each shard's timeout follows its own wait_ms")

	b, err := json.Marshal(c)
	require.NoError(t, err)
	again, err := ParseConfig(b)
	require.NoError(t, err, "%s", b)
	assert.Equal(t, c, again)

	// One shard may leave its models out: it serves every model.
	one, err := ParseConfig([]byte(`{"shards": [{"name": "all", "control_plane": {"cluster": "c", "authority": "a"}}]}`))
	require.NoError(t, err)
	assert.Empty(t, one.ShardList()[0].Models)
}

func TestConfigShardsErrors(t *testing.T) {
	shard := func(name, models, cluster string) string {
		return fmt.Sprintf(`{"name": %q, "models": %s, "control_plane": {"cluster": %q, "authority": "a"}}`, name, models, cluster)
	}
	shards := func(s ...string) string { return `{"shards": [` + strings.Join(s, ",") + `]}` }
	many := make([]string, MaxShards+1)
	for i := range many {
		many[i] = shard(fmt.Sprint("s", i), fmt.Sprintf(`["m%d"]`, i), fmt.Sprint("c", i))
	}
	cases := map[string]struct {
		json string
		want []string
	}{
		"a model in two shards": {shards(shard("a", `["llama", "qwen"]`, "c1"), shard("b", `["qwen"]`, "c2")),
			[]string{`model "qwen" is in two shards: shards[0] (a) and shards[1] (b)`}},
		"a model twice in one shard": {shards(shard("a", `["llama", "llama"]`, "c1")), []string{`shards[0] (a).models lists "llama" twice`}},
		"a shard without models among two": {shards(shard("a", `["llama"]`, "c1"), shard("b", `[]`, "c2")),
			[]string{"shards[1] (b).models is empty: with more than one shard, each lists the models it serves"}},
		"too many shards": {shards(many...), []string{fmt.Sprintf("shards: %d shards, at most %d", MaxShards+1, MaxShards)}},
		"two shards on one cluster": {shards(shard("a", `["llama"]`, "c1"), shard("b", `["qwen"]`, "c1")),
			[]string{`shards[1] (b).control_plane.cluster "c1" is also shards[0] (a)'s`}},
		"two shards of one name": {shards(shard("a", `["llama"]`, "c1"), shard("a", `["qwen"]`, "c2")),
			[]string{`shards[1].name "a" is also shards[0]'s`}},
		"no name":                     {shards(shard("", `["llama"]`, "c1")), []string{"shards[0].name is required"}},
		"a name that cannot be a key": {shards(shard("Llama 3", `["llama"]`, "c1")), []string{`shards[0].name "Llama 3": want`}},
		"a shard's control plane without a cluster": {shards(shard("a", `["llama"]`, "")),
			[]string{"shards[0] (a).control_plane.cluster is required"}},
		"a shard's control plane with a bad wait": {
			`{"shards": [{"name": "a", "models": ["llama"], "control_plane": {"cluster": "c", "authority": "a", "wait_ms": 2000, "timeout_ms": 1500}}]}`,
			[]string{"shards[0] (a).control_plane.timeout_ms 1500 must exceed wait_ms 2000"}},
		"control_plane beside shards": {
			`{"control_plane": {"cluster": "c0", "authority": "a"}, "shards": [` + shard("a", `["llama"]`, "c1") + `]}`,
			[]string{"control_plane and shards are exclusive"}},
		"an adapter listed instead of its base": {
			`{"adapters": {"llama-sql-lora": "llama"}, "shards": [` + shard("a", `["llama", "llama-sql-lora"]`, "c1") + `]}`,
			[]string{`shards[0] (a).models lists "llama-sql-lora", a LoRA adapter of "llama": list its base model`}},
		"an adapter whose base no shard serves": {
			`{"adapters": {"qwen-lora": "qwen"}, "shards": [` + shard("a", `["llama"]`, "c1") + `]}`,
			[]string{`adapters: "qwen-lora" routes on "qwen", which no shard serves`}},
		"every problem at once": {shards(shard("a", `["llama"]`, "c1"), shard("b", `[]`, "c1")),
			[]string{"shards[1] (b).models is empty", `cluster "c1" is also shards[0] (a)'s`}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.json))
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
