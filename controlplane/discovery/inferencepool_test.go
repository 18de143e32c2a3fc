package discovery

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inffake "sigs.k8s.io/gateway-api-inference-extension/client-go/clientset/versioned/fake"
)

func TestParsePoolRef(t *testing.T) {
	cases := []struct {
		in      string
		want    PoolRef
		wantErr string
	}{
		{in: "llm/llama-pool", want: PoolRef{Namespace: "llm", Name: "llama-pool"}},
		{in: "llm/llama-pool=meta-llama/Llama-3.1-8B-Instruct", want: PoolRef{Namespace: "llm", Name: "llama-pool", Model: "meta-llama/Llama-3.1-8B-Instruct"}},
		{in: "llama-pool", wantErr: "NAMESPACE/NAME"},
		{in: "llm/", wantErr: "name"},
		{in: "/pool", wantErr: "namespace"},
		{in: "LLM/pool", wantErr: "namespace"},
		{in: "llm/pool=", wantErr: "empty model"},
		{in: "llm/a/b", wantErr: "name"},
	}
	for _, c := range cases {
		got, err := ParsePoolRef(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: err = %v, want one naming %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if err == nil && got.String() != c.in {
			t.Errorf("%q: String() = %q", c.in, got.String())
		}
	}
}

func TestPodReady(t *testing.T) {
	now := metav1.Now()
	cases := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"running and ready", pod("p", "10.0.0.1", true, nil), true},
		{"not ready", pod("p", "10.0.0.1", false, nil), false},
		{"no ip yet", pod("p", "", true, nil), false},
		{"pending", func() *corev1.Pod { p := pod("p", "10.0.0.1", true, nil); p.Status.Phase = corev1.PodPending; return p }(), false},
		{"terminating", func() *corev1.Pod { p := pod("p", "10.0.0.1", true, nil); p.DeletionTimestamp = &now; return p }(), false},
		{"no Ready condition", func() *corev1.Pod { p := pod("p", "10.0.0.1", true, nil); p.Status.Conditions = nil; return p }(), false},
	}
	for _, c := range cases {
		if got := PodReady(c.pod); got != c.want {
			t.Errorf("%s: PodReady = %v", c.name, got)
		}
	}
}

func pod(name, ip string, ready bool, lbl map[string]string, anno ...string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: lbl, Annotations: map[string]string{}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
	for i := 0; i+1 < len(anno); i += 2 {
		p.Annotations[anno[i]] = anno[i+1]
	}
	return p
}

func inferencePool(ns, name string, sel map[string]string, ports ...int32) *infv1.InferencePool {
	p := &infv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: infv1.InferencePoolSpec{Selector: infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{}},
			EndpointPickerRef: infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}}}}
	for k, v := range sel {
		p.Spec.Selector.MatchLabels[infv1.LabelKey(k)] = infv1.LabelValue(v)
	}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, infv1.Port{Number: infv1.PortNumber(n)})
	}
	return p
}

