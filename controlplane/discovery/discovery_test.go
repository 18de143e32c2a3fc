package discovery

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestParseFileYAMLAndJSON(t *testing.T) {
	yml := `engines:
  - model: llama
    addr: 10.0.0.7:8000
    kv: tcp://10.0.0.7:5557
    replay: tcp://10.0.0.7:5558
    kind: vllm
    speed: 14025
    dp_size: 2
  - {model: qwen, addr: "10.0.0.8:30000", kind: sglang}
`
	es, err := ParseFile([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	js, err := ParseFile([]byte(`{"engines":[{"model":"llama","addr":"10.0.0.7:8000","kv":"tcp://10.0.0.7:5557","replay":"tcp://10.0.0.7:5558","kind":"vllm","speed":14025,"dp_size":2},{"model":"qwen","addr":"10.0.0.8:30000","kind":"sglang"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(es, js) || len(es) != 2 || es[0].Speed != 14025 || es[1].Kind != "sglang" {
		t.Fatalf("yaml %+v json %+v", es, js)
	}
	for name, bad := range map[string]string{
		"unknown field":   "engines: [{model: m, addr: 1.2.3.4:5, colour: red}]",
		"missing model":   "engines: [{addr: 1.2.3.4:5}]",
		"bad addr":        "engines: [{model: m, addr: nowhere}]",
		"bad kind":        "engines: [{model: m, addr: 1.2.3.4:5, kind: tgi}]",
		"replay alone":    "engines: [{model: m, addr: 1.2.3.4:5, replay: 'tcp://1.2.3.4:5558'}]",
		"bad kv endpoint": "engines: [{model: m, addr: 1.2.3.4:5, kv: '1.2.3.4:5557'}]",
	} {
		if _, err := ParseFile([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseFlag(t *testing.T) {
	e, err := ParseFlag("model=llama,addr=127.0.0.1:8001,metrics=http://127.0.0.1:8001/metrics,kv=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,kind=vllm,speed=14025")
	if err != nil {
		t.Fatal(err)
	}
	want := Engine{Model: "llama", Addr: "127.0.0.1:8001", Metrics: "http://127.0.0.1:8001/metrics", KV: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Kind: "vllm", Speed: 14025}
	if e != want {
		t.Fatalf("%+v", e)
	}
	for _, bad := range []string{"model=m", "model=m,addr=1.2.3.4:5,speed=fast", "model=m,addr=1.2.3.4:5,colour=red", "model"} {
		if _, err := ParseFlag(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDPRanks(t *testing.T) {
	internal := Engine{ID: "e", Model: "m", Addr: "10.0.0.1:8000", KV: "tcp://10.0.0.1:5557", Replay: "tcp://10.0.0.1:5600", DPSize: 3}
	external := Engine{ID: "x", Model: "m", Addr: "10.0.0.2:8000", KV: "tcp://10.0.0.2:5557", DPSize: 2, DPExternal: true}
	rs := Replicas([]Engine{internal, external})
	if len(rs) != 3 {
		t.Fatalf("%+v", rs)
	}
	e := rs[0]
	if e.ID != "e" || len(e.Streams) != 3 || e.Streams[2].Endpoint != "tcp://10.0.0.1:5559" || e.Streams[2].Replay != "tcp://10.0.0.1:5602" || e.Streams[2].Rank != 2 || e.Metrics != "http://10.0.0.1:8000/metrics" {
		t.Fatalf("internal DP: %+v", e)
	}
	x1 := rs[2]
	if x1.ID != "x-dp1" || x1.Addr != "10.0.0.2:8001" || x1.Metrics != "http://10.0.0.2:8001/metrics" || len(x1.Streams) != 1 || x1.Streams[0].Endpoint != "tcp://10.0.0.2:5558" || x1.Streams[0].Rank != 1 {
		t.Fatalf("external DP: %+v", x1)
	}
	if ep, _ := OffsetEndpoint("ipc:///tmp/kv", 2); ep != "ipc:///tmp/kv_dp2" {
		t.Fatalf("ipc offset %q", ep)
	}
}

func boolp(b bool) *bool                      { return &b }
func int32p(i int32) *int32                   { return &i }
func strp(s string) *string                   { return &s }
func podRef(n string) *corev1.ObjectReference { return &corev1.ObjectReference{Kind: "Pod", Name: n} }

func slice(name, svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: strp("metrics"), Port: int32p(9090)}, {Name: strp("http"), Port: int32p(8000)}},
		Endpoints:   eps,
	}
}

func ep(ip, pod string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, TargetRef: podRef(pod), Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

type updates struct {
	mu sync.Mutex
	l  [][]Engine
}

func (u *updates) add(es []Engine) { u.mu.Lock(); u.l = append(u.l, es); u.mu.Unlock() }

// waitIDs polls until the latest list has exactly ids.
func (u *updates) waitIDs(t *testing.T, ids ...string) []Engine {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		u.mu.Lock()
		var last []Engine
		any := len(u.l) > 0
		if any {
			last = u.l[len(u.l)-1]
		}
		u.mu.Unlock()
		var got []string
		for _, e := range last {
			got = append(got, e.ID)
		}
		if any && slices.Equal(got, ids) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("engines %v, want %v", got, ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKubernetesEndpointSlices(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "llama-svc", Namespace: "llm",
		Labels:      map[string]string{"kvroute.io/model": "llama"},
		Annotations: map[string]string{AnnoReplayPort: "5558", AnnoSpeed: "9000"}}}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "llm"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "llm", Annotations: map[string]string{AnnoKVPort: "6000"}}}
	cs := fake.NewClientset(svc, other, pod,
		slice("llama-abc", "llama-svc", ep("10.1.0.1", "llama-0", boolp(true)), ep("10.1.0.2", "llama-1", boolp(false)), ep("10.1.0.3", "llama-2", nil)),
		slice("web-abc", "web", ep("10.2.0.1", "web-0", boolp(true))))
	k := &Kubernetes{Client: cs, Namespace: "llm", Selector: "kvroute.io/model", PortName: "http", Pods: true, Debounce: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u := &updates{}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, u.add) }()

	// llama-1 is not ready; the unlabelled Service is not ours.
	es := u.waitIDs(t, "llama-0", "llama-2")
	want0 := Engine{ID: "llama-0", Model: "llama", Addr: "10.1.0.1:8000", Metrics: "http://10.1.0.1:8000/metrics", KV: "tcp://10.1.0.1:6000", Replay: "tcp://10.1.0.1:5558", Speed: 9000}
	if es[0] != want0 {
		t.Fatalf("llama-0: %+v\nwant %+v", es[0], want0)
	}
	if es[1].KV != "tcp://10.1.0.3:5557" {
		t.Fatalf("default KV port: %+v", es[1])
	}

	// llama-1 becomes ready, llama-2 leaves.
	s, _ := cs.DiscoveryV1().EndpointSlices("llm").Get(ctx, "llama-abc", metav1.GetOptions{})
	s.Endpoints = []discoveryv1.Endpoint{ep("10.1.0.1", "llama-0", boolp(true)), ep("10.1.0.2", "llama-1", boolp(true))}
	if _, err := cs.DiscoveryV1().EndpointSlices("llm").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitIDs(t, "llama-0", "llama-1")

	// A new pod in a second slice of the same Service.
	if _, err := cs.DiscoveryV1().EndpointSlices("llm").Create(ctx, slice("llama-def", "llama-svc", ep("10.1.0.9", "llama-9", boolp(true))), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitIDs(t, "llama-0", "llama-1", "llama-9")

	// The Service loses its label: nothing is ours.
	svc.Labels = nil
	if _, err := cs.CoreV1().Services("llm").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitIDs(t)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestKubernetesBadSelector(t *testing.T) {
	k := &Kubernetes{Client: fake.NewClientset(), Selector: "a in (", Namespace: "x"}
	if err := k.Run(context.Background(), func([]Engine) {}); err == nil || !strings.Contains(err.Error(), "selector") {
		t.Fatalf("err = %v", err)
	}
}
