// Command kvroute-enginesim runs simulated vLLM replicas: the OpenAI API, Prometheus
// /metrics and ZMQ KV events exactly as vLLM speaks them, over a paged prefix cache and
// a continuous-batching scheduler timed by a hardware profile. See --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/radix"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

const command = "kvroute-enginesim"

var help = cli.Help{
	Intro: `simulated vLLM replicas for testing kvroute. Each replica serves vLLM's
OpenAI API (POST /v1/completions, /v1/chat/completions, /tokenize, /reset_prefix_cache;
GET /v1/models, /health, /version, /metrics) and, with --kv-events-config, publishes KV
cache events over ZMQ (PUB + optional ROUTER replay) in vLLM's wire format. Prompts are
tokenized by a deterministic stand-in tokenizer (4 bytes per token); token-id prompts are
used as given. Time runs at --time-scale wall seconds per simulated second; latencies in
responses and metrics are simulated.`,
	Usage: []string{"[flags]"},
	Details: `Fault switches (loopback clients only, with --enable-admin):
  POST /admin/restart                      a process restart: cache empty, event seq from 0, no AllBlocksCleared
                                           (--engine sglang: AllBlocksCleared first, as SGLang's start-up)
  POST /admin/pause-events[?on=false]      stop (or resume) sending KV events; seqs keep counting
  POST /admin/resume-events
  POST /admin/slow-metrics?ms=N            delay GET /metrics by N ms (0 = off)
  POST /admin/fail-fraction?f=F[&code=503] fail a fraction F of generation requests (500 or 503)
  POST /admin/reset-prefix-cache
  GET  /admin/state                        queue, cache and event state as JSON

Example:
  kvroute-enginesim --port 8000 --profile seed000 --time-scale 0.001 \
    --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5567","topic":"kv@127.0.0.1:8000@llama"}'`,
}

type loraFlag []server.LoRAModule

func (l *loraFlag) String() string {
	var parts []string
	for _, m := range *l {
		parts = append(parts, m.Name+"="+m.Path)
	}
	return strings.Join(parts, " ")
}

func (l *loraFlag) Set(v string) error {
	for _, item := range strings.Fields(v) {
		name, path, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return fmt.Errorf("lora module %q: want name=path", item)
		}
		*l = append(*l, server.LoRAModule{Name: name, Path: path})
	}
	return nil
}

