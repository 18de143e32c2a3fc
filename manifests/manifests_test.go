package manifests_test

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	wasmextv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/google/go-containerregistry/pkg/name"
	istionetworking "istio.io/api/networking/v1alpha3"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/shared/api"
)

// manifestFiles lists every YAML manifest under manifests/ (kustomization files aside).
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".yaml") && d.Name() != "kustomization.yaml" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d manifests: is the test running in manifests/?", len(files))
	}
	return files
}

// kustomizations lists the directories holding a kustomization.yaml, with its kind.
func kustomizations(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		js, err := yaml.YAMLToJSONStrict(b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		var k kusttypes.Kustomization
		if err := strictJSON(js, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if k.Kind != kusttypes.KustomizationKind && k.Kind != kusttypes.ComponentKind {
			return fmt.Errorf("%s: kind %q", path, k.Kind)
		}
		out[filepath.Dir(path)] = k.Kind
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func decodeFile(t *testing.T, path string) []object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeYAML(path, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", path)
	}
	return objs
}

// render builds a kustomization with kustomize's Go API and decodes the result strictly.
func render(t *testing.T, dir string) []object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []object
	for i, r := range m.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeObject(fmt.Sprintf("kustomize build %s, resource %d", dir, i), js)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// pluginConfigs returns every kvroute plugin configuration in objs, by source.
func pluginConfigs(t *testing.T, objs []object) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *extensionsv1alpha1.WasmPlugin:
			b, err := wasmPluginPluginConfig(&v.Spec)
			if err != nil {
				t.Fatalf("%s: %v", o.Source, err)
			}
			out[o.Source+" pluginConfig"] = b
		case *networkingv1alpha3.EnvoyFilter:
			for ecds, w := range wasmFilters(o) {
				b, err := wasmPluginConfig(w)
				if err != nil {
					t.Fatalf("%s: %v", o.Source, err)
				}
				out[o.Source+" "+ecds+" configuration"] = b
			}
		}
	}
	return out
}

func TestEveryManifestDecodesStrictly(t *testing.T) {
	kinds := map[string]int{}
	for _, f := range manifestFiles(t) {
		for _, o := range decodeFile(t, f) {
			kinds[o.Kind]++
		}
	}
	// Each of these is in the list; losing one would be a regression.
	for _, k := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "PodDisruptionBudget", "Secret", "WasmPlugin", "EnvoyFilter"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests", k)
		}
	}
}

func TestKustomizationsDecodeStrictly(t *testing.T) {
	ks := kustomizations(t)
	for _, dir := range []string{"base", "filter/ecds", "filter/wasmplugin", "filter/override-host", "filter/release", "vllm", "overlays/llm-clients", "overlays/llm-clients-canary"} {
		if ks[dir] == "" {
			t.Errorf("%s has no kustomization.yaml", dir)
		}
	}
}

