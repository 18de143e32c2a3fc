// Package mesh runs the whole of kvroute on one machine, on loopback: simulated vLLM
// replicas (KV events and metrics on), the control plane watching them, and the proxy
// running the real kvroute.wasm in front of them, as Envoy would in a sidecar. It is what
// `make run` starts and what the end-to-end tests drive. With Options.Engines the control
// plane and the proxy go in front of engines that already run (vLLM, SGLang or
// kvroute-enginesim) instead of simulated ones.
package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/controlplane"
	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/proxy"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// Cluster is the control plane's Envoy cluster name in the filter's configuration, as
// Istio would name it.
const Cluster = "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local"

// Options configure a mesh; zero values take the defaults noted.
type Options struct {
	Replicas int    // simulated vLLM replicas (4)
	Model    string // served model name ("llama")
	Profile  string // engine timing profile: seed000 or fast ("seed000")
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
	// ProxyAddr is where clients connect ("127.0.0.1:10000"; ":0" style picks a port).
	ProxyAddr string
	// ControlPlaneAddr is the control plane's HTTP address ("127.0.0.1:0").
	ControlPlaneAddr string
	// VMs is the number of proxy worker VMs (2).
	VMs int
	// WasmPath is the filter module (default: built from this checkout's filter/).
	WasmPath string
	// Filter is the plugin configuration; Cluster and an authority are filled in.
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
	o.Filter.ControlPlane.Cluster = Cluster
	if o.Filter.ControlPlane.Authority == "" {
		o.Filter.ControlPlane.Authority = "kvroute-controlplane.kvroute-system.svc.cluster.local"
	}
}

// Mesh is a running local mesh.
type Mesh struct {
	opts    Options
	Engines []*server.Server
	Host    *host.Host
	Proxy   *proxy.Server
	// Reports sees every report batch on its way to the control plane.
	Reports *ReportTap

	cpMu   sync.Mutex
	cp     *controlplane.ControlPlane
	cpStop context.CancelFunc
	cpAddr string
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
	proxyLn, err := listen("proxy", o.ProxyAddr)
	if err != nil {
		return nil, err
	}
	// The control plane gets a fixed port, so it can be stopped and started again at the
	// same address (the fault tests do): the port is checked here, then released for it.
	cpLn, err := listen("control plane", o.ControlPlaneAddr)
	if err != nil {
		proxyLn.Close()
		return nil, err
	}
	m := &Mesh{opts: o, cpAddr: cpLn.Addr().String()}
	cpLn.Close()
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
	for i := 0; i < o.Replicas && len(o.Engines) == 0; i++ {
		s, err := server.Start(server.Config{
			Host: "127.0.0.1", ModelName: o.Model, EnableAdmin: true, DefaultMaxTokens: 16,
			Logger: o.Logger.With("replica", i),
			Replica: replica.Config{
				Engine:    sched.Config{Profile: prof, NumGPUBlocks: max(o.KVBlocks, 0)},
				TimeScale: o.TimeScale,
				// "*" makes vLLM (and the simulator) bind rather than connect; the
				// bind host keeps it on loopback, port 0 picks a free port.
				Events: publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq",
					Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0",
					BufferSteps: publisher.DefaultBufferSteps, HWM: publisher.DefaultHWM, MaxQueueSize: publisher.DefaultQueueSize},
				EventsOptions: publisher.Options{Encoding: kvevents.Map, BindHost: "127.0.0.1"},
			},
		})
		if err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
		m.Engines = append(m.Engines, s)
	}
	if err := m.startControlPlane(m.engineList()); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) { // taken between the check and now
			return &PortInUseError{Part: "control plane", Addr: m.cpAddr, Err: err}
		}
		return err
	}

	m.Reports = newReportTap(m.cpAddr)
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
		VMs: o.VMs, PluginConfig: cfg, PluginName: "kvroute", Node: host.Node{ID: "kvroute-mesh"},
		Clusters: map[string]host.Cluster{Cluster: {Handler: m.Reports}},
		Logger:   o.Logger.With("part", "filter"),
	})
	if err != nil {
		return fmt.Errorf("load %s: %w", wasm, err)
	}
	m.Host = h
	var addrs []string
	for _, e := range m.engineList() {
		addrs = append(addrs, e.Addr)
	}
	p, err := proxy.Serve(proxyLn, proxy.Config{Host: m.Host, Endpoints: addrs})
	if err != nil {
		return fmt.Errorf("proxy on %s: %w", o.ProxyAddr, err)
	}
	m.Proxy = p
	return nil
}

// engineList is the control plane's static engine list: the engines given in Options, or
// every simulated replica with its KV-event and replay endpoints.
func (m *Mesh) engineList() []discovery.Engine {
	if len(m.opts.Engines) > 0 {
		return m.opts.Engines
	}
	var es []discovery.Engine
	for i, s := range m.Engines {
		es = append(es, discovery.Engine{ID: fmt.Sprintf("vllm-%d", i), Model: m.opts.Model, Addr: s.Addr(),
			KV: s.EventsEndpoint(), Replay: s.ReplayEndpoint()})
	}
	return es
}

