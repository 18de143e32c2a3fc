package server

import (
	"strings"

	"github.com/kvroute/kvroute/shared/table"
)

// tableFormat is the newest table format this control plane writes that a poll's
// api.TableFormatsHeader lists ("1,2"): format 2 (slower tiers) only for a filter that
// reads it, format 1 for every other, including filters that send no header
// (docs/table.md, "Slower tiers"). Names it does not know are ignored.
func tableFormat(header string) uint8 {
	for f := range strings.SplitSeq(header, ",") {
		if strings.TrimSpace(f) == "2" {
			return table.FormatTiers
		}
	}
	return table.FormatVersion
}
