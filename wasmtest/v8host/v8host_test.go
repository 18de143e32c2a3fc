package v8host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/route"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// The model the table and the driver's requests use.
const benchModel = "llama-3.3-70b-bench"

// TestFilterOnCppHost3930b7b runs the filter as `make wasm` ships it on the V8 host for
// KVROUTE_V8_REQUESTS requests (default 20,000; `make soak` uses 100,000) over two
// worker VMs. The rule: no VM fails, and every request sent after the leader received the
// table (all of them: the driver waits for the table first) goes upstream with an endpoint
// header the filter chose, never a client-sent one. Before them, 64 requests sent before
// any table are held by the filter and forwarded, with the endpoint header, once each
// VM's tick after the table resumes them (proxy_continue_stream on their effective
// context).
func TestFilterOnCppHost3930b7b(t *testing.T) {
	nodePath := findNode(t)
	module, err := wasmbuild.Filter()
	require.NoError(t, err)
	n := requestsFromEnv(t)
	r := runBench(t, nodePath, module, n, "--held", strconv.Itoa(heldBeforeTable))

	require.Zero(t, r.Traps, "VM failures %+v, fatal errors %q, restricted calls %s", r.TrapMessages, r.FatalErrors, r.RestrictedTraps)
	require.Empty(t, r.RestrictedTraps, "host calls refused inside _initialize or proxy_on_memory_allocate")
	require.GreaterOrEqual(t, r.Requests, n)
	require.Equal(t, 0, r.TableLoadedAt, "the leader had the table before the first request (%d polls)", r.Polls)
	require.Equal(t, r.Requests, r.AfterTable)
	require.Equal(t, r.AfterTable, r.AfterTableWithHeader, "requests after the table without the endpoint header")
	require.Zero(t, r.SpoofedHeaderKept, "a client-sent endpoint header went upstream")
	require.Zero(t, r.FailedOpen)
	require.Equal(t, heldBeforeTable, r.Held)
	require.Equal(t, r.Held, r.HeldForwarded, "held requests resumed after the table")
	require.Equal(t, r.Held, r.HeldForwardedWithHeader, "and routed on it")
	assert.Equal(t, int64(heldBeforeTable), r.Metrics["kvroute_held_for_table_total"])
	assert.Zero(t, r.Metrics["kvroute_unrouted_total"])
	assert.Equal(t, int64(n+heldBeforeTable), r.Metrics["kvroute_decisions_total"])
	assert.Positive(t, r.Metrics["kvroute_predicted_hits_total"], "the table's prefixes match the requests' system prompts")
	assert.Positive(t, r.Reports, "the leader posted the queued reports")
	assert.Zero(t, r.Logs["critical"])
	t.Logf("V8 host (cpp-host 3930b7b), %d requests on %d VMs: guest time per request p50 %.1f µs, p99 %.1f µs (p99.9 %.1f, mean %.1f, max %.1f, the first %.1f); CPU p50 %.0f µs, p99 %.0f µs; start %d ms, run %d ms",
		r.Requests, r.VMs, r.P50, r.P99, r.P999, r.Mean, r.Max, r.First, r.CPUP50, r.CPUP99, r.StartMs, r.RunMs)

	// The same workload on wazero, in the same run, so the two engines are compared side by
	// side on one (noisy) machine.
	tablePath, promptsPath := writeFixtures(t)
	w := wazeroRun(t, module, tablePath, promptsPath, min(n, 20000))
	wp50, wp99 := percentile(w, 0.50), percentile(w, 0.99)
	t.Logf("side by side, guest time per 32 KB request: V8 p50 %.0f µs p99 %.0f µs; wazero p50 %.0f µs p99 %.0f µs (%d requests); wazero/V8 p50 %.2fx",
		r.P50, r.P99, wp50, wp99, len(w), wp50/r.P50)
}

