// Package version names the vLLM release the simulator imitates (--vllm-version), or
// the SGLang revision (--sglang-version, sglang.go), and derives from it every
// behaviour that changed between releases. Each switch cites
// the vLLM change it follows (PR numbers are vllm-project/vllm):
//
//   - Error envelope: flat {"object":"error","message",...} up to 0.10.0; nested
//     {"error":{"message","type","param","code"}} from 0.10.1 (PR #22099; ErrorInfo and
//     ErrorResponse in vllm/entrypoints/openai/engine/protocol.py @040a2cc2, built by
//     create_error_response in vllm/entrypoints/openai/engine/serving.py @619e4b31).
//   - KV event layout (vLLM's vllm/distributed/kv_events.py):
//     0.9.0 6-element BlockStored and a 2-element batch; 0.10.x 7 elements (medium,
//     PR #19737); 0.23.x 12 elements; >= 0.24 map-encoded events (PR #42892). The
//     releases in between append fields one at a time; their exact layouts are not
//     modelled, so they are refused unless --kv-events-encoding names one.
//   - Replay reply shape: [seq, payload] and end [END_SEQ, ""] up to 0.25; the live
//     shape [topic, seq, payload] and end ["", END_SEQ, ""] from 0.26.0 (PR #45177).
//   - Per-token latency metric: vllm:time_per_output_token_seconds before 0.11, both
//     it (deprecated) and vllm:inter_token_latency_seconds in 0.11, the latter alone
//     from 0.12 (PR #24110; see [Version.TPOT]).
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package version

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

// Default is the newest release docs/testing.md's matrix lists; GET /version reports it.
const Default = "0.26.0"

// Version is a vLLM release number.
type Version struct{ Major, Minor, Patch int }

// Parse reads "0.26.0", "v0.10.1" or "0.23" (patch 0).
func Parse(s string) (Version, error) {
	parts := strings.Split(strings.TrimPrefix(strings.TrimSpace(s), "v"), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("vllm version %q: want MAJOR.MINOR[.PATCH]", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, fmt.Errorf("vllm version %q: bad number %q", s, p)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

// MustParse is Parse for constants.
func MustParse(s string) Version {
	v, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return v
}

// OrDefault returns v, or Default when v is the zero Version.
func (v Version) OrDefault() Version {
	if v == (Version{}) {
		return MustParse(Default)
	}
	return v
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports v >= o.
func (v Version) AtLeast(o Version) bool {
	if v.Major != o.Major {
		return v.Major > o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor > o.Minor
	}
	return v.Patch >= o.Patch
}

// NestedErrors: the OpenAI server's errors are {"error": {...}} (PR #22099, 0.10.1).
func (v Version) NestedErrors() bool { return v.AtLeast(Version{0, 10, 1}) }

// LegacyReplay: replay replies have no topic frame (before PR #45177, 0.26.0).
func (v Version) LegacyReplay() bool { return !v.AtLeast(Version{0, 26, 0}) }

// EventEncoding is the KV event layout of the release, or an error for releases whose
// layout is not modelled.
func (v Version) EventEncoding() (kvevents.Encoding, error) {
	switch {
	case v.AtLeast(Version{0, 24, 0}):
		return kvevents.Map, nil
	case v.Major == 0 && v.Minor == 23:
		return kvevents.Array, nil
	case v.Major == 0 && v.Minor == 10:
		return kvevents.ArrayV010, nil
	case v == Version{0, 9, 0}:
		return kvevents.ArrayV09, nil
	}
	return "", fmt.Errorf("vllm %s: its KV event layout is not modelled (0.9.0, 0.10.x, 0.23.x and >= 0.24 are); pass --kv-events-encoding", v)
}

// TPOT says how the release shows vllm:time_per_output_token_seconds: the only
// per-token latency histogram before 0.11; next to vllm:inter_token_latency_seconds,
// marked deprecated, in 0.11 (PR #24110); hidden from 0.12 (loggers.py: "Deprecated in
// 0.11 ... With 0.12.x you can enable with --show-hidden-metrics-for-version=0.11")
// and later removed (PR #32661).
func (v Version) TPOT() metrics.TPOTMode {
	switch {
	case !v.AtLeast(Version{0, 11, 0}):
		return metrics.TPOTOnly
	case !v.AtLeast(Version{0, 12, 0}):
		return metrics.TPOTDeprecated
	}
	return metrics.TPOTHidden
}
