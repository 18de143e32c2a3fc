package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	simmetrics "github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

// Fan-out: N simulated proxy leaders follow the table (full, then deltas,
// as filter/leader.go does: GET /v1/table?version=V every 100 ms, or long polls with
// wait_ms) and post report batches every 100 ms (one placement and one outcome per
// request at -fanout.rps requests/s per proxy, text keys of an 8 KB prompt), while the
// control plane scrapes M simulated engines' vLLM /metrics every 100 ms. The control
// plane runs in a child process (this test binary as TestFanoutControlPlaneProcess),
// so its CPU is measured alone (getrusage of the child); proxies and engines share the
// machine with it. Reported: the control plane's CPU (user+system seconds of the child
// process per second, from /proc: the proxies' and engines' own work is not in it) in
// cores and per 1,000 proxies, publish-to-receive latency (receive time minus the
// frame's generated time, same clock) p50/p99, table bytes/s out, the mean delta's size,
// versions/s, requests/s served.
//
// The proxies poll as current filters do, listing the formats they read
// (-fanout.formats "1,2": format 2); -fanout.formats "" polls as filters before format 2
// did (format 1). -fanout.churn is the fraction of engines whose waiting count changes on
// every scrape (a busy fleet: versions every 50 ms instead of the 100 ms refresh).
// -fanout.page full serves vLLM v1's whole page (the engine simulator's, every request
// histogram: about 34 KB) instead of the 2 KB of families the scraper reads.
//
//	go test ./controlplane -run '^$' -bench Fanout -benchtime 1x -fanout.proxies 2000 -fanout.engines 200
//
// KV events are not part of this run (BenchmarkIngestEndToEnd in controlplane/index
// measures them): the engines' key churn is simulated by the reports.
func BenchmarkFanout(b *testing.B) {
	for _, mode := range []string{"poll", "longpoll"} {
		b.Run("mode="+mode, func(b *testing.B) {
			for range b.N {
				r := fanout(b, *fanoutProxies, *fanoutEngines, mode, *fanoutDur)
				b.ReportMetric(r.cores, "cores")
				b.ReportMetric(r.cores*1000/float64(*fanoutProxies), "cores/1000proxies")
				b.ReportMetric(r.p50, "p50-ms")
				b.ReportMetric(r.p99, "p99-ms")
				b.ReportMetric(r.bytesPerSec, "bytes/s")
				b.ReportMetric(r.deltaBytes, "bytes/delta")
				b.ReportMetric(r.versionsPerSec, "versions/s")
				b.ReportMetric(r.reqPerSec, "req/s")
				b.ReportMetric(float64(r.errors), "errors")
			}
		})
	}
}

var (
	fanoutProxies = flag.Int("fanout.proxies", 500, "simulated proxies (BenchmarkFanout)")
	fanoutEngines = flag.Int("fanout.engines", 200, "simulated engines scraped (BenchmarkFanout)")
	fanoutRPS     = flag.Int("fanout.rps", 5, "requests/s per proxy, each a placement and an outcome report")
	fanoutDur     = flag.Duration("fanout.duration", 10*time.Second, "measured time (BenchmarkFanout)")
	fanoutProfile = flag.String("fanout.cpuprofile", "", "write the control plane's CPU profile here")
	fanoutFormats = flag.String("fanout.formats", api.TableFormats, "X-Kvroute-Table-Formats the proxies send (\"\": as filters before format 2, format 1)")
	fanoutChurn   = flag.Float64("fanout.churn", 0, "fraction of engines whose waiting count changes on every scrape")
	fanoutPage    = flag.String("fanout.page", "small", "engine /metrics page: small (the families scraped, 2 KB) or full (vLLM v1's, 34 KB)")
	fanoutClient  = flag.String("fanout.client", "raw", "how the simulated proxies poll: raw (requests written at the socket, fanout_client_test.go) or go (net/http's client)")
)

const fanoutEnv = "KVROUTE_FANOUT_CP" // engines file and profile path in the child

type fanoutResult struct {
	cores, p50, p99, bytesPerSec, reqPerSec float64
	deltaBytes, versionsPerSec              float64
	errors                                  int64
}