// TestUnpatchedFilterDiesOnCppHost3930b7b proves the V8 host is as strict as Envoy 1.36-1.38:
// the filter as plain `go build` writes it (no poll_oneoff shim) dies there. Go's wasip1
// runtime calls WASI poll_oneoff from netpoll once any timer exists (after the first GCs
// the scavenger has one) and throws "poll_oneoff failed" on cpp-host's ENOSYS; the throw
// itself sleeps through poll_oneoff again and ends in `unreachable`.
//
// Measured with the driver's defaults (virtual clock, 1 ms per request, 100 ms ticks, two
// worker VMs, 32 KB bodies): with a filter that allocated on every request, VM 0, the
// leader, failed in proxy_on_tick right after request 99 ("poll_oneoff failed", then
// `unreachable`) and VM 1 at request 157, when its GC reached poll_oneoff inside
// proxy_on_memory_allocate and cpp-host's restricted-callback rule trapped it; since the
// cuts both died that second way, at requests 88 and 91, and since the request path's
// host calls stopped allocating (even without filter/wasmpatch's allocator, their
// results no longer escape) both die the first way, in proxy_on_request_body, at
// requests 76 and 77. Every later request passes unfiltered. The test allows 3,000.
// Since the filter collects once at plugin start (its warm-up, filter/warmup.go), the
// first collection is in the canary VM's proxy_on_configure, which throws "poll_oneoff
// failed": the plugin does not start (Envoy rejects the configuration), before any
// request.
func TestUnpatchedFilterDiesOnCppHost3930b7b(t *testing.T) {
	nodePath := findNode(t)
	module, err := wasmbuild.FilterWithoutPollShim()
	require.NoError(t, err)
	const n = 3000
	r, stderr, err := runBenchMay(t, nodePath, module, n)
	if err != nil {
		// bench.mjs exits 2 when the plugin does not start.
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit) && exit.ExitCode() == 2, "bench.mjs: %v: %s\n%s", err, r.Error, tail(stderr))
		t.Logf("the plugin did not start: %s; fatal errors %q", firstLine(r.Error), r.FatalErrors)
		require.Contains(t, r.FatalErrors, "poll_oneoff failed", "the start failed for another reason: %s", r.Error)
		return
	}
	for _, m := range r.TrapMessages {
		t.Logf("VM %d failed at request %d (%s): %s", m.VM, m.Request, m.Phase, firstLine(m.Message))
	}
	for _, c := range r.RestrictedTraps {
		t.Logf("refused host call: %s", c)
	}

	require.Positive(t, r.Traps, "the unpatched module survived %d requests: the host is more forgiving than cpp-host 3930b7b", n)
	require.NotNil(t, r.FirstTrapRequest)
	require.Less(t, *r.FirstTrapRequest, n)
	// Either way the death is poll_oneoff's: the runtime's own fatal error on ENOSYS, or
	// cpp-host refusing the call inside proxy_on_memory_allocate.
	pollRefused := false
	for _, c := range r.RestrictedTraps {
		pollRefused = pollRefused || strings.Contains(string(c), "poll_oneoff")
	}
	require.True(t, pollRefused || slices.Contains(r.FatalErrors, "poll_oneoff failed"),
		"the VMs died of something else than poll_oneoff: fatal errors %q, refused calls %s", r.FatalErrors, r.RestrictedTraps)
	assert.Equal(t, r.VMs, r.Traps, "every worker VM dies")
	assert.Positive(t, r.FailedOpen, "streams on a failed VM pass unfiltered")
}

// heldBeforeTable is how many requests TestFilterOnCppHost3930b7b sends before the table.
const heldBeforeTable = 64

type benchResult struct {
	Error            string `json:"error"`
	Requests         int    `json:"requests"`
	VMs              int    `json:"vms"`
	Traps            int    `json:"traps"`
	FirstTrapRequest *int   `json:"first_trap_request"`
	TrapMessages     []struct {
		VM      int    `json:"vm"`
		Phase   string `json:"phase"`
		Request int    `json:"request"`
		Message string `json:"message"`
	} `json:"trap_messages"`
	RestrictedTraps         []json.RawMessage `json:"restricted_traps"`
	FatalErrors             []string          `json:"fatal_errors"`
	P50                     float64           `json:"p50_us"`
	P99                     float64           `json:"p99_us"`
	P999                    float64           `json:"p999_us"`
	Mean                    float64           `json:"mean_us"`
	CPUP50                  float64           `json:"cpu_p50_us"`
	CPUP99                  float64           `json:"cpu_p99_us"`
	Max                     float64           `json:"max_us"`
	First                   float64           `json:"first_us"`
	EndpointHeader          int               `json:"endpoint_header"`
	AfterTable              int               `json:"after_table"`
	AfterTableWithHeader    int               `json:"after_table_with_header"`
	TableLoadedAt           int               `json:"table_loaded_at_request"`
	SpoofedHeaderKept       int               `json:"spoofed_header_kept"`
	FailedOpen              int               `json:"failed_open"`
	Held                    int               `json:"held"`
	HeldForwarded           int               `json:"held_forwarded"`
	HeldForwardedWithHeader int               `json:"held_forwarded_with_header"`
	Polls                   int               `json:"polls"`
	Reports                 int               `json:"reports"`
	Metrics                 map[string]int64  `json:"metrics"`
	Logs                    map[string]int    `json:"logs"`
	StartMs                 int               `json:"start_ms"`
	RunMs                   int               `json:"run_ms"`
}

