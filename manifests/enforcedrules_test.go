package manifests_test

// Rules that Envoy, istiod and istio-agent enforce on the configs these manifests render,
// BEYOND what proto decoding and protoc-gen-validate (strict_test.go) can see: checks in
// C++ constructors, in Envoy's ECDS machinery, and in Istio's Go code. Each rule names
// where it is enforced upstream; envoyrules_test.go runs them over every manifest and
// rendered kustomization, and proves each one with a broken copy of a real manifest.
//
// Sources, read for this file:
//   - envoyproxy/envoy (too large to fetch; read through the code index): the Wasm
//     PluginConfig constructor (PR #36456, first released in v1.33.0 per
//     changelogs/1.33.0.yaml "Added the Wasm VM reload support ... failure_policy");
//     source/common/filter/config_discovery_impl.cc at 040783c8c0b423531a51d33f2d4765ca3de0d96e;
//     source/common/http/filter_chain_helper.h processDynamicFilterConfig;
//     source/extensions/common/wasm/plugin.cc WasmConfig::WasmConfig;
//     source/extensions/common/wasm/wasm_vm.cc createWasmVm at 049a148308475d1a1f95a582be990e4f675c8e3b.
//   - Envoy's API as vendored by github.com/envoyproxy/go-control-plane/envoy v1.40.0 (go.mod):
//     api/envoy/extensions/wasm/v3/wasm.proto, api/envoy/config/core/v3/base.proto,
//     http_uri.proto, extension.proto, api/envoy/extensions/filters/http/rbac/v3/rbac.proto.
//   - istio/istio, fetched at master 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c; the files
//     cited from pkg/wasm, pkg/model/wasm.go and pilot/pkg/networking/core/envoyfilter are
//     identical at tags 1.28.0 (b8d1df54465060428c2a2a38286e360beb85fb31) and 1.30.0
//     (badd809ed7d57954d4c16e12e75e15a7722a7b96).

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbachttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmextv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/reflect/protoregistry"
	istionetworking "istio.io/api/networking/v1alpha3"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
)

// enforcedRule is one check an upstream component applies where a proto decoder cannot see it.
type enforcedRule struct {
	ID     string // named in errors and in the negative test of the rule
	Source string // repository, file, commit or release, function
	Check  func(o object) []error
}

// checkEnforcedRules runs every rule on o; each error names its rule and source.
func checkEnforcedRules(o object) error {
	var errs []error
	for _, r := range enforcedRules {
		for _, err := range r.Check(o) {
			errs = append(errs, fmt.Errorf("%s: rule %s (%s): %w", o.Source, r.ID, r.Source, err))
		}
	}
	return errors.Join(errs...)
}