// TestStrictDecodingCatchesMistakes proves the checks above can fail: each case breaks one
// field of a real manifest and expects decoding to reject it.
func TestStrictDecodingCatchesMistakes(t *testing.T) {
	cases := []struct {
		name, file, old, new, want string
	}{
		{"misspelt Envoy field in an Any, two levels down", "filter/override-host/envoyfilter.yaml",
			"override_host_sources:", "override_host_source:", "override_host_source"},
		{"misspelt Envoy field in a nested fallback policy", "filter/override-host/envoyfilter.yaml",
			"choice_count:", "choice_counts:", "choice_counts"},
		{"misspelt stop-iteration knob", "filter/ecds/envoyfilter.yaml",
			"            allow_on_headers_stop_iteration: true", "            allow_on_header_stop_iteration: true", "allow_on_header_stop_iteration"},
		{"unknown @type", "filter/ecds/envoyfilter.yaml",
			"\"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC", "\"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.Rbac", "Rbac"},
		{"Envoy validation rule (PGV): override_host without its required fallback", "filter/override-host/envoyfilter.yaml",
			"                fallback_policy:\n", dropBlock, "FallbackPolicy"},
		{"Envoy validation rule (PGV): least_request choice_count below 2", "filter/override-host/envoyfilter.yaml",
			"choice_count: 2", "choice_count: 1", "ChoiceCount"},
		{"Envoy validation rule (PGV): empty remote cluster", "filter/ecds/envoyfilter.yaml",
			"cluster: kvroute-wasm-fetch", `cluster: ""`, "Cluster"},
		{"misspelt EnvoyFilter field", "filter/ecds/envoyfilter.yaml",
			"workloadSelector:", "workloadSelecter:", "workloadSelecter"},
		{"snake_case name the CRD schema does not know", "filter/ecds/envoyfilter.yaml",
			"applyTo: EXTENSION_CONFIG", "apply_to: EXTENSION_CONFIG", "apply_to"},
		{"misspelt WasmPlugin field", "filter/wasmplugin/wasmplugin.yaml",
			"failStrategy:", "failureStrategy:", "failureStrategy"},
		{"bad WasmPlugin enum", "filter/wasmplugin/wasmplugin.yaml",
			"failStrategy: FAIL_OPEN", "failStrategy: FAIL_OPENED", "FAIL_OPENED"},
		{"misspelt Deployment field", "base/deployment.yaml",
			"readOnlyRootFilesystem:", "readOnlyRootFileSystem:", "readOnlyRootFileSystem"},
		{"wrongly cased Deployment field (the API server is case-sensitive)", "base/deployment.yaml",
			"revisionHistoryLimit:", "RevisionHistoryLimit:", "RevisionHistoryLimit"},
		{"duplicate key", "base/service.yaml",
			"  selector:\n", "  selector:\n    app: x\n  selector:\n", "selector"},
		{"misspelt PDB field", "base/pdb.yaml",
			"minAvailable:", "minAvaliable:", "minAvaliable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeYAML(c.file, b); err != nil {
				t.Fatalf("the unmodified file must decode: %v", err)
			}
			if strings.Count(string(b), c.old) != 1 {
				t.Fatalf("%q occurs %d times in %s, want once", c.old, strings.Count(string(b), c.old), c.file)
			}
			var bad string
			if c.new == dropBlock {
				bad = dropYAMLBlock(string(b), c.old)
			} else {
				bad = strings.Replace(string(b), c.old, c.new, 1)
			}
			_, err = decodeYAML(c.file, []byte(bad))
			if err == nil {
				t.Fatalf("decoding accepted %s with %q", c.file, c.new)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not mention %q: %v", c.want, err)
			}
			t.Log(err)
		})
	}
}

// dropBlock as a replacement removes the line and everything indented below it.
const dropBlock = "<drop the block>"

func dropYAMLBlock(text, first string) string {
	i := strings.Index(text, first)
	indent := len(first) - len(strings.TrimLeft(first, " "))
	rest := text[i+len(first):]
	for rest != "" {
		line, after, _ := strings.Cut(rest, "\n")
		if strings.TrimSpace(line) != "" && len(line)-len(strings.TrimLeft(line, " ")) <= indent {
			break
		}
		rest = after
	}
	return text[:i] + rest
}

func TestPluginConfigsAreAccepted(t *testing.T) {
	var all []object
	for _, f := range manifestFiles(t) {
		all = append(all, decodeFile(t, f)...)
	}
	for dir, kind := range kustomizations(t) {
		if kind == kusttypes.KustomizationKind {
			all = append(all, render(t, dir)...)
		}
	}
	cfgs := pluginConfigs(t, all)
	if len(cfgs) < 4 {
		t.Fatalf("found %d plugin configs, want the WasmPlugin's and the EnvoyFilters' (raw and rendered)", len(cfgs))
	}
	var first *api.Config
	var firstSrc string
	for src, b := range cfgs {
		c, err := api.ParseConfig(b)
		if err != nil {
			t.Errorf("%s: api.ParseConfig: %v\n%s", src, err, b)
			continue
		}
		// Both forms and every overlay carry the same configuration.
		if first == nil {
			first, firstSrc = &c, src
		} else if !reflect.DeepEqual(*first, c) {
			t.Errorf("%s and %s configure the filter differently:\n%+v\n%+v", firstSrc, src, *first, c)
		}
	}
}

