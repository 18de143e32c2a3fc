package host

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// Config describes one Envoy-like host: the plugin's configuration and what surrounds it.
type Config struct {
	// VMs is the number of worker VMs (Envoy: one per worker thread). Default runtime.NumCPU().
	VMs int
	// PluginConfig is the buffer proxy_on_configure reads (Istio: pluginConfig as JSON).
	PluginConfig []byte
	// VMConfig is the buffer proxy_on_vm_start reads (vm_config.configuration).
	VMConfig []byte
	// PluginName, RootID and VMID are the plugin_name, plugin_root_id and plugin_vm_id
	// properties. VMID is also the namespace of shared data and queues (Istio sets none).
	PluginName, RootID, VMID string
	// Node is what the node.* properties return.
	Node Node
	// Properties holds further read-only properties by dotted path, e.g. "cluster_name".
	Properties map[string]string
	// Clusters maps DispatchHttpCall upstream names to targets; SetCluster changes it later.
	Clusters map[string]Cluster
	// Clock drives ticks, HTTP-call timeouts and the guest's clock. Default clock.Wall().
	Clock clock.Clock
	// Logger receives the plugin's log lines and the host's own events. Default: discard.
	// The last lines are also kept in memory (Host.Logs) whatever the logger.
	Logger *slog.Logger
	// Env is the guest's WASI environment (Istio vmConfig.env), e.g. GOMEMLIMIT.
	Env map[string]string
	// CountCalls names guest functions (as the module's name section has them, e.g.
	// "runtime.gcMarkTermination", once per Go GC cycle) whose calls Host.Calls counts.
	CountCalls []string
	// TimeCalls names guest functions (or name prefixes ending in "*"), as Go spells them
	// ("main.(*plugin).enqueue") or as the name section has them, whose calls and
	// inclusive wall time Host.CallTimes reports: a profile of the guest for chosen
	// functions. Each timed call costs two clock reads; time few, or top-level, functions.
	TimeCalls []string
	// CPUTime makes the callback durations (Stream.FilterTime, VM.TickDurations) the CPU
	// time of the thread that ran the callback (Linux; wall time elsewhere) instead of
	// wall time: on a machine shared with other work, wall time also counts the time the
	// OS ran something else in the middle of a callback.
	CPUTime bool
	// CallSites names guest functions (as CountCalls does) whose callers Host.CallSites
	// counts: for "runtime.mallocgc", where the guest allocates. Each call walks the
	// guest's stack; count few, and only to find where calls come from.
	CallSites []string
	// TimeHostCalls times every call of a host function (proxy-wasm's and WASI's) in the
	// host's wall clock, Host.HostCallTimes: how much of a callback's time is this host's
	// implementation rather than the guest's code. A call's time includes any call the
	// host makes back into the guest inside it (proxy_on_memory_allocate, which the
	// host functions that return bytes call to get guest memory for them).
	TimeHostCalls bool
	// Profile is the proxy-wasm-cpp-host behaviour to reproduce. Default: the strictest,
	// CppHostC4d7bb0 (the oldest Envoy the manifests support).
	Profile *Profile
	// Rand returns the random source of VM i (WASI random_get). Default crypto/rand.
	Rand func(vm int) io.Reader
	// Interpreter forces wazero's interpreter even where its compiler is available.
	Interpreter bool
	// DisallowHeadersStopIteration emulates Envoy without allow_on_headers_stop_iteration
	// (the default before 1.35): ActionPause from a headers callback stops all iteration and
	// the filter sees no body until it resumes the stream.
	DisallowHeadersStopIteration bool
}

// Node is the Envoy node identity exposed as node.id, node.cluster and node.metadata.KEY.
type Node struct {
	ID, Cluster string
	Metadata    map[string]string
}

// Cluster is where DispatchHttpCall requests to one upstream name go.
type Cluster struct {
	// URL is a base URL ("http://127.0.0.1:8080"); the call's :path is appended.
	URL string
	// Handler serves the call in process when URL is empty (simulations).
	Handler http.Handler
	// Latency delays the response under a virtual clock (the wall clock has real latency).
	Latency time.Duration
}

// Host is a set of worker VMs running one plugin, with the state Envoy shares between them.
type Host struct {
	cfg      Config
	profile  *Profile
	env      []string // "KEY=value", sorted
	clock    clock.Clock
	start    time.Time // origin of the guest's monotonic clock
	runtime  wazero.Runtime
	vms      []*VM
	next     atomic.Uint64
	store    *store
	metrics  *metrics
	logs     *logBook
	client   *http.Client
	ctx      context.Context // cancelled by Close: in-flight HTTP calls stop
	cancel   context.CancelFunc
	clusters sync.Map // name -> Cluster
	closed   atomic.Bool
	stats    hostStats
	calls    map[string]*atomic.Int64 // Config.CountCalls
	timedMu  sync.Mutex
	timed    map[string]*callTime // Config.TimeCalls, by function name
	sitesMu  sync.Mutex
	sites    map[string]map[string]int64 // Config.CallSites: function, then call site
	// hostCalls counts the guest's calls of each host function (proxy-wasm and WASI), by
	// qualified name ("env.proxy_get_shared_data"); fixed once the host functions exist.
	hostCalls map[string]*atomic.Int64
	// hostTimes is the time in each host function (Config.TimeHostCalls), by qualified name.
	hostTimes map[string]*callTime
}

