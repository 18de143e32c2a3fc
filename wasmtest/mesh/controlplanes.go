// The mesh's control planes: one, or one per model in a sharded mesh (Options.Models).

package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/controlplane"
	"github.com/kvroute/kvroute/controlplane/discovery"
)

// ShardAuthority and ShardCluster name the control plane of a sharded mesh's model as
// one control plane per model would be named in Istio (docs/controlplane.md).
func ShardAuthority(model string) string {
	return "kvroute-controlplane-" + model + ".kvroute-system.svc.cluster.local"
}

func ShardCluster(model string) string { return "outbound|8080||" + ShardAuthority(model) }

// cpShard is one control plane of the mesh and the engines it watches.
type cpShard struct {
	model   string // "" for the one control plane of an unsharded mesh
	cluster string
	addr    string
	tap     *ReportTap
	mu      sync.Mutex
	ln      net.Listener // held for the first start (Start); nil after
	cp      *controlplane.ControlPlane
	stop    context.CancelFunc
}

// takeListener hands over the listener held since Start (nil after the first start).
func (s *cpShard) takeListener() net.Listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	ln := s.ln
	s.ln = nil
	return ln
}

// release closes the listener held for a control plane that never started.
func (s *cpShard) release() {
	if ln := s.takeListener(); ln != nil {
		ln.Close()
	}
}

// shardEngines are the engines control plane s watches: with Models, only its model's
// (a control plane per model is given only that model's engines, docs/controlplane.md).
func (m *Mesh) shardEngines(s *cpShard) []discovery.Engine {
	es := m.EngineList()
	if s.model == "" {
		return es
	}
	return slices.DeleteFunc(es, func(e discovery.Engine) bool { return e.Model != s.model })
}

// shard is the control plane of model ("" or any model of an unsharded mesh: its one).
func (m *Mesh) shard(model string) *cpShard {
	for _, s := range m.cps {
		if s.model == model {
			return s
		}
	}
	if len(m.cps) == 1 && m.cps[0].model == "" {
		return m.cps[0]
	}
	panic(fmt.Sprintf("mesh: no control plane serves model %q", model))
}

func (m *Mesh) startControlPlane(s *cpShard) error {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	logger := m.opts.Logger.With("part", "controlplane")
	if s.model != "" {
		logger = logger.With("shard", s.model)
	}
	ln := s.takeListener() // the port held since Start, for the first start
	cp, err := controlplane.New(controlplane.Options{
		Listen: s.addr, Listener: ln, Engines: m.shardEngines(s),
		PublishInterval: ms(m.opts.PublishInterval), ScrapeInterval: ms(m.opts.ScrapeInterval),
		WarmUp: max(m.opts.ControlPlaneWarmUp, 0), TakeoverAfter: max(m.opts.ControlPlaneTakeoverAfter, 0),
		Logger: logger,
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cp.Start(ctx); err != nil { // Start closes the listener it was given
		cancel()
		return err
	}
	s.mu.Lock()
	s.cp, s.stop = cp, cancel
	s.mu.Unlock()
	if m.opts.ControlPlaneReplicas > 1 {
		go s.probeReady(ctx)
	}
	return nil
}

// probeReady marks the replica's cluster ready while its /readyz answers 200, probed
// every 20 ms as a kubelet readiness probe would, until ctx ends.
func (s *cpShard) probeReady(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		ok := false
		if req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr+"/readyz", nil); err == nil {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
		}
		if s.tap != nil && ctx.Err() == nil {
			s.tap.ready.Store(ok)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ControlPlane returns the running control plane (the first model's with Models), or
// nil while it is stopped.
func (m *Mesh) ControlPlane() *controlplane.ControlPlane { return m.cps[0].running() }

func (s *cpShard) running() *controlplane.ControlPlane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cp
}

// ControlPlaneReplicaURL is the base URL of control-plane replica i.
func (m *Mesh) ControlPlaneReplicaURL(i int) string { return "http://" + m.cps[i].addr }

// KillControlPlaneReplica stops replica i the way SIGKILL does: every call in flight to
// it and every later one fails at once, as Envoy answers a reset or refused upstream,
// and the process goes without draining; its state is lost.
func (m *Mesh) KillControlPlaneReplica(i int) {
	s := m.cps[i]
	s.tap.kill()
	s.shutdown()
}

// StopControlPlaneReplica stops replica i the way SIGTERM does: long polls are answered
// and the process drains.
func (m *Mesh) StopControlPlaneReplica(i int) { m.cps[i].shutdown() }

// StartControlPlaneReplica starts a fresh process of replica i at its address.
func (m *Mesh) StartControlPlaneReplica(i int) error {
	s := m.cps[i]
	if s.running() != nil {
		return fmt.Errorf("control-plane replica %d is already running", i)
	}
	if err := m.startControlPlane(s); err != nil {
		return err
	}
	s.tap.revive()
	return nil
}

// ControlPlaneURL is the control plane's base URL (the first model's with Models).
func (m *Mesh) ControlPlaneURL() string { return "http://" + m.cps[0].addr }

// ShardURL is the base URL of the control plane that serves model.
func (m *Mesh) ShardURL(model string) string { return "http://" + m.shard(model).addr }

// StopControlPlane shuts the control plane down (a fault the filter must survive); with
// Models, every model's.
func (m *Mesh) StopControlPlane() {
	for _, s := range m.cps {
		s.shutdown()
	}
}

// StopShard shuts down the control plane of model alone.
func (m *Mesh) StopShard(model string) { m.shard(model).shutdown() }

func (s *cpShard) shutdown() {
	if s.tap != nil {
		s.tap.ready.Store(false) // a terminating pod leaves its Service's endpoints
	}
	s.mu.Lock()
	cp, stop := s.cp, s.stop
	s.cp, s.stop = nil, nil
	s.mu.Unlock()
	if cp != nil {
		stop()
		_ = cp.Wait()
	}
}

// StartControlPlane starts a fresh control plane at the same address (with Models, each
// stopped one): it rebuilds its state from the engines and the filters' reports.
func (m *Mesh) StartControlPlane() error {
	started := false
	for _, s := range m.cps {
		if s.running() == nil {
			if err := m.startControlPlane(s); err != nil {
				return err
			}
			started = true
		}
	}
	if !started {
		return errors.New("control plane already running")
	}
	return nil
}

// StartShard starts the control plane of model again at its address.
func (m *Mesh) StartShard(model string) error {
	s := m.shard(model)
	if s.running() != nil {
		return fmt.Errorf("the control plane of %s is already running", model)
	}
	return m.startControlPlane(s)
}

// versionGauge is the filter's gauge of the table version it has of s.
func (s *cpShard) versionGauge() string {
	if s.model == "" {
		return "kvroute_table_version"
	}
	return "kvroute_shard_" + s.model + "_table_version"
}

// healthyVersion is control plane s's table version once it lists every engine it
// watches as healthy, else -1.
func (m *Mesh) healthyVersion(ctx context.Context, s *cpShard) int64 {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr+"/debug/state", nil)
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
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil || len(st.Replicas) < len(m.shardEngines(s)) {
		return -1
	}
	for _, r := range st.Replicas {
		if !r.Healthy {
			return -1
		}
	}
	return st.Version
}