// TestOverlaysRender builds every kustomization and checks what only a render shows: the
// release values are stamped in, local-config objects are gone, names stay unique.
func TestOverlaysRender(t *testing.T) {
	for dir, kind := range kustomizations(t) {
		if kind != kusttypes.KustomizationKind {
			continue
		}
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			seen := map[string]bool{}
			for _, o := range objs {
				id := o.Kind + " " + o.Namespace + "/" + o.Name
				if seen[id] {
					t.Errorf("%s twice", id)
				}
				seen[id] = true
				if o.Namespace == "" && o.Kind != "Namespace" {
					t.Errorf("%s has no namespace", id)
				}
				if o.Kind == "ConfigMap" {
					t.Errorf("%s: a release file leaked into the output (it must be local-config)", id)
				}
				checkFilterResource(t, o)
			}
		})
	}
}

// checkFilterResource checks a rendered WasmPlugin or kvroute EnvoyFilter.
func checkFilterResource(t *testing.T, o object) {
	t.Helper()
	checkImage := func(url, sum string) {
		t.Helper()
		if !strings.HasPrefix(url, "oci://") {
			t.Errorf("%s: url %q is not oci://", o.Source, url)
		} else if _, err := name.NewTag(strings.TrimPrefix(url, "oci://"), name.StrictValidation); err != nil {
			t.Errorf("%s: url %q: %v", o.Source, url, err)
		}
		if !hex64.MatchString(sum) || sum == strings.Repeat("0", 64) {
			t.Errorf("%s: sha256 %q is not a pinned image digest (run make oci with OCI_PIN)", o.Source, sum)
		}
	}
	switch v := o.Value.(type) {
	case *extensionsv1alpha1.WasmPlugin:
		s := &v.Spec
		checkImage(s.GetUrl(), s.GetSha256())
		if s.GetFailStrategy().String() != "FAIL_OPEN" {
			t.Errorf("%s: failStrategy %s, want FAIL_OPEN", o.Source, s.GetFailStrategy())
		}
		if len(s.GetSelector().GetMatchLabels()) == 0 || len(s.GetMatch()) == 0 {
			t.Errorf("%s: want a label selector and a port match", o.Source)
		}
	case *networkingv1alpha3.EnvoyFilter:
		wasm := wasmFilters(o)
		for ecds, w := range wasm {
			c := w.GetConfig()
			r := c.GetVmConfig().GetCode().GetRemote()
			checkImage(r.GetHttpUri().GetUri(), r.GetSha256())
			if !c.GetAllowOnHeadersStopIteration().GetValue() {
				t.Errorf("%s %s: allow_on_headers_stop_iteration must be true (requests hang without it)", o.Source, ecds)
			}
			// Fail open through failure_policy alone: Envoy >= 1.33 refuses the config when
			// fail_open is set too (rule envoy/wasm-fail-open-xor-failure-policy), and
			// istio-agent >= 1.25 reads failure_policy first (agent/fail-open-effective).
			//lint:ignore SA1019 checking the deprecated field is unset
			if c.GetFailurePolicy() != wasmextv3.FailurePolicy_FAIL_OPEN || c.GetFailOpen() {
				t.Errorf("%s %s: want failure_policy FAIL_OPEN and no fail_open", o.Source, ecds)
			}
		}
		// Every ECDS HTTP filter refers to an extension config of the same object, sits
		// before the router, and falls back to a do-nothing default.
		for _, p := range o.Patches {
			hf, ok := p.Value.(*hcmv3.HttpFilter)
			if !ok || hf.GetConfigDiscovery() == nil {
				continue
			}
			if wasm[hf.GetName()] == nil {
				t.Errorf("%s: HTTP filter %q has no EXTENSION_CONFIG of that name", o.Source, hf.GetName())
			}
			sub := p.Patch.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName()
			if p.Patch.GetPatch().GetOperation() != istionetworking.EnvoyFilter_Patch_INSERT_BEFORE || sub != "envoy.filters.http.router" {
				t.Errorf("%s: %q must be inserted before envoy.filters.http.router", o.Source, hf.GetName())
			}
			cd := hf.GetConfigDiscovery()
			if !cd.GetApplyDefaultConfigWithoutWarming() || !slices.Contains(cd.GetTypeUrls(), cd.GetDefaultConfig().GetTypeUrl()) {
				t.Errorf("%s: %q needs a default config among its type_urls, applied without warming", o.Source, hf.GetName())
			}
		}
	}
}

