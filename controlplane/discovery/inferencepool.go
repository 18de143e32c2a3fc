package discovery

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infinformers "sigs.k8s.io/gateway-api-inference-extension/client-go/informers/externalversions"
	inflisters "sigs.k8s.io/gateway-api-inference-extension/client-go/listers/api/v1"
)

// PoolRef names a Gateway API Inference Extension InferencePool
// (inference.networking.k8s.io/v1) whose selected Pods are engines.
type PoolRef struct {
	Namespace, Name string
	// Model is the served model name; "" takes kvroute.io/model from the Pod or the pool
	// (label or annotation, the Pod's winning), else the pool's name.
	Model string
}

func (r PoolRef) String() string {
	s := r.Namespace + "/" + r.Name
	if r.Model != "" {
		s += "=" + r.Model
	}
	return s
}

// ParsePoolRef parses an --inference-pool value: NAMESPACE/NAME[=MODEL].
func ParsePoolRef(v string) (PoolRef, error) {
	ref, model, _ := strings.Cut(v, "=")
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return PoolRef{}, fmt.Errorf("--inference-pool %q: want NAMESPACE/NAME[=MODEL]", v)
	}
	for _, part := range []struct{ what, s string }{{"namespace", ns}, {"name", name}} {
		if errs := validation.IsDNS1123Subdomain(part.s); len(errs) > 0 {
			return PoolRef{}, fmt.Errorf("--inference-pool %q: %s %q: %s", v, part.what, part.s, strings.Join(errs, "; "))
		}
	}
	if strings.Contains(v, "=") && model == "" {
		return PoolRef{}, fmt.Errorf("--inference-pool %q: empty model after '='", v)
	}
	return PoolRef{Namespace: ns, Name: name, Model: model}, nil
}

// poolWatch is the InferencePool side of Kubernetes.Run: one pool informer and one Pod
// informer per namespace that holds a listed pool.
type poolWatch struct {
	k         *Kubernetes
	factories map[string]infinformers.SharedInformerFactory
	pools     map[string]inflisters.InferencePoolNamespaceLister
	pods      map[string]func(labels.Selector) ([]*corev1.Pod, error)
}

// watchPools registers the informers the listed pools need (nil when there are none).
func (k *Kubernetes) watchPools(kube func(ns string) informers.SharedInformerFactory, watch func(cache.SharedIndexInformer) error) (*poolWatch, error) {
	if len(k.InferencePools) == 0 {
		return nil, nil
	}
	w := &poolWatch{k: k, factories: map[string]infinformers.SharedInformerFactory{},
		pools: map[string]inflisters.InferencePoolNamespaceLister{}, pods: map[string]func(labels.Selector) ([]*corev1.Pod, error){}}
	for _, ref := range k.InferencePools {
		ns := ref.Namespace
		if _, ok := w.factories[ns]; ok {
			continue
		}
		f := infinformers.NewSharedInformerFactoryWithOptions(k.PoolClient, 0, infinformers.WithNamespace(ns))
		w.factories[ns] = f
		poolInf := f.Inference().V1().InferencePools()
		if err := watch(poolInf.Informer()); err != nil {
			return nil, err
		}
		w.pools[ns] = poolInf.Lister().InferencePools(ns)
		podInf := kube(ns).Core().V1().Pods()
		if err := watch(podInf.Informer()); err != nil {
			return nil, err
		}
		w.pods[ns] = podInf.Lister().Pods(ns).List
	}
	return w, nil
}

func (w *poolWatch) start(stop <-chan struct{}) {
	for _, f := range w.factories {
		f.Start(stop)
	}
}

func (w *poolWatch) shutdown() {
	for _, f := range w.factories {
		f.Shutdown()
	}
}

// engines lists the ready Pods of every listed pool as engines, one per target port.
func (w *poolWatch) engines() []Engine {
	var out []Engine
	for _, ref := range w.k.InferencePools {
		pool, err := w.pools[ref.Namespace].Get(ref.Name)
		if err != nil {
			w.k.Logger.Debug("kubernetes discovery: inference pool not found", "pool", ref.Namespace+"/"+ref.Name, "err", err)
			continue
		}
		sel := poolSelector(pool)
		if sel.Empty() {
			// The API requires a selector; an empty one would select every Pod.
			w.k.Logger.Warn("kubernetes discovery: inference pool has no selector", "pool", ref.Namespace+"/"+ref.Name)
			continue
		}
		pods, err := w.pods[ref.Namespace](sel)
		if err != nil {
			continue
		}
		out = append(out, w.k.poolEngines(ref, pool, pods)...)
	}
	return out
}

func poolSelector(pool *infv1.InferencePool) labels.Selector {
	set := labels.Set{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	return labels.SelectorFromSet(set)
}

// PodReady is what a pool member must be to take traffic: running, Ready, not
// terminating, with an IP (the EndpointSlice controller's test for a ready endpoint).
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poolEngines describes one pool's ready Pods. With one target port an engine's ID is
// the Pod's name (as with Service discovery); with several, "<pod>-<port>", and the i-th
// port's server publishes KV events on kv-port + i (replay on replay-port + i).
func (k *Kubernetes) poolEngines(ref PoolRef, pool *infv1.InferencePool, pods []*corev1.Pod) []Engine {
	var ports []int
	for _, p := range pool.Spec.TargetPorts {
		if p.Number > 0 && p.Number <= 65535 && !slices.Contains(ports, int(p.Number)) {
			ports = append(ports, int(p.Number))
		}
	}
	var out []Engine
	for _, pod := range pods {
		if !PodReady(pod) {
			continue
		}
		maps := []map[string]string{pool.Labels, pool.Annotations, pod.Labels, pod.Annotations}
		if ref.Model != "" {
			maps = append(maps, map[string]string{AnnoModel: ref.Model})
		}
		for i, port := range ports {
			id := pod.Name
			if len(ports) > 1 {
				id = fmt.Sprintf("%s-%d", pod.Name, port)
			}
			e, err := engineAt(id, pod.Status.PodIP, port, i, pool.Name, maps)
			if err != nil {
				k.Logger.Warn("kubernetes discovery: skipping pool member", "pool", ref.Namespace+"/"+ref.Name, "pod", pod.Name, "err", err)
				continue
			}
			out = append(out, e)
		}
	}
	return out
}
