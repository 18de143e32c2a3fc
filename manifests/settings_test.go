package manifests_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSettingsMoveTheWholeDeployment follows the rollout steps of README.md for a model
// Service of its own, on a copy of manifests/: set settings/settings.yaml (the one file
// the steps name) and copy overlays/llm-clients for the client namespace. Every
// kustomization an operator applies then renders without a trace of the defaults, and
// the values that must agree across objects still do.
func TestSettingsMoveTheWholeDeployment(t *testing.T) {
	root := t.TempDir()
	copyTree(t, ".", root)
	edit := func(path string, pairs ...string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for i := 0; i < len(pairs); i += 2 {
			if strings.Count(s, pairs[i]) != 1 {
				t.Fatalf("%s: %q is not there once", path, pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const token = "t0k.en-with.dots"
	edit("settings/settings.yaml",
		"modelService: vllm.llm.svc.cluster.local", "modelService: qwen.serving.svc.cluster.local",
		`modelPort: "8000"`, `modelPort: "8080"`,
		"controlPlaneNamespace: kvroute-system", "controlPlaneNamespace: kvroute-ops",
		"token: kvroute-dev-token-change-me", "token: "+token,
		"tenantSecret: kvroute-dev-tenant-secret-change-me", "tenantSecret: 0123")
	copyTree(t, filepath.Join(root, "overlays", "llm-clients"), filepath.Join(root, "overlays", "apps"))
	edit("overlays/apps/kustomization.yaml", "namespace: llm-clients", "namespace: apps")
	// The WasmPlugin form, as README.md tells to combine it.
	wasmDir := filepath.Join(root, "overlays", "apps-wasmplugin")
	if err := os.MkdirAll(wasmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wasmDir, "kustomization.yaml"), []byte(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: apps
resources:
- ../../filter/wasmplugin
- ../../filter/override-host
components:
- ../../settings
`), 0o644); err != nil {
		t.Fatal(err)
	}

	rendered := map[string][]object{}
	for _, dir := range []string{"base", "overlays/apps", "overlays/apps-wasmplugin", "overlays/llm-clients-canary", "vllm", "observability"} {
		objs := render(t, filepath.Join(root, dir))
		rendered[dir] = objs
		for _, o := range objs {
			js, err := json.Marshal(o.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, stale := range []string{"vllm.llm", "kvroute-system", "change-me", `"llm"`, "=llm"} {
				if strings.Contains(string(js), stale) {
					t.Errorf("%s %s %s/%s still holds %s", dir, o.Kind, o.Namespace, o.Name, stale)
				}
			}
			if o.Namespace == "llm" || o.Namespace == "kvroute-system" {
				t.Errorf("%s %s %s is in a default namespace", dir, o.Kind, o.Name)
			}
		}
	}
	// The objects moved where the settings say, and still agree with each other (the
	// token, the control plane's cluster, the model Service's host and port).
	checkAgree(t, rendered["base"], rendered["overlays/apps"], rendered["vllm"], rendered["overlays/apps-wasmplugin"])
	checkAgree(t, rendered["base"], rendered["overlays/llm-clients-canary"], rendered["vllm"], rendered["overlays/apps-wasmplugin"])
	for dir, objs := range rendered {
		for src, cfg := range pluginConfigs(t, objs) {
			if !strings.Contains(string(cfg), `"`+token+`"`) || !strings.Contains(string(cfg), "kvroute-controlplane.kvroute-ops.svc.cluster.local") {
				t.Errorf("%s %s: plugin config %s", dir, src, cfg)
			}
		}
	}
}

// copyTree copies the files under src into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