// TestCanaryIsSeparate: the canary overlay adds a second filter for another label value,
// with its own ECDS name, next to the stable one.
func TestCanaryIsSeparate(t *testing.T) {
	selectors := map[string]string{} // ECDS name -> kvroute.io/filter value
	for _, o := range render(t, "overlays/llm-clients-canary") {
		ef, ok := o.Value.(*networkingv1alpha3.EnvoyFilter)
		if !ok {
			continue
		}
		for ecds := range wasmFilters(o) {
			if _, dup := selectors[ecds]; dup {
				t.Errorf("ECDS name %q used twice", ecds)
			}
			selectors[ecds] = ef.Spec.GetWorkloadSelector().GetLabels()["kvroute.io/filter"]
		}
	}
	want := map[string]string{"kvroute": "enabled", "kvroute-canary": "canary"}
	if !reflect.DeepEqual(selectors, want) {
		t.Fatalf("ECDS filters by label: %v, want %v", selectors, want)
	}
}

// TestControlPlaneHasReplicas: two replicas that roll one at a time with the new one ready
// first and serving minReadySeconds before the next goes, a budget that keeps one up,
// spread over nodes and zones, the warm-up that makes a restarted replica useful, and the
// DestinationRule on the control plane's Service that keeps each proxy on one replica.
func TestControlPlaneHasReplicas(t *testing.T) {
	base := render(t, "base")
	var (
		dep *appsv1.Deployment
		pdb *policyv1.PodDisruptionBudget
		dr  *networkingv1.DestinationRule
		svc *corev1.Service
	)
	for _, o := range base {
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			dep = v
		case *policyv1.PodDisruptionBudget:
			pdb = v
		case *networkingv1.DestinationRule:
			dr = v
		case *corev1.Service:
			svc = v
		}
	}
	if dep == nil || pdb == nil || dr == nil || svc == nil {
		t.Fatal("want the control plane's Deployment, PodDisruptionBudget, DestinationRule and Service")
	}
	ru := dep.Spec.Strategy.RollingUpdate
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 || ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("want 2 replicas rolled with maxSurge 1, maxUnavailable 0: %v %+v", dep.Spec.Replicas, ru)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("want a PodDisruptionBudget with minAvailable 1: %+v", pdb.Spec)
	}
	keys := map[string]bool{}
	for _, c := range dep.Spec.Template.Spec.TopologySpreadConstraints {
		keys[c.TopologyKey] = c.LabelSelector != nil && reflect.DeepEqual(c.LabelSelector.MatchLabels, dep.Spec.Selector.MatchLabels)
	}
	if !keys["kubernetes.io/hostname"] || !keys["topology.kubernetes.io/zone"] {
		t.Errorf("want the replicas spread over nodes and zones: %v", keys)
	}
	args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	if dep.Spec.MinReadySeconds == 0 || !strings.Contains(args, "--warm-up=") {
		t.Errorf("want minReadySeconds and --warm-up: %d, %s", dep.Spec.MinReadySeconds, args)
	}
	if host := svc.Name + "." + svc.Namespace + ".svc.cluster.local"; dr.Spec.Host != host {
		t.Errorf("DestinationRule host %q, want the control plane's Service %q", dr.Spec.Host, host)
	}
	lb := dr.Spec.TrafficPolicy.GetLoadBalancer().GetConsistentHash()
	od := dr.Spec.TrafficPolicy.GetOutlierDetection()
	if lb == nil || !lb.GetUseSourceIp() || od == nil || od.GetConsecutiveGatewayErrors().GetValue() != 1 {
		t.Errorf("want each proxy kept on one replica until it fails a call: %v", dr.Spec.TrafficPolicy)
	}
}

