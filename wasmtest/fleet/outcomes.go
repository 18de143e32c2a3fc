package fleet

import (
	"encoding/csv"
	"io"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// OutcomeColumns name WriteOutcomes' columns.
var OutcomeColumns = []string{"policy", "request", "arrival_s", "replica", "prompt_tokens", "cached_tokens",
	"cpu_loaded_tokens", "routed_cached_tokens", "reusable_tokens", "reuse_from", "ttft_s", "e2e_s",
	"spill", "preemptions", "measured", "state"}

// WriteOutcomes writes every request of every result as CSV, one row per request and
// policy, with what the workload let it reuse (workload.Reuses, indexed by request):
// the rows a table's figures are made of, to find where two policies part (which
// requests lost a prefix they could have had, and when). Sizes, times and places only,
// never a prompt's text.
func WriteOutcomes(w io.Writer, results []*sim.Result, reuses []workload.Reuse) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(OutcomeColumns); err != nil {
		return err
	}
	itoa, secs := strconv.Itoa, func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 4, 64) }
	for _, res := range results {
		for _, o := range res.Outcomes {
			reuse := workload.Reuse{From: -1}
			if o.Index >= 0 && o.Index < len(reuses) {
				reuse = reuses[o.Index]
			}
			row := []string{res.Policy, itoa(o.Index), secs(o.Arrival), itoa(o.Replica), itoa(o.Prompt), itoa(o.Cached),
				itoa(o.Loaded), itoa(o.RouteCached), itoa(reuse.Tokens), itoa(reuse.From), secs(o.TTFT), secs(o.E2E),
				strconv.FormatBool(o.Spill), itoa(o.Preemptions), strconv.FormatBool(o.Measured), o.State}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
