// Command kvroute-mesh runs kvroute on one machine: simulated vLLM replicas, the control
// plane, and a proxy running the real kvroute.wasm as Envoy would. See --help.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

const command = "kvroute-mesh"

var help = cli.Help{
	Intro: `the whole of kvroute on one machine, on loopback. It starts simulated vLLM
replicas (OpenAI API, /metrics, KV events over ZMQ), the kvroute control plane watching
them, and a proxy that runs bin/kvroute.wasm the way Envoy does (worker VMs, shared data,
the leader polling the control plane) and forwards each request to the replicas the
filter picked (Envoy's override_host policy). It prints where everything is, then a
summary line every few seconds, until Ctrl-C.`,
	Usage: []string{
		"[flags]",
		"--demo [flags]",
		"--engine model=M,addr=HOST:PORT,kv=tcp://HOST:PORT[,...] [--engine ...] [--demo] [flags]",
	},
	Details: `--demo also sends shared-prefix chat traffic twice, through the same proxy and filter,
once balanced round robin and once as kvroute picks, every replica's cache emptied before
each run, prints progress every 5 s and the comparison at the end, and exits.

Bring your own engines: each --engine is an engine you already run (vLLM, SGLang or
kvroute-enginesim), in the control plane's --engine syntax (comma-separated key=value:
model, addr, kv, replay, metrics, topic, kind, speed, id, dp_size, dp_external), or just
its URL (http://HOST:PORT: no KV events, the table then learns from placements alone).
No simulated replica starts: the control plane watches your engines (scrapes /metrics,
subscribes to their KV events) and the proxy sends them the requests, e.g.
  kvroute-mesh --engine model=llama,addr=10.0.0.7:8000,kv=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558 \
               --engine model=llama,addr=10.0.0.8:8000,kv=tcp://10.0.0.8:5557,replay=tcp://10.0.0.8:5558
Start vLLM with --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}', --enable-prompt-tokens-details
and --enable-force-include-usage (without it streams that do not ask for usage report no
outcome; the summary counts them).
With --demo the kvroute run sends other customers' prompts than the round-robin run
(your engines' caches cannot be emptied), so that neither run finds the other's prefixes.`,
}

// engineFlag collects --engine values; parse reads them once --model is known.
type engineFlag []string

func (e *engineFlag) String() string { return "" }

func (e *engineFlag) Set(v string) error {
	*e = append(*e, v)
	return nil
}

// parseEngine reads one --engine value: the control plane's key=value pairs, or a URL or
// host:port alone; model defaults to the --model flag.
func parseEngine(v, model string) (discovery.Engine, error) {
	if !strings.Contains(v, "=") {
		v = "addr=" + strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(v, "http://"), "https://"), "/")
	}
	if !strings.HasPrefix(v, "model=") && !strings.Contains(v, ",model=") {
		v += ",model=" + model
	}
	return discovery.ParseFlag(v)
}

type options struct {
	replicas, vms, kvBlocks, maxSeqs int
	proxyAddr, cpAddr, wasm, model   string
	profile, logLevel                string
	sessionHeader                    string
	timeScale                        float64
	every                            time.Duration
	demo                             bool
	demoLoad                         mesh.Load
	engineFlags                      engineFlag
	engines                          []discovery.Engine
}

