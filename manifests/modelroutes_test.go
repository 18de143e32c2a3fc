package manifests_test

// Only vLLM's inference APIs (OpenAI's, and Anthropic's Messages) and its health check
// reach the engines through the mesh: the clients' VirtualService answers every other
// path with 404, and the AuthorizationPolicy on the vLLM pods refuses it with 403, except
// /metrics, which the control plane scrapes.

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
)

// routeKind says what the mesh must do with a vLLM route.
type routeKind int

const (
	inference routeKind = iota // OpenAI inference API: reaches the engines
	health                     // health check: reaches the engines
	scrape                     // the control plane's /metrics scrape: refused to clients, open at the engine
	refused                    // admin, debug, non-OpenAI or metadata: refused
)

// vllmRoutes are the HTTP routes vLLM's API server registers, from vllm-project/vllm
// (read through the code index; vLLM is too large to fetch). Sources:
//
//	[A] vllm/entrypoints/openai/api_server.py @ 048027fbbdb8c252560205a6159ba3288ede291e:
//	    build_app (FastAPI defaults /docs, /redoc, /openapi.json; chat, responses,
//	    translations, completion, anthropic, models, pooling routers), get_server_load_metrics
//	    (its comment lists the GPU routes), show_version, /load
//	[B] vllm/entrypoints/serve/instrumentator/metrics.py @ 02a69ad2710b79425c217f79dd4ad8e4ea671ee1
//	    attach_router: the /metrics mount and the handlers it excludes (/health,
//	    /health/decode, /load, /ping, /version, /server_info)
//	[C] vllm/entrypoints/serve/instrumentator/server_info.py @ 09cb327f1183534adbdf9eee3e438688e75fbe2b
//	[D] vllm/entrypoints/serve/tokenize/api_router.py @ 045d7575500e01e0f4a7ff84e039a9f7f7dc3bd0
//	[E] vllm/frontend/entrypoints/serve/dev/{sleep,cache,rpc}/api_router.py,
//	    serve/profile/api_router.py, serve/lora/api_router.py, serve/elastic_ep/api_router.py
//	    @ 055e47c28003156421365af985d676fc921cb075 (the dev routers need VLLM_SERVER_DEV_MODE,
//	    profile a profiler config, LoRA VLLM_ALLOW_RUNTIME_LORA_UPDATING)
//	[F] vllm/entrypoints/serve/pause/api_router.py @ 16c2663c4d8a685dfdb37953677d645b8f2fb129
//	    (/pause/step; its docstring names POST /resume)
//
// The deployed image is vllm/vllm-openai:v0.11.0, older than these files; the mesh rules are
// an allow-list, so a route missing here is refused all the same.
type vllmRoute struct {
	path, source string
	kind         routeKind
}

var vllmRoutes = []vllmRoute{
	{"/v1/chat/completions", "A", inference},
	{"/v1/completions", "A", inference},
	{"/v1/embeddings", "A", inference},
	{"/v1/responses", "A", inference},
	{"/v1/messages", "A", inference}, // Anthropic's Messages API (vllm/entrypoints/anthropic/api_router.py)
	{"/v1/audio/transcriptions", "A", inference},
	{"/v1/audio/translations", "A", inference},
	{"/v1/models", "A", health},
	{"/health", "B", health},
	{"/metrics", "B", scrape},
	// Stored responses by id: not tenant-scoped, so not exposed.
	{"/v1/responses/resp_123", "A", refused},
	{"/v1/responses/resp_123/cancel", "A", refused},
	// Not inference APIs kvroute routes (pooling, scoring, reranking).
	{"/pooling", "A", refused},
	{"/classify", "A", refused},
	{"/score", "A", refused},
	{"/v1/score", "A", refused},
	{"/rerank", "A", refused},
	{"/v1/rerank", "A", refused},
	{"/v2/rerank", "A", refused},
	// Server metadata and docs.
	{"/load", "A", refused},
	{"/version", "A", refused},
	{"/ping", "B", refused},
	{"/health/decode", "B", refused},
	{"/docs", "A", refused},
	{"/redoc", "A", refused},
	{"/openapi.json", "A", refused},
	{"/server_info", "C", refused},
	{"/tokenize", "D", refused},
	{"/detokenize", "D", refused},
	{"/tokenizer_info", "D", refused},
	// Engine administration.
	{"/sleep", "E", refused},
	{"/wake_up", "E", refused},
	{"/is_sleeping", "E", refused},
	{"/reset_prefix_cache", "E", refused},
	{"/reset_mm_cache", "E", refused},
	{"/reset_encoder_cache", "E", refused},
	{"/collective_rpc", "E", refused},
	{"/start_profile", "E", refused},
	{"/stop_profile", "E", refused},
	{"/v1/load_lora_adapter", "E", refused},
	{"/v1/unload_lora_adapter", "E", refused},
	{"/scale_elastic_ep", "E", refused},
	{"/is_scaling_elastic_ep", "E", refused},
	{"/pause/step", "F", refused},
	{"/resume", "F", refused},
	// Spellings that must not slip through exact matching.
	{"/v1/chat/completions/", "-", refused},
	{"/V1/completions", "-", refused},
	{"/v1", "-", refused},
	{"/", "-", refused},
}

