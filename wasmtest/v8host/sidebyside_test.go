package v8host

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// wazeroRun is the V8 driver's workload on wasmtest/host (wazero) under the same cpp-host
// profile: the same table frame and system prompts, ~32 KB chat bodies in 16 KiB chunks,
// the same JSON response with usage, two VMs round robin, a virtual clock ticking 1 ms a
// request. It returns the guest time of each request (request and response callbacks), as
// bench.mjs measures it in V8.
func wazeroRun(t *testing.T, module, tablePath, promptsPath string, n int) []time.Duration {
	t.Helper()
	frame, err := os.ReadFile(tablePath)
	require.NoError(t, err)
	pj, err := os.ReadFile(promptsPath)
	require.NoError(t, err)
	var fixtures struct {
		Model   string   `json:"model"`
		Systems []string `json:"system_prompts"`
	}
	require.NoError(t, json.Unmarshal(pj, &fixtures))

	const cluster = "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local"
	cp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == api.TablePath && r.URL.Query().Get("version") == "42":
			w.WriteHeader(http.StatusNotModified)
		case r.URL.Path == api.TablePath:
			w.Header().Set("content-type", api.TableContentType)
			w.Header().Set("x-kvroute-age-ms", "5")
			w.Write(frame)
		default:
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		}
	})
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	cfg := fmt.Sprintf(`{"control_plane":{"cluster":%q,"authority":"kvroute-controlplane"}}`, cluster)
	h, err := host.Load(context.Background(), module, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(1),
		PluginConfig: []byte(cfg), Profile: host.CppHostC4d7bb0, Clusters: map[string]host.Cluster{cluster: {Handler: cp}}})
	require.NoError(t, err)
	defer h.Close(context.Background())
	clk.Advance(300 * time.Millisecond) // the leader polls; every VM reads the table

	resp := func(promptBytes int) []byte {
		p := promptBytes / 4
		return []byte(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":8,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			fixtures.Model, p, p+8, p/2))
	}
	times := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		system := fixtures.Systems[i%len(fixtures.Systems)]
		user := fmt.Sprintf("request %d: %s", i, strings.Repeat("words of the user's question ", (32768-len(system)-200)/29))
		body, err := json.Marshal(map[string]any{"model": fixtures.Model, "max_tokens": 16,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
		require.NoError(t, err)
		var chunks [][]byte
		for off := 0; off < len(body); off += 16384 {
			chunks = append(chunks, body[off:min(off+16384, len(body))])
		}
		res, err := h.Do(context.Background(), host.Request{
			VM: h.VM(i % 2),
			Headers: host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"},
				{":authority", "llm.bench.svc.cluster.local"}, {"content-type", "application/json"}},
			Body:            chunks,
			UpstreamAddress: "10.1.0.1:8000",
			Upstream: func(host.Message) host.Response {
				return host.Response{Headers: host.Headers{{":status", "200"}, {"content-type", "application/json"}},
					Body: [][]byte{resp(len(body))}}
			},
		})
		require.NoError(t, err)
		require.False(t, res.FailedOpen, "request %d: the VM failed", i)
		require.NotEmpty(t, res.Forwarded.Headers.Get(api.DefaultEndpointHeader), "request %d was not routed", i)
		times = append(times, res.FilterTime)
		clk.Advance(time.Millisecond)
	}
	return times
}

func percentile(d []time.Duration, q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1000
}
