// Package wasmbuild compiles Go packages into proxy-wasm modules the way `make wasm` does
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared, then filter/wasmpatch's poll_oneoff shim),
// so a test always loads the module built from the code it sits next to. The Go build
// cache makes repeated builds cheap.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package wasmbuild

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/filter/wasmpatch"
)

// Build compiles the main package in directory dir into the module file out and applies
// the poll_oneoff shim and, for a module that offers one, its own memory allocator
// (wasmpatch.UseAllocator), as `make wasm` does for the filter.
func Build(dir, out string) error {
	if err := BuildUnpatched(dir, out); err != nil {
		return err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	patched, _, err := wasmpatch.PollOneoffShim(b)
	switch {
	case errors.Is(err, wasmpatch.ErrNoPollOneoff):
		patched = b
	case err != nil:
		return fmt.Errorf("patch %s: %w", dir, err)
	}
	alloc, err := wasmpatch.UseAllocator(patched)
	switch {
	case err == nil:
		patched = alloc
	case !errors.Is(err, wasmpatch.ErrNoExport):
		return fmt.Errorf("patch %s: %w", dir, err)
	}
	if bytes.Equal(patched, b) {
		return nil
	}
	return os.WriteFile(out, patched, 0o644)
}

// BuildUnpatched compiles the main package in directory dir into the module file out as
// go build alone writes it: what a proxy-wasm-cpp-host older than 94091cd cannot keep alive.
func BuildUnpatched(dir, out string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.Command(goTool(), "build", "-buildmode=c-shared", "-trimpath", "-o", abs, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s for wasip1: %w\n%s", dir, err, msg)
	}
	return nil
}

// BuildTemp compiles the package in dir into a new temporary directory and returns the
// module's path and a function that removes the directory.
func BuildTemp(dir string) (path string, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", "wasmbuild-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	path = filepath.Join(tmp, filepath.Base(dir)+".wasm")
	if err := Build(dir, path); err != nil {
		cleanup()
		return "", nil, err
	}
	return path, cleanup, nil
}

type once struct {
	sync.Once
	path string
	err  error
}

var filter, filterUnpatched once

// Filter returns the path of kvroute.wasm built from this checkout's filter/ as `make
// wasm` ships it, once per process. Set KVROUTE_WASM to use a given module instead.
func Filter() (string, error) {
	filter.Do(func() {
		if p := os.Getenv("KVROUTE_WASM"); p != "" {
			filter.path = p
			return
		}
		filter.path, filter.err = buildFilter("kvroute.wasm", Build)
	})
	return filter.path, filter.err
}

// FilterWithoutPollShim returns the path of the filter as go build alone writes it, once
// per process: the module that dies on hosts whose poll_oneoff fails.
func FilterWithoutPollShim() (string, error) {
	filterUnpatched.Do(func() {
		filterUnpatched.path, filterUnpatched.err = buildFilter("kvroute.go.wasm", BuildUnpatched)
	})
	return filterUnpatched.path, filterUnpatched.err
}

// buildFilter writes to one fixed place per checkout, so test runs do not pile up
// modules in /tmp; each build lands under a temporary name and is renamed into place, so
// test binaries running in parallel never read a half-written module.
func buildFilter(name string, build func(dir, out string) error) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("kvroute-wasm-%08x", crc32.ChecksumIEEE([]byte(root))))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "kvroute.wasm.*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := build(filepath.Join(root, "filter"), tmp.Name()); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the kvroute module")
	}
	return filepath.Dir(mod), nil
}

// goTool prefers the go command of the toolchain running the tests.
func goTool() string {
	//lint:ignore SA1019 the tests' binary runs where it was built; "go" on PATH is the fallback
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