// options are the parsed flags.
type options struct {
	host, model, servedName, profile         string
	port, replicas                           int
	blockSize, numGPUBlocks                  int
	maxNumSeqs, maxBatchedTokens, maxLen     int
	timeScale                                float64
	kvEventsConfig, encoding, vllmVersion    string
	sglangVersion                            string
	engine                                   string
	sglangPageSize                           int
	legacyReplay                             bool
	dpRank                                   int
	hashAlgo, hashSeed                       string
	loras                                    loraFlag
	defaultMaxTokens, vocabSize              int
	enableAdmin                              bool
	logLevel                                 string
	enablePrefixCaching, promptTokensDetails bool
	forceIncludeUsage, cacheReport           bool
	responsesStore                           bool
	cpuOffloadTokens                         int
	cpuLoadUsPerToken                        float64
}

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := cli.NewFlagSet(command, help, out)
	seed := os.Getenv("PYTHONHASHSEED")
	// vLLM reads bool(int(os.getenv("VLLM_ENABLE_RESPONSES_API_STORE", "0"))) (vllm/envs.py).
	storeOn, _ := strconv.Atoi(os.Getenv("VLLM_ENABLE_RESPONSES_API_STORE"))
	if seed == "" {
		seed = "0"
	}
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on for HTTP, and the host that replaces \"*\" in tcp:// KV event bind endpoints (use 0.0.0.0 to listen on all interfaces)")
	fs.IntVar(&o.port, "port", 8000, "HTTP port of the first replica (0 = pick a free port); replica i listens on port+i")
	fs.IntVar(&o.replicas, "replicas", 1, "replicas to run in this process; replica i adds i to the HTTP port and to the KV event endpoints' ports")
	fs.StringVar(&o.model, "model", "meta-llama/Llama-3.3-70B-Instruct", "model name (vLLM --model); served under this name unless --served-model-name is set")
	fs.StringVar(&o.servedName, "served-model-name", "", "name the API serves and metrics label model_name carries (default: --model)")
	fs.Var(&o.loras, "lora-modules", "LoRA adapter served as a model, name=path (repeatable, or several separated by spaces); its blocks hash with its name")
	fs.StringVar(&o.profile, "profile", "seed000", "timing profile: seed000 (Llama 3.3 70B FP8, TP=2 H200: 71.3 us/prefill token, 558,124-token KV pool) or fast (tiny, for tests)")
	fs.IntVar(&o.blockSize, "block-size", 0, "tokens per KV block (0 = profile's, 16)")
	fs.IntVar(&o.cpuOffloadTokens, "cpu-offload-tokens", 0, "tokens of KV kept in CPU memory by vLLM's OffloadingConnector (LRU; its events carry medium \"CPU\"); 0 = none")
	fs.Float64Var(&o.cpuLoadUsPerToken, "cpu-load-us-per-token", 3.28, "microseconds to load a token of KV back from the CPU tier, added to the step that admits the request (3.28: Llama 3.3 70B BF16 KV over PCIe Gen5, docs/rule.md)")
	fs.IntVar(&o.numGPUBlocks, "num-gpu-blocks", 0, "KV pool size in blocks, overriding the profile (vLLM --num-gpu-blocks-override); 0 = profile pool / block size")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 0, "maximum running sequences (0 = profile's: 256 seed000, 64 fast)")
	fs.IntVar(&o.maxBatchedTokens, "max-num-batched-tokens", 0, "token budget per scheduler step, chunked prefill (0 = profile's, 8192)")
	fs.IntVar(&o.maxLen, "max-model-len", 0, "context length limit, prompt + output tokens (0 = profile's)")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "wall seconds per simulated second: 1 = real time, 0.001 = one simulated second per wall millisecond")
	fs.StringVar(&o.kvEventsConfig, "kv-events-config", "", `vLLM's KVEventsConfig JSON: enable_kv_cache_events, publisher ("zmq"), endpoint (default tcp://*:5557; bound if it contains "*" or "::", else connected), replay_endpoint (ROUTER), buffer_steps, hwm, topic`)
	fs.StringVar(&o.vllmVersion, "vllm-version", version.Default, "vLLM release to imitate: error envelope (flat <= 0.10.0, nested >= 0.10.1), KV event layout (0.9.0, 0.10.x, 0.23.x arrays; maps >= 0.24) and replay shape (topic frame >= 0.26)")
	fs.StringVar(&o.encoding, "kv-events-encoding", "", "KV event layout, overriding --vllm-version's (and --engine sglang's): map (vLLM >= 0.24), array (0.23), array-v0.10, array-v0.9, sglang")
	fs.StringVar(&o.engine, "engine", "vllm", "engine to imitate: vllm, or sglang (SGLang's /metrics names, its KV event layout and hashes, legacy replay, AllBlocksCleared at every process start)")
	fs.IntVar(&o.sglangPageSize, "sglang-page-size", 1, "--engine sglang: SGLang's --page-size, tokens per cached and published page (it replaces the block size)")
	fs.StringVar(&o.sglangVersion, "sglang-version", version.SGLangDefault, "--engine sglang: SGLang revision to imitate: main (SHA-256 page hashes, medium, one BlockRemoved per radix node, new metric labels) or 0.4.7 to 0.5.0rc0 (hash(tuple(page)), per-page removals, split events)")
	fs.BoolVar(&o.legacyReplay, "kv-events-legacy-replay", false, "overriding --vllm-version's: answer replay requests in the <= v0.25 shape ([seq, payload], end [END_SEQ, \"\"]) instead of v0.26's ([topic, seq, payload], end [\"\", END_SEQ, \"\"])")
	fs.IntVar(&o.dpRank, "data-parallel-rank", 0, "data-parallel rank: offsets the KV event ports (vLLM offset_endpoint_port) and fills data_parallel_rank")
	fs.StringVar(&o.hashAlgo, "prefix-caching-hash-algo", cache.AlgoSimXXH64, "block hash: sim_xxh64 (fast, simulator-private) or sha256_cbor (vLLM's, identical hashes given the same seed)")
	fs.StringVar(&o.hashSeed, "hash-seed", seed, "block hash seed, vLLM's PYTHONHASHSEED (taken from $PYTHONHASHSEED when set)")
	fs.IntVar(&o.defaultMaxTokens, "default-max-tokens", 16, "output tokens when a request sets no max_tokens (the simulated model never stops early)")
	fs.IntVar(&o.vocabSize, "vocab-size", 128256, "token ids accepted in token-id prompts are below this")
	fs.BoolVar(&o.enableAdmin, "enable-admin", true, "serve the /admin/ fault switches (loopback clients only)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error (logs carry ids and token counts, never prompt text)")
	fs.BoolVar(&o.enablePrefixCaching, "enable-prefix-caching", true, "accepted for vLLM compatibility; prefix caching is always on")
	fs.BoolVar(&o.promptTokensDetails, "enable-prompt-tokens-details", true, "accepted for vLLM compatibility; usage always carries prompt_tokens_details.cached_tokens")
	fs.BoolVar(&o.cacheReport, "enable-cache-report", false, "--engine sglang: SGLang's flag: usage carries prompt_tokens_details.cached_tokens when the prompt hit the cache")
	fs.BoolVar(&o.responsesStore, "enable-responses-store", storeOn != 0, "vLLM's VLLM_ENABLE_RESPONSES_API_STORE (taken from it when set): keep Responses API responses in this process's memory so previous_response_id finds them; off, store=true is silently ignored")
	fs.BoolVar(&o.forceIncludeUsage, "enable-force-include-usage", false, "vLLM's: every stream carries usage (in each chunk and a last chunk of its own), whatever stream_options says")
	return fs
}