func parse(args []string, out io.Writer) (options, error) {
	var o options
	fs := newFlagSet(&o, out)
	if err := cli.Parse(fs, args); err != nil {
		return o, err
	}
	if o.replicas < 1 || o.vms < 1 || o.timeScale <= 0 || o.every <= 0 {
		return o, cli.Usagef("--replicas, --vms, --time-scale and --summary-every must be positive")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, v := range o.engineFlags {
		e, err := parseEngine(v, o.model)
		if err == nil {
			err = e.Validate()
		}
		if err != nil && !strings.HasPrefix(err.Error(), "--engine") {
			err = fmt.Errorf("--engine %q: %w", v, err)
		}
		if err != nil {
			return o, &cli.UsageError{Err: err}
		}
		o.engines = append(o.engines, e)
	}
	for _, sim := range []string{"replicas", "profile", "time-scale", "kv-blocks", "max-num-seqs"} {
		if len(o.engines) > 0 && set[sim] {
			return o, cli.Usagef("--%s is for simulated replicas: with --engine none start", sim)
		}
	}
	if o.demo {
		// The demo runs and exits: unless told otherwise it takes free ports, so it can
		// run next to a `make run` holding the default ones.
		if !set["proxy"] {
			o.proxyAddr = "127.0.0.1:0"
		}
		if !set["controlplane"] {
			o.cpAddr = "127.0.0.1:0"
		}
	}
	return o, nil
}

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := cli.NewFlagSet(command, help, out)
	fs.IntVar(&o.replicas, "replicas", 4, "simulated vLLM replicas")
	fs.Var(&o.engineFlags, "engine", "an engine you run, instead of simulated replicas: key=value pairs as the control plane's --engine takes, or its URL (repeatable; see above)")
	fs.StringVar(&o.proxyAddr, "proxy", "127.0.0.1:10000", "address of the proxy clients send OpenAI requests to (--demo: a free port unless set)")
	fs.StringVar(&o.cpAddr, "controlplane", "127.0.0.1:18080", "address of the control plane (GET /debug/state, /metrics, /v1/table; --demo: a free port unless set)")
	fs.StringVar(&o.wasm, "wasm", "bin/kvroute.wasm", "the filter module (make wasm builds it); empty builds it from this checkout")
	fs.IntVar(&o.vms, "vms", 2, "proxy worker VMs (Envoy worker threads)")
	fs.StringVar(&o.model, "model", "llama", "served model name")
	fs.StringVar(&o.sessionHeader, "session-header", "", "a request header naming an agent's session (e.g. x-session-id) that the filter trusts: a session's requests prefer the replica of its previous one (the filter's session_header); unset, a client's session header is ignored")
	fs.StringVar(&o.profile, "profile", "seed000", "engine timing: seed000 (Llama 3.3 70B FP8 on TP=2 H200: 71.3 us per prefill token) or fast")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "wall seconds per simulated engine second (1 = real time)")
	fs.IntVar(&o.kvBlocks, "kv-blocks", 1250, "KV pool per replica in 16-token blocks: 1250 (20,000 tokens) holds about 13 of the demo's system prompts, so the demo's 40 fit the fleet but not one replica (0 = the profile's 558,124 tokens)")
	fs.IntVar(&o.maxSeqs, "max-num-seqs", 0, "running sequences per replica (0 = the profile's)")
	fs.DurationVar(&o.every, "summary-every", 5*time.Second, "how often to print the summary line")
	fs.StringVar(&o.logLevel, "log-level", "warn", "debug, info, warn or error (no prompt text is ever logged)")
	fs.BoolVar(&o.demo, "demo", false, "run the round robin vs kvroute comparison, print it and exit")
	fs.IntVar(&o.demoLoad.Customers, "demo-customers", 40, "demo: distinct customer system prompts")
	fs.IntVar(&o.demoLoad.PrefixTokens, "demo-prefix-tokens", 1500, "demo: tokens of each system prompt")
	fs.IntVar(&o.demoLoad.QuestionTokens, "demo-question-tokens", 100, "demo: tokens of each question")
	fs.IntVar(&o.demoLoad.MaxTokens, "demo-max-tokens", 16, "demo: output tokens per request")
	fs.Float64Var(&o.demoLoad.Rate, "demo-rate", 8, "demo: requests per second (Poisson)")
	fs.DurationVar(&o.demoLoad.Duration, "demo-duration", 30*time.Second, "demo: length of each of the two runs")
	fs.Float64Var(&o.demoLoad.HotShare, "demo-hot-share", 0, "demo: share of requests from customer 0 (a hot prefix)")
	fs.Uint64Var(&o.demoLoad.Seed, "demo-seed", 1, "demo: seed of arrivals and questions")
	return fs
}

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr)) }

