package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	infclient "sigs.k8s.io/gateway-api-inference-extension/client-go/clientset/versioned"
)

// Annotations (and labels) read from the Service and, overriding it, the Pod.
const (
	AnnoModel       = "kvroute.io/model"        // served model name (Service label or annotation)
	AnnoKVPort      = "kvroute.io/kv-port"      // KV-event PUB port (default 5557)
	AnnoReplayPort  = "kvroute.io/replay-port"  // replay ROUTER port (optional)
	AnnoKVTopic     = "kvroute.io/kv-topic"     // KV-event topic (optional)
	AnnoEngine      = "kvroute.io/engine"       // vllm (default) or sglang
	AnnoSpeed       = "kvroute.io/speed"        // prefill tokens/s
	AnnoMetricsPath = "kvroute.io/metrics-path" // default /metrics
	AnnoDPSize      = "kvroute.io/dp-size"      // data-parallel ranks behind the endpoint
	AnnoKVEvents    = "kvroute.io/kv-events"    // "false" disables the subscription
	DefaultKVPort   = 5557
)

// Kubernetes watches the EndpointSlices of the Services matching Selector in Namespace,
// and the ready Pods of the InferencePools listed in InferencePools (inferencepool.go).
type Kubernetes struct {
	Client    kubernetes.Interface
	Namespace string
	// Selector picks the engine Services, e.g. "kvroute.io/model" (label exists). Empty
	// with InferencePools set: no Service discovery, only the pools.
	Selector string
	// PortName is the EndpointSlice port of the engines' HTTP API ("" = the first).
	PortName string
	// Pods enables reading Pod annotations (needs get/list/watch on pods).
	Pods bool
	// InferencePools are Gateway API Inference Extension pools whose ready Pods are
	// engines, on the pool's target ports. They need PoolClient.
	InferencePools []PoolRef
	// PoolClient reads InferencePools (inference.networking.k8s.io/v1).
	PoolClient infclient.Interface
	// Debounce coalesces bursts of changes (default 100 ms).
	Debounce time.Duration
	Logger   *slog.Logger
}

