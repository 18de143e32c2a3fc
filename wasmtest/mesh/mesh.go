// Package mesh runs the whole of kvroute on one machine, on loopback: simulated vLLM
// replicas (KV events and metrics on), the control plane watching them, and the proxy
// running the real kvroute.wasm in front of them, as Envoy would in a sidecar. It is what
// `make run` starts and what the end-to-end tests drive. With Options.Engines the control
// plane and the proxy go in front of engines that already run (vLLM, SGLang or
// kvroute-enginesim) instead of simulated ones.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/proxy"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// Cluster is the control plane's Envoy cluster name in the filter's configuration, as
// Istio would name it.
const Cluster = "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local"

// Options configure a mesh; zero values take the defaults noted.
type Options struct {
	Replicas int    // simulated vLLM replicas (4), per model with Models
	Model    string // served model name ("llama")
	// Models, when set, shards the mesh by model: Replicas simulated engines
	// for each model, one control plane per model that watches only that model's
	// engines, and the filter configured with one shard per model (api.Shard, named
	// after the model, on the cluster ShardCluster(model)). Model is then unused.
	Models  []string
	Profile string // engine timing profile: seed000 or fast ("seed000")
	// Engines, when set, are engines already running that the control plane watches and
	// the proxy forwards to, in place of simulated replicas (Replicas, Profile,
	// TimeScale, KVBlocks and MaxNumSeqs are then unused). An engine without a model
	// serves Model; one without an id is named engine-<i>.
	Engines []discovery.Engine
	// TimeScale is wall seconds per simulated second of the engines (1: real time).
	TimeScale float64
	// KVBlocks is each replica's KV pool in 16-token blocks (0 or less: the profile's). The
	// default mesh uses 1,250 (20,000 tokens): a set of shared prefixes then fits the
	// fleet but not one replica, which is docs/rule.md's situation scaled down.
	KVBlocks int
	// MaxNumSeqs caps running sequences per replica (0: the profile's).
	MaxNumSeqs int
	// SGLangReplicas of each model's Replicas are SGLang stand-ins instead of vLLM ones
	// (the last ones: --engine sglang at SGLang main, page size 1, the same KV pool in
	// tokens): SGLang's metric names, KV-event layout, hashes and radix-tree events,
	// which the control plane reads with its SGLang names and bookkeeping.
	SGLangReplicas int
	// NoForcedUsage starts the simulated engines without vLLM's
	// --enable-force-include-usage (which the manifests and `make run` set): their
	// streams then carry usage only when the request asks (stream_options.include_usage).
	NoForcedUsage bool
	// ProxyAddr is where clients connect ("127.0.0.1:10000"; ":0" style picks a port).
	ProxyAddr string
	// ControlPlaneAddr is the control plane's HTTP address ("127.0.0.1:0").
	ControlPlaneAddr string
	// ControlPlaneReplicas runs that many replicas of the control plane of an unsharded
	// mesh (1), each watching every engine on a port of its own and reached on a cluster
	// of its own (ReplicaCluster); the filter lists the others as control_plane.failover.
	ControlPlaneReplicas int
	// ControlPlaneWarmUp is each control plane's Options.WarmUp (0: 5 s, the command's
	// default; negative: off).
	ControlPlaneWarmUp time.Duration
	// ControlPlaneTakeoverAfter is each replica's Options.TakeoverAfter (0: 3 s with
	// ControlPlaneReplicas, else off; negative: off).
	ControlPlaneTakeoverAfter time.Duration
	// VMs is the number of proxy worker VMs (2).
	VMs int
	// Namespace is the proxy's Kubernetes namespace in its node metadata (NAMESPACE, as
	// Istio's sidecars carry it): the tenant with tenants.source "workload".
	Namespace string
	// WasmPath is the filter module (default: built from this checkout's filter/).
	WasmPath string
	// Filter is the plugin configuration; Cluster and an authority are filled in (with
	// Models: the shards, each with a copy of Filter.ControlPlane's settings).
	Filter api.Config
	// PublishInterval and ScrapeInterval of the control plane (50 ms, 50 ms).
	PublishInterval, ScrapeInterval int
	Logger                          *slog.Logger
	// OnListen, if set, runs once the proxy's and the control plane's ports are held,
	// before anything else starts (a command prints its progress there).
	OnListen func()
}

// PortInUseError is a listening address that another process holds.
type PortInUseError struct {
	Part string // "proxy" or "control plane"
	Addr string
	Err  error
}

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("%s address %s is already in use", e.Part, e.Addr)
}

