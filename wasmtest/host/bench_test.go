package host_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// BenchmarkDo is one request through a VM with no sockets: what the host plus the
// conformance plugin cost per request. filter-µs/op is the time inside guest callbacks.
func BenchmarkDo(b *testing.B) {
	for _, tc := range []struct {
		name string
		req  host.Request
	}{
		{"GET", host.Request{Headers: request("GET", "/v1/models")}},
		{"POST-1KB", host.Request{Headers: request("POST", "/v1/completions"),
			Body: [][]byte{[]byte(fmt.Sprintf(`{"route":"10.0.0.1:8000","prompt":%q}`, strings.Repeat("lorem ipsum ", 85)))}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h, err := host.Load(context.Background(), pluginPath, host.Config{VMs: 1, PluginConfig: pluginConfig(0, "control")})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close(context.Background())
			ctx := context.Background()
			var filter int64
			for b.Loop() {
				res, err := h.Do(ctx, tc.req)
				if err != nil {
					b.Fatal(err)
				}
				filter += int64(res.FilterTime)
			}
			b.ReportMetric(float64(filter)/float64(b.N)/1e3, "filter-µs/op")
		})
	}
}