// parse turns command-line arguments into one server config per replica.
func parse(args []string, out io.Writer) ([]server.Config, error) {
	var o options
	fs := newFlagSet(&o, out)
	if err := cli.Parse(fs, args); err != nil {
		return nil, err
	}
	if !o.enablePrefixCaching {
		return nil, errors.New("--enable-prefix-caching=false: the simulator always caches prefixes")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	prof, err := timing.ByName(o.profile)
	if err != nil {
		return nil, err
	}
	for _, ov := range []struct {
		v   int
		dst *int
	}{{o.blockSize, &prof.BlockSize}, {o.maxNumSeqs, &prof.MaxNumSeqs}, {o.maxBatchedTokens, &prof.MaxNumBatchedTokens}, {o.maxLen, &prof.MaxModelLen}} {
		if ov.v < 0 {
			return nil, fmt.Errorf("engine limits must be >= 0, got %d", ov.v)
		}
		if ov.v > 0 {
			*ov.dst = ov.v
		}
	}
	if err := prof.Validate(); err != nil {
		return nil, err
	}
	if o.timeScale <= 0 {
		return nil, fmt.Errorf("--time-scale %v must be positive", o.timeScale)
	}
	if o.replicas < 1 {
		return nil, fmt.Errorf("--replicas %d must be >= 1", o.replicas)
	}
	ver, err := version.Parse(o.vllmVersion)
	if err != nil {
		return nil, fmt.Errorf("--vllm-version: %w", err)
	}
	var enc kvevents.Encoding
	switch {
	case o.encoding != "":
		enc, err = kvevents.ParseEncoding(o.encoding)
	case o.engine == replica.EngineSGLang:
		enc = kvevents.SGLang
	default:
		enc, err = ver.EventEncoding()
	}
	if err != nil {
		return nil, err
	}
	if o.engine != replica.EngineVLLM && o.engine != replica.EngineSGLang {
		return nil, fmt.Errorf("--engine %q: want vllm or sglang", o.engine)
	}
	sgv, err := version.ParseSGLang(o.sglangVersion)
	if err != nil {
		return nil, fmt.Errorf("--sglang-version: %w", err)
	}
	var radixOpt *radix.Options
	if o.engine == replica.EngineSGLang {
		if o.sglangPageSize <= 0 {
			return nil, fmt.Errorf("--sglang-page-size %d must be positive", o.sglangPageSize)
		}
		if o.blockSize > 0 && o.blockSize != o.sglangPageSize {
			return nil, fmt.Errorf("--block-size %d: SGLang caches pages of --sglang-page-size %d tokens", o.blockSize, o.sglangPageSize)
		}
		prof.BlockSize = o.sglangPageSize // SGLang's radix cache holds pages, not vLLM blocks
		ro := sgv.Radix(o.sglangPageSize)
		radixOpt = &ro
	}
	if o.cpuOffloadTokens < 0 || o.cpuLoadUsPerToken < 0 || math.IsNaN(o.cpuLoadUsPerToken) {
		return nil, fmt.Errorf("--cpu-offload-tokens %d and --cpu-load-us-per-token %v must be >= 0", o.cpuOffloadTokens, o.cpuLoadUsPerToken)
	}
	if o.cpuOffloadTokens > 0 && o.engine != replica.EngineVLLM {
		return nil, errors.New("--cpu-offload-tokens imitates vLLM's OffloadingConnector: --engine vllm only")
	}
	if o.cpuOffloadTokens > 0 && enc == kvevents.ArrayV09 {
		// vLLM 0.9's events have no medium: CPU removals would read as GPU ones. The
		// connector arrived in 0.11.0 anyway.
		return nil, errors.New("--cpu-offload-tokens needs events with a medium (vLLM >= 0.10 layouts)")
	}
	legacyReplay := ver.LegacyReplay()
	if o.engine == replica.EngineSGLang {
		legacyReplay = true // SGLang's ZmqEventPublisher replays [seq, payload] (kv_events.py @612d5790)
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "kv-events-legacy-replay" {
			legacyReplay = o.legacyReplay
		}
	})
	parseEvents := publisher.ParseConfig
	if o.engine == replica.EngineSGLang {
		parseEvents = publisher.ParseSGLangConfig // SGLang's KVEventsConfig, not vLLM's
	}
	ev, unknown, err := parseEvents(o.kvEventsConfig)
	if err != nil {
		return nil, err
	}
	if len(unknown) > 0 {
		log.Warn("kv-events-config: ignoring unknown fields", "fields", unknown)
	}
	if _, err := cache.NewHasher(o.hashAlgo, o.hashSeed, prof.BlockSize); err != nil {
		return nil, err
	}
	name := o.model
	if o.servedName != "" {
		name = o.servedName
	}

	var cfgs []server.Config
	for i := range o.replicas {
		rev := ev
		if rev.Endpoint, err = offsetReplica(ev.Endpoint, i); err != nil {
			return nil, err
		}
		if rev.ReplayEndpoint, err = offsetReplica(ev.ReplayEndpoint, i); err != nil {
			return nil, err
		}
		port := o.port
		if port != 0 {
			port += i
		}
		cfgs = append(cfgs, server.Config{
			Host: o.host, Port: port, ModelName: name, LoRAModules: o.loras,
			DefaultMaxTokens: o.defaultMaxTokens, VocabSize: o.vocabSize, EnableAdmin: o.enableAdmin, Version: ver,
			ForceIncludeUsage: o.forceIncludeUsage, SGLangCacheReport: o.cacheReport, ResponsesStore: o.responsesStore,
			Logger: log.With("replica", i),
			Replica: replica.Config{
				Engine: sched.Config{Profile: prof, NumGPUBlocks: o.numGPUBlocks, HashAlgo: o.hashAlgo, HashSeed: o.hashSeed,
					CPUTierTokens: o.cpuOffloadTokens, CPULoadPerToken: time.Duration(o.cpuLoadUsPerToken * float64(time.Microsecond)),
					Radix: radixOpt},
				TimeScale:     o.timeScale,
				Events:        rev,
				EventsOptions: publisher.Options{Encoding: enc, DataParallelRank: o.dpRank, LegacyReplay: legacyReplay, BindHost: o.host},
				Kind:          o.engine,
				SGLang:        sgv,
			},
		})
	}
	if err := portsApart(cfgs); err != nil {
		return nil, err
	}
	return cfgs, nil
}