func (m *Mesh) startControlPlane(engines []discovery.Engine) error {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	cp, err := controlplane.New(controlplane.Options{
		Listen: m.cpAddr, Engines: engines,
		PublishInterval: ms(m.opts.PublishInterval), ScrapeInterval: ms(m.opts.ScrapeInterval),
		Logger: m.opts.Logger.With("part", "controlplane"),
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cp.Start(ctx); err != nil {
		cancel()
		return err
	}
	m.cpMu.Lock()
	m.cp, m.cpStop = cp, cancel
	m.cpMu.Unlock()
	return nil
}

// ControlPlane returns the running control plane, or nil while it is stopped.
func (m *Mesh) ControlPlane() *controlplane.ControlPlane {
	m.cpMu.Lock()
	defer m.cpMu.Unlock()
	return m.cp
}

// ControlPlaneURL is the control plane's base URL.
func (m *Mesh) ControlPlaneURL() string { return "http://" + m.cpAddr }

// StopControlPlane shuts the control plane down (a fault the filter must survive).
func (m *Mesh) StopControlPlane() {
	m.cpMu.Lock()
	cp, stop := m.cp, m.cpStop
	m.cp, m.cpStop = nil, nil
	m.cpMu.Unlock()
	if cp != nil {
		stop()
		_ = cp.Wait()
	}
}

// StartControlPlane starts a fresh control plane at the same address: it rebuilds its
// state from the engines and the filters' reports.
func (m *Mesh) StartControlPlane() error {
	if m.ControlPlane() != nil {
		return errors.New("control plane already running")
	}
	return m.startControlPlane(m.engineList())
}

// ExternalEngines are the engines from Options.Engines (none: the mesh runs simulated
// replicas, Engines).
func (m *Mesh) ExternalEngines() []discovery.Engine { return slices.Clone(m.opts.Engines) }

// Ready waits until the filter routes to every engine: the control plane has scraped
// each of them, the filter's leader has loaded a table at least that new, and every proxy
// VM has read shared data since. Before that the filter leaves requests to the proxy's
// fallback. It returns false if ctx ends first.
func (m *Mesh) Ready(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var (
		version int64 = -1
		ticks   []uint64
	)
	for {
		switch {
		case version < 0:
			version = m.healthyVersion(ctx)
		case ticks == nil:
			if v, ok := m.Host.Metric("kvroute_table_version"); ok && v.Value > 0 && v.Value >= version {
				for _, vm := range m.Host.VMs() {
					ticks = append(ticks, vm.Ticks())
				}
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

// healthyVersion is the control plane's table version once it lists every engine as
// healthy, else -1.
func (m *Mesh) healthyVersion(ctx context.Context) int64 {
	req, err := http.NewRequestWithContext(ctx, "GET", m.ControlPlaneURL()+"/debug/state", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st struct {
		Version  int64
		Replicas []struct {
			Healthy bool `json:"healthy"`
		}
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil || len(st.Replicas) < len(m.engineList()) {
		return -1
	}
	for _, r := range st.Replicas {
		if !r.Healthy {
			return -1
		}
	}
	return st.Version
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
	for _, s := range m.Engines {
		s.Close()
	}
}

// ReportTap passes the filters' calls to the control plane and keeps totals of the
// outcome reports on the way: predicted against actual cached tokens.
type ReportTap struct {
	rp *httputil.ReverseProxy
	mu sync.Mutex
	t  ReportTotals
}

// ReportTotals add up outcome reports with usage.
type ReportTotals struct {
	Outcomes, PromptTokens, PredictedCached, ActualCached int64
}

func newReportTap(cpAddr string) *ReportTap {
	u := &url.URL{Scheme: "http", Host: cpAddr}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "control plane unreachable", http.StatusBadGateway)
	}
	return &ReportTap{rp: rp}
}

func (t *ReportTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == api.ReportsPath && r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		r.Body.Close()
		if err == nil {
			if rb, _, err := api.ParseReportBatch(b); err == nil {
				t.add(rb.Reports)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
	}
	t.rp.ServeHTTP(w, r)
}

func (t *ReportTap) add(rs []api.Report) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range rs {
		if r.Kind != api.KindOutcome || r.PromptTokens <= 0 || r.CachedTokens < 0 {
			continue
		}
		t.t.Outcomes++
		t.t.PromptTokens += int64(r.PromptTokens)
		t.t.PredictedCached += int64(min(r.PredictedCachedTokens, r.PromptTokens))
		t.t.ActualCached += int64(r.CachedTokens)
	}
}

// Totals returns the sums so far.
func (t *ReportTap) Totals() ReportTotals {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.t
}