// vsOutcome is what an Istio sidecar does with a request path under a VirtualService:
// the first HTTP route whose match list is empty or has a matching uri wins (Istio keeps
// the order; Envoy compares the path without the query string). Returns the HTTP status
// of a direct response, or 0 and the destination host when the request is forwarded.
func vsOutcome(t *testing.T, vs *networkingv1.VirtualService, path string) (status uint32, host string) {
	t.Helper()
	path, _, _ = strings.Cut(path, "?")
	for _, h := range vs.Spec.GetHttp() {
		hit := len(h.GetMatch()) == 0
		for _, m := range h.GetMatch() {
			u := m.GetUri()
			switch {
			case u == nil:
				t.Fatalf("route %q: a match without uri is not modelled here", h.GetName())
			case u.GetExact() != "":
				hit = hit || path == u.GetExact()
			case u.GetPrefix() != "":
				hit = hit || strings.HasPrefix(path, u.GetPrefix())
			default:
				t.Fatalf("route %q: only exact and prefix uri matches are modelled", h.GetName())
			}
		}
		if !hit {
			continue
		}
		if d := h.GetDirectResponse(); d != nil {
			return d.GetStatus(), ""
		}
		return 0, h.GetRoute()[0].GetDestination().GetHost()
	}
	return 404, "" // no route: Envoy answers 404
}

// authzAllows models an Istio DENY AuthorizationPolicy on a path and port: a request is
// denied when any rule matches (paths / notPaths on the url path, ports).
func authzAllows(t *testing.T, ap *securityv1.AuthorizationPolicy, path string, port int) bool {
	t.Helper()
	if ap.Spec.GetAction().String() != "DENY" {
		t.Fatalf("only DENY policies are modelled, got %s", ap.Spec.GetAction())
	}
	path, _, _ = strings.Cut(path, "?")
	for _, r := range ap.Spec.GetRules() {
		if len(r.GetFrom()) > 0 || len(r.GetWhen()) > 0 {
			t.Fatal("only `to` rules are modelled")
		}
		for _, to := range r.GetTo() {
			op := to.GetOperation()
			if len(op.GetMethods())+len(op.GetNotMethods())+len(op.GetHosts())+len(op.GetNotHosts())+len(op.GetNotPorts()) > 0 {
				t.Fatal("only paths, notPaths and ports are modelled")
			}
			for _, p := range append(op.GetPaths(), op.GetNotPaths()...) {
				if strings.ContainsAny(p, "*{") {
					t.Fatalf("path %q: only exact paths are modelled", p)
				}
			}
			matches := (len(op.GetPorts()) == 0 || slices.Contains(op.GetPorts(), strconv.Itoa(port))) &&
				(len(op.GetPaths()) == 0 || slices.Contains(op.GetPaths(), path)) &&
				!slices.Contains(op.GetNotPaths(), path)
			if matches {
				return false
			}
		}
	}
	return true
}

