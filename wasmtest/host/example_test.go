package host_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// Example shows a test driving a plugin in virtual time: four worker VMs, a control
// plane served in process, one request through a VM, then the host's state by name.
func Example() {
	ctx := context.Background()
	clk := clock.NewVirtual(time.Unix(1_700_000_000, 0))
	controlPlane := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("table")) })
	h, err := host.Load(ctx, "bin/kvroute.wasm", host.Config{
		VMs:          4,
		PluginConfig: []byte(`{"cluster":"control"}`),
		Clusters:     map[string]host.Cluster{"control": {Handler: controlPlane, Latency: 2 * time.Millisecond}},
		Clock:        clk,
		Rand:         host.SeededRand(1),
	})
	if err != nil {
		panic(err)
	}
	defer h.Close(ctx)

	clk.Advance(time.Second) // ticks, HTTP calls and queue deliveries due in that second

	res, err := h.Do(ctx, host.Request{
		Headers: host.Headers{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "vllm"}},
		Body:    [][]byte{[]byte(`{"model":"m","prompt":"hello"}`)},
		Upstream: func(fwd host.Message) host.Response {
			return host.Response{Headers: host.Headers{{":status", "200"}}, Body: [][]byte{[]byte(`{}`)}}
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Forwarded.Headers.Get("x-gateway-destination-endpoint"), res.FilterTime)

	table, _, _ := h.SharedData("kvroute/table/current")
	decisions, _ := h.Metric("kvroute.decisions")
	fmt.Println(len(table), decisions.Value, len(h.Logs()))
}