type hostStats struct {
	failOpenStreams atomic.Int64
	vmFailures      atomic.Int64
	httpCalls       atomic.Int64
	callbacks       atomic.Int64
}

// Stats counts host events.
type Stats struct {
	VMs             int
	FailedVMs       int
	VMFailures      int64 // VMs that trapped (each VM fails at most once)
	FailOpenStreams int64 // streams that bypassed the filter because their VM had failed
	HTTPCalls       int64 // proxy_http_call accepted
	Callbacks       int64 // guest callbacks run
}

// compileCache is shared by every host in the process, so tests that start many hosts
// from the same module compile it once.
var compileCache = wazero.NewCompilationCache()

// Load reads a module from disk and starts a host with it.
func Load(ctx context.Context, path string, cfg Config) (*Host, error) {
	wasm, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load plugin: %w", err)
	}
	return New(ctx, wasm, cfg)
}

// New compiles the module once, starts cfg.VMs worker VMs and runs, on each, what Envoy
// runs when it loads a plugin: _initialize, proxy_on_vm_start, proxy_on_context_create for
// the root context and proxy_on_configure. An import the host does not provide, a missing
// ABI version export, a trap or a false return fails New.
func New(ctx context.Context, wasm []byte, cfg Config) (*Host, error) {
	if cfg.VMs <= 0 {
		cfg.VMs = runtime.NumCPU()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Wall()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rand == nil {
		cfg.Rand = func(int) io.Reader { return rand.Reader }
	}
	if cfg.Profile == nil {
		cfg.Profile = CppHostC4d7bb0
	}
	h := &Host{
		cfg:     cfg,
		profile: cfg.Profile,
		env:     environ(cfg.Env),
		clock:   cfg.Clock,
		start:   cfg.Clock.Now(),
		store:   newStore(),
		metrics: newMetrics(),
		logs:    newLogBook(cfg.Logger),
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	for name, c := range cfg.Clusters {
		h.clusters.Store(name, c)
	}

	rcfg := wazero.NewRuntimeConfig()
	if cfg.Interpreter {
		rcfg = wazero.NewRuntimeConfigInterpreter()
	}
	h.runtime = wazero.NewRuntimeWithConfig(ctx, rcfg.WithCompilationCache(compileCache))
	fail := func(err error) (*Host, error) {
		h.cancel()
		_ = h.runtime.Close(ctx)
		return nil, err
	}
	wasi, err := h.instantiateWASI(ctx)
	if err != nil {
		return fail(fmt.Errorf("instantiate WASI: %w", err))
	}
	env, err := h.instantiateABI(ctx)
	if err != nil {
		return fail(fmt.Errorf("instantiate proxy-wasm ABI: %w", err))
	}
	compiled, err := h.runtime.CompileModule(h.withCallCounters(ctx), wasm)
	if err != nil {
		return fail(fmt.Errorf("compile plugin: %w", err))
	}
	if err := checkImports(compiled, map[string]api.Module{
		abiModule: env, wasiModule: wasi[0], wasiUnstableModule: wasi[1]}); err != nil {
		return fail(fmt.Errorf("%w (host profile %s)", err, h.profile))
	}
	if err := checkABIVersion(compiled); err != nil {
		return fail(err)
	}

	// Instantiation (the Go runtime's _initialize) is independent per VM: do it in
	// parallel. The plugin lifecycle runs in VM order so shared-data races at start-up are
	// reproducible.
	h.vms = make([]*VM, cfg.VMs)
	errs := make([]error, cfg.VMs)
	var wg sync.WaitGroup
	for i := range h.vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.vms[i], errs[i] = h.newVM(ctx, compiled, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	for _, vm := range h.vms {
		if err := vm.start(); err != nil {
			h.Close(ctx)
			return nil, err
		}
	}
	return h, nil
}

// environ renders the guest environment as cpp-host's environ_get does: KEY=value, in a
// stable order.
func environ(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (h *Host) environ() []string { return h.env }

// Profile returns the cpp-host behaviour the host reproduces.
func (h *Host) Profile() *Profile { return h.profile }

// checkImports lists every function the module imports that no host module exports, so a
// module built against a newer SDK fails here, at load, like Envoy's "missing import".
func checkImports(compiled wazero.CompiledModule, provided map[string]api.Module) error {
	var missing []string
	for _, f := range compiled.ImportedFunctions() {
		module, name, _ := f.Import()
		m, ok := provided[module]
		if ok {
			if _, ok = m.ExportedFunctionDefinitions()[name]; ok {
				continue
			}
		}
		missing = append(missing, module+"."+name)
	}
	for _, m := range compiled.ImportedMemories() {
		module, name, _ := m.Import()
		missing = append(missing, module+"."+name+" (memory)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("plugin imports what this host does not provide: %s", strings.Join(missing, ", "))
	}
	return nil
}

// checkABIVersion requires one of the ABI version exports cpp-host accepts.
func checkABIVersion(compiled wazero.CompiledModule) error {
	exports := compiled.ExportedFunctions()
	for _, v := range []string{"proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0", "proxy_abi_version_0_1_0"} {
		if _, ok := exports[v]; ok {
			return nil
		}
	}
	return errors.New("plugin: missing or unknown Proxy-Wasm ABI version (no proxy_abi_version_0_x_y export)")
}

// Close stops ticks and HTTP calls, runs proxy_on_done and proxy_on_delete on the root
// contexts of the VMs that are still alive, and frees the runtime.
func (h *Host) Close(ctx context.Context) error {
	if h.closed.Swap(true) {
		return nil
	}
	h.cancel()
	for _, vm := range h.vms {
		if vm != nil {
			vm.stop()
		}
	}
	return h.runtime.Close(ctx)
}

// VMs returns the worker VMs in order.
func (h *Host) VMs() []*VM { return h.vms }

// VM returns worker VM i.
func (h *Host) VM(i int) *VM { return h.vms[i] }

// NextVM picks VMs round robin, as Envoy's listener spreads connections over workers.
func (h *Host) NextVM() *VM {
	return h.vms[(h.next.Add(1)-1)%uint64(len(h.vms))]
}

// NewStream opens an HTTP stream on the next VM (round robin).
func (h *Host) NewStream(info StreamInfo, hooks StreamHooks) *Stream {
	return h.NextVM().NewStream(info, hooks)
}

// Clock returns the host's clock.
func (h *Host) Clock() clock.Clock { return h.clock }

// SetCluster maps (or remaps) a DispatchHttpCall upstream name.
func (h *Host) SetCluster(name string, c Cluster) { h.clusters.Store(name, c) }

func (h *Host) cluster(name string) (Cluster, bool) {
	c, ok := h.clusters.Load(name)
	if !ok {
		return Cluster{}, false
	}
	return c.(Cluster), true
}

// SharedData reads a shared-data key as the plugin would.
func (h *Host) SharedData(key string) (value []byte, cas uint32, ok bool) {
	return h.store.get(key)
}

// SetSharedData writes a shared-data key with the plugin's CAS rules (cas 0: always).
func (h *Host) SetSharedData(key string, value []byte, cas uint32) error {
	if st := h.store.set(key, value, cas); st != statusOK {
		return fmt.Errorf("set shared data %q: %s", key, st)
	}
	return nil
}

// SharedDataKeys lists the shared-data keys, sorted (the ABI itself cannot list them).
func (h *Host) SharedDataKeys() []string { return h.store.keys() }

// QueueLen returns the number of items waiting in a shared queue, -1 if not registered.
func (h *Host) QueueLen(name string) int { return h.store.queueLen(name) }

// Metric returns the current value of a plugin metric by name.
func (h *Host) Metric(name string) (MetricValue, bool) { return h.metrics.get(name) }

// Metrics returns every plugin metric, sorted by name.
func (h *Host) Metrics() []MetricValue { return h.metrics.all() }

// Logs returns the most recent log lines (plugin logs, guest stdout/stderr, host events).
func (h *Host) Logs() []LogEntry { return h.logs.entries() }

// Stats returns host counters.
func (h *Host) Stats() Stats {
	s := Stats{
		VMs:             len(h.vms),
		VMFailures:      h.stats.vmFailures.Load(),
		FailOpenStreams: h.stats.failOpenStreams.Load(),
		HTTPCalls:       h.stats.httpCalls.Load(),
		Callbacks:       h.stats.callbacks.Load(),
	}
	for _, vm := range h.vms {
		if vm.Failed() != nil {
			s.FailedVMs++
		}
	}
	return s
}

// Properties lists the property paths this host answers (see package documentation).
func Properties() []string {
	out := append([]string(nil), supportedProperties...)
	sort.Strings(out)
	return out
}

// SeededRand gives each VM its own deterministic random stream for WASI random_get, so a
// virtual-clock run repeats exactly (the plugin's random ids, the Go runtime's hash seeds).
func SeededRand(seed uint64) func(vm int) io.Reader {
	return func(vm int) io.Reader {
		var key [32]byte
		binary.LittleEndian.PutUint64(key[:], seed)
		binary.LittleEndian.PutUint64(key[8:], uint64(vm))
		return mathrand.NewChaCha8(key)
	}
}
