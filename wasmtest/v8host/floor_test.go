package v8host

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// The floor module (wasmtest/host/testdata/floor: an SDK filter that only holds the body
// and sets the endpoint header) through the same driver as TestFilterOnCppHost3930b7b:
// the guest time the SDK's callbacks cost in V8 by themselves, beside kvroute's in that
// test's log. It must run without a trap, as kvroute does.
func TestFloorOnCppHost3930b7b(t *testing.T) {
	nodePath := findNode(t)
	module, cleanup, err := wasmbuild.BuildTemp("../host/testdata/floor")
	require.NoError(t, err)
	defer cleanup()
	n := requestsFromEnv(t)
	r := runBench(t, nodePath, module, n)
	require.Zero(t, r.Traps, "VM failures %+v, fatal errors %q", r.TrapMessages, r.FatalErrors)
	require.GreaterOrEqual(t, r.Requests, n)
	t.Logf("floor module on V8 (cpp-host 3930b7b), %d requests on %d VMs: guest time per request p50 %.1f µs, p99 %.1f µs (mean %.1f); CPU p50 %.0f µs, p99 %.0f µs",
		r.Requests, r.VMs, r.P50, r.P99, r.Mean, r.CPUP50, r.CPUP99)
}
