package api

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
)

// MaxShards bounds the shards one filter polls: the leader keeps a long poll open to
// each, and each has its own keys in shared data and its own report queue.
const MaxShards = 16

// Shard is one control plane and the models whose table it serves. Each shard's control
// plane watches only its models' engines; the filter polls
// every shard, routes a request on the table of the shard that serves its model (the
// body's "model", or model_header; a LoRA adapter's base model) and sends the request's
// reports to that shard's control plane. A request for a model no shard serves is left
// to Envoy's fallback load balancer, as when there is no table (fail open), and counted
// (kvroute_unserved_model_total).
//
// The plain control_plane block is one shard that serves every model; its table keeps
// the shared-data keys it always had (docs/table.md).
type Shard struct {
	// Name keys the shard's table in shared data and names its metrics: lower-case
	// letters, digits, '-' and '_', at most 32.
	Name string `json:"name"`
	// Models are the base models the shard serves. Required when there is more than
	// one shard; a single shard without models serves every model.
	Models       []string     `json:"models,omitempty"`
	ControlPlane ControlPlane `json:"control_plane"`
}

var shardName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ShardList is the shards the filter polls: Shards, or the control_plane block as one
// unnamed shard that serves every model.
func (c *Config) ShardList() []Shard {
	if len(c.Shards) == 0 {
		return []Shard{{ControlPlane: c.ControlPlane}}
	}
	return c.Shards
}

func (c *Config) validateShards(bad func(string, ...any)) {
	if !c.ControlPlane.isZero() {
		bad("control_plane and shards are exclusive: with shards, each shard has its own control_plane")
	}
	if len(c.Shards) > MaxShards {
		bad("shards: %d shards, at most %d (run one control plane per pool of models)", len(c.Shards), MaxShards)
	}
	names := map[string]int{}
	clusters := map[string]string{}
	served := map[string]string{}
	for i := range c.Shards {
		s := &c.Shards[i]
		path := fmt.Sprintf("shards[%d]", i)
		switch {
		case s.Name == "":
			bad("%s.name is required (it keys the shard's table in shared data and names its metrics)", path)
		case !shardName.MatchString(s.Name):
			bad("%s.name %q: want 1 to 32 of a-z, 0-9, '-' and '_', starting with a letter or digit", path, s.Name)
		default:
			if j, dup := names[s.Name]; dup {
				bad("%s.name %q is also shards[%d]'s", path, s.Name, j)
			}
			names[s.Name] = i
			path = fmt.Sprintf("shards[%d] (%s)", i, s.Name)
		}
		s.ControlPlane.validate(path+".control_plane", bad)
		for _, e := range s.ControlPlane.Targets() {
			if cl := e.Cluster; cl != "" {
				if other, dup := clusters[cl]; dup && other != path {
					bad("%s.control_plane.cluster %q is also %s's: two shards are two control planes", path, cl, other)
				}
				clusters[cl] = path
			}
		}
		if len(s.Models) == 0 && len(c.Shards) > 1 {
			bad("%s.models is empty: with more than one shard, each lists the models it serves", path)
		}
		for j, m := range s.Models {
			switch {
			case m == "":
				bad("%s.models[%d] is empty", path, j)
			case served[m] == path:
				bad("%s.models lists %q twice", path, m)
			case served[m] != "":
				bad("model %q is in two shards: %s and %s", m, served[m], path)
			default:
				served[m] = path
			}
			if base, ok := c.Adapters[m]; ok {
				bad("%s.models lists %q, a LoRA adapter of %q: list its base model (adapters route on their base model's shard)", path, m, base)
			}
		}
	}
	if len(served) == 0 {
		return // one shard serving every model
	}
	for _, a := range slices.Sorted(maps.Keys(c.Adapters)) {
		base := c.Adapters[a]
		if _, ok := served[base]; !ok && base != "" && served[a] == "" {
			bad("adapters: %q routes on %q, which no shard serves", a, base)
		}
	}
}