// vllmMetrics is one engine's exposition, as vLLM writes it (the names the scraper reads).
// waiting is the num_requests_waiting value (it changes between scrapes of an engine
// that churns).
func vllmMetrics(i, waiting int) string {
	if *fanoutPage == "full" {
		var b strings.Builder
		simmetrics.Write(&b, simmetrics.Snapshot{ModelName: "meta-llama/Llama-3.1-8B-Instruct", Engine: "0", Created: 1.7e9,
			Running: i % 7, Waiting: waiting, KVUsage: float64(i%100) / 100, PrefixQueries: 12345670, PrefixHits: 8123456,
			PromptTokens: 45000000, GenerationTokens: 3100000, Success: map[string]int64{"stop": 9000, "length": 900},
			TTFT: simmetrics.NewHistogram(simmetrics.TTFTBuckets), E2E: simmetrics.NewHistogram(simmetrics.E2EBuckets),
			Request: simmetrics.NewRequestHistograms(131072, simmetrics.TPOTHidden),
			CacheConfig: []simmetrics.Label{{Name: "block_size", Value: "16"}, {Name: "cache_dtype", Value: "auto"},
				{Name: "enable_prefix_caching", Value: "True"}, {Name: "gpu_memory_utilization", Value: "0.9"},
				{Name: "num_cpu_blocks", Value: "0"}, {Name: "num_gpu_blocks", Value: strconv.Itoa(20000 + i)}}})
		return b.String()
	}
	return fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.%02d
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1.234567e+07
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 8.123456e+06
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="%d",num_cpu_blocks="0"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 4.5e+07
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 3.1e+06
`, i%7, waiting, i%100, 20000+i)
}

func fanout(b *testing.B, proxies, engines int, mode string, dur time.Duration) fanoutResult {
	b.StopTimer()
	// Engines: one HTTP server each (the scraper keeps a connection per engine host).
	var scrapes atomic.Int64
	var es []discovery.Engine
	for i := range engines {
		body := vllmMetrics(i, i%3)
		churn := float64(i) < *fanoutChurn*float64(engines)
		var n atomic.Int64
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scrapes.Add(1)
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			if churn {
				io.WriteString(w, vllmMetrics(i, int(n.Add(1)%8)))
				return
			}
			io.WriteString(w, body)
		}))
		defer eng.Close()
		es = append(es, discovery.Engine{ID: fmt.Sprintf("e%d", i), Model: "m", Addr: fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255),
			Metrics: eng.URL + "/metrics"})
	}
	f, err := os.CreateTemp(b.TempDir(), "engines*.json")
	if err != nil {
		b.Fatal(err)
	}
	json.NewEncoder(f).Encode(map[string]any{"engines": es})
	f.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestFanoutControlPlaneProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fanoutEnv+"="+f.Name()+","+*fanoutProfile)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var base string
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "addr "); ok {
			base = "http://" + a
			break
		}
	}
	if base == "" {
		b.Fatal("control plane process gave no address")
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 2 * proxies, MaxConnsPerHost: 0, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{KeepAlive: -1}).DialContext}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu        sync.Mutex
		lat       []float64
		bytesOut  atomic.Int64
		deltaOut  atomic.Int64
		vmin      = uint64(1<<64 - 1)
		vmax      uint64
		reqs      atomic.Int64
		errs      atomic.Int64
		measuring atomic.Bool
		wg        sync.WaitGroup
	)
	// A proxy's leader would apply each frame to its table; the simulated ones only
	// check the frame's header and follow its version, so that the proxies' own work
	// (thousands of table applies per second) does not starve the control plane
	// they share the machine with.
	get := func(tab *version) {
		path := api.TablePath
		if tab.Version != 0 {
			path += "?version=" + strconv.FormatUint(tab.Version, 10)
			if mode == "longpoll" {
				path += "&wait_ms=1000"
			}
		}
		var (
			status int
			delta  bool
			body   []byte
			err    error
		)
		if tab.raw != nil {
			status, delta, body, err = tab.raw.get(path, time.Now().Add(5*time.Second))
		} else {
			status, delta, body, err = goGet(ctx, client, base+path)
		}
		now := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				errs.Add(1)
			}
			time.Sleep(100 * time.Millisecond)
			return
		}
		if measuring.Load() {
			reqs.Add(1)
		}
		switch {
		case status == http.StatusOK:
			if len(body) < 36 || string(body[:4]) != "KVRT" {
				errs.Add(1)
				return
			}
			tab.Version = binary.LittleEndian.Uint64(body[8:])
			tab.GeneratedMs = int64(binary.LittleEndian.Uint64(body[24:]))
			if measuring.Load() {
				bytesOut.Add(int64(len(body)))
				mu.Lock()
				if delta {
					deltaOut.Add(int64(len(body)))
					lat = append(lat, float64(now.UnixMilli()-tab.GeneratedMs))
				}
				vmin, vmax = min(vmin, tab.Version), max(vmax, tab.Version)
				mu.Unlock()
			}
		case status == http.StatusNotModified, status == http.StatusServiceUnavailable:
		default:
			errs.Add(1)
		}
	}
	post := func(p int, n int, seq *int) {
		body := api.AppendBatchHeader(nil, fmt.Sprintf("p%d", p))
		for range n {
			*seq++
			e := es[(p+*seq)%engines]
			keys := make([]uint64, 32) // an 8 KB prompt: 128 text blocks, 32 checkpoint keys
			for i := range keys {
				keys[i] = uint64(p)<<40 | uint64(*seq%64)<<8 | uint64(i)
			}
			common := api.Report{Model: "m", Replica: e.Addr, Domain: prefix.Text, BlockSize: prefix.DefaultBlockBytes, Stride: 4,
				Blocks: 128, Keys: keys, AtMs: time.Now().UnixMilli()}
			pl, oc := common, common
			pl.Kind = api.KindPlacement
			oc.Kind, oc.Status, oc.PromptTokens, oc.CachedTokens, oc.PromptBytes = api.KindOutcome, 200, 2048, 1024, 8192
			body = pl.AppendBinary(body)
			body = oc.AppendBinary(body)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+api.ReportsPath, bytes.NewReader(body))
		req.Header.Set("Content-Type", api.ReportsContentType) // as filters post them
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				errs.Add(1)
			}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if measuring.Load() {
			reqs.Add(1)
		}
		if resp.StatusCode != http.StatusOK {
			errs.Add(1)
		}
	}
	for p := range proxies {
		wg.Add(2)
		go func() { // the leader's table loop
			defer wg.Done()
			time.Sleep(time.Duration(p) * 100 * time.Millisecond / time.Duration(proxies)) // spread the phases
			tab := &version{}
			if *fanoutClient == "raw" {
				tab.raw = &rawPoller{addr: strings.TrimPrefix(base, "http://")}
				defer tab.raw.close()
			}
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for ctx.Err() == nil {
				get(tab)
				if mode == "poll" || tab.Version == 0 {
					select {
					case <-t.C:
					case <-ctx.Done():
					}
				}
			}
		}()
		go func() { // the leader's report loop: every 100 ms, what queued meanwhile
			defer wg.Done()
			time.Sleep(time.Duration(p) * 100 * time.Millisecond / time.Duration(proxies))
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			seq, acc := 0, 0.0
			for {
				select {
				case <-t.C:
				case <-ctx.Done():
					return
				}
				acc += float64(*fanoutRPS) / 10
				if n := int(acc); n > 0 {
					acc -= float64(n)
					post(p, n, &seq)
				}
			}
		}()
	}
	time.Sleep(3 * time.Second) // warm up: connections, full tables
	user0, sys0 := childCPU(b, cmd.Process.Pid)
	t0 := time.Now()
	s0 := scrapes.Load()
	measuring.Store(true)
	b.StartTimer()
	time.Sleep(dur)
	b.StopTimer()
	measuring.Store(false)
	wall := time.Since(t0).Seconds()
	user1, sys1 := childCPU(b, cmd.Process.Pid)
	user, sys := user1-user0, sys1-sys0
	cpu := user + sys
	sc1 := scrapes.Load() - s0
	cancel()
	wg.Wait()
	stdin.Close()
	cmd.Wait()
	tr.CloseIdleConnections()
	mu.Lock()
	slices.Sort(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return -1
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	r := fanoutResult{cores: cpu / wall, p50: q(0.5), p99: q(0.99), bytesPerSec: float64(bytesOut.Load()) / wall,
		reqPerSec: float64(reqs.Load()) / wall, errors: errs.Load()}
	if len(lat) > 0 {
		r.deltaBytes = float64(deltaOut.Load()) / float64(len(lat))
	}
	if vmax > vmin {
		r.versionsPerSec = float64(vmax-vmin) / wall
	}
	b.Logf("%s (formats %q, churn %.2f, page %s): %d proxies, %d engines (%.0f scrapes/s): control plane %.2f cores (%.0f%% in the kernel), %.1f versions/s, %d deltas received (%.0f bytes each), p50 %.0f ms p99 %.0f ms, %.0f KB/s out, %.0f req/s, %d errors",
		mode, *fanoutFormats, *fanoutChurn, *fanoutPage, proxies, engines, float64(sc1)/wall, r.cores, 100*sys/max(cpu, 1e-9), r.versionsPerSec, len(lat), r.deltaBytes, r.p50, r.p99, r.bytesPerSec/1e3, r.reqPerSec, r.errors)
	mu.Unlock()
	return r
}

// version is what a simulated proxy keeps of the table, and its connection with
// -fanout.client raw.
type version struct {
	Version     uint64
	GeneratedMs int64
	raw         *rawPoller
}

// goGet is one poll through net/http's client (-fanout.client go).
func goGet(ctx context.Context, client *http.Client, url string) (status int, delta bool, body []byte, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if *fanoutFormats != "" {
		req.Header.Set(api.TableFormatsHeader, *fanoutFormats)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, nil, err
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Kvroute-Frame") == "delta", body, err
}

// childCPU is a process's user and system CPU seconds so far (/proc/PID/stat).
func childCPU(b *testing.B, pid int) (user, sys float64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return ut / 100, st / 100 // USER_HZ
}

// TestFanoutControlPlaneProcess is BenchmarkFanout's control plane; without its
// environment variable it does nothing. It serves until stdin closes.
func TestFanoutControlPlaneProcess(t *testing.T) {
	arg := os.Getenv(fanoutEnv)
	if arg == "" {
		t.Skip("the fan-out benchmark's control-plane process")
	}
	file, prof, _ := strings.Cut(arg, ",")
	es, err := discovery.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := New(Options{Listen: "127.0.0.1:0", Engines: es, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if prof != "" {
		pf, err := os.Create(prof)
		if err != nil {
			t.Fatal(err)
		}
		pprof.StartCPUProfile(pf)
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}
	fmt.Printf("addr %s\n", cp.Addr())
	io.Copy(io.Discard, os.Stdin)
	cancel()
	cp.Wait()
}