const (
	srcEnvoyPluginConfig = "envoyproxy/envoy source/extensions/common/wasm/wasm.cc PluginConfig::PluginConfig, PR #36456, v1.33.0 and later"
	srcEnvoyWasmConfig   = "envoyproxy/envoy source/extensions/common/wasm/plugin.cc WasmConfig::WasmConfig"
	srcEnvoyRuntime      = "envoyproxy/envoy api/envoy/extensions/wasm/v3/wasm.proto VmConfig.runtime (go-control-plane v1.40.0) and source/extensions/common/wasm/wasm_vm.cc createWasmVm @049a1483"
	srcEnvoyRemotePGV    = "envoyproxy/envoy api/envoy/config/core/v3/base.proto RemoteDataSource (sha256 min_len 1) and http_uri.proto HttpUri (cluster min_len 1, timeout required), go-control-plane v1.40.0"
	srcEnvoyWarming      = "envoyproxy/envoy source/common/http/filter_chain_helper.h processDynamicFilterConfig and source/common/filter/config_discovery_impl.cc validateConfigSource"
	srcEnvoyTypeURL      = "envoyproxy/envoy source/common/filter/config_discovery_impl.cc @040783c8 validateTypeUrlHelper via validateProtoConfigTypeUrl"
	srcEnvoyUpdateType   = "envoyproxy/envoy source/common/filter/config_discovery_impl.cc @040783c8 FilterConfigSubscription::onConfigUpdate -> validateTypeUrl"
	srcEnvoyFactories    = "envoyproxy/envoy source/common/http/filter_chain_helper.h processDynamicFilterConfig (\"no factory found for a required type URL\")"
	srcEnvoyRBAC         = "envoyproxy/envoy api/envoy/extensions/filters/http/rbac/v3/rbac.proto RBAC.rules (\"If set but empty, all requests are denied\"); istio/istio pkg/wasm/convert.go allowHTTPTypedConfig uses RBAC without rules as allow-all"
	srcAgentFetchHint    = "istio/istio pkg/wasm/convert.go rewriteVMConfig (missRemoteFetchHint), 1.28.0-master"
	srcAgentScheme       = "istio/istio pkg/wasm/cache.go LocalFileCache.getOrFetch (\"unsupported Wasm module downloading URL scheme\"), 1.28.0-master"
	srcAgentChecksum     = "istio/istio pkg/wasm/convert.go rewriteVMConfig (sha256 \"nil\" -> \"\") and pkg/wasm/cache.go getOrFetch (empty checksum accepts any download), 1.28.0-master"
	srcAgentSecret       = "istio/istio pkg/wasm/convert.go rewriteVMConfig (\"missing image pulling secret\"), pkg/model/wasm.go WasmSecretEnv, 1.28.0-master"
	srcAgentPolicy       = "istio/istio pkg/wasm/convert.go rewriteVMConfig and pkg/wasm/options.go PullPolicyValues, 1.28.0-master"
	srcAgentMetaEnv      = "istio/istio pkg/wasm/convert.go rewriteVMConfig (strips every ISTIO_META_ key), pkg/model/wasm.go, 1.28.0-master"
	srcAgentFailOpen     = "istio/istio pkg/wasm/convert.go httpWasmFailOpen and MaybeConvertWasmExtensionConfig (deny-all RBAC when not fail-open), 1.28.0-master"
	srcIstiodECDSAdd     = "istio/istio pilot/pkg/networking/core/envoyfilter/extension_configuration_patch.go InsertedExtensionConfigurations, 1.28.0-master"
	srcIstiodSubFilter   = "istio/istio pkg/config/validation/envoyfilter/envoyfilter.go validateEnvoyFilter, master 86c9f01f"
	srcIstiodWasmPlugin  = "istio/istio pkg/config/validation/validation.go ValidateWasmPlugin (validateWasmPluginURL, validateWasmPluginSHA, validateWasmPluginVMConfig), master 86c9f01f"
	srcIstiodVSAction    = "istio/istio pkg/config/validation/virtualservice.go validateHTTPRoute (route vs redirect vs direct_response), master 86c9f01f"
	srcIstiodVSStatus    = "istio/istio pkg/config/validation/validation.go validateHTTPDirectResponse -> validateHTTPStatus, master 86c9f01f"
)