// TestManifestsAgree checks the values that must match across objects: a mismatch here is
// a silent failure in a cluster (a filter polling a cluster that does not exist, a token
// the control plane refuses, an endpoint header nobody reads, discovery finding nothing).
func TestManifestsAgree(t *testing.T) {
	checkAgree(t, render(t, "base"), render(t, "overlays/llm-clients"), render(t, "vllm"), render(t, "filter/wasmplugin"))
}

// checkAgree is TestManifestsAgree on rendered objects: the control plane (base), a client
// overlay, the model namespace (vllm) and a WasmPlugin form.
func checkAgree(t *testing.T, base, clients, vllm, wasmPlugin []object) {
	t.Helper()
	find := func(objs []object, kind, name string) object {
		t.Helper()
		for _, o := range objs {
			if o.Kind == kind && (o.Name == name || name == "") {
				return o
			}
		}
		t.Fatalf("no %s %s", kind, name)
		return object{}
	}

	cpSvcObj := find(base, "Service", "kvroute-controlplane")
	cpSvc := cpSvcObj.Value.(*corev1.Service)
	cpDep := find(base, "Deployment", "kvroute-controlplane").Value.(*appsv1.Deployment)
	secret := find(base, "Secret", "kvroute-controlplane-auth").Value.(*corev1.Secret)
	modelSvcObj := find(vllm, "Service", "") // the example's only Service, named by ../settings
	modelSvc := modelSvcObj.Value.(*corev1.Service)
	modelDep := find(vllm, "Deployment", "vllm-llama-3-1-8b-instruct").Value.(*appsv1.Deployment)
	role := find(base, "Role", "kvroute-controlplane-discovery")
	binding := find(base, "RoleBinding", "kvroute-controlplane-discovery").Value.(*rbacv1.RoleBinding)

	cpFQDN := cpSvc.Name + "." + cpSvc.Namespace + ".svc.cluster.local"
	cpPort := cpSvc.Spec.Ports[0]
	wantCluster := fmt.Sprintf("outbound|%d||%s", cpPort.Port, cpFQDN)
	modelFQDN := modelSvc.Name + "." + modelSvc.Namespace + ".svc.cluster.local"
	modelPort := modelSvc.Spec.Ports[0]

	// The filter's plugin config points at the control plane's Service with its token.
	for src, b := range pluginConfigs(t, append(clients, wasmPlugin...)) {
		c, err := api.ParseConfig(b)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if c.ControlPlane.Cluster != wantCluster {
			t.Errorf("%s: control_plane.cluster %q, want %q", src, c.ControlPlane.Cluster, wantCluster)
		}
		if h, _, err := net.SplitHostPort(c.ControlPlane.Authority); err != nil || h != cpFQDN {
			t.Errorf("%s: control_plane.authority %q, want %s:<port>", src, c.ControlPlane.Authority, cpFQDN)
		}
		if c.ControlPlane.Token != secret.StringData["token"] {
			t.Errorf("%s: control_plane.token differs from Secret %s's token", src, secret.Name)
		}
		// The override_host policy reads the header the filter writes.
		for _, o := range clients {
			for _, p := range o.Patches {
				cl, ok := p.Value.(*clusterv3.Cluster)
				if !ok {
					continue
				}
				if got := overrideHeader(t, cl); got != c.EndpointHeader {
					t.Errorf("%s: override_host reads %q, the filter writes %q", o.Source, got, c.EndpointHeader)
				}
				m := p.Patch.GetMatch().GetCluster()
				if m.GetService() != modelFQDN || m.GetPortNumber() != uint32(modelPort.Port) {
					t.Errorf("%s: cluster match %s:%d, want the model Service %s:%d", o.Source, m.GetService(), m.GetPortNumber(), modelFQDN, modelPort.Port)
				}
			}
		}
	}

	// Retries from the client namespace move on after a refused or reset connection (a
	// killed engine), on the model Service's port, and stay in that namespace.
	retries := find(clients, "VirtualService", "kvroute-model-retries").Value.(*networkingv1.VirtualService)
	if !reflect.DeepEqual(retries.Spec.GetHosts(), []string{modelFQDN}) || !reflect.DeepEqual(retries.Spec.GetExportTo(), []string{"."}) {
		t.Errorf("retries VirtualService: hosts %v exportTo %v, want [%s] and [.]", retries.Spec.GetHosts(), retries.Spec.GetExportTo(), modelFQDN)
	}
	for _, h := range retries.Spec.GetHttp() {
		if h.GetDirectResponse() != nil {
			continue // answered by the sidecar (modelroutes_test.go)
		}
		for _, d := range h.GetRoute() {
			if d.GetDestination().GetHost() != modelFQDN || d.GetDestination().GetPort().GetNumber() != uint32(modelPort.Port) {
				t.Errorf("retries VirtualService routes to %s:%d, want the model Service", d.GetDestination().GetHost(), d.GetDestination().GetPort().GetNumber())
			}
		}
		on := strings.Split(h.GetRetries().GetRetryOn(), ",")
		if h.GetRetries().GetAttempts() < 2 || !slices.Contains(on, "connect-failure") || !slices.Contains(on, "reset") {
			t.Errorf("retries %v: want at least 2 attempts on connect-failure and reset", h.GetRetries())
		}
		if h.GetTimeout() != nil || h.GetRetries().GetPerTryTimeout() != nil {
			t.Errorf("retries VirtualService must not time out completions")
		}
	}

	// The filter sits on the model Service's port in both forms.
	for _, o := range append(clients, wasmPlugin...) {
		switch v := o.Value.(type) {
		case *networkingv1alpha3.EnvoyFilter:
			for _, p := range o.Patches {
				if l := p.Patch.GetMatch().GetListener(); l != nil && l.GetPortNumber() != uint32(modelPort.Port) {
					t.Errorf("%s: listener port %d, want the model port %d", o.Source, l.GetPortNumber(), modelPort.Port)
				}
			}
		case *extensionsv1alpha1.WasmPlugin:
			for _, m := range v.Spec.GetMatch() {
				for _, p := range m.GetPorts() {
					if p.GetNumber() != uint32(modelPort.Port) {
						t.Errorf("%s: match port %d, want the model port %d", o.Source, p.GetNumber(), modelPort.Port)
					}
				}
			}
		}
	}

	// The control plane's flags agree with its Service, its RBAC and the model Service.
	c := cpDep.Spec.Template.Spec.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[k] = v
	}
	if _, port, _ := net.SplitHostPort(flags["listen"]); port != strconv.Itoa(int(c.Ports[0].ContainerPort)) || cpPort.TargetPort.StrVal != c.Ports[0].Name {
		t.Errorf("--listen=%s, container port %d %q, Service targetPort %v do not line up", flags["listen"], c.Ports[0].ContainerPort, c.Ports[0].Name, cpPort.TargetPort)
	}
	if h, _, _ := net.SplitHostPort(flags["listen"]); h != "0.0.0.0" {
		t.Errorf("--listen=%s: the default (127.0.0.1) is unreachable from other pods", flags["listen"])
	}
	if flags["k8s-namespace"] != modelSvc.Namespace || role.Namespace != modelSvc.Namespace || binding.Namespace != modelSvc.Namespace {
		t.Errorf("--k8s-namespace=%s, Role in %s, RoleBinding in %s, model Service in %s", flags["k8s-namespace"], role.Namespace, binding.Namespace, modelSvc.Namespace)
	}
	if s := binding.Subjects[0]; s.Name != cpDep.Spec.Template.Spec.ServiceAccountName || s.Namespace != cpDep.Namespace {
		t.Errorf("RoleBinding subject %s/%s is not the control plane's ServiceAccount", s.Namespace, s.Name)
	}
	if _, ok := modelSvc.Labels[flags["k8s-selector"]]; !ok {
		t.Errorf("model Service lacks label %q that --k8s-selector selects", flags["k8s-selector"])
	}
	if flags["k8s-port-name"] != modelPort.Name {
		t.Errorf("--k8s-port-name=%s, model Service port is named %q", flags["k8s-port-name"], modelPort.Name)
	}
	tokenMount := ""
	for _, m := range c.VolumeMounts {
		tokenMount = m.MountPath + "/token"
	}
	if flags["token-file"] != tokenMount {
		t.Errorf("--token-file=%s, the Secret is mounted at %s", flags["token-file"], tokenMount)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("probes must be HTTP on the http port")
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("readiness on /readyz and liveness on /healthz, got %s and %s", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
	sc := c.SecurityContext
	if !*cpDep.Spec.Template.Spec.SecurityContext.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("the control plane must run as non-root, read-only, without privilege escalation or capabilities")
	}

	// The engine's own flags and annotations match what discovery and the filter expect.
	vc := modelDep.Spec.Template.Spec.Containers[0]
	args := strings.Join(vc.Args, " ")
	for _, want := range []string{"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-force-include-usage", `"publisher":"zmq"`, `"endpoint":"tcp://*:5557"`, `"topic":"kv@$(POD_IP)@`} {
		if !strings.Contains(args, want) {
			t.Errorf("vLLM args lack %s", want)
		}
	}
	if !slices.ContainsFunc(vc.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" }) {
		t.Errorf("vLLM topic uses $(POD_IP) but the container has no POD_IP env")
	}
	if _, ok := modelDep.Spec.Template.Labels[flags["k8s-selector"]]; ok {
		t.Errorf("pod label %s would override the served model name (annotations come first)", flags["k8s-selector"])
	}
	if modelDep.Spec.Template.Annotations["kvroute.io/model"] != modelSvc.Annotations["kvroute.io/model"] {
		t.Errorf("pod and Service disagree on the served model name")
	}
}

