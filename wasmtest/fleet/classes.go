package fleet

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
)

// Budgets are the classes' TTFT budgets, as sim.Config.ClassBudgets takes them.
func Budgets(o *api.Overload) map[string]time.Duration {
	out := make(map[string]time.Duration, len(o.Classes))
	for _, c := range o.Classes {
		out[c.Name] = time.Duration(c.TTFTBudgetMs) * time.Millisecond
	}
	return out
}

// WriteClasses writes each policy's requests by class (admitted and completed, shed,
// TTFT, goodput) and its tenants' shares of the prefill tokens.
func WriteClasses(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tclass\tarrived\tcompleted\tshed\tfailed\tTTFT p50 s\tp95 s\tp99 s\tbudget s\tgoodput/s\t")
	for _, r := range results {
		for _, c := range r.Classes {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.2f\t\n", r.Policy, c.Name, c.Arrived, c.Completed,
				c.Shed, c.Failed, secs(c.TTFTp50), secs(c.TTFTp95), secs(c.TTFTp99), secs(c.Budget), c.Goodput)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nprefill tokens of completed requests by tenant (share)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t", r.Policy)
		for _, t := range r.Tenants {
			fmt.Fprintf(tw, "%s %s\t", t.Name, pct(t.Share))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// MixedOverload is the classes of workload.DefaultParts (docs/overload.md): critical
// within 2 s, standard within 5 s, sheddable within 30 s, every tenant weighing 1, at
// the prefill rate of profile prefillSecondsPerToken.
func MixedOverload(prefillSecondsPerToken float64) api.Overload {
	return api.Overload{
		Classes: []api.Class{
			{Name: "critical", TTFTBudgetMs: 2000, Critical: true},
			{Name: "standard", TTFTBudgetMs: 5000},
			{Name: "sheddable", TTFTBudgetMs: 30000},
		},
		DefaultClass:           "standard",
		PrefillTokensPerSecond: 1 / prefillSecondsPerToken,
	}
}