func TestModelRoutesOnlyExposeTheAPI(t *testing.T) {
	clients := render(t, "overlays/llm-clients")
	vllm := render(t, "vllm")
	var vs *networkingv1.VirtualService
	for _, o := range clients {
		if v, ok := o.Value.(*networkingv1.VirtualService); ok {
			vs = v
		}
	}
	var ap *securityv1.AuthorizationPolicy
	var dep *appsv1.Deployment
	for _, o := range vllm {
		switch v := o.Value.(type) {
		case *securityv1.AuthorizationPolicy:
			ap = v
		case *appsv1.Deployment:
			dep = v
		}
	}
	if vs == nil || ap == nil || dep == nil {
		t.Fatal("want the clients' VirtualService, the vLLM AuthorizationPolicy and Deployment")
	}
	model := vs.Spec.GetHosts()[0]
	port := int(dep.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort)

	for _, r := range vllmRoutes {
		for _, path := range []string{r.path, r.path + "?stream=true"} {
			status, host := vsOutcome(t, vs, path)
			allowed := authzAllows(t, ap, path, port)
			switch r.kind {
			case inference, health:
				if host != model || !allowed {
					t.Errorf("%s (source %s): want it to reach the engines; VirtualService gives %d %q, AuthorizationPolicy allows: %v", path, r.source, status, host, allowed)
				}
			case scrape:
				if host != "" || status != 404 || !allowed {
					t.Errorf("%s (source %s): want 404 for clients and open at the engine for the control plane's scrape; got %d %q, allowed %v", path, r.source, status, host, allowed)
				}
			case refused:
				if host != "" || status != 404 || allowed {
					t.Errorf("%s (source %s): want 404 from the clients' sidecars and 403 at the engines; got %d %q, allowed %v", path, r.source, status, host, allowed)
				}
			}
		}
	}

	// The policy covers the vLLM pods on the model port, and leaves the KV-event ports to
	// the NetworkPolicy: they bypass the sidecar.
	sel := ap.Spec.GetSelector().GetMatchLabels()
	for k, v := range sel {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("AuthorizationPolicy selector %s=%s does not select the vLLM pods", k, v)
		}
	}
	if len(sel) == 0 {
		t.Error("AuthorizationPolicy without a selector applies to the whole namespace")
	}
	excluded := strings.Split(dep.Spec.Template.Annotations["traffic.sidecar.istio.io/excludeInboundPorts"], ",")
	for _, a := range []string{"kvroute.io/kv-port", "kvroute.io/replay-port"} {
		if p := dep.Spec.Template.Annotations[a]; !slices.Contains(excluded, p) {
			t.Errorf("%s %s is not excluded from the sidecar: the AuthorizationPolicy would refuse the control plane's ZMQ connection", a, p)
		}
	}
	// The control plane scrapes kvroute.io/metrics-path (default /metrics) on every engine.
	metricsPath := dep.Spec.Template.Annotations["kvroute.io/metrics-path"]
	if metricsPath == "" {
		metricsPath = "/metrics"
	}
	if !authzAllows(t, ap, metricsPath, port) {
		t.Errorf("the AuthorizationPolicy refuses the control plane's scrape of %s", metricsPath)
	}

	// Both lists name the same API paths, so they cannot drift apart.
	var vsPaths []string
	for _, h := range vs.Spec.GetHttp() {
		for _, m := range h.GetMatch() {
			vsPaths = append(vsPaths, m.GetUri().GetExact())
		}
	}
	apPaths := slices.DeleteFunc(slices.Clone(ap.Spec.GetRules()[0].GetTo()[0].GetOperation().GetNotPaths()), func(p string) bool { return p == metricsPath })
	slices.Sort(vsPaths)
	slices.Sort(apPaths)
	if !slices.Equal(vsPaths, apPaths) {
		t.Errorf("VirtualService passes %v, AuthorizationPolicy %v (plus %s)", vsPaths, apPaths, metricsPath)
	}
	// Every path either list opens is a vLLM route this test knows as inference or health.
	for _, p := range vsPaths {
		i := slices.IndexFunc(vllmRoutes, func(r vllmRoute) bool { return r.path == p })
		if i < 0 || (vllmRoutes[i].kind != inference && vllmRoutes[i].kind != health) {
			t.Errorf("%s is opened but is not a known vLLM inference or health route", p)
		}
	}
	if t.Failed() {
		t.Logf("VirtualService http: %v", vs.Spec.GetHttp())
	}
}

// TestRouteModelsRejectWrongConfigs proves the two models above fail when they should.
func TestRouteModelsRejectWrongConfigs(t *testing.T) {
	cases := []struct {
		name, file, old, new, path string
	}{
		{"a /v1/ prefix would expose the LoRA admin endpoint", "filter/override-host/virtualservice.yaml",
			"        exact: /v1/models\n", "        prefix: /v1/\n", "/v1/load_lora_adapter"},
		{"without the catch-all the sidecar forwards admin paths", "filter/override-host/virtualservice.yaml",
			"  - name: not-the-api\n    directResponse:\n      status: 404\n", "  - name: not-the-api\n    route:\n    - destination:\n        host: vllm.llm.svc.cluster.local\n", "/sleep"},
		{"an extra notPaths entry lets /collective_rpc through", "vllm/authorizationpolicy.yaml",
			"        - /health\n", "        - /health\n        - /collective_rpc\n", "/collective_rpc"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			objs := decodeFile(t, c.file)
			b := mustRead(t, c.file)
			if strings.Count(b, c.old) != 1 {
				t.Fatalf("%q not found once in %s", c.old, c.file)
			}
			bad, err := decodeYAML(c.file, []byte(strings.Replace(b, c.old, c.new, 1)))
			if err != nil {
				t.Fatal(err)
			}
			open := func(objs []object) bool {
				switch v := objs[0].Value.(type) {
				case *networkingv1.VirtualService:
					_, host := vsOutcome(t, v, c.path)
					return host != ""
				case *securityv1.AuthorizationPolicy:
					return authzAllows(t, v, c.path, 8000)
				}
				t.Fatalf("unexpected %T", objs[0].Value)
				return false
			}
			if open(objs) {
				t.Fatalf("the real %s already lets %s through", c.file, c.path)
			}
			if !open(bad) {
				t.Fatalf("the broken %s still refuses %s: the model misses the mistake", c.file, c.path)
			}
		})
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