// portsApart refuses replicas that would bind the same port: replica i adds i to every
// port, so vLLM's usual 5557 and 5558 collide from --replicas 2 on ("address already in
// use" from the second replica, after the first started).
func portsApart(cfgs []server.Config) error {
	taken := map[string]string{} // host:port -> what binds it
	for i, c := range cfgs {
		for _, b := range []struct{ what, ep string }{
			{"HTTP port", fmt.Sprintf("tcp://%s:%d", c.Host, c.Port)},
			{"KV events endpoint", c.Replica.Events.Endpoint},
			{"replay endpoint", c.Replica.Events.ReplayEndpoint},
		} {
			if !strings.HasPrefix(b.ep, "tcp://") || strings.HasSuffix(b.ep, ":0") || (b.what != "HTTP port" && !publisher.ShouldBind(b.ep)) {
				continue // none, any free port, or connected rather than bound
			}
			port := b.ep[strings.LastIndexByte(b.ep, ':')+1:]
			what := fmt.Sprintf("replica %d's %s", i, b.what)
			if other, dup := taken[port]; dup {
				return fmt.Errorf("--replicas %d: %s (port %s) is %s: replica i adds i to every port, so keep the ports at least %d apart (e.g. \"replay_endpoint\":\"tcp://*:5567\")",
					len(cfgs), what, port, other, len(cfgs))
			}
			taken[port] = what
		}
	}
	return nil
}

// offsetReplica moves replica i's tcp endpoint i ports up (port 0 stays 0: any port).
func offsetReplica(ep string, i int) (string, error) {
	if i == 0 || ep == "" || strings.HasSuffix(ep, ":0") {
		return ep, nil
	}
	if !strings.HasPrefix(ep, "tcp://") {
		return "", fmt.Errorf("--replicas %d needs tcp:// KV event endpoints, got %q", i+1, ep)
	}
	j := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[j+1:])
	if err != nil {
		return "", fmt.Errorf("endpoint %q: bad port", ep)
	}
	return ep[:j+1] + strconv.Itoa(port+i), nil
}

// run starts every replica and serves until ctx ends.
func run(ctx context.Context, cfgs []server.Config) error {
	var servers []*server.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for i, c := range cfgs {
		s, err := server.Start(c)
		if err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		servers = append(servers, s)
		c.Logger.Info("replica ready", "http", s.URL(), "kv_events", s.EventsEndpoint(), "kv_replay", s.ReplayEndpoint())
	}
	<-ctx.Done()
	return nil
}

func main() { os.Exit(cli.Exit(command, realMain(os.Args[1:]), os.Stderr)) }

func realMain(args []string) error {
	cfgs, err := parse(args, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil { // every error of parse is about the command line
		return &cli.UsageError{Err: err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, cfgs)
}
