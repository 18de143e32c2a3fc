// Package wasmimage packages kvroute.wasm as an OCI image that istio-agent can pull for a
// WasmPlugin `url: oci://...` or an EnvoyFilter's remote `http_uri.uri: oci://...`.
//
// Istio's image fetcher (pkg/wasm/imagefetcher.go) accepts three layouts: a Docker image
// whose last layer is a tar.gz with plugin.wasm, the "compat" variant (an OCI image whose
// last layer is application/vnd.oci.image.layer.v1.tar+gzip holding plugin.wasm), and the
// "oci" artifact variant (application/vnd.module.wasm.content.layer.v1+wasm), which it
// only accepts with exactly TWO layers (the module plus the runtime config pushed as a
// layer). A one-layer artifact of the kind `oras push --config ...:vnd.module.wasm.config`
// produces is rejected ("number of layers must be 2"). This package therefore builds the
// compat variant: one OCI tar+gzip layer holding plugin.wasm, a standard OCI config
// (architecture wasm, os wasip1) and the manifest annotation
// module.wasm.image/variant=compat, which standard registries and tools (crane, skopeo,
// oras, docker) all handle.
//
// The image is reproducible: the same module always gives the same manifest digest, which
// is the value a WasmPlugin's `sha256` (and an Envoy remote source's `sha256`, as
// istio-agent reads it) must hold for an oci:// URL: istio-agent compares it to the
// digest of the manifest it pulled, not to the module's own hash.
package wasmimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// ModuleFile is the name Istio looks for inside the layer.
	ModuleFile = "plugin.wasm"
	// VariantAnnotation and VariantCompat mark the manifest as the compat variant (the
	// Wasm image spec requires it when the layer is an OCI tar+gzip).
	VariantAnnotation = "module.wasm.image/variant"
	VariantCompat     = "compat"
	// RefNameAnnotation names an image inside an OCI layout (the tag, e.g. "0.1.0").
	RefNameAnnotation = "org.opencontainers.image.ref.name"

	// Media types of the compat variant.
	ManifestMediaType = types.OCIManifestSchema1 // application/vnd.oci.image.manifest.v1+json
	ConfigMediaType   = types.OCIConfigJSON      // application/vnd.oci.image.config.v1+json
	LayerMediaType    = types.OCILayer           // application/vnd.oci.image.layer.v1.tar+gzip
)

// wasmMagic starts every Wasm binary; istio-agent refuses a module without it.
var wasmMagic = []byte{0x00, 'a', 's', 'm'}

// Options adds metadata to the image; none of it is needed by Istio.
type Options struct {
	// Created is the config's creation time. Zero means the Unix epoch, so that
	// rebuilding the same module gives the same digest.
	Created time.Time
	// Annotations are added to the manifest (e.g. org.opencontainers.image.source).
	Annotations map[string]string
}

// Build returns the compat-variant image holding module.
func Build(module []byte, o Options) (v1.Image, error) {
	if len(module) < 8 || !bytes.Equal(module[:4], wasmMagic) {
		return nil, errors.New("wasm image: the module does not start with the Wasm magic number")
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	gz, err := layerBytes(module)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(LayerMediaType))
	if err != nil {
		return nil, fmt.Errorf("wasm image: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, ManifestMediaType)
	img = mutate.ConfigMediaType(img, ConfigMediaType)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: LayerMediaType,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "kvroute-oci: " + ModuleFile},
	})
	if err != nil {
		return nil, fmt.Errorf("wasm image: append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("wasm image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "wasm", "wasip1"
	cf.Created = v1.Time{Time: created}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("wasm image: config: %w", err)
	}
	anns := map[string]string{VariantAnnotation: VariantCompat}
	for k, v := range o.Annotations {
		anns[k] = v
	}
	return mutate.Annotations(img, anns).(v1.Image), nil
}

