package host_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// The floor module (testdata/floor, BenchmarkKvrouteRequestPath -args -floor) still
// builds, holds the body and routes, so the benchmark's comparison is not silently lost.
func TestFloorModuleRoutes(t *testing.T) {
	path, cleanup, err := wasmbuild.BuildTemp("testdata/floor")
	require.NoError(t, err)
	defer cleanup()
	h, err := host.Load(context.Background(), path, host.Config{VMs: 1})
	require.NoError(t, err)
	defer h.Close(context.Background())
	res, err := h.Do(context.Background(), kvRequest(kv32K[:len(kv32K)/2], kv32K[len(kv32K)/2:]))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9002", endpointOf(res.Forwarded))
	require.Equal(t, len(kv32K), len(res.Forwarded.Body))
}
