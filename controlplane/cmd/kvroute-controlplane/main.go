// Command kvroute-controlplane watches the LLM engines (metrics, KV events), keeps the
// prefix index and serves the routing table to kvroute filters. Run with --help.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/controlplane"
	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/front"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/server"
	"github.com/kvroute/kvroute/internal/cli"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	infclient "sigs.k8s.io/gateway-api-inference-extension/client-go/clientset/versioned"
)

type engineFlags []discovery.Engine

func (e *engineFlags) String() string { return fmt.Sprintf("%d engines", len(*e)) }
func (e *engineFlags) Set(v string) error {
	eng, err := discovery.ParseFlag(v)
	if err != nil {
		return err
	}
	*e = append(*e, eng)
	return nil
}

type poolFlags []discovery.PoolRef

func (p *poolFlags) String() string { return fmt.Sprintf("%d pools", len(*p)) }
func (p *poolFlags) Set(v string) error {
	ref, err := discovery.ParsePoolRef(v)
	if err != nil {
		return err
	}
	*p = append(*p, ref)
	return nil
}

const command = "kvroute-controlplane"

var help = cli.Help{
	Intro: `watches LLM engines (Prometheus metrics, vLLM/SGLang KV events),
keeps the prefix index and serves the routing table that every kvroute filter polls.
Engines come from --engines-file, repeated --engine flags, and/or Kubernetes
(--k8s-selector, --inference-pool).`,
	Usage: []string{
		"--engine model=M,addr=HOST:PORT,kv=tcp://HOST:PORT[,...] [--engine ...] [flags]",
		"--engines-file FILE [flags]",
		"--k8s-selector LABEL | --inference-pool NAMESPACE/NAME[=MODEL] [flags]",
	},
	Details: `An --engine value is comma-separated key=value pairs:
  id, model, addr (ip:port), metrics (URL, default http://<addr>/metrics),
  kv (tcp://host:port of the engine's KV-event PUB), replay (its replay ROUTER),
  topic, kind (vllm|sglang), speed (prefill tokens/s), dp_size, dp_external
e.g. --engine model=llama,addr=127.0.0.1:8001,kv=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,kind=vllm,speed=14025

HTTP API: GET /v1/table?version=V[&model=M][&wait_ms=W], POST /v1/reports,
GET /debug/state, /metrics, /healthz, /readyz.`,
}

func main() { os.Exit(cli.Exit(command, run(os.Args[1:]), os.Stderr)) }

