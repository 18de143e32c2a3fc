package api

import (
	"sort"
	"strings"
)

// TableFormatsHeader on a table poll lists the frame formats the filter reads, e.g.
// "1,2,3,4"; the control plane answers in the newest it can write, format 1 without it
// (docs/table.md, "Version skew").
const TableFormatsHeader = "X-Kvroute-Table-Formats"

// TableFormats is the value this build's filter sends in TableFormatsHeader.
const TableFormats = "1,2,3,4"

// DefaultCPULoadCost is guards.offload_cost's default for the "CPU" medium: loading a
// token of Llama 3.3 70B's KV (BF16, TP=2: 163,840 bytes a GPU) over PCIe Gen5 at 50 GB/s
// takes 3.28 us, against 71.3 us to prefill it (docs/rule.md, "Slower tiers").
const DefaultCPULoadCost = 0.046

// maxTierName matches table.MaxTierName (api does not import table).
const maxTierName = 32

// NormalizeMedium is how the control plane and the filter spell a KV medium: vLLM's
// strings ("CPU", "Disk", "STORAGE") upper-cased, so configuration is case-blind.
func NormalizeMedium(m string) string { return strings.ToUpper(strings.TrimSpace(m)) }

// fillOffloadDefaults normalizes guards.offload_cost's medium names and adds the CPU
// default when the medium is not configured.
func (g *Guards) fillOffloadDefaults() {
	oc := make(map[string]float64, len(g.OffloadCost)+1)
	for m, r := range g.OffloadCost {
		oc[NormalizeMedium(m)] = r
	}
	if _, ok := oc["CPU"]; !ok {
		oc["CPU"] = DefaultCPULoadCost
	}
	g.OffloadCost = oc
}

// validateOffload checks guards.offload_cost (after fillOffloadDefaults).
func (g *Guards) validateOffload(bad func(string, ...any)) {
	names := make([]string, 0, len(g.OffloadCost))
	for m := range g.OffloadCost {
		names = append(names, m)
	}
	sort.Strings(names) // one message order for one config
	for _, m := range names {
		r := g.OffloadCost[m]
		if m == "" || len(m) > maxTierName || m == "GPU" {
			bad("guards.offload_cost: medium %q: want a slower medium's name of 1 to %d bytes (not GPU)", m, maxTierName)
		}
		if !(r >= 0 && r <= 1) { // also NaN
			bad("guards.offload_cost[%q] %v out of range [0, 1]: a load-cost ratio to prefill (1 counts the tier as uncached)", m, r)
		}
	}
	if len(names) > 64 {
		bad("guards.offload_cost: %d media, at most 64", len(names))
	}
}

// OffloadRatios returns the load-cost ratio of each of a table model's tiers (its
// medium names, in tier order) into dst: guards.offload_cost's value, or 1 (uncached)
// for a medium it does not name.
func (c *Config) OffloadRatios(tiers []string, dst []float64) []float64 {
	dst = dst[:0]
	for _, t := range tiers {
		r, ok := c.Guards.OffloadCost[t]
		if !ok {
			r, ok = c.Guards.OffloadCost[NormalizeMedium(t)]
		}
		if !ok {
			r = 1
		}
		dst = append(dst, r)
	}
	return dst
}
