package server

import (
	"strings"

	"github.com/kvroute/kvroute/shared/table"
)

// tableFormat is the newest table format this control plane writes that a poll's
// api.TableFormatsHeader lists ("1,2,3,4"): format 4 (homes), 3 (replicas' load) or 2
// (slower tiers) only for a filter that reads it, format 1 for every other, including
// filters that send no header (docs/table.md, "Version skew"). Names it does not know are
// ignored.
func tableFormat(header string) uint8 {
	best := uint8(table.FormatVersion)
	for f := range strings.SplitSeq(header, ",") {
		switch strings.TrimSpace(f) {
		case "4":
			best = table.FormatHomes
		case "3":
			best = max(best, table.FormatLoad)
		case "2":
			best = max(best, table.FormatTiers)
		}
	}
	return best
}
