package route

import (
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/table"
)

// Placement is the report of decision d for chain c on model m: the chain's checkpoint
// keys (at the table's stride) on the picked replica. Hashes and counts only.
func Placement(m *table.Model, c *Chain, d *Decision, at time.Time) api.Report {
	return placement(m, c, d, at, nil)
}

// placement is Placement with the keys appended to keys[:0].
func placement(m *table.Model, c *Chain, d *Decision, at time.Time, keys []uint64) api.Report {
	stride := max(int(m.Config.Stride), 1)
	return api.Report{
		Kind: api.KindPlacement, Model: m.Name, Replica: d.Addrs[0], Domain: c.Domain,
		BlockSize: c.BlockSize, Stride: stride, Blocks: len(c.Keys),
		Keys:        prefix.Checkpoints(keys[:0], c.Keys, stride),
		PromptBytes: c.PromptBytes, PredictedCachedTokens: int(d.PredictedCached),
		AtMs: at.UnixMilli(), Starts: true,
	}
}

// Start is the report that placed's request started at at: its first response byte,
// when the engine has prefilled it (filter/response.go). The control plane stops
// counting the placement as queued (controlplane/index/placed.go).
func Start(placed *api.Report, at time.Time) api.Report {
	return api.Report{
		Kind: api.KindStart, Model: placed.Model, Replica: placed.Replica, Domain: placed.Domain,
		BlockSize: placed.BlockSize, Stride: placed.Stride, Placement: placed.PlacementID(),
		AtMs: at.UnixMilli(),
	}
}

// Outcome turns a placement into its outcome: the replica that served (which may be a
// retry target or the fallback's pick), the status, and the engine's usage when the
// response carried it (nil otherwise: cached tokens -1).
func Outcome(placed api.Report, replica string, status int, u *prompt.Usage, at time.Time) api.Report {
	r := placed
	r.Kind, r.Replica, r.Status, r.AtMs, r.Starts = api.KindOutcome, replica, status, at.UnixMilli(), false
	r.CachedTokens = -1
	if u != nil {
		r.PromptTokens, r.CachedTokens = u.PromptTokens, u.CachedTokens
	}
	return r
}