func (e *PortInUseError) Unwrap() error { return e.Err }

// listen holds addr for part, naming the part when the port is taken.
func listen(part, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, &PortInUseError{Part: part, Addr: addr, Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", part, addr, err)
	}
	return ln, nil
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Replicas, 4)
	def(&o.VMs, 2)
	def(&o.PublishInterval, 50)
	def(&o.ScrapeInterval, 50)
	if o.Model == "" {
		o.Model = "llama"
	}
	o.Engines = slices.Clone(o.Engines)
	for i := range o.Engines {
		if o.Engines[i].Model == "" {
			o.Engines[i].Model = o.Model
		}
		if o.Engines[i].ID == "" {
			o.Engines[i].ID = fmt.Sprintf("engine-%d", i)
		}
	}
	if o.Profile == "" {
		o.Profile = "seed000"
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.ProxyAddr == "" {
		o.ProxyAddr = "127.0.0.1:10000"
	}
	if o.ControlPlaneAddr == "" {
		o.ControlPlaneAddr = "127.0.0.1:0"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	def(&o.ControlPlaneReplicas, 1)
	if o.ControlPlaneWarmUp == 0 {
		o.ControlPlaneWarmUp = 5 * time.Second
	}
	if o.ControlPlaneTakeoverAfter == 0 && o.ControlPlaneReplicas > 1 {
		o.ControlPlaneTakeoverAfter = 3 * time.Second
	}
	if len(o.Models) > 0 {
		o.Engines = nil // sharded meshes simulate their engines
		cp := o.Filter.ControlPlane
		o.Filter.ControlPlane, o.Filter.Shards = api.ControlPlane{}, nil
		for _, model := range o.Models {
			cp.Cluster, cp.Authority = ShardCluster(model), ShardAuthority(model)
			o.Filter.Shards = append(o.Filter.Shards, api.Shard{Name: model, Models: []string{model}, ControlPlane: cp})
		}
		return
	}
	o.Filter.ControlPlane.Cluster = Cluster
	if o.Filter.ControlPlane.Authority == "" {
		o.Filter.ControlPlane.Authority = "kvroute-controlplane.kvroute-system.svc.cluster.local"
	}
	o.Filter.ControlPlane.Failover = nil
	for i := 1; i < o.ControlPlaneReplicas; i++ {
		o.Filter.ControlPlane.Failover = append(o.Filter.ControlPlane.Failover,
			api.Endpoint{Cluster: ReplicaCluster(i), Authority: ReplicaAuthority(i)})
	}
}

// ReplicaAuthority and ReplicaCluster name control-plane replica i of an unsharded mesh
// (0 is Cluster), as a Service per replica would be named in Istio.
func ReplicaAuthority(i int) string {
	if i == 0 {
		return "kvroute-controlplane.kvroute-system.svc.cluster.local"
	}
	return fmt.Sprintf("kvroute-controlplane-%d.kvroute-system.svc.cluster.local", i)
}

func ReplicaCluster(i int) string {
	if i == 0 {
		return Cluster
	}
	return "outbound|8080||" + ReplicaAuthority(i)
}

// Mesh is a running local mesh.
type Mesh struct {
	opts    Options
	Engines []*server.Server
	Host    *host.Host
	Proxy   *proxy.Server
	// Reports sees every report batch on its way to the control plane (to every shard's).
	Reports *ReportTap

	cps []*cpShard // one control plane; with Options.Models, one per model
}

// Start brings the mesh up: engines, control plane, filter host and proxy. The proxy's
// and the control plane's ports are taken first, so a busy port (a *PortInUseError) fails
// before any engine starts; on any error everything started so far is stopped.
func Start(ctx context.Context, o Options) (*Mesh, error) {
	o.defaults()
	prof, err := timing.ByName(o.Profile)
	if err != nil {
		return nil, err
	}
	if o.SGLangReplicas < 0 || o.SGLangReplicas > o.Replicas {
		return nil, fmt.Errorf("SGLangReplicas %d: want 0 to Replicas (%d)", o.SGLangReplicas, o.Replicas)
	}
	if o.ControlPlaneReplicas > 1 && len(o.Models) > 0 {
		return nil, errors.New("ControlPlaneReplicas: replicas of a sharded mesh's control planes are not simulated")
	}
	proxyLn, err := listen("proxy", o.ProxyAddr)
	if err != nil {
		return nil, err
	}
	// Each control plane gets a fixed port, so it can be stopped and started again at the
	// same address (the fault tests do). Its listener is held from here to its first
	// start and handed to it: released in between, the port was taken by one of the
	// engines' own listeners on port 0, or by another process's connection
	// (TestReplicaKilled failed so in a CI run: "control plane address ... is already in
	// use"). A restart binds the address again.
	m := &Mesh{opts: o}
	shards := slices.Repeat([]string{""}, o.ControlPlaneReplicas)
	if len(o.Models) > 0 {
		shards = o.Models
	}
	for i, model := range shards {
		addr := o.ControlPlaneAddr
		if i > 0 {
			addr = "127.0.0.1:0"
		}
		cpLn, err := listen("control plane", addr)
		if err != nil {
			proxyLn.Close()
			m.Close() // the listeners held for the shards before
			return nil, err
		}
		s := &cpShard{model: model, cluster: ReplicaCluster(i), addr: cpLn.Addr().String(), ln: cpLn}
		if model != "" {
			s.cluster = ShardCluster(model)
		}
		m.cps = append(m.cps, s)
	}
	if o.OnListen != nil {
		o.OnListen()
	}
	if err := m.start(ctx, prof, proxyLn); err != nil {
		proxyLn.Close() // a no-op once the proxy owns it
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Mesh) start(ctx context.Context, prof timing.Profile, proxyLn net.Listener) error {
	o := m.opts
	if o.MaxNumSeqs > 0 {
		prof.MaxNumSeqs = o.MaxNumSeqs
	}
	for i := 0; i < o.Replicas*max(1, len(o.Models)) && len(o.Engines) == 0; i++ {
		rc := replica.Config{
			Engine:    sched.Config{Profile: prof, NumGPUBlocks: max(o.KVBlocks, 0)},
			TimeScale: o.TimeScale,
			// "*" makes vLLM (and the simulator) bind rather than connect; the
			// bind host keeps it on loopback, port 0 picks a free port.
			Events: publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq",
				Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0",
				BufferSteps: publisher.DefaultBufferSteps, HWM: publisher.DefaultHWM, MaxQueueSize: publisher.DefaultQueueSize},
			EventsOptions: publisher.Options{Encoding: kvevents.Map, BindHost: "127.0.0.1"},
		}
		if m.isSGLang(i) {
			sglangReplica(&rc, o.KVBlocks*prof.BlockSize)
		}
		s, err := server.Start(server.Config{
			Host: "127.0.0.1", ModelName: m.engineModel(i), EnableAdmin: true, DefaultMaxTokens: 16,
			ForceIncludeUsage: !o.NoForcedUsage, SGLangCacheReport: true, // SGLang's --enable-cache-report
			ResponsesStore: true, // VLLM_ENABLE_RESPONSES_API_STORE=1, as a Responses API user runs vLLM
			Logger:         o.Logger.With("replica", i),
			Replica:        rc,
		})
		if err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
		m.Engines = append(m.Engines, s)
	}
	totals := &tapTotals{}
	clusters := map[string]host.Cluster{}
	for _, s := range m.cps {
		s.tap = newReportTap(s.addr, totals)
		s.tap.gated = o.ControlPlaneReplicas > 1
		clusters[s.cluster] = host.Cluster{Handler: s.tap}
		if err := m.startControlPlane(s); err != nil { // on the listener held since Start
			return err
		}
	}
	m.Reports = m.cps[0].tap
	cfg, err := json.Marshal(o.Filter)
	if err != nil {
		return err
	}
	if _, err := api.ParseConfig(cfg); err != nil {
		return fmt.Errorf("filter configuration: %w", err)
	}
	wasm := o.WasmPath
	if wasm == "" {
		if wasm, err = wasmbuild.Filter(); err != nil {
			return err
		}
	}
	h, err := host.Load(ctx, wasm, host.Config{
		VMs: o.VMs, PluginConfig: cfg, PluginName: "kvroute", Node: m.node(),
		Clusters: clusters,
		Logger:   o.Logger.With("part", "filter"),
	})
	if err != nil {
		return fmt.Errorf("load %s: %w", wasm, err)
	}
	m.Host = h
	var addrs []string
	for _, e := range m.EngineList() {
		addrs = append(addrs, e.Addr)
	}
	p, err := proxy.Serve(proxyLn, proxy.Config{Host: m.Host, Endpoints: addrs})
	if err != nil {
		return fmt.Errorf("proxy on %s: %w", o.ProxyAddr, err)
	}
	m.Proxy = p
	return nil
}

// engineModel is the model simulated engine i serves: with Models, Replicas engines
// for each model in turn.
func (m *Mesh) engineModel(i int) string {
	if len(m.opts.Models) == 0 {
		return m.opts.Model
	}
	return m.opts.Models[i/m.opts.Replicas]
}

// isSGLang reports whether simulated engine i is an SGLang stand-in: the last
// SGLangReplicas of its model's replicas.
func (m *Mesh) isSGLang(i int) bool {
	return i%m.opts.Replicas >= m.opts.Replicas-m.opts.SGLangReplicas
}

// sglangReplica turns rc into SGLang main's stand-in (kvroute-enginesim --engine
// sglang): pages of one token, the pool kept at poolTokens (0: the profile's), its
// radix tree's events in SGLang's layout, replayed in SGLang's [seq, payload] shape.
func sglangReplica(rc *replica.Config, poolTokens int) {
	const pageSize = 1 // SGLang's default --page-size
	v := version.SGLang{}
	rc.Engine = v.Engine(rc.Engine.Profile, pageSize, poolTokens)
	rc.Kind, rc.SGLang = replica.EngineSGLang, v
	rc.EventsOptions.Encoding, rc.EventsOptions.LegacyReplay = kvevents.SGLang, true
}

// node is the proxy's Envoy node: its id, and Istio's NAMESPACE metadata when set.
func (m *Mesh) node() host.Node {
	n := host.Node{ID: "kvroute-mesh"}
	if m.opts.Namespace != "" {
		n.Metadata = map[string]string{"NAMESPACE": m.opts.Namespace}
	}
	return n
}

// EngineList is the control plane's static engine list: the engines given in Options, or
// every simulated replica with its KV-event and replay endpoints.
func (m *Mesh) EngineList() []discovery.Engine {
	if len(m.opts.Engines) > 0 {
		return m.opts.Engines
	}
	var es []discovery.Engine
	for i, s := range m.Engines {
		e := discovery.Engine{ID: fmt.Sprintf("vllm-%d", i), Model: m.engineModel(i), Addr: s.Addr(),
			KV: s.EventsEndpoint(), Replay: s.ReplayEndpoint()}
		if m.isSGLang(i) {
			e.ID, e.Kind = fmt.Sprintf("sglang-%d", i), replica.EngineSGLang
		}
		es = append(es, e)
	}
	return es
}

// ExternalEngines are the engines from Options.Engines (none: the mesh runs simulated
// replicas, Engines).
func (m *Mesh) ExternalEngines() []discovery.Engine { return slices.Clone(m.opts.Engines) }

// Ready waits until the filter routes to every engine: each control plane has scraped
// each of its engines, the filter's leader has loaded a table of it at least that new,
// and every proxy VM has read shared data since. Before that the filter leaves requests
// to the proxy's fallback. It returns false if ctx ends first.
func (m *Mesh) Ready(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	versions := make([]int64, len(m.cps))
	for i := range versions {
		versions[i] = -1
	}
	var ticks []uint64
	for {
		loaded := true
		for i, s := range m.cps {
			if i > 0 && s.model == "" {
				continue // another replica of the one control plane: the filter polls the first
			}
			if versions[i] < 0 {
				versions[i] = m.healthyVersion(ctx, s)
			}
			v, ok := m.Host.Metric(s.versionGauge())
			loaded = loaded && versions[i] >= 0 && ok && v.Value > 0 && v.Value >= versions[i]
		}
		switch {
		case !loaded && ticks == nil:
		case ticks == nil:
			for _, vm := range m.Host.VMs() {
				ticks = append(ticks, vm.Ticks())
			}
		default:
			done := true
			for i, vm := range m.Host.VMs() {
				done = done && vm.Ticks() > ticks[i]
			}
			if done {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// URL is the proxy's base URL, where clients send OpenAI requests.
func (m *Mesh) URL() string { return m.Proxy.URL }

// Close stops everything.
func (m *Mesh) Close() {
	if m.Proxy != nil {
		m.Proxy.Close()
	}
	if m.Host != nil {
		m.Host.Close(context.Background())
	}
	m.StopControlPlane()
	for _, s := range m.cps {
		s.release()
	}
	for _, s := range m.Engines {
		s.Close()
	}
}
