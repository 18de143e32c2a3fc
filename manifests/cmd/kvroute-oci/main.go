// Command kvroute-oci packages bin/kvroute.wasm as the OCI image istio-agent pulls for
// oci:// URLs (Istio's "compat" Wasm image: one tar+gzip layer holding plugin.wasm; see
// package wasmimage), writes it as an OCI image layout directory and an oci-archive
// tarball, and prints the manifest digest that a WasmPlugin's `sha256` must hold.
// `make oci` runs it; run with --help for the flags.
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/manifests/internal/wasmimage"
)

const command = "kvroute-oci"

var help = cli.Help{
	Intro: `packages bin/kvroute.wasm as the OCI image istio-agent pulls for
oci:// URLs (Istio's "compat" Wasm image: one tar+gzip layer holding plugin.wasm), writes it
as an OCI image layout directory and an oci-archive tarball, and prints the manifest
digest that a WasmPlugin's or EnvoyFilter's sha256 must hold. make oci runs it.`,
	Usage:   []string{"[--wasm MODULE] [--out DIR] [--archive FILE] [--ref REGISTRY/REPO:TAG [--pin RELEASE.yaml]]"},
	Details: `Then push it: crane push out/kvroute-wasm REGISTRY/REPO:TAG (the digest stays the same).`,
}

func main() { os.Exit(cli.Exit(command, run(os.Args[1:], os.Stdout), os.Stderr)) }

func run(args []string, stdout io.Writer) error {
	fs := cli.NewFlagSet(command, help, stdout)
	wasm := fs.String("wasm", "bin/kvroute.wasm", "the filter module to package")
	out := fs.String("out", "out/kvroute-wasm", "OCI image layout directory to (re)write")
	archive := fs.String("archive", "out/kvroute-wasm.oci.tar", "oci-archive tarball of the layout (\"\" = none)")
	ref := fs.String("ref", "", "image reference it will be pushed as, e.g. ghcr.io/kvroute/kvroute-wasm:0.1.0 (its tag names the image in the layout)")
	pin := fs.String("pin", "", "release file to update in place (manifests/filter/release/release.yaml or the canary's): sha256 and, with --ref, url")
	source := fs.String("source", "", "org.opencontainers.image.source annotation (e.g. the repository URL)")
	revision := fs.String("revision", "", "org.opencontainers.image.revision annotation (e.g. the git commit)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var tag, url string
	if *ref != "" {
		r, err := name.ParseReference(*ref, name.StrictValidation)
		if err != nil {
			return cli.Usagef("--ref %q: %w", *ref, err)
		}
		t, ok := r.(name.Tag)
		if !ok {
			return cli.Usagef("--ref %q: give a tag, not a digest (the digest is what this command computes)", *ref)
		}
		tag, url = t.TagStr(), "oci://"+t.Name()
	}
	if *pin != "" && url == "" {
		return cli.Usagef("--pin needs --ref, so that the release file's url names what was built")
	}
	module, err := os.ReadFile(*wasm)
	if err != nil {
		return fmt.Errorf("read the module (run `make wasm` first?): %w", err)
	}
	// No tag or time in the image: the digest depends on the module (and the optional
	// source/revision) only, so a candidate keeps its digest when promoted to a new tag.
	anns := map[string]string{"org.opencontainers.image.title": wasmimage.ModuleFile}
	if *source != "" {
		anns["org.opencontainers.image.source"] = *source
	}
	if *revision != "" {
		anns["org.opencontainers.image.revision"] = *revision
	}
	img, err := wasmimage.Build(module, wasmimage.Options{Annotations: anns})
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	// Read the module back as istio-agent will, before anything is written.
	back, err := wasmimage.Module(img)
	if err != nil {
		return err
	}
	if !bytes.Equal(back, module) {
		return errors.New("the image does not give back the module")
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	if err := wasmimage.WriteLayout(*out, img, tag); err != nil {
		return err
	}
	if *archive != "" {
		if err := writeArchive(*archive, *out); err != nil {
			return err
		}
	}
	if *pin != "" {
		if err := wasmimage.Pin(*pin, digest, url); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(module)
	fmt.Fprintf(stdout, "module   %s  sha256:%x (%d bytes)\n", *wasm, sum, len(module))
	fmt.Fprintf(stdout, "layout   %s", *out)
	if tag != "" {
		fmt.Fprintf(stdout, " (tag %s)", tag)
	}
	fmt.Fprintln(stdout)
	if *archive != "" {
		fmt.Fprintf(stdout, "archive  %s\n", *archive)
	}
	if *pin != "" {
		fmt.Fprintf(stdout, "pinned   %s: url %s, sha256 %s\n", *pin, url, digest.Hex)
	}
	push := "<registry>/kvroute-wasm:<tag>"
	if *ref != "" {
		push = *ref
	}
	fmt.Fprintf(stdout, "push     crane push %s %s   (or: skopeo copy --preserve-digests oci:%s:%s docker://%s)\n",
		*out, push, *out, orDefault(tag, "<tag>"), push)
	fmt.Fprintf(stdout, "manifest %s   <- WasmPlugin/EnvoyFilter sha256 is the hex after \"sha256:\"\n", digest)
	return nil
}

func writeArchive(path, layoutDir string) error {
	var buf bytes.Buffer
	if err := wasmimage.WriteArchive(&buf, layoutDir); err != nil {
		return fmt.Errorf("oci archive: %w", err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func orDefault(s, d string) string {
	if strings.TrimSpace(s) == "" {
		return d
	}
	return s
}