// realMain is the command: it returns the exit status, and every error is one line on
// stderr.
func realMain(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stdout)
	if err != nil {
		return cli.Exit(command, err, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = run(ctx, o, stdout)
	var busy *mesh.PortInUseError
	if errors.As(err, &busy) {
		flagName := "--proxy"
		if busy.Part != "proxy" {
			flagName = "--controlplane"
		}
		err = fmt.Errorf("%s (another kvroute-mesh running?); %s ADDR moves the %s (make run ARGS=\"%s ADDR\")", busy, flagName, busy.Part, flagName)
	}
	return cli.Exit(command, err, stderr)
}

// run starts the mesh and runs until ctx ends (or, with --demo, the demo does).
func run(ctx context.Context, o options, stdout io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return cli.Usagef("--log-level: %w", err)
	}
	if o.wasm != "" {
		if _, err := os.Stat(o.wasm); err != nil {
			return fmt.Errorf("%s: %w (run `make wasm`, or pass --wasm \"\" to build it)", o.wasm, err)
		}
	}
	m, err := mesh.Start(ctx, mesh.Options{
		Replicas: o.replicas, Model: o.model, Profile: o.profile, TimeScale: o.timeScale,
		KVBlocks: o.kvBlocks, MaxNumSeqs: o.maxSeqs, ProxyAddr: o.proxyAddr, ControlPlaneAddr: o.cpAddr,
		VMs: o.vms, WasmPath: o.wasm, Engines: o.engines, Filter: api.Config{SessionHeader: o.sessionHeader},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		OnListen: func() {
			if len(o.engines) > 0 {
				fmt.Fprintf(stdout, "kvroute-mesh: starting the control plane and the proxy in front of %s ...\n", plural(len(o.engines), "engine"))
			} else {
				fmt.Fprintf(stdout, "kvroute-mesh: starting %s, the control plane and the proxy ...\n", plural(o.replicas, "replica"))
			}
		},
	})
	if err != nil {
		return err
	}
	defer m.Close()
	// The banner's curl should be routed: wait for the filter's first table.
	readyCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	ready := m.Ready(readyCtx)
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	printBanner(ctx, stdout, m, o)
	if !ready {
		fmt.Fprintf(stdout, "kvroute-mesh: the filter has no table from the control plane after 15 s (%s/debug/state says why): requests take the proxy's fallback until it has\n", m.ControlPlaneURL())
	}

	if o.demo {
		fmt.Fprintf(stdout, "\ndemo: two runs of %s each (round robin, then kvroute) ...\n", o.demoLoad.Duration)
		o.demoLoad.Progress = func(policy string, elapsed time.Duration, r mesh.LoadResult) {
			fmt.Fprintf(stdout, "%s %-11s %3.0fs of %s: %d requests, %d errors, cached tokens %.1f%%, TTFT p50 %s\n",
				time.Now().Format("15:04:05"), policy, elapsed.Seconds(), o.demoLoad.Duration, r.Requests, r.Errors,
				100*r.CachedRate(), r.TTFTQuantile(0.5).Round(time.Millisecond))
		}
		c := m.Compare(ctx, o.demoLoad)
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, c.Table())
		return nil
	}
	// On a terminal the summary is a table redrawn in place; otherwise one line each.
	summary := &mesh.SummaryPrinter{W: stdout, Terminal: isTerminal(stdout)}
	t := time.NewTicker(o.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "\nkvroute-mesh: stopping")
			return nil
		case <-t.C:
			summary.Print(time.Now(), m.Summary())
		}
	}
}

// plural is "1 engine", "2 engines".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// servedModel is the model the banner's curl names: the one the first engine serves
// (GET /v1/models), which is want unless the engine was configured with another name;
// then warn says so. If the engine does not answer, want, and warn says why.
func servedModel(ctx context.Context, engineURL, want string) (model, warn string) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, engineURL+"/v1/models", nil)
	if err == nil {
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			} else {
				err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list)
			}
		}
	}
	if err != nil || len(list.Data) == 0 {
		if err == nil {
			err = errors.New("no model listed")
		}
		return want, fmt.Sprintf("GET %s/v1/models: %v; the curl below names %q", engineURL, err, want)
	}
	var ids []string
	for _, d := range list.Data {
		if d.ID == want {
			return want, ""
		}
		ids = append(ids, d.ID)
	}
	return ids[0], fmt.Sprintf("%s serves %s, not %q: the control plane files that engine's replicas under %q, so requests for the model it serves go unrouted (set model= in --engine to the served name)",
		engineURL, strings.Join(ids, ", "), want, want)
}

func printBanner(ctx context.Context, out io.Writer, m *mesh.Mesh, o options) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  proxy (kvroute.wasm, %d VMs)  %s\n", o.vms, m.URL())
	fmt.Fprintf(out, "  control plane                %s  (/debug/state, /metrics, /v1/table)\n", m.ControlPlaneURL())
	for i, e := range m.Engines {
		fmt.Fprintf(out, "  vllm-%d (simulated)           %s  (/metrics; KV events %s)\n", i, e.URL(), e.EventsEndpoint())
	}
	for _, e := range m.ExternalEngines() {
		kv := e.KV
		if kv == "" {
			kv = "none"
		}
		fmt.Fprintf(out, "  %-28s http://%s  (model %s; KV events %s)\n", e.ID, e.Addr, e.Model, kv)
	}
	if o.demo {
		return
	}
	engineURL, model := "", o.model
	if len(m.Engines) > 0 {
		engineURL = m.Engines[0].URL()
	} else if es := m.ExternalEngines(); len(es) > 0 {
		engineURL, model = "http://"+es[0].Addr, es[0].Model
	}
	model, warn := servedModel(ctx, engineURL, model)
	if warn != "" {
		fmt.Fprintf(out, "\nkvroute-mesh: %s\n", warn)
	}
	system := strings.ReplaceAll(mesh.SystemPrompt(7, 200), `"`, ``)
	fmt.Fprintf(out, `
Send a request twice: the second answer's usage.prompt_tokens_details.cached_tokens
shows the prefix found cached.

  curl -s %s/v1/chat/completions -H 'content-type: application/json' -d '{
    "model": "%s", "max_tokens": 16,
    "messages": [{"role": "system", "content": "%s"},
                 {"role": "user", "content": "Where is my order 42?"}]}'

`, m.URL(), model, system)
}
