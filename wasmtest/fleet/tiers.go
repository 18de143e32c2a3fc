package fleet

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// GPUOnlyName is kvroute whose proxies read table format 1 (GPU holders only), as a
// filter that does not know slower tiers does: run beside kvroute when replicas have a
// CPU tier, it shows what counting CPU-tier hits at their load cost is worth.
const GPUOnlyName = "kvroute-gpu-only"

func newGPUOnly(f policy.Fleet, routerOf func(*workload.Request) int, o Options, seed uint64) (policy.Policy, error) {
	c := o.KVRoute
	c.Routers, c.Seed, c.GPUOnly = o.Routers, seed, true
	p, err := kvroute.New(f, routerOf, c)
	if err != nil {
		return nil, err
	}
	p.Label = GPUOnlyName
	return p, nil
}

// WriteTiers writes each policy's cached rate split into GPU prefix-cache hits and
// CPU-tier loads, with its TTFT.
func WriteTiers(w io.Writer, results []*sim.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tcached\tGPU hits\tCPU-tier hits\tTTFT p50 s\tp95 s\tp99 s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Policy, pct(r.CachedTokenRate), pct(r.CachedTokenRate-r.CPUTokenRate),
			pct(r.CPUTokenRate), secs(r.TTFTp50), secs(r.TTFTp95), secs(r.TTFTp99))
	}
	return tw.Flush()
}
