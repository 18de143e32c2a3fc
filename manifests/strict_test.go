package manifests_test

// Strict decoding of every manifest, as close to the real API servers as a unit test can
// get: Kubernetes objects into their k8s.io/api types with the API server's own
// case-sensitive strict JSON decoder (unknown and duplicate fields are errors); Istio
// objects into istio.io/client-go types, their specs with protojson (no unknown fields)
// and only the camelCase names Istio's CRD schemas carry; and every Envoy config inside an
// EnvoyFilter patch into its go-control-plane message with protojson, resolving each
// `@type`, then checked against Envoy's own validation rules (protoc-gen-validate).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	istioextensions "istio.io/api/extensions/v1alpha1"
	istionetworking "istio.io/api/networking/v1alpha3"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingk8sv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest document.
type object struct {
	Source     string // file (or render) and document index, for messages
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	// Value is the typed object: *appsv1.Deployment, *networkingv1alpha3.EnvoyFilter, ...
	Value any
	// Patches are an EnvoyFilter's patch values decoded into Envoy messages, in order.
	Patches []envoyPatch
}

// envoyPatch is one EnvoyFilter config patch with its value as an Envoy message.
type envoyPatch struct {
	Patch *istionetworking.EnvoyFilter_EnvoyConfigObjectPatch
	Value proto.Message
}

// kubeTypes are the Kubernetes kinds the manifests may use, by apiVersion/kind.
var kubeTypes = map[string]func() any{
	"v1/Namespace":                      func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                 func() any { return &corev1.ServiceAccount{} },
	"v1/Secret":                         func() any { return &corev1.Secret{} },
	"v1/ConfigMap":                      func() any { return &corev1.ConfigMap{} },
	"v1/Service":                        func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":     func() any { return &policyv1.PodDisruptionBudget{} },
	"rbac.authorization.k8s.io/v1/Role": func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any {
		return &rbacv1.RoleBinding{}
	},
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingk8sv1.NetworkPolicy{} },
}

