// Package wasmbuild compiles Go packages into proxy-wasm modules the way `make wasm` does
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared), so a test always loads the module built
// from the code it sits next to. The Go build cache makes repeated builds cheap.
package wasmbuild

import (
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Build compiles the main package in directory dir into the module file out.
func Build(dir, out string) error {
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

var (
	filterOnce sync.Once
	filterPath string
	filterErr  error
)

// Filter returns the path of kvroute.wasm built from this checkout's filter/, once per
// process. Set KVROUTE_WASM to use a given module instead.
func Filter() (string, error) {
	filterOnce.Do(func() {
		if p := os.Getenv("KVROUTE_WASM"); p != "" {
			filterPath = p
			return
		}
		filterPath, filterErr = buildFilter()
	})
	return filterPath, filterErr
}

// buildFilter writes to one fixed place per checkout, so test runs do not pile up
// modules in /tmp; each build lands under a temporary name and is renamed into place, so
// test binaries running in parallel never read a half-written module.
func buildFilter() (string, error) {
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
	if err := Build(filepath.Join(root, "filter"), tmp.Name()); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kvroute.wasm")
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
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