func findNode(t *testing.T) string {
	p, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("KVROUTE_REQUIRE_NODE") == "1" {
			t.Fatalf("node not found (%v); the V8 host needs Node 20", err)
		}
		t.Skip("node not found: the V8 host needs Node 20")
	}
	return p
}

func requestsFromEnv(t *testing.T) int {
	v := os.Getenv("KVROUTE_V8_REQUESTS")
	if v == "" {
		return 20000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("KVROUTE_V8_REQUESTS=%q: want a positive integer", v)
	}
	return n
}

// runBench writes the table and prompts, runs bench.mjs and parses its JSON line.
func runBench(t *testing.T, nodePath, module string, requests int, flags ...string) benchResult {
	t.Helper()
	r, stderr, err := runBenchMay(t, nodePath, module, requests, flags...)
	require.NoError(t, err, "bench.mjs failed: %s\n%s", r.Error, tail(stderr))
	return r
}

// runBenchMay is runBench for a run that may fail to start (bench.mjs exits 2: r.Error,
// r.FatalErrors and r.RestrictedTraps say why); it returns the driver's stderr and exit.
// flags go to bench.mjs as well.
func runBenchMay(t *testing.T, nodePath, module string, requests int, flags ...string) (benchResult, string, error) {
	t.Helper()
	tablePath, promptsPath := writeFixtures(t)
	script, err := filepath.Abs("bench.mjs")
	require.NoError(t, err)
	// Generous: about 1 ms of CPU per request on a loaded 2-core machine, plus compiling.
	timeout := 2*time.Minute + time.Duration(requests)*5*time.Millisecond
	if dl, ok := t.Deadline(); ok {
		if left := time.Until(dl) - 15*time.Second; left < timeout {
			timeout = left
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodePath, append([]string{script, "--wasm", module, "--table", tablePath,
		"--prompts", promptsPath, "--requests", strconv.Itoa(requests)}, flags...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("bench.mjs did not finish within %v\n%s", timeout, tail(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var r benchResult
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &r); jerr != nil {
		t.Fatalf("bench.mjs: %v (%v)\nstdout: %s\nstderr: %s", err, jerr, tail(stdout.String()), tail(stderr.String()))
	}
	return r, stderr.String(), err
}

// writeFixtures builds a full table frame with shared/table: four replicas of benchModel
// and, for each of eight ~24 KB system prompts, every stride-th key of its chain (as the
// control plane publishes them) on one replica; and the prompts file the driver sends them
// from.
func writeFixtures(t *testing.T) (tablePath, promptsPath string) {
	t.Helper()
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	var replicas []table.Replica
	for i := range 4 {
		replicas = append(replicas, table.Replica{
			Slot: uint32(i), ID: fmt.Sprintf("vllm-%d", i), Addr: fmt.Sprintf("10.1.0.%d:8000", i+1),
			Speed: 20000, Queued: uint64(500 * i), KVUsage: 0.4, StateAgeMs: 20, Healthy: true,
		})
	}
	m, err := table.NewModel(benchModel, cfg, replicas)
	require.NoError(t, err)
	var p prompt.Parser
	var prompts []string
	for i := range 8 {
		var sb strings.Builder
		for line := 0; sb.Len() < 24<<10; line++ {
			fmt.Fprintf(&sb, "Tenant %d assistant policy, rule %d: answer briefly and cite the catalogue. ", i, line)
		}
		prompts = append(prompts, sb.String())
		body, err := json.Marshal(map[string]any{"model": benchModel, "messages": []map[string]string{{"role": "system", "content": sb.String()}}})
		require.NoError(t, err)
		req, err := p.Parse(prompt.Chat, body, prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 64})
		require.NoError(t, err)
		chain := route.NewChain(cfg, route.Identity{Model: benchModel}, &req, nil)
		require.NotEmpty(t, chain.Keys)
		for k := int(cfg.Stride) - 1; k < len(chain.Keys); k += int(cfg.Stride) {
			require.NoError(t, m.Set(chain.Keys[k], uint32(i%len(replicas))))
		}
	}
	tb := table.New()
	tb.Version = 42
	tb.GeneratedMs = time.Now().UnixMilli()
	tb.Models[benchModel] = m
	dir := t.TempDir()
	tablePath = filepath.Join(dir, "table.bin")
	require.NoError(t, os.WriteFile(tablePath, table.EncodeFull(tb), 0o644))
	pj, err := json.Marshal(map[string]any{"model": benchModel, "system_prompts": prompts})
	require.NoError(t, err)
	promptsPath = filepath.Join(dir, "prompts.json")
	require.NoError(t, os.WriteFile(promptsPath, pj, 0o644))
	return tablePath, promptsPath
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