var enforcedRules = []enforcedRule{
	// Envoy >= 1.33: PluginConfig's constructor throws "only one of fail_open or
	// failure_policy can be set" when fail_open is true and failure_policy is not
	// UNSPECIFIED. The exception rejects the ECDS update, so the placeholder filter stays.
	{"envoy/wasm-fail-open-xor-failure-policy", srcEnvoyPluginConfig, eachWasm(func(w *wasmv3.Wasm) error {
		c := w.GetConfig()
		//lint:ignore SA1019 the deprecated field is the point: Envoy refuses it beside failure_policy
		if c.GetFailOpen() && c.GetFailurePolicy() != wasmextv3.FailurePolicy_UNSPECIFIED {
			return fmt.Errorf("fail_open and failure_policy (%s) are both set: Envoy throws \"only one of fail_open or failure_policy can be set\"", c.GetFailurePolicy())
		}
		return nil
	})},
	// Same constructor: any other enum number hits `default: throw "unknown failure policy"`
	// (protojson accepts numbers for open enums, so decoding lets them through).
	{"envoy/wasm-failure-policy-known", srcEnvoyPluginConfig, eachWasm(func(w *wasmv3.Wasm) error {
		if _, ok := wasmextv3.FailurePolicy_name[int32(w.GetConfig().GetFailurePolicy())]; !ok {
			return fmt.Errorf("failure_policy %d: Envoy throws \"unknown failure policy\"", w.GetConfig().GetFailurePolicy())
		}
		return nil
	})},
	// wasm.proto: runtimes are extensions; the null runtime runs only modules linked into
	// Envoy, wamr and wasmtime are "not enabled in the official build", empty picks the first
	// engine built in. createWasmVm fails for a runtime without a registered factory.
	{"envoy/wasm-runtime-in-official-build", srcEnvoyRuntime, eachWasm(func(w *wasmv3.Wasm) error {
		switch rt := w.GetConfig().GetVmConfig().GetRuntime(); rt {
		case "", "envoy.wasm.runtime.v8":
			return nil
		default:
			return fmt.Errorf("vm_config.runtime %q: only envoy.wasm.runtime.v8 (or empty) loads a .wasm module in official Envoy builds", rt)
		}
	})},
	// WasmConfig's constructor throws "Environment variables must not be set for NullVm".
	{"envoy/wasm-nullvm-without-env", srcEnvoyWasmConfig, eachWasm(func(w *wasmv3.Wasm) error {
		vm := w.GetConfig().GetVmConfig()
		env := vm.GetEnvironmentVariables()
		if vm.GetRuntime() == "envoy.wasm.runtime.null" && (len(env.GetKeyValues()) > 0 || len(env.GetHostEnvKeys()) > 0) {
			return errors.New("environment_variables with the null runtime: Envoy throws \"Environment variables must not be set for NullVm\"")
		}
		return nil
	})},
	// WasmConfig's constructor throws "Key ... is duplicated in ...environment_variables".
	{"envoy/wasm-env-keys-unique", srcEnvoyWasmConfig, eachWasm(func(w *wasmv3.Wasm) error {
		env := w.GetConfig().GetVmConfig().GetEnvironmentVariables()
		seen := map[string]bool{}
		for k := range env.GetKeyValues() {
			seen[k] = true
		}
		for _, k := range env.GetHostEnvKeys() {
			if seen[k] {
				return fmt.Errorf("environment variable %q is set twice (key_values/host_env_keys): Envoy throws \"Key %s is duplicated\"", k, k)
			}
			seen[k] = true
		}
		return nil
	})},
	// PGV on RemoteDataSource and HttpUri, spelled out because the remote source is what
	// istio-agent reads (and rewrites) before Envoy ever validates it.
	{"envoy/wasm-remote-source-complete", srcEnvoyRemotePGV, eachWasm(func(w *wasmv3.Wasm) error {
		r := w.GetConfig().GetVmConfig().GetCode().GetRemote()
		if r == nil {
			return nil
		}
		var errs []error
		if r.GetSha256() == "" {
			errs = append(errs, errors.New("code.remote.sha256 is empty"))
		}
		if r.GetHttpUri().GetCluster() == "" {
			errs = append(errs, errors.New("code.remote.http_uri.cluster is empty"))
		}
		if r.GetHttpUri().GetTimeout() == nil {
			errs = append(errs, errors.New("code.remote.http_uri.timeout is missing"))
		}
		return errors.Join(errs...)
	})},
	// "Error: filter config X applied without warming but has no default config."
	{"envoy/ecds-default-when-not-warming", srcEnvoyWarming, eachECDSFilter(func(hf *hcmv3.HttpFilter) error {
		cd := hf.GetConfigDiscovery()
		if cd.GetApplyDefaultConfigWithoutWarming() && cd.GetDefaultConfig() == nil {
			return fmt.Errorf("%q: apply_default_config_without_warming without default_config: Envoy rejects the listener", hf.GetName())
		}
		return nil
	})},
	// The default config is checked against type_urls ("Error: filter config has type URL
	// X but expect Y.").
	{"envoy/ecds-default-type-listed", srcEnvoyTypeURL, eachECDSFilter(func(hf *hcmv3.HttpFilter) error {
		cd := hf.GetConfigDiscovery()
		if d := cd.GetDefaultConfig(); d != nil && !slices.Contains(cd.GetTypeUrls(), d.GetTypeUrl()) {
			return fmt.Errorf("%q: default_config type %s is not among type_urls %v", hf.GetName(), d.GetTypeUrl(), cd.GetTypeUrls())
		}
		return nil
	})},
	// Each type URL must name an HTTP filter factory Envoy has registered. Approximation:
	// the type resolves and is an HTTP filter config (envoy.extensions.filters.http.*).
	{"envoy/ecds-type-urls-are-http-filters", srcEnvoyFactories, eachECDSFilter(func(hf *hcmv3.HttpFilter) error {
		for _, u := range hf.GetConfigDiscovery().GetTypeUrls() {
			name := strings.TrimPrefix(u, "type.googleapis.com/")
			if _, err := protoregistry.GlobalTypes.FindMessageByURL(u); err != nil || !strings.HasPrefix(name, "envoy.extensions.filters.http.") {
				return fmt.Errorf("%q: type_urls entry %s is not an HTTP filter config Envoy knows", hf.GetName(), u)
			}
		}
		return nil
	})},
	// An ECDS update whose type is not in the filter's type_urls is rejected
	// (config_fail), so the Wasm type must be listed where the Wasm config is served.
	{"envoy/ecds-resource-type-listed", srcEnvoyUpdateType, func(o object) []error {
		var errs []error
		configs := extensionConfigs(o)
		for _, hf := range ecdsFilters(o) {
			ec := configs[hf.GetName()]
			if ec == nil {
				continue // istiod/extension-config-referenced covers this
			}
			if t := ec.GetTypedConfig().GetTypeUrl(); !slices.Contains(hf.GetConfigDiscovery().GetTypeUrls(), t) {
				errs = append(errs, fmt.Errorf("%q: the served config's type %s is not among type_urls %v: Envoy rejects every update", hf.GetName(), t, hf.GetConfigDiscovery().GetTypeUrls()))
			}
		}
		return errs
	}},
	// A fail-open filter needs a default that lets requests through: an RBAC filter with
	// `rules` set, even empty, denies every request.
	{"envoy/ecds-default-allows", srcEnvoyRBAC, eachECDSFilter(func(hf *hcmv3.HttpFilter) error {
		d := hf.GetConfigDiscovery().GetDefaultConfig()
		rb := &rbachttpv3.RBAC{}
		if d == nil || !d.MessageIs(rb) {
			return nil
		}
		if err := d.UnmarshalTo(rb); err != nil {
			return err
		}
		if rb.GetRules() != nil || rb.GetMatcher() != nil {
			return fmt.Errorf("%q: default_config is an RBAC filter with rules/matcher: requests are denied until the module loads", hf.GetName())
		}
		return nil
	})},

	// istio-agent rewrites code.remote to a local file; without http_uri the conversion
	// fails ("does not have httpUri specified").
	{"agent/remote-needs-http-uri", srcAgentFetchHint, eachWasm(func(w *wasmv3.Wasm) error {
		if r := w.GetConfig().GetVmConfig().GetCode().GetRemote(); r != nil && r.GetHttpUri() == nil {
			return errors.New("code.remote without http_uri: istio-agent cannot fetch the module")
		}
		return nil
	})},
	// istio-agent fetches http, https and oci URLs only.
	{"agent/remote-url-scheme", srcAgentScheme, eachWasm(func(w *wasmv3.Wasm) error {
		r := w.GetConfig().GetVmConfig().GetCode().GetRemote()
		if r == nil {
			return nil
		}
		u, err := url.Parse(r.GetHttpUri().GetUri())
		if err != nil {
			return err
		}
		if u.Scheme != "oci" && u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("uri %q: istio-agent fetches only oci://, http:// and https://", r.GetHttpUri().GetUri())
		}
		return nil
	})},
	// istio-agent turns sha256 "nil" into "" and, with an empty checksum, accepts whatever
	// it downloads: only a 64-hex digest pins the module.
	{"agent/sha256-pins-the-module", srcAgentChecksum, eachWasm(func(w *wasmv3.Wasm) error {
		r := w.GetConfig().GetVmConfig().GetCode().GetRemote()
		if r != nil && !hex64.MatchString(r.GetSha256()) {
			return fmt.Errorf("code.remote.sha256 %q: istio-agent only verifies a 64-hex digest (\"nil\" or empty accept any module)", r.GetSha256())
		}
		return nil
	})},
	// A pull-secret key that is present but empty fails the fetch.
	{"agent/pull-secret-not-empty", srcAgentSecret, eachWasm(func(w *wasmv3.Wasm) error {
		if v, ok := w.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues()["ISTIO_META_WASM_IMAGE_PULL_SECRET"]; ok && v == "" {
			return errors.New("ISTIO_META_WASM_IMAGE_PULL_SECRET is empty: istio-agent fails the fetch (\"missing image pulling secret\")")
		}
		return nil
	})},
	// An unknown pull policy is silently ignored (default: IfNotPresent, Always for :latest).
	{"agent/pull-policy-known", srcAgentPolicy, eachWasm(func(w *wasmv3.Wasm) error {
		if v, ok := w.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues()["ISTIO_META_WASM_IMAGE_PULL_POLICY"]; ok && !slices.Contains([]string{"UNSPECIFIED_POLICY", "IfNotPresent", "Always"}, v) {
			return fmt.Errorf("ISTIO_META_WASM_IMAGE_PULL_POLICY %q is not one istio-agent knows; it is ignored", v)
		}
		return nil
	})},
	// istio-agent deletes every ISTIO_META_* key before Envoy sees the config: any other
	// such key never reaches the module.
	{"agent/istio-meta-env-known", srcAgentMetaEnv, eachWasm(func(w *wasmv3.Wasm) error {
		known := []string{"ISTIO_META_WASM_IMAGE_PULL_SECRET", "ISTIO_META_WASM_IMAGE_PULL_POLICY", "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"}
		for k := range w.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues() {
			if strings.HasPrefix(k, "ISTIO_META_") && !slices.Contains(known, k) {
				return fmt.Errorf("environment variable %s: istio-agent strips ISTIO_META_* keys, the module never sees it", k)
			}
		}
		return nil
	})},
	// istio-agent reads failure_policy first and fail_open only when it is UNSPECIFIED; a
	// failed pull then installs deny-all RBAC unless that says fail-open. kvroute must
	// never drop a request because the filter failed.
	{"agent/fail-open-effective", srcAgentFailOpen, eachWasm(func(w *wasmv3.Wasm) error {
		c := w.GetConfig()
		//lint:ignore SA1019 read as istio-agent reads it
		open := c.GetFailOpen()
		if p := c.GetFailurePolicy(); p != wasmextv3.FailurePolicy_UNSPECIFIED {
			open = p == wasmextv3.FailurePolicy_FAIL_OPEN
		}
		if !open {
			//lint:ignore SA1019 the deprecated field is part of what istio-agent reads
			return fmt.Errorf("failure_policy %s / fail_open %v is not fail-open: a failed pull denies every request", c.GetFailurePolicy(), c.GetFailOpen())
		}
		return nil
	})},

	// istiod serves EXTENSION_CONFIG patches only with operation ADD; others are skipped.
	{"istiod/extension-config-add-only", srcIstiodECDSAdd, eachPatch(func(p *istionetworking.EnvoyFilter_EnvoyConfigObjectPatch) error {
		if p.GetApplyTo() == istionetworking.EnvoyFilter_EXTENSION_CONFIG && p.GetPatch().GetOperation() != istionetworking.EnvoyFilter_Patch_ADD {
			return fmt.Errorf("EXTENSION_CONFIG with operation %s: istiod ignores it", p.GetPatch().GetOperation())
		}
		return nil
	})},
	// istiod sends an EXTENSION_CONFIG only when Envoy asks for its name, and Envoy asks
	// for the names its filters' config_discovery use.
	{"istiod/extension-config-referenced", srcIstiodECDSAdd, func(o object) []error {
		var errs []error
		names := map[string]bool{}
		for _, hf := range ecdsFilters(o) {
			names[hf.GetName()] = true
		}
		for name := range extensionConfigs(o) {
			if !names[name] {
				errs = append(errs, fmt.Errorf("EXTENSION_CONFIG %q is not named by any config_discovery filter: it is never requested", name))
			}
		}
		for name := range names {
			if extensionConfigs(o)[name] == nil {
				errs = append(errs, fmt.Errorf("HTTP filter %q discovers a config no EXTENSION_CONFIG here provides", name))
			}
		}
		return errs
	}},
	// istiod's webhook rejects a subFilter match whose filter is not the HCM, or a
	// subFilter match on anything but HTTP_FILTER.
	{"istiod/subfilter-needs-hcm", srcIstiodSubFilter, eachPatch(func(p *istionetworking.EnvoyFilter_EnvoyConfigObjectPatch) error {
		f := p.GetMatch().GetListener().GetFilterChain().GetFilter()
		if f.GetSubFilter() == nil {
			return nil
		}
		if p.GetApplyTo() != istionetworking.EnvoyFilter_HTTP_FILTER {
			return errors.New("subfilter match can be used with applyTo HTTP_FILTER only")
		}
		if f.GetName() != "envoy.filters.network.http_connection_manager" && f.GetName() != "envoy.http_connection_manager" {
			return fmt.Errorf("subfilter match requires filter name envoy.filters.network.http_connection_manager, got %q", f.GetName())
		}
		if f.GetSubFilter().GetName() == "" {
			return errors.New("subfilter match has no name")
		}
		return nil
	})},
	// istiod's WasmPlugin validation: url scheme, sha256 format, env names.
	{"istiod/wasmplugin-valid", srcIstiodWasmPlugin, func(o object) []error {
		wp, ok := o.Value.(*extensionsv1alpha1.WasmPlugin)
		if !ok {
			return nil
		}
		var errs []error
		s := &wp.Spec
		if u, err := url.Parse(s.GetUrl()); err != nil || !slices.Contains([]string{"", "file", "http", "https", "oci"}, u.Scheme) {
			errs = append(errs, fmt.Errorf("url %q has no scheme istiod accepts", s.GetUrl()))
		}
		if s.GetSha256() != "" && !hex64.MatchString(s.GetSha256()) {
			errs = append(errs, fmt.Errorf("sha256 %q must match [a-f0-9]{64}", s.GetSha256()))
		}
		seen := map[string]bool{}
		for _, e := range s.GetVmConfig().GetEnv() {
			if e.GetName() == "" || seen[e.GetName()] {
				errs = append(errs, fmt.Errorf("vmConfig.env %q is empty or duplicate", e.GetName()))
			}
			seen[e.GetName()] = true
		}
		return errs
	}},
	// Each HTTP route has a route, a redirect or a direct_response, and direct_response
	// excludes fault and rewrite.
	{"istiod/virtualservice-one-action", srcIstiodVSAction, eachHTTPRoute(func(name string, r httpRoute) error {
		actions := 0
		for _, set := range []bool{len(r.route) > 0, r.redirect, r.direct} {
			if set {
				actions++
			}
		}
		if actions != 1 {
			return fmt.Errorf("http route %q has %d of route/redirect/directResponse, want exactly one", name, actions)
		}
		if r.direct && (r.fault || r.rewrite) {
			return fmt.Errorf("http route %q: directResponse cannot be combined with fault or rewrite", name)
		}
		return nil
	})},
	{"istiod/virtualservice-direct-response-status", srcIstiodVSStatus, eachHTTPRoute(func(name string, r httpRoute) error {
		if r.direct && (r.status < 200 || r.status > 600) {
			return fmt.Errorf("http route %q: directResponse status %d is not in 200-599", name, r.status)
		}
		return nil
	})},
}

