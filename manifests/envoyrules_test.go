package manifests_test

// Holds every manifest, raw and rendered, to the rules in enforcedrules_test.go: what
// Envoy, istiod and istio-agent enforce beyond the proto. Typed decoding accepted the ECDS
// config that set both fail_open and failure_policy, which Envoy >= 1.33 refuses in the
// Wasm PluginConfig constructor ("only one of fail_open or failure_policy can be set"),
// leaving the placeholder RBAC filter in place: kvroute never ran.
//
// Checked before the fix: with manifests/filter/ecds/envoyfilter.yaml as of the commit
// before this test (`git show HEAD:manifests/filter/ecds/envoyfilter.yaml`, fail_open:
// true next to failure_policy: FAIL_OPEN), TestEnforcedRulesHoldForEveryManifest failed on
// the raw file and on every rendered overlay with rule
// envoy/wasm-fail-open-xor-failure-policy. The case "fail_open next to failure_policy"
// below keeps that config failing.

import (
	"os"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	"google.golang.org/protobuf/types/known/anypb"
	kusttypes "sigs.k8s.io/kustomize/api/types"
)

// allObjects is every manifest file and every rendered kustomization, decoded strictly.
func allObjects(t *testing.T) []object {
	t.Helper()
	var all []object
	for _, f := range manifestFiles(t) {
		all = append(all, decodeFile(t, f)...)
	}
	for dir, kind := range kustomizations(t) {
		if kind == kusttypes.KustomizationKind {
			all = append(all, render(t, dir)...)
		}
	}
	return all
}

func TestEnforcedRulesHoldForEveryManifest(t *testing.T) {
	kinds := map[string]int{}
	for _, o := range allObjects(t) {
		kinds[o.Kind]++
		if err := checkEnforcedRules(o); err != nil {
			t.Error(err)
		}
	}
	// The rules must have had something to check.
	for _, k := range []string{"EnvoyFilter", "WasmPlugin", "VirtualService", "AuthorizationPolicy"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests: the rules for it checked nothing", k)
		}
	}
}

// envBlock adds vm_config.environment_variables to the ECDS Wasm config.
func envBlock(lines ...string) string {
	return "              runtime: envoy.wasm.runtime.v8\n              environment_variables:\n" + strings.Join(lines, "")
}

const ecdsRuntime = "              runtime: envoy.wasm.runtime.v8\n"