func run(args []string) error {
	fs := cli.NewFlagSet(command, help, os.Stdout)
	var (
		engines engineFlags
		pools   poolFlags
		o       controlplane.Options
		ic      index.Config
	)
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8080", "HTTP listen address (manifests use 0.0.0.0:8080)")
	enginesFile := fs.String("engines-file", "", "static engines file, YAML or JSON: {engines: [{model, addr, metrics, kv, replay, topic, kind, speed, dp_size, dp_external, id}]}")
	fs.Var(&engines, "engine", "a static engine as key=value pairs (repeatable; see above)")
	k8sSelector := fs.String("k8s-selector", "", "discover engines from the EndpointSlices of the Services matching this label selector (e.g. kvroute.io/model)")
	k8sNamespace := fs.String("k8s-namespace", "", "namespace of the engine Services (default: this pod's namespace, else \"default\")")
	k8sPort := fs.String("k8s-port-name", "", "EndpointSlice port name of the engines' HTTP API (default: the first port)")
	k8sPods := fs.Bool("k8s-pods", true, "read Pod labels/annotations (kvroute.io/kv-port, ...); needs get/list/watch on pods")
	fs.Var(&pools, "inference-pool", "NAMESPACE/NAME[=MODEL]: discover engines from the ready Pods of this Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1), on its target ports (repeatable; MODEL default: kvroute.io/model on the Pod or pool, else the pool's name)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&o.KVBind, "kv-bind", "", "bind a SUB socket here (e.g. tcp://0.0.0.0:5557) for engines that connect to the control plane; engines are told apart by topic")
	fs.IntVar(&o.MaxDPRanks, "kv-bind-ranks", 1, "with --kv-bind: also bind port+1..port+N-1 for data-parallel ranks 1..N-1")
	kvAllow := fs.String("kv-bind-allow", "", "with --kv-bind: IPs or CIDRs (comma-separated) that may publish any engine's topic; by default a topic is accepted only from the address of the engine it names (its addr, metrics and kv hosts), others are dropped and counted")
	fs.IntVar(&ic.BlockBytes, "block-bytes", 64, "text-domain block size in bytes (published to filters)")
	fs.IntVar(&ic.BlockTokens, "block-tokens", 16, "token-domain block size in tokens; the engines' block_size must be a multiple of it")
	fs.IntVar(&ic.Stride, "stride", 4, "the table keeps every stride-th key of a chain (published to filters)")
	fs.Float64Var(&ic.DefaultBytesPerToken, "bytes-per-token", 4.0, "bytes per token of canonical prompt text until outcome reports teach the model's ratio")
	fs.DurationVar(&ic.SpecTTL, "spec-ttl", 60*time.Second, "lifetime of a placement's speculative entries unless an outcome confirms them")
	fs.DurationVar(&ic.ConfirmedTTL, "confirmed-ttl", 10*time.Minute, "lifetime of a confirmed key after the last outcome that confirmed it, whatever engine evictions did (at most 8h)")
	fs.IntVar(&ic.UnhealthyAfter, "unhealthy-after", 3, "consecutive failed scrapes before a replica is marked unhealthy")
	fs.Float64Var(&ic.DefaultUncachedTokens, "default-uncached-tokens", 512, "uncached prompt tokens assumed per waiting request until outcomes say better (engines without kvroute:queued_prefill_tokens)")
	fs.DurationVar(&ic.ReportLag, "report-lag", 200*time.Millisecond, "how late the filters' reports arrive (their report_ms and a tick): a queue counted from their start reports is dated this long ago (engines without kvroute:queued_prefill_tokens)")
	fs.IntVar(&ic.MaxKeysPerReplica, "max-keys-per-replica", 1<<20, "hard cap on the keys one replica may hold, whatever its capacity")
	fs.IntVar(&ic.Budget.MaxKeys, "max-keys", 0, "memory budget in entries: keys the replicas hold plus KV-event blocks tracked, over all replicas; inputs beyond it are dropped and counted (default: none, only --max-index-bytes' 256 MiB); each model's share is its replicas' part, borrowable while other models are idle")
	fs.Int64Var(&ic.Budget.MaxBytes, "max-index-bytes", 0, "memory budget in bytes of the index's own structures, priced per kind of entry (docs/controlplane.md lists what a key held from reports and from KV events costs); inputs beyond it are dropped and counted; with --max-keys too, whichever binds first; 0: 256 MiB unless --max-keys is given (then none); Go's heap runs to about twice it")
	fs.Int64Var(&ic.Budget.DefaultCapacityTokens, "default-capacity-tokens", index.DefaultCapacityTokens, "a replica's KV capacity in tokens until vllm:cache_config_info gives num_gpu_blocks x block_size; a replica holds at most 4 x capacity / (stride x block-tokens) keys")
	maxHomes := fs.Int("max-homes", index.DefaultMaxHomes, "keys the table lists nowhere that each model remembers with the replica that held each last, served to filters as homes (table format 4; about 40 bytes a key here, 12 in each filter); 0: none")
	fs.IntVar(&ic.Budget.MaxReplicas, "max-replicas", index.DefaultMaxReplicas, "replicas discovery may list; the rest are dropped and counted")
	fs.DurationVar(&ic.RefreshInterval, "refresh-interval", 100*time.Millisecond, "while scrapes succeed, publish a version at least this often so state age stays fresh")
	fs.DurationVar(&o.PublishInterval, "publish-interval", 50*time.Millisecond, "at most one table version per interval")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", 100*time.Millisecond, "metrics scrape period per replica (50-100 ms)")
	fs.DurationVar(&o.ScrapeTimeout, "scrape-timeout", 500*time.Millisecond, "timeout of one metrics scrape")
	fs.IntVar(&o.History, "history", 600, "versions kept for deltas (600 x 50 ms = 30 s)")
	token := fs.String("token", "", "bearer token required on /v1/table, /v1/reports and /debug/state (prefer --token-file or $KVROUTE_CONTROLPLANE_TOKEN)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token")
	fs.Int64Var(&o.MaxBodyBytes, "max-body-bytes", 8<<20, "largest report batch accepted")
	fs.Int64Var(&o.MaxReportBytesInFlight, "max-report-bytes-in-flight", 16<<20, "report body bytes read and not yet applied, charged as they arrive; a batch whose bytes would pass it gets 429 and is counted")
	fs.DurationVar(&o.BodyTimeout, "body-timeout", server.DefaultBodyTimeout, "time a request's body may take to arrive; past it the request gets 400 and its connection is closed")
	fs.IntVar(&o.MaxConnections, "max-connections", front.DefaultMaxConns+front.DefaultMaxFallbackConns, "HTTP connections held at once (four fifths for filters' polls and reports, the rest for other requests); past it a connection is answered 503, closed and counted")
	fs.BoolVar(&o.InsecureNoToken, "insecure-no-token", false, "allow --listen on a non-loopback address without a token (anyone reaching the port can then post reports)")
	fs.DurationVar(&o.ReplayTimeout, "replay-timeout", 2*time.Second, "timeout of one KV-event replay request")
	fs.DurationVar(&o.TakeoverAfter, "takeover-after", 0, "with replicas: for this long after the start, answer 503 to filters holding another replica's table, so they stay with one that has heard their reports (the rollout's minReadySeconds; 0: off)")
	fs.DurationVar(&o.WarmUp, "warm-up", 5*time.Second, "hold the first table until every KV-event stream has applied its engine's replay buffer, at most this long (0: publish at once); /readyz fails until the first table")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 5*time.Second, "time to drain HTTP requests on SIGTERM/SIGINT")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return cli.Usagef("--log-level: %w", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	allow, err := controlplane.ParseAllow(*kvAllow)
	if err != nil {
		return cli.Usagef("--kv-bind-allow: %w", err)
	}
	o.KVBindAllow = allow
	switch {
	case *maxHomes < 0:
		return cli.Usagef("--max-homes %d: want 0 or more", *maxHomes)
	case *maxHomes == 0:
		ic.MaxHomes = -1 // index.Config: negative keeps none, 0 the default
	default:
		ic.MaxHomes = *maxHomes
	}
	o.Index = ic

	o.Token = *token
	if o.Token == "" {
		o.Token = os.Getenv("KVROUTE_CONTROLPLANE_TOKEN")
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		o.Token = strings.TrimSpace(string(b))
	}
	if *enginesFile != "" {
		es, err := discovery.LoadFile(*enginesFile)
		if err != nil {
			return err
		}
		o.Engines = append(o.Engines, es...)
	}
	o.Engines = append(o.Engines, engines...)
	if *k8sSelector != "" || len(pools) > 0 {
		cfg, err := kubeConfig(*kubeconfig)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		ns := *k8sNamespace
		if ns == "" {
			if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
				ns = strings.TrimSpace(string(b))
			} else {
				ns = "default"
			}
		}
		o.Kubernetes = &discovery.Kubernetes{Client: cs, Namespace: ns, Selector: *k8sSelector, PortName: *k8sPort, Pods: *k8sPods, Logger: o.Logger}
		if len(pools) > 0 {
			pc, err := infclient.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("inference pool client: %w", err)
			}
			o.Kubernetes.InferencePools, o.Kubernetes.PoolClient = pools, pc
		}
	}
	if o.Kubernetes == nil && len(o.Engines) == 0 {
		return cli.Usagef("no engines: give --engine, --engines-file, --k8s-selector or --inference-pool")
	}

	cp, err := controlplane.New(o)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := cp.Start(ctx); err != nil {
		return err
	}
	o.Logger.Info("kvroute control plane listening", "addr", cp.Addr(), "engines", len(o.Engines), "kubernetes", *k8sSelector != "", "inference_pools", len(pools))
	b := cp.Index.BudgetState() // 0: no such limit
	o.Logger.Info("index memory budget", "max_keys", b.MaxKeys, "max_index_bytes", b.MaxBytes)
	<-ctx.Done()
	o.Logger.Info("shutting down")
	return cp.Wait()
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: not in a cluster and no --kubeconfig: %w", err)
	}
	return cfg, nil
}