// eachWasm applies check to every Wasm HTTP filter config an EnvoyFilter serves over ECDS.
func eachWasm(check func(*wasmv3.Wasm) error) func(object) []error {
	return func(o object) []error {
		var errs []error
		for name, w := range wasmFilters(o) {
			if err := check(w); err != nil {
				errs = append(errs, fmt.Errorf("ECDS %q: %w", name, err))
			}
		}
		return errs
	}
}

// eachECDSFilter applies check to every HTTP filter that uses config_discovery.
func eachECDSFilter(check func(*hcmv3.HttpFilter) error) func(object) []error {
	return func(o object) []error {
		var errs []error
		for _, hf := range ecdsFilters(o) {
			if err := check(hf); err != nil {
				errs = append(errs, err)
			}
		}
		return errs
	}
}

func eachPatch(check func(*istionetworking.EnvoyFilter_EnvoyConfigObjectPatch) error) func(object) []error {
	return func(o object) []error {
		ef, ok := o.Value.(*networkingv1alpha3.EnvoyFilter)
		if !ok {
			return nil
		}
		var errs []error
		for i, p := range ef.Spec.GetConfigPatches() {
			if err := check(p); err != nil {
				errs = append(errs, fmt.Errorf("configPatches[%d]: %w", i, err))
			}
		}
		return errs
	}
}