// TestInferencePoolDiscovery runs discovery against fake clientsets and changes the pool
// and its pods step by step; each step states the engines that must follow.
func TestInferencePoolDiscovery(t *testing.T) {
	llama := map[string]string{"app": "llama"}
	kube := fake.NewClientset(
		pod("llama-0", "10.1.0.1", true, llama, AnnoKVPort, "6000", AnnoReplayPort, "6001"),
		pod("llama-1", "10.1.0.2", false, llama),                           // not ready
		pod("llama-2", "10.1.0.3", true, map[string]string{"app": "qwen"}), // not selected
		pod("llama-3", "", true, llama),                                    // no IP yet
	)
	pools := newPoolClient(inferencePool("llm", "llama-pool", llama, 8000))
	k := &Kubernetes{Client: kube, PoolClient: pools, Debounce: time.Millisecond,
		InferencePools: []PoolRef{{Namespace: "llm", Name: "llama-pool"}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u := &updates{}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, u.add) }()

	pods := kube.CoreV1().Pods("llm")
	poolAPI := pools.InferenceV1().InferencePools("llm")
	getPod := func(name string) *corev1.Pod {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	updatePod := func(p *corev1.Pod) {
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	editPool := func(edit func(*infv1.InferencePool)) {
		p, err := poolAPI.Get(ctx, "llama-pool", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(p)
		if _, err := poolAPI.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name  string
		do    func()
		ids   []string
		check func(es []Engine)
	}{
		{name: "only the ready, selected pod with an IP", do: func() {}, ids: []string{"llama-0"},
			check: func(es []Engine) {
				want := Engine{ID: "llama-0", Model: "llama-pool", Addr: "10.1.0.1:8000", Metrics: "http://10.1.0.1:8000/metrics",
					KV: "tcp://10.1.0.1:6000", Replay: "tcp://10.1.0.1:6001"}
				if es[0] != want {
					t.Errorf("llama-0: %+v\nwant %+v", es[0], want)
				}
			}},
		{name: "llama-1 turns ready", do: func() {
			p := getPod("llama-1")
			p.Status.Conditions[0].Status = corev1.ConditionTrue
			updatePod(p)
		}, ids: []string{"llama-0", "llama-1"},
			check: func(es []Engine) {
				if es[1].KV != "tcp://10.1.0.2:5557" || es[1].Replay != "" {
					t.Errorf("default KV port: %+v", es[1])
				}
			}},
		{name: "llama-2 is relabelled into the pool", do: func() {
			p := getPod("llama-2")
			p.Labels = llama
			if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, ids: []string{"llama-0", "llama-1", "llama-2"}},
		{name: "llama-3 gets its IP", do: func() {
			p := getPod("llama-3")
			p.Status.PodIP = "10.1.0.4"
			updatePod(p)
		}, ids: []string{"llama-0", "llama-1", "llama-2", "llama-3"}},
		{name: "the pool's selector narrows", do: func() {
			p := getPod("llama-1")
			p.Labels = map[string]string{"app": "llama", "tier": "gold"}
			if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			editPool(func(p *infv1.InferencePool) { p.Spec.Selector.MatchLabels["tier"] = "gold" })
		}, ids: []string{"llama-1"}},
		{name: "two target ports: two engines per pod, KV ports offset", do: func() {
			editPool(func(p *infv1.InferencePool) {
				p.Spec.TargetPorts = []infv1.Port{{Number: 8000}, {Number: 8001}}
				p.Annotations = map[string]string{AnnoModel: "llama-3-8b"}
			})
		}, ids: []string{"llama-1-8000", "llama-1-8001"},
			check: func(es []Engine) {
				if es[1].Addr != "10.1.0.2:8001" || es[1].KV != "tcp://10.1.0.2:5558" || es[1].Metrics != "http://10.1.0.2:8001/metrics" || es[1].Model != "llama-3-8b" {
					t.Errorf("second port: %+v", es[1])
				}
			}},
		{name: "llama-1 stops being ready", do: func() {
			p := getPod("llama-1")
			p.Status.Conditions[0].Status = corev1.ConditionFalse
			updatePod(p)
		}, ids: []string{}},
		{name: "ready again, one port", do: func() {
			p := getPod("llama-1")
			p.Status.Conditions[0].Status = corev1.ConditionTrue
			updatePod(p)
			editPool(func(p *infv1.InferencePool) { p.Spec.TargetPorts = []infv1.Port{{Number: 8000}} })
		}, ids: []string{"llama-1"}},
		{name: "the pool is deleted", do: func() {
			if err := poolAPI.Delete(ctx, "llama-pool", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, ids: []string{}},
		{name: "the pool comes back", do: func() {
			if _, err := poolAPI.Create(ctx, inferencePool("llm", "llama-pool", llama, 8000), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, ids: []string{"llama-0", "llama-1", "llama-2", "llama-3"}},
	}
	for _, s := range steps {
		s.do()
		es := u.waitIDs(t, s.ids...)
		if s.check != nil {
			s.check(es)
		}
		if t.Failed() {
			t.Fatalf("step %q failed", s.name)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestInferencePoolsAndServices: pools in two namespaces, the model from the flag, the
// pool's annotation or the pod's, next to Service discovery; a pod found both ways once.
func TestInferencePoolsAndServices(t *testing.T) {
	qwenPod := pod("qwen-0", "10.2.0.1", true, map[string]string{"app": "qwen"}, AnnoModel, "Qwen/Qwen3-8B")
	qwenPod.Namespace = "other"
	llamaPod := pod("llama-0", "10.1.0.1", true, map[string]string{"app": "llama"})
	mistralPod := pod("mistral-0", "10.1.0.5", true, map[string]string{"app": "mistral"})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "llama-svc", Namespace: "llm", Labels: map[string]string{AnnoModel: "llama"}}}
	kube := fake.NewClientset(llamaPod, qwenPod, mistralPod, svc,
		slice("llama-abc", "llama-svc", ep("10.1.0.1", "llama-0", boolp(true))))
	mistral := inferencePool("llm", "mistral-pool", map[string]string{"app": "mistral"}, 8000)
	mistral.Annotations = map[string]string{AnnoModel: "mistral-7b"}
	pools := newPoolClient(
		inferencePool("llm", "llama-pool", map[string]string{"app": "llama"}, 8000),
		inferencePool("other", "qwen-pool", map[string]string{"app": "qwen"}, 8000),
		mistral,
		inferencePool("llm", "empty-selector", nil, 8000))
	cases := []struct {
		name     string
		selector string
		refs     []PoolRef
		want     map[string]string // id -> model
	}{
		{name: "pools only", refs: []PoolRef{{Namespace: "llm", Name: "llama-pool", Model: "meta-llama/Llama-3.1-8B"}, {Namespace: "other", Name: "qwen-pool"}, {Namespace: "llm", Name: "mistral-pool"}},
			want: map[string]string{"llama-0": "meta-llama/Llama-3.1-8B", "qwen-0": "Qwen/Qwen3-8B", "mistral-0": "mistral-7b"}},
		{name: "pool and Service find one pod once", selector: AnnoModel, refs: []PoolRef{{Namespace: "llm", Name: "llama-pool"}, {Namespace: "llm", Name: "mistral-pool"}},
			want: map[string]string{"llama-0": "llama", "mistral-0": "mistral-7b"}},
		{name: "a missing pool and an empty selector add nothing", refs: []PoolRef{{Namespace: "llm", Name: "nope"}, {Namespace: "llm", Name: "empty-selector"}, {Namespace: "other", Name: "qwen-pool"}},
			want: map[string]string{"qwen-0": "Qwen/Qwen3-8B"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := &Kubernetes{Client: kube, PoolClient: pools, Namespace: "llm", Selector: c.selector, PortName: "http", Pods: true,
				InferencePools: c.refs, Debounce: time.Millisecond}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			u := &updates{}
			done := make(chan error, 1)
			go func() { done <- k.Run(ctx, u.add) }()
			var ids []string
			for id := range c.want {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			for _, e := range u.waitIDs(t, ids...) {
				if e.Model != c.want[e.ID] {
					t.Errorf("%s: model %q, want %q", e.ID, e.Model, c.want[e.ID])
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestInferencePoolNeedsClient(t *testing.T) {
	k := &Kubernetes{Client: fake.NewClientset(), InferencePools: []PoolRef{{Namespace: "llm", Name: "p"}}}
	if err := k.Run(context.Background(), func([]Engine) {}); err == nil || !strings.Contains(err.Error(), "PoolClient") {
		t.Fatalf("err = %v", err)
	}
}

// newPoolClient is the GIE fake clientset without field management: v1.4.0's
// NewClientset has no structured-merge schema for InferencePool, so its updates fail
// ("no type found matching ...InferencePool").
func newPoolClient(objs ...runtime.Object) *inffake.Clientset {
	//lint:ignore SA1019 NewClientset cannot update an InferencePool (see above)
	return inffake.NewSimpleClientset(objs...)
}