// istioTypes are the Istio kinds: the client-go object and a pointer to its spec.
var istioTypes = map[string]func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message){
	"networking.istio.io/v1alpha3/EnvoyFilter": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &networkingv1alpha3.EnvoyFilter{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"extensions.istio.io/v1alpha1/WasmPlugin": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &extensionsv1alpha1.WasmPlugin{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"networking.istio.io/v1/VirtualService": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &networkingv1.VirtualService{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"networking.istio.io/v1/DestinationRule": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &networkingv1.DestinationRule{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"networking.istio.io/v1/Sidecar": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &networkingv1.Sidecar{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"security.istio.io/v1/PeerAuthentication": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &securityv1.PeerAuthentication{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
	"security.istio.io/v1/AuthorizationPolicy": func() (any, *metav1.TypeMeta, *metav1.ObjectMeta, proto.Message) {
		o := &securityv1.AuthorizationPolicy{}
		return o, &o.TypeMeta, &o.ObjectMeta, &o.Spec
	},
}

// envoyTypes maps an EnvoyFilter applyTo to the Envoy message its patch value is.
var envoyTypes = map[istionetworking.EnvoyFilter_ApplyTo]func() proto.Message{
	istionetworking.EnvoyFilter_CLUSTER:             func() proto.Message { return &clusterv3.Cluster{} },
	istionetworking.EnvoyFilter_HTTP_FILTER:         func() proto.Message { return &hcmv3.HttpFilter{} },
	istionetworking.EnvoyFilter_EXTENSION_CONFIG:    func() proto.Message { return &corev3.TypedExtensionConfig{} },
	istionetworking.EnvoyFilter_LISTENER:            func() proto.Message { return &listenerv3.Listener{} },
	istionetworking.EnvoyFilter_NETWORK_FILTER:      func() proto.Message { return &listenerv3.Filter{} },
	istionetworking.EnvoyFilter_FILTER_CHAIN:        func() proto.Message { return &listenerv3.FilterChain{} },
	istionetworking.EnvoyFilter_ROUTE_CONFIGURATION: func() proto.Message { return &routev3.RouteConfiguration{} },
	istionetworking.EnvoyFilter_VIRTUAL_HOST:        func() proto.Message { return &routev3.VirtualHost{} },
	istionetworking.EnvoyFilter_HTTP_ROUTE:          func() proto.Message { return &routev3.Route{} },
}

// strictProto rejects unknown fields and resolves every @type from the linked Envoy and
// protobuf packages (an unknown type URL is an error too).
var strictProto = protojson.UnmarshalOptions{DiscardUnknown: false, Resolver: protoregistry.GlobalTypes}

// decodeYAML decodes every document of a YAML stream strictly.
func decodeYAML(source string, data []byte) ([]object, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", source, i, err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue // a comment-only document
		}
		o, err := decodeObject(fmt.Sprintf("%s#%d", source, i), js)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
}

func decodeObject(source string, js []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	o := object{Source: source, APIVersion: tm.APIVersion, Kind: tm.Kind}
	key := tm.APIVersion + "/" + tm.Kind
	fail := func(err error) (object, error) {
		return object{}, fmt.Errorf("%s (%s): %w", source, key, err)
	}
	if mk, ok := kubeTypes[key]; ok {
		v := mk()
		if err := strictJSON(js, v); err != nil {
			return fail(err)
		}
		meta := v.(metav1.Object)
		o.Name, o.Namespace, o.Value = meta.GetName(), meta.GetNamespace(), v
		return o, nil
	}
	mk, ok := istioTypes[key]
	if !ok {
		return fail(errors.New("unknown kind: add its Go type to kubeTypes or istioTypes"))
	}
	v, typeMeta, objMeta, spec := mk()
	var env struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
		Spec            json.RawMessage   `json:"spec"`
	}
	if err := strictJSON(js, &env); err != nil {
		return fail(err)
	}
	*typeMeta, *objMeta = env.TypeMeta, env.Metadata
	if err := decodeIstioSpec(env.Spec, spec); err != nil {
		return fail(fmt.Errorf("spec: %w", err))
	}
	o.Name, o.Namespace, o.Value = env.Metadata.Name, env.Metadata.Namespace, v
	if ef, ok := v.(*networkingv1alpha3.EnvoyFilter); ok {
		for i, p := range ef.Spec.GetConfigPatches() {
			m, err := decodeEnvoyPatch(p)
			if err != nil {
				return fail(fmt.Errorf("configPatches[%d] (%s): %w", i, p.GetApplyTo(), err))
			}
			o.Patches = append(o.Patches, envoyPatch{Patch: p, Value: m})
		}
	}
	return o, nil
}

// strictJSON is the API server's decoding: case-sensitive, unknown and duplicate fields
// are errors.
func strictJSON(js []byte, v any) error {
	strict, err := sigsjson.UnmarshalStrict(js, v, sigsjson.DisallowUnknownFields, sigsjson.DisallowDuplicateFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// decodeIstioSpec decodes a spec with protojson, then insists on the camelCase field names:
// protojson also accepts proto names (snake_case), but Istio's CRD schemas only know the
// JSON names, so the API server would prune or reject the others.
func decodeIstioSpec(js []byte, spec proto.Message) error {
	if err := strictProto.Unmarshal(js, spec); err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(js, &generic); err != nil {
		return err
	}
	return errors.Join(jsonNames(spec.ProtoReflect().Descriptor(), generic, "spec")...)
}

// jsonNames checks that an object uses the JSON names of message md, down to the
// free-form fields (google.protobuf.Struct and other well-known types).
func jsonNames(md protoreflect.MessageDescriptor, v any, path string) []error {
	if md.FullName().Parent() == "google.protobuf" {
		return nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil // protojson already checked the shape
	}
	var errs []error
	for k, val := range obj {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			errs = append(errs, fmt.Errorf("%s.%s: not a field name of %s in Istio's CRD schema (want camelCase)", path, k, md.FullName()))
			continue
		}
		p := path + "." + k
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				for mk, mv := range asMap(val) {
					errs = append(errs, jsonNames(fd.MapValue().Message(), mv, p+"."+mk)...)
				}
			}
		case fd.Message() != nil && fd.IsList():
			list, _ := val.([]any)
			for i, e := range list {
				errs = append(errs, jsonNames(fd.Message(), e, fmt.Sprintf("%s[%d]", p, i))...)
			}
		case fd.Message() != nil:
			errs = append(errs, jsonNames(fd.Message(), val, p)...)
		}
	}
	return errs
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// decodeEnvoyPatch decodes a patch value into the Envoy message for its applyTo and checks
// it against Envoy's validation rules, including every message packed in an Any.
func decodeEnvoyPatch(p *istionetworking.EnvoyFilter_EnvoyConfigObjectPatch) (proto.Message, error) {
	mk, ok := envoyTypes[p.GetApplyTo()]
	if !ok {
		return nil, fmt.Errorf("no Envoy type known for applyTo %s: add it to envoyTypes", p.GetApplyTo())
	}
	js, err := protojson.Marshal(p.GetPatch().GetValue())
	if err != nil {
		return nil, err
	}
	m := mk()
	if err := strictProto.Unmarshal(js, m); err != nil {
		return nil, err
	}
	// A MERGE value is a fragment of the real object (a cluster without a name, ...):
	// validate what it sets, not what it leaves to Istio.
	partial := p.GetPatch().GetOperation() == istionetworking.EnvoyFilter_Patch_MERGE
	if err := validateDeep(m, !partial); err != nil {
		return nil, err
	}
	return m, nil
}

type validator interface{ ValidateAll() error }

// validateDeep runs Envoy's generated validation on m (when whole) and on every message
// below it; protoc-gen-validate does not look inside Any, so those are unpacked here.
func validateDeep(m proto.Message, whole bool) error {
	if v, ok := m.(validator); ok && whole {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var errs []error
	var walk func(protoreflect.Message, bool)
	walk = func(rm protoreflect.Message, validated bool) {
		rm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			visit := func(sub protoreflect.Message) {
				if a, ok := sub.Interface().(*anypb.Any); ok {
					inner, err := a.UnmarshalNew()
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", fd.FullName(), err))
						return
					}
					if err := validateDeep(inner, true); err != nil {
						errs = append(errs, err)
					}
					return
				}
				// A message below an unvalidated (partial) one is validated on its own.
				if v, ok := sub.Interface().(validator); ok && !validated {
					if err := v.ValidateAll(); err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", fd.FullName(), err))
					}
				}
				walk(sub, true)
			}
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len(); i++ {
					visit(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					visit(mv.Message())
					return true
				})
			case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
				visit(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect(), whole)
	return errors.Join(errs...)
}

// wasmFilters returns the Wasm HTTP filter configs an EnvoyFilter adds over ECDS, by
// extension config name.
func wasmFilters(o object) map[string]*wasmv3.Wasm {
	out := map[string]*wasmv3.Wasm{}
	for _, p := range o.Patches {
		ec, ok := p.Value.(*corev3.TypedExtensionConfig)
		if !ok {
			continue
		}
		w := &wasmv3.Wasm{}
		if ec.GetTypedConfig().MessageIs(w) && ec.GetTypedConfig().UnmarshalTo(w) == nil {
			out[ec.GetName()] = w
		}
	}
	return out
}

// wasmPluginConfig returns the JSON a Wasm filter hands its plugin (configuration as a
// StringValue, the form Envoy passes through unchanged).
func wasmPluginConfig(w *wasmv3.Wasm) ([]byte, error) {
	c := w.GetConfig().GetConfiguration()
	s := &wrapperspb.StringValue{}
	if err := c.UnmarshalTo(s); err != nil {
		return nil, fmt.Errorf("configuration: want a google.protobuf.StringValue holding JSON: %w", err)
	}
	return []byte(s.GetValue()), nil
}

// wasmPluginPluginConfig returns a WasmPlugin's pluginConfig as the JSON istio hands the
// plugin.
func wasmPluginPluginConfig(spec *istioextensions.WasmPlugin) ([]byte, error) {
	return protojson.Marshal(spec.GetPluginConfig())
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
