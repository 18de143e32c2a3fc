package wasmimage

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// fakeModule is a tiny valid-looking Wasm binary (magic, version, then payload).
func fakeModule(payload string) []byte {
	return append([]byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}, payload...)
}

func TestBuildIsReproducibleAndDependsOnlyOnTheModule(t *testing.T) {
	digest := func(m []byte, o Options) v1.Hash {
		img, err := Build(m, o)
		if err != nil {
			t.Fatal(err)
		}
		// Validate what a registry would get: the image as written to a layout.
		dir := filepath.Join(t.TempDir(), "layout")
		if err := WriteLayout(dir, img, ""); err != nil {
			t.Fatal(err)
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		written, err := idx.Image(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(written); err != nil {
			t.Fatalf("inconsistent image: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := digest(fakeModule("one"), Options{}), digest(fakeModule("one"), Options{})
	if a != b {
		t.Errorf("same module, two digests: %s, %s", a, b)
	}
	if c := digest(fakeModule("two"), Options{}); c == a {
		t.Errorf("different modules, one digest %s", a)
	}
	if c := digest(fakeModule("one"), Options{Annotations: map[string]string{"x": "y"}}); c == a {
		t.Errorf("annotations are part of the manifest, so of the digest")
	}
}

func TestBuildRejectsWhatIsNotWasm(t *testing.T) {
	for _, m := range [][]byte{nil, []byte("not wasm at all"), {0x00, 'a', 's', 'm'}} {
		if _, err := Build(m, Options{}); err == nil {
			t.Errorf("Build(%q) accepted it", m)
		}
	}
}

func TestModuleReadsBackWhatBuildPacked(t *testing.T) {
	m := fakeModule(strings.Repeat("payload", 1000))
	img, err := Build(m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Module(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, m) {
		t.Fatalf("module changed in the image")
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if mf.MediaType != ManifestMediaType || mf.Config.MediaType != ConfigMediaType || len(mf.Layers) != 1 || mf.Layers[0].MediaType != LayerMediaType {
		t.Fatalf("not the compat variant: %+v", mf)
	}
	if mf.Annotations[VariantAnnotation] != VariantCompat {
		t.Fatalf("annotations %v lack %s=%s", mf.Annotations, VariantAnnotation, VariantCompat)
	}
}

func TestPin(t *testing.T) {
	const hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	release := `# sha256: the digest (this comment stays)
# url: where it is (so does this one)
data:
  url: oci://old.example/kvroute-wasm:old
  sha256: "ffff"
`
	cases := []struct {
		name, in, url, want, err string
	}{
		{"digest and url", release, "oci://reg.example/kvroute-wasm:1.0",
			strings.NewReplacer(`oci://old.example/kvroute-wasm:old`, `oci://reg.example/kvroute-wasm:1.0`, `"ffff"`, `"`+hex+`"`).Replace(release), ""},
		{"digest only", release, "", strings.Replace(release, `"ffff"`, `"`+hex+`"`, 1), ""},
		{"no sha256 line", "data:\n  url: x\n", "", "", "found 0"},
		{"two sha256 lines", release + "  sha256: again\n", "", "", "found 2"},
		{"url with a comment", release, "oci://x#y", "", "no spaces"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "release.yaml")
			if err := os.WriteFile(path, []byte(c.in), 0o640); err != nil {
				t.Fatal(err)
			}
			err := Pin(path, v1.Hash{Algorithm: "sha256", Hex: hex}, c.url)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v, want 0640 kept", fi.Mode().Perm())
			}
		})
	}
	if err := Pin(filepath.Join(t.TempDir(), "x"), v1.Hash{Algorithm: "sha256", Hex: "abc"}, ""); err == nil {
		t.Errorf("a short digest was accepted")
	}
}

func TestLayoutAndArchive(t *testing.T) {
	img, err := Build(fakeModule("layout"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	// Writing twice replaces the layout rather than adding a second image to it.
	for range 2 {
		if err := WriteLayout(dir, img, "1.0"); err != nil {
			t.Fatal(err)
		}
	}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 3 { // manifest, config, layer
		t.Errorf("%d blobs, want 3", len(blobs))
	}
	var a, b bytes.Buffer
	if err := WriteArchive(&a, dir); err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(&b, dir); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("the archive is not reproducible")
	}
}