// httpRoute is what the VirtualService rules read of an HTTP route.
type httpRoute struct {
	route                            []string
	redirect, direct, fault, rewrite bool
	status                           uint32
}

func eachHTTPRoute(check func(string, httpRoute) error) func(object) []error {
	return func(o object) []error {
		vs, ok := o.Value.(*networkingv1.VirtualService)
		if !ok {
			return nil
		}
		var errs []error
		for i, h := range vs.Spec.GetHttp() {
			r := httpRoute{
				redirect: h.GetRedirect() != nil,
				direct:   h.GetDirectResponse() != nil,
				fault:    h.GetFault() != nil,
				rewrite:  h.GetRewrite() != nil,
				status:   h.GetDirectResponse().GetStatus(),
			}
			for _, d := range h.GetRoute() {
				r.route = append(r.route, d.GetDestination().GetHost())
			}
			name := h.GetName()
			if name == "" {
				name = fmt.Sprint(i)
			}
			if err := check(name, r); err != nil {
				errs = append(errs, err)
			}
		}
		return errs
	}
}

// ecdsFilters returns an EnvoyFilter's HTTP filters that use config_discovery.
func ecdsFilters(o object) []*hcmv3.HttpFilter {
	var out []*hcmv3.HttpFilter
	for _, p := range o.Patches {
		if hf, ok := p.Value.(*hcmv3.HttpFilter); ok && hf.GetConfigDiscovery() != nil {
			out = append(out, hf)
		}
	}
	return out
}

// extensionConfigs returns an EnvoyFilter's EXTENSION_CONFIG values by name.
func extensionConfigs(o object) map[string]*corev3.TypedExtensionConfig {
	out := map[string]*corev3.TypedExtensionConfig{}
	for _, p := range o.Patches {
		if ec, ok := p.Value.(*corev3.TypedExtensionConfig); ok {
			out[ec.GetName()] = ec
		}
	}
	return out
}
