package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/manifests/internal/wasmimage"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

const testRef = "registry.example.com/kvroute/kvroute-wasm:test"

// TestMakeOCI runs what `make oci OCI_REF=... OCI_PIN=...` runs, on a freshly built
// kvroute.wasm, and checks the output the way a registry and istio-agent would read it,
// then the pinning step on a copy of the manifests.
func TestMakeOCI(t *testing.T) {
	wasm, err := wasmbuild.Filter()
	if err != nil {
		t.Fatal(err)
	}
	module, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	manifests := filepath.Join(tmp, "manifests")
	copyTree(t, "../..", manifests, "filter", "overlays", "settings")
	release := filepath.Join(manifests, "filter", "release", "release.yaml")
	layoutDir, archive := filepath.Join(tmp, "out", "kvroute-wasm"), filepath.Join(tmp, "out", "kvroute-wasm.oci.tar")
	var stdout bytes.Buffer
	if err := run([]string{"-wasm", wasm, "-out", layoutDir, "-archive", archive, "-ref", testRef, "-pin", release}, &stdout); err != nil {
		t.Fatal(err)
	}
	t.Logf("kvroute-oci printed:\n%s", stdout.String())

	// The layout: one image, tagged, whose manifest digest is the printed one.
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d images in the layout, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 || desc.Annotations[wasmimage.RefNameAnnotation] != "test" {
		t.Errorf("index entry %+v: want an OCI manifest tagged %q", desc, "test")
	}
	if !strings.Contains(stdout.String(), "manifest "+desc.Digest.String()) {
		t.Errorf("printed digest is not the layout's %s", desc.Digest)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Digests and sizes of manifest, config and layer, and the layer's diff id.
	if err := validate.Image(img); err != nil {
		t.Fatalf("inconsistent image: %v", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	if sha256Hex(raw) != desc.Digest.Hex || int64(len(raw)) != desc.Size {
		t.Errorf("manifest bytes do not hash to the index's digest")
	}
	blob := func(h v1.Hash) []byte {
		b, err := os.ReadFile(filepath.Join(layoutDir, "blobs", h.Algorithm, h.Hex))
		if err != nil {
			t.Fatal(err)
		}
		if sha256Hex(b) != h.Hex {
			t.Errorf("blob %s does not hash to its name", h)
		}
		return b
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	// What Istio's image fetcher requires of the compat variant.
	if mf.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mf.MediaType)
	}
	if mf.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s", mf.Config.MediaType)
	}
	if len(mf.Layers) != 1 || mf.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("layers %+v: want exactly one %s", mf.Layers, types.OCILayer)
	}
	if mf.Annotations[wasmimage.VariantAnnotation] != wasmimage.VariantCompat {
		t.Errorf("manifest annotations %v lack the compat variant", mf.Annotations)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != "wasm" || cfg.OS != "wasip1" || len(cfg.RootFS.DiffIDs) != 1 {
		t.Errorf("config %+v", cfg)
	}
	blob(mf.Config.Digest)
	// The one layer is a tar.gz holding exactly plugin.wasm, byte for byte the module.
	files := untarGz(t, blob(mf.Layers[0].Digest))
	if len(files) != 1 || !bytes.Equal(files[wasmimage.ModuleFile], module) {
		names := []string{}
		for n := range files {
			names = append(names, n)
		}
		t.Fatalf("layer holds %v, want only %s equal to the fresh build", names, wasmimage.ModuleFile)
	}
	if got, err := wasmimage.Module(img); err != nil || !bytes.Equal(got, module) {
		t.Fatalf("Module: %v", err)
	}

	// The archive is the layout, file for file.
	checkArchive(t, archive, layoutDir)

	// Rebuilding gives the same digest (what makes pinning it meaningful).
	var again bytes.Buffer
	if err := run([]string{"-wasm", wasm, "-out", filepath.Join(tmp, "again"), "-archive", ""}, &again); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(again.String(), "manifest "+desc.Digest.String()) {
		t.Errorf("a second build of the same module has another digest:\n%s", again.String())
	}

	// Pinning: the copied release file now names the image, and kustomize stamps it into
	// the filter of the per-namespace overlay.
	url, sum := renderedImage(t, filepath.Join(manifests, "overlays", "llm-clients"))
	if url != "oci://"+testRef || sum != desc.Digest.Hex {
		t.Errorf("rendered overlay loads %s sha256 %s, want oci://%s sha256 %s", url, sum, testRef, desc.Digest.Hex)
	}

	// The committed pin is only expected to match at a release; say so when it does not.
	if _, committed := renderedImage(t, "../../overlays/llm-clients"); committed != desc.Digest.Hex {
		t.Logf("manifests/filter/release/release.yaml pins %s; this checkout builds %s (re-pin before a release: make oci OCI_REF=... OCI_PIN=manifests/filter/release/release.yaml)", committed, desc.Digest.Hex)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-pin", "x.yaml"}, // -pin without -ref
		{"-ref", "reg.example/x@sha256:" + strings.Repeat("a", 64)}, // a digest, not a tag
		{"-wasm", filepath.Join(t.TempDir(), "missing.wasm")},
		{"extra"},
	} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// renderedImage builds a kustomization and returns the oci:// URL and sha256 of its
// kvroute EnvoyFilter's Wasm module.
func renderedImage(t *testing.T, dir string) (url, sum string) {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj["kind"] != "EnvoyFilter" {
			continue
		}
		walk(obj, func(k string, v any) {
			if k != "remote" {
				return
			}
			r := v.(map[string]any)
			url = r["http_uri"].(map[string]any)["uri"].(string)
			sum = r["sha256"].(string)
		})
	}
	if url == "" {
		t.Fatalf("%s: no EnvoyFilter with a remote Wasm module", dir)
	}
	return url, sum
}

func walk(v any, f func(string, any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			f(k, e)
			walk(e, f)
		}
	case []any:
		for _, e := range x {
			walk(e, f)
		}
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func untarGz(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return untar(t, zr)
}

func untar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func checkArchive(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := untar(t, f)
	n := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(got[filepath.ToSlash(rel)], want) {
			return fmt.Errorf("archive entry %s differs from the layout", rel)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(got) {
		t.Errorf("archive has %d files, layout %d", len(got), n)
	}
}

// copyTree copies the named subdirectories of src into dst.
func copyTree(t *testing.T, src, dst string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(src, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			target := filepath.Join(dst, rel)
			if e.IsDir() {
				return os.MkdirAll(target, 0o755)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