// overrideHeader returns the request header an override_host policy reads.
func overrideHeader(t *testing.T, cl *clusterv3.Cluster) string {
	t.Helper()
	pol := cl.GetLoadBalancingPolicy().GetPolicies()
	if len(pol) == 0 {
		t.Fatalf("cluster patch without load_balancing_policy")
	}
	oh := &overridehostv3.OverrideHost{}
	if err := pol[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(oh); err != nil {
		t.Fatalf("first load balancing policy is not override_host: %v", err)
	}
	fb := oh.GetFallbackPolicy().GetPolicies()
	if len(fb) == 0 || fb[0].GetTypedExtensionConfig().GetName() != "envoy.load_balancing_policies.least_request" {
		t.Errorf("override_host must fall back to least_request")
	}
	if len(oh.GetOverrideHostSources()) != 1 {
		t.Fatalf("want one override host source")
	}
	return oh.GetOverrideHostSources()[0].GetHeader()
}

// TestDockerfileMatchesDeployment: the image's user is the one the Deployment requires, and
// it builds the control plane's real main package.
func TestDockerfileMatchesDeployment(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	dep := decodeFile(t, "base/deployment.yaml")[0].Value.(*appsv1.Deployment)
	uid := *dep.Spec.Template.Spec.SecurityContext.RunAsUser
	if !strings.Contains(df, fmt.Sprintf("\nUSER %d:%d\n", uid, uid)) || !strings.Contains(df, ":nonroot\n") {
		t.Errorf("Dockerfile must run as the distroless nonroot user %d, as the Deployment does", uid)
	}
	const pkg = "./controlplane/cmd/kvroute-controlplane"
	if !strings.Contains(df, pkg) {
		t.Fatalf("Dockerfile does not build %s", pkg)
	}
	if _, err := os.Stat(filepath.Join("..", pkg, "main.go")); err != nil {
		t.Errorf("Dockerfile builds %s: %v", pkg, err)
	}
}