// TestEnforcedRulesRejectBrokenConfigs proves every rule: each case breaks a real manifest
// the way the rule forbids (by text, or on the decoded proto where protoc-gen-validate
// would already refuse the text) and expects that rule to name it.
func TestEnforcedRulesRejectBrokenConfigs(t *testing.T) {
	const ecds, wp, vs = "filter/ecds/envoyfilter.yaml", "filter/wasmplugin/wasmplugin.yaml", "filter/override-host/virtualservice.yaml"
	cases := []struct {
		name, rule, file, old, new string
		mutate                     func(*wasmv3.Wasm) // instead of old/new: edits the decoded ECDS Wasm config
	}{
		{name: "fail_open next to failure_policy (the config Envoy refused)", rule: "envoy/wasm-fail-open-xor-failure-policy", file: ecds,
			old: "            failure_policy: FAIL_OPEN\n", new: "            fail_open: true\n            failure_policy: FAIL_OPEN\n"},
		{name: "failure_policy number Envoy does not know", rule: "envoy/wasm-failure-policy-known", file: ecds,
			old: "failure_policy: FAIL_OPEN", new: "failure_policy: 9"},
		{name: "Wasm runtime missing from official builds", rule: "envoy/wasm-runtime-in-official-build", file: ecds,
			old: "runtime: envoy.wasm.runtime.v8", new: "runtime: envoy.wasm.runtime.wasmtime"},
		{name: "Wasm runtime Envoy has no factory for", rule: "envoy/wasm-runtime-in-official-build", file: ecds,
			old: "runtime: envoy.wasm.runtime.v8", new: "runtime: envoy.wasm.runtime.v9"},
		{name: "environment variables on the null VM", rule: "envoy/wasm-nullvm-without-env", file: ecds,
			old: ecdsRuntime, new: "              runtime: envoy.wasm.runtime.null\n              environment_variables:\n                key_values:\n                  LOG: debug\n"},
		{name: "environment variable both inline and from the host", rule: "envoy/wasm-env-keys-unique", file: ecds,
			old: ecdsRuntime, new: envBlock("                key_values:\n                  HOME: /x\n", "                host_env_keys:\n                - HOME\n")},
		{name: "remote code without sha256", rule: "envoy/wasm-remote-source-complete", file: ecds,
			mutate: func(w *wasmv3.Wasm) { w.GetConfig().GetVmConfig().GetCode().GetRemote().Sha256 = "" }},
		{name: "remote code without a fetch timeout", rule: "envoy/wasm-remote-source-complete", file: ecds,
			mutate: func(w *wasmv3.Wasm) { w.GetConfig().GetVmConfig().GetCode().GetRemote().GetHttpUri().Timeout = nil }},
		{name: "remote code without a fetch cluster", rule: "envoy/wasm-remote-source-complete", file: ecds,
			mutate: func(w *wasmv3.Wasm) {
				w.GetConfig().GetVmConfig().GetCode().GetRemote().GetHttpUri().HttpUpstreamType = nil
			}},
		{name: "default applied without warming but absent", rule: "envoy/ecds-default-when-not-warming", file: ecds,
			old: "          default_config:\n            \"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC\n", new: ""},
		{name: "default config type missing from type_urls", rule: "envoy/ecds-default-type-listed", file: ecds,
			old: "          - type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC\n", new: ""},
		{name: "type_urls naming a network filter", rule: "envoy/ecds-type-urls-are-http-filters", file: ecds,
			old: "          - type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n",
			new: "          - type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n          - type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC\n"},
		{name: "served Wasm type missing from type_urls", rule: "envoy/ecds-resource-type-listed", file: ecds,
			old: "          - type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n", new: ""},
		{name: "default RBAC with empty rules denies everything", rule: "envoy/ecds-default-allows", file: ecds,
			old: "            \"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC\n",
			new: "            \"@type\": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC\n            rules: {}\n"},
		{name: "remote code without http_uri", rule: "agent/remote-needs-http-uri", file: ecds,
			mutate: func(w *wasmv3.Wasm) { w.GetConfig().GetVmConfig().GetCode().GetRemote().HttpUri = nil }},
		{name: "module URL scheme istio-agent cannot fetch", rule: "agent/remote-url-scheme", file: ecds,
			old: "uri: oci://set-by-manifests-filter-release", new: "uri: s3://set-by-manifests-filter-release"},
		{name: "sha256 \"nil\" accepts any module", rule: "agent/sha256-pins-the-module", file: ecds,
			old: `sha256: "0000000000000000000000000000000000000000000000000000000000000000"`, new: `sha256: "nil"`},
		{name: "empty image pull secret", rule: "agent/pull-secret-not-empty", file: ecds,
			old: ecdsRuntime, new: envBlock("                key_values:\n                  ISTIO_META_WASM_IMAGE_PULL_SECRET: \"\"\n")},
		{name: "image pull policy istio-agent ignores", rule: "agent/pull-policy-known", file: ecds,
			old: ecdsRuntime, new: envBlock("                key_values:\n                  ISTIO_META_WASM_IMAGE_PULL_POLICY: Sometimes\n")},
		{name: "ISTIO_META_ variable the module would never see", rule: "agent/istio-meta-env-known", file: ecds,
			old: ecdsRuntime, new: envBlock("                key_values:\n                  ISTIO_META_KVROUTE_TOKEN: secret\n")},
		{name: "fail-closed filter: a failed pull denies all requests", rule: "agent/fail-open-effective", file: ecds,
			old: "failure_policy: FAIL_OPEN", new: "failure_policy: FAIL_CLOSED"},
		{name: "EXTENSION_CONFIG patched with MERGE", rule: "istiod/extension-config-add-only", file: ecds,
			old: "  - applyTo: EXTENSION_CONFIG\n    patch:\n      operation: ADD\n", new: "  - applyTo: EXTENSION_CONFIG\n    patch:\n      operation: MERGE\n"},
		{name: "HTTP filter discovering a name no EXTENSION_CONFIG serves", rule: "istiod/extension-config-referenced", file: ecds,
			old: "        name: kvroute\n        config_discovery:\n", new: "        name: kvroute-typo\n        config_discovery:\n"},
		{name: "subFilter under a filter that is not the HCM", rule: "istiod/subfilter-needs-hcm", file: ecds,
			old: "name: envoy.filters.network.http_connection_manager\n            subFilter:",
			new: "name: envoy.filters.network.tcp_proxy\n            subFilter:"},
		{name: "WasmPlugin sha256 that is not a hex digest", rule: "istiod/wasmplugin-valid", file: wp,
			old: `sha256: "0000000000000000000000000000000000000000000000000000000000000000"`, new: `sha256: "sha256:00"`},
		{name: "WasmPlugin url scheme istiod refuses", rule: "istiod/wasmplugin-valid", file: wp,
			old: "url: oci://set-by-manifests-filter-release", new: "url: ftp://set-by-manifests-filter-release"},
		{name: "VirtualService route with both a destination and a direct response", rule: "istiod/virtualservice-one-action", file: vs,
			old: "    directResponse:\n      status: 404\n", new: "    directResponse:\n      status: 404\n    route:\n    - destination:\n        host: vllm.llm.svc.cluster.local\n"},
		{name: "VirtualService direct response with an invalid status", rule: "istiod/virtualservice-direct-response-status", file: vs,
			old: "      status: 404\n", new: "      status: 700\n"},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.rule] = true
		t.Run(c.name, func(t *testing.T) {
			b, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			good, err := decodeYAML(c.file, b)
			if err != nil {
				t.Fatalf("the unmodified file must decode: %v", err)
			}
			for _, o := range good {
				if err := checkEnforcedRules(o); err != nil {
					t.Fatalf("the unmodified file must pass: %v", err)
				}
			}
			var bad []object
			if c.mutate != nil {
				bad = good
				mutated := 0
				for i := range bad {
					mutated += mutateWasm(t, &bad[i], c.mutate)
				}
				if mutated == 0 {
					t.Fatalf("%s has no Wasm config to break", c.file)
				}
			} else {
				if n := strings.Count(string(b), c.old); n != 1 {
					t.Fatalf("%q occurs %d times in %s, want once", c.old, n, c.file)
				}
				bad, err = decodeYAML(c.file, []byte(strings.Replace(string(b), c.old, c.new, 1)))
				if err != nil {
					t.Fatalf("the broken copy must still decode (the rule, not the proto, must catch it): %v", err)
				}
			}
			var errs []string
			for _, o := range bad {
				if err := checkEnforcedRules(o); err != nil {
					errs = append(errs, err.Error())
				}
			}
			all := strings.Join(errs, "\n")
			if !strings.Contains(all, "rule "+c.rule+" ") {
				t.Fatalf("rule %s did not reject the broken copy; errors: %q", c.rule, all)
			}
			t.Log(all)
		})
	}
	for _, r := range enforcedRules {
		if !covered[r.ID] {
			t.Errorf("rule %s has no negative case", r.ID)
		}
		if r.Source == "" {
			t.Errorf("rule %s cites no source", r.ID)
		}
	}
}

// mutateWasm applies f to each ECDS Wasm config of o, packing the result back into its
// EXTENSION_CONFIG; it returns how many it changed.
func mutateWasm(t *testing.T, o *object, f func(*wasmv3.Wasm)) int {
	t.Helper()
	n := 0
	for _, p := range o.Patches {
		ec, ok := p.Value.(*corev3.TypedExtensionConfig)
		if !ok {
			continue
		}
		w := &wasmv3.Wasm{}
		if !ec.GetTypedConfig().MessageIs(w) {
			continue
		}
		if err := ec.GetTypedConfig().UnmarshalTo(w); err != nil {
			t.Fatal(err)
		}
		f(w)
		a, err := anypb.New(w)
		if err != nil {
			t.Fatal(err)
		}
		ec.TypedConfig = a
		n++
	}
	return n
}
