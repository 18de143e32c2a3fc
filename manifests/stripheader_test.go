package manifests_test

import (
	"strings"
	"testing"

	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	istionetworking "istio.io/api/networking/v1alpha3"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"

	"github.com/kvroute/kvroute/shared/api"
)

// Every EnvoyFilter that installs kvroute also removes a client-sent endpoint header,
// first in the HTTP filter chain, naming the header the plugin configuration routes with.
// kvroute strips it itself, but a failed VM under FAIL_OPEN passes requests on unfiltered
// and override_host would follow the client's choice (the V8 host, wasmtest/v8host,
// showed a spoofed header surviving on every request of a trapped VM). Before the strip
// patch existed, every rendered overlay failed here with "no filter strips ...".
func TestClientEndpointHeaderIsStrippedFirst(t *testing.T) {
	checked := 0
	for _, dir := range []string{"overlays/llm-clients", "overlays/llm-clients-canary"} {
		objs := render(t, dir)
		configs := pluginConfigs(t, objs)
		for _, o := range objs {
			ef, ok := o.Value.(*networkingv1alpha3.EnvoyFilter)
			if !ok || len(wasmFilters(o)) == 0 {
				continue
			}
			header := ""
			for src, b := range configs {
				if strings.HasPrefix(src, o.Source) {
					cfg, err := api.ParseConfig(b)
					if err != nil {
						t.Fatalf("%s: %v", src, err)
					}
					header = cfg.EndpointHeader
				}
			}
			if header == "" {
				t.Fatalf("%s: no plugin configuration found", o.Source)
			}
			strips := false
			for i, p := range o.Patches {
				if p.Patch.GetApplyTo() != istionetworking.EnvoyFilter_HTTP_FILTER ||
					p.Patch.GetPatch().GetOperation() != istionetworking.EnvoyFilter_Patch_INSERT_FIRST {
					continue
				}
				f, ok := p.Value.(*hcmv3.HttpFilter)
				if !ok {
					continue
				}
				var hm headermutationv3.HeaderMutation
				if err := f.GetTypedConfig().UnmarshalTo(&hm); err != nil {
					continue
				}
				for _, m := range hm.GetMutations().GetRequestMutations() {
					if m.GetRemove() == header {
						strips = true
						if ctx := ef.Spec.ConfigPatches[i].GetMatch().GetContext(); ctx != istionetworking.EnvoyFilter_SIDECAR_OUTBOUND {
							t.Errorf("%s: the strip filter applies to %s, not the outbound sidecar", o.Source, ctx)
						}
					}
				}
			}
			if !strips {
				t.Errorf("%s: no filter strips a client-sent %q before kvroute", o.Source, header)
			}
			checked++
		}
	}
	if checked < 2 {
		t.Fatalf("checked %d kvroute EnvoyFilters, want the stable and the canary one", checked)
	}
}