// layerBytes is the gzipped tar holding only plugin.wasm, with fixed metadata (owner 0,
// mode 0444, epoch mtime, USTAR, no gzip name or time) so it is byte-for-byte repeatable.
func layerBytes(module []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     ModuleFile,
		Mode:     0o444,
		Size:     int64(len(module)),
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("wasm image: tar header: %w", err)
	}
	if _, err := tw.Write(module); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Module extracts the Wasm module the way istio-agent does for the compat variant: the
// last layer must be an OCI tar+gzip layer, and the module is its plugin.wasm.
func Module(img v1.Image) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("wasm image: layers: %w", err)
	}
	if len(layers) == 0 {
		return nil, errors.New("wasm image: no layers")
	}
	last := layers[len(layers)-1]
	mt, err := last.MediaType()
	if err != nil {
		return nil, fmt.Errorf("wasm image: layer media type: %w", err)
	}
	if mt != LayerMediaType {
		return nil, fmt.Errorf("wasm image: layer media type %s, want %s", mt, LayerMediaType)
	}
	rc, err := last.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("wasm image: layer is not gzip: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("wasm image: no %s in the layer", ModuleFile)
		}
		if err != nil {
			return nil, fmt.Errorf("wasm image: layer tar: %w", err)
		}
		if filepath.Base(h.Name) == ModuleFile {
			return io.ReadAll(tr)
		}
	}
}

// WriteLayout writes img as the only image of a fresh OCI image layout in dir (replacing
// what was there), tagged refName inside the layout when it is not empty.
func WriteLayout(dir string, img v1.Image, refName string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if refName != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{RefNameAnnotation: refName}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	return nil
}

// WriteArchive writes the OCI layout in dir as a tar stream (an "oci-archive", which
// skopeo and podman read), with sorted entries and fixed metadata.
func WriteArchive(w io.Writer, dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		} else if !d.IsDir() {
			return fmt.Errorf("oci archive: %s is neither a file nor a directory", path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := pathDir(f); d != "" && !dirs[d]; d = pathDir(d) {
			dirs[d] = true
		}
	}
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func pathDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}

var (
	sha256Line = regexp.MustCompile(`(?m)^([ \t]*sha256:)[ \t]*.*$`)
	urlLine    = regexp.MustCompile(`(?m)^([ \t]*url:)[ \t]*.*$`)
	hexDigest  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Pin rewrites a release file (manifests/filter/release/release.yaml or the canary's) in
// place: its `sha256:` line gets digest's hex and, when url is not empty, its `url:` line
// gets url. Each line must occur exactly once; comments and layout are kept.
func Pin(path string, digest v1.Hash, url string) error {
	if digest.Algorithm != "sha256" || !hexDigest.MatchString(digest.Hex) {
		return fmt.Errorf("pin %s: %q is not a sha256 digest", path, digest)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := pinBytes(b, digest.Hex, url)
	if err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func pinBytes(b []byte, hex, url string) ([]byte, error) {
	// Quoted: an unquoted all-digit digest would be a YAML number, not a string.
	b, err := replaceLine(b, sha256Line, "sha256", `"`+hex+`"`)
	if err != nil || url == "" {
		return b, err
	}
	if strings.ContainsAny(url, " \t\r\n\"'#") {
		return nil, fmt.Errorf("url %q: no spaces, quotes or '#'", url)
	}
	return replaceLine(b, urlLine, "url", url)
}

// replaceLine sets the value of the one line re matches (group 1 is the key and its
// indentation), literally: no template expansion of value.
func replaceLine(b []byte, re *regexp.Regexp, key, value string) ([]byte, error) {
	m := re.FindAllSubmatchIndex(b, -1)
	if len(m) != 1 {
		return nil, fmt.Errorf("want exactly one `%s:` line, found %d", key, len(m))
	}
	out := append([]byte{}, b[:m[0][3]]...)
	out = append(out, ' ')
	out = append(out, value...)
	return append(out, b[m[0][1]:]...), nil
}