// Run calls update with the full engine list after the caches sync and on every change,
// until ctx ends. It returns an error when the selector is invalid or the caches do
// not sync.
func (k *Kubernetes) Run(ctx context.Context, update func([]Engine)) error {
	services := k.Selector != "" || len(k.InferencePools) == 0
	sel, err := labels.Parse(k.Selector)
	if err != nil {
		return fmt.Errorf("service selector %q: %w", k.Selector, err)
	}
	if len(k.InferencePools) > 0 && k.PoolClient == nil {
		return fmt.Errorf("kubernetes discovery: InferencePools need a PoolClient")
	}
	if k.Debounce <= 0 {
		k.Debounce = 100 * time.Millisecond
	}
	if k.Logger == nil {
		k.Logger = slog.Default()
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	// One informer factory per namespace: the Services' and each pool's.
	factories := map[string]informers.SharedInformerFactory{}
	factory := func(ns string) informers.SharedInformerFactory {
		f, ok := factories[ns]
		if !ok {
			f = informers.NewSharedInformerFactoryWithOptions(k.Client, 0, informers.WithNamespace(ns))
			factories[ns] = f
		}
		return f
	}
	var synced []cache.InformerSynced
	watch := func(inf cache.SharedIndexInformer) error {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
		synced = append(synced, inf.HasSynced)
		return nil
	}
	var compute []func() []Engine
	if services {
		f := factory(k.Namespace)
		svcInf := f.Core().V1().Services()
		sliceInf := f.Discovery().V1().EndpointSlices()
		for _, inf := range []cache.SharedIndexInformer{svcInf.Informer(), sliceInf.Informer()} {
			if err := watch(inf); err != nil {
				return err
			}
		}
		var podLister func(name string) *corev1.Pod
		if k.Pods {
			podInf := f.Core().V1().Pods()
			if err := watch(podInf.Informer()); err != nil {
				return err
			}
			lister := podInf.Lister().Pods(k.Namespace)
			podLister = func(name string) *corev1.Pod {
				p, err := lister.Get(name)
				if err != nil {
					return nil
				}
				return p
			}
		}
		svcLister := svcInf.Lister().Services(k.Namespace)
		sliceLister := sliceInf.Lister().EndpointSlices(k.Namespace)
		compute = append(compute, func() []Engine {
			svcs, err := svcLister.List(sel)
			if err != nil {
				k.Logger.Error("kubernetes discovery: list services", "err", err)
				return nil
			}
			var out []Engine
			for _, svc := range svcs {
				slices, err := sliceLister.List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
				if err != nil {
					continue
				}
				out = append(out, k.engines(svc, slices, podLister)...)
			}
			return out
		})
	}
	pools, err := k.watchPools(factory, watch)
	if err != nil {
		return err
	}
	if pools != nil {
		compute = append(compute, pools.engines)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
		defer f.Shutdown()
	}
	if pools != nil {
		pools.start(ctx.Done())
		defer pools.shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kubernetes discovery: caches did not sync")
	}
	all := func() []Engine {
		var out []Engine
		for _, c := range compute {
			out = append(out, c()...)
		}
		return k.dedupe(out)
	}
	var last []Engine
	first := true
	for {
		es := all()
		if first || !slices.EqualFunc(es, last, func(a, b Engine) bool { return a == b }) {
			update(es)
			last, first = es, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select { // coalesce a burst
		case <-ctx.Done():
			return nil
		case <-time.After(k.Debounce):
		}
	}
}

// dedupe sorts engines by ID and keeps the first of equal IDs (a Pod behind both a
// labelled Service and a pool, or equal Pod names in two namespaces).
func (k *Kubernetes) dedupe(es []Engine) []Engine {
	slices.SortStableFunc(es, func(a, b Engine) int { return strings.Compare(a.ID, b.ID) })
	out := es[:0]
	for i, e := range es {
		if i > 0 && e.ID == out[len(out)-1].ID {
			if e != out[len(out)-1] {
				k.Logger.Warn("kubernetes discovery: two engines with one id, keeping the first", "id", e.ID, "kept", out[len(out)-1].Addr, "dropped", e.Addr)
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

func lookup(key string, maps ...map[string]string) string {
	v := ""
	for _, m := range maps {
		if x, ok := m[key]; ok && x != "" {
			v = x
		}
	}
	return v
}

// engines lists the ready endpoints of one Service as engines.
func (k *Kubernetes) engines(svc *corev1.Service, sl []*discoveryv1.EndpointSlice, pod func(string) *corev1.Pod) []Engine {
	var out []Engine
	seen := map[string]bool{}
	for _, s := range sl {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		port := -1
		for _, p := range s.Ports {
			if p.Port == nil {
				continue
			}
			if k.PortName == "" || (p.Name != nil && *p.Name == k.PortName) {
				port = int(*p.Port)
				break
			}
		}
		if port < 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			// Ready nil means unknown, which the API says to read as ready; serving
			// but terminating endpoints are not ready.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if len(ep.Addresses) == 0 {
				continue
			}
			ip := ep.Addresses[0]
			maps := []map[string]string{svc.Labels, svc.Annotations}
			id := ""
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				id = ep.TargetRef.Name
				if pod != nil {
					if p := pod(ep.TargetRef.Name); p != nil {
						maps = append(maps, p.Labels, p.Annotations)
					}
				}
			}
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			if id == "" {
				id = addr
			}
			if seen[id] {
				continue
			}
			seen[id] = true
			e, err := engineAt(id, ip, port, 0, svc.Name, maps)
			if err != nil {
				k.Logger.Warn("kubernetes discovery: skipping endpoint", "service", svc.Name, "endpoint", id, "err", err)
				continue
			}
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Engine) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// engineAt describes the engine at ip:port from the kvroute.io/* keys in maps (later maps
// win): the model (default defModel), KV-event and replay ports shifted by offset (the
// port's index among a pool's target ports), engine kind, speed, DP size, metrics path.
func engineAt(id, ip string, port, offset int, defModel string, maps []map[string]string) (Engine, error) {
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	e := Engine{ID: id, Addr: addr, Model: lookup(AnnoModel, maps...), Kind: lookup(AnnoEngine, maps...), Topic: lookup(AnnoKVTopic, maps...)}
	if e.Model == "" {
		e.Model = defModel
	}
	path := lookup(AnnoMetricsPath, maps...)
	if path == "" {
		path = "/metrics"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	e.Metrics = "http://" + addr + path
	if lookup(AnnoKVEvents, maps...) != "false" {
		kvPort := DefaultKVPort
		if v, err := strconv.Atoi(lookup(AnnoKVPort, maps...)); err == nil && v > 0 && v < 65536 {
			kvPort = v
		}
		if kvPort+offset > 65535 {
			return e, fmt.Errorf("kv port %d + %d out of range", kvPort, offset)
		}
		e.KV = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(kvPort+offset))
		if v, err := strconv.Atoi(lookup(AnnoReplayPort, maps...)); err == nil && v > 0 && v+offset < 65536 {
			e.Replay = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(v+offset))
		}
	}
	if v, err := strconv.ParseUint(lookup(AnnoSpeed, maps...), 10, 32); err == nil {
		e.Speed = uint32(v)
	}
	if v, err := strconv.Atoi(lookup(AnnoDPSize, maps...)); err == nil && v > 1 && v <= 1024 {
		e.DPSize = v
	}
	return e, e.Validate()
}
