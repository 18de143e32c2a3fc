// Command kvroute-mesh runs kvroute on one machine: simulated vLLM replicas, the control
// plane, and a proxy running the real kvroute.wasm as Envoy would. See --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

const usage = `kvroute-mesh: the whole of kvroute on one machine, on loopback.

Starts simulated vLLM replicas (OpenAI API, /metrics, KV events over ZMQ), the kvroute
control plane watching them, and a proxy that runs bin/kvroute.wasm the way Envoy does
(worker VMs, shared data, the leader polling the control plane) and forwards each request
to the replicas the filter picked (Envoy's override_host policy). Prints where everything
is, then a summary line every few seconds, until Ctrl-C.

With --demo it also sends shared-prefix chat traffic twice, through the same proxy and
filter, once balanced round robin and once as kvroute picks, every replica's cache
emptied before each run, and prints the comparison.

Flags:
`

type options struct {
	replicas, vms, kvBlocks, maxSeqs int
	proxyAddr, cpAddr, wasm, model   string
	profile, logLevel                string
	timeScale                        float64
	every                            time.Duration
	demo                             bool
	demoLoad                         mesh.Load
}

func parse(args []string, out io.Writer) (options, error) {
	var o options
	fs := newFlagSet(&o, out)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.replicas < 1 || o.vms < 1 || o.timeScale <= 0 || o.every <= 0 {
		return o, errors.New("--replicas, --vms, --time-scale and --summary-every must be positive")
	}
	if o.demo {
		// The demo runs and exits: unless told otherwise it takes free ports, so it can
		// run next to a `make run` holding the default ones.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
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
	fs := flag.NewFlagSet("kvroute-mesh", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.replicas, "replicas", 4, "simulated vLLM replicas")
	fs.StringVar(&o.proxyAddr, "proxy", "127.0.0.1:10000", "address of the proxy clients send OpenAI requests to (--demo: a free port unless set)")
	fs.StringVar(&o.cpAddr, "controlplane", "127.0.0.1:18080", "address of the control plane (GET /debug/state, /metrics, /v1/table; --demo: a free port unless set)")
	fs.StringVar(&o.wasm, "wasm", "bin/kvroute.wasm", "the filter module (make wasm builds it); empty builds it from this checkout")
	fs.IntVar(&o.vms, "vms", 2, "proxy worker VMs (Envoy worker threads)")
	fs.StringVar(&o.model, "model", "llama", "served model name")
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
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvroute-mesh:", err)
		return 2
	}
	if err := run(o, stdout); err != nil {
		var busy *mesh.PortInUseError
		if errors.As(err, &busy) {
			flagName := "--proxy"
			if busy.Part != "proxy" {
				flagName = "--controlplane"
			}
			err = fmt.Errorf("%s (another kvroute-mesh running?); %s ADDR moves the %s", busy, flagName, busy.Part)
		}
		fmt.Fprintln(stderr, "kvroute-mesh:", strings.ReplaceAll(err.Error(), "\n", "; "))
		return 1
	}
	return 0
}

func run(o options, stdout io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.wasm != "" {
		if _, err := os.Stat(o.wasm); err != nil {
			return fmt.Errorf("%s: %w (run `make wasm`, or pass --wasm \"\" to build it)", o.wasm, err)
		}
	}
	m, err := mesh.Start(ctx, mesh.Options{
		Replicas: o.replicas, Model: o.model, Profile: o.profile, TimeScale: o.timeScale,
		KVBlocks: o.kvBlocks, MaxNumSeqs: o.maxSeqs, ProxyAddr: o.proxyAddr, ControlPlaneAddr: o.cpAddr,
		VMs: o.vms, WasmPath: o.wasm,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		OnListen: func() {
			fmt.Fprintln(stdout, "kvroute-mesh: starting", o.replicas, "replicas, the control plane and the proxy ...")
		},
	})
	if err != nil {
		return err
	}
	defer m.Close()
	printBanner(stdout, m, o)

	if o.demo {
		fmt.Fprintf(stdout, "\ndemo: two runs of %s each (round robin, then kvroute) ...\n", o.demoLoad.Duration)
		c := m.Compare(ctx, o.demoLoad)
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, c.Table())
		return nil
	}
	t := time.NewTicker(o.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "\nkvroute-mesh: stopping")
			return nil
		case <-t.C:
			fmt.Fprintln(stdout, time.Now().Format("15:04:05"), m.Summary())
		}
	}
}

func printBanner(out io.Writer, m *mesh.Mesh, o options) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  proxy (kvroute.wasm, %d VMs)  %s\n", o.vms, m.URL())
	fmt.Fprintf(out, "  control plane                %s  (/debug/state, /metrics, /v1/table)\n", m.ControlPlaneURL())
	for i, e := range m.Engines {
		fmt.Fprintf(out, "  vllm-%d (simulated)           %s  (/metrics; KV events %s)\n", i, e.URL(), e.EventsEndpoint())
	}
	system := strings.ReplaceAll(mesh.SystemPrompt(7, 200), `"`, ``)
	fmt.Fprintf(out, `
Send a request (repeat it: the second one finds its prefix cached):

  curl -s %s/v1/chat/completions -H 'content-type: application/json' -d '{
    "model": "%s", "max_tokens": 16,
    "messages": [{"role": "system", "content": "%s"},
                 {"role": "user", "content": "Where is my order 42?"}]}' | jq .usage

`, m.URL(), o.model, system)
}
