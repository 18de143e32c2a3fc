// Package wasmbuild compiles kvroute's filter to bin/kvroute.wasm's equivalent for tests,
// so a test always exercises the module built from the code it sits next to (the Go
// build cache makes this quick when nothing changed). Set KVROUTE_WASM to test a given
// module instead.
package wasmbuild

import (
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

var (
	once sync.Once
	path string
	err  error
)

// Filter returns the path of a freshly built kvroute.wasm.
func Filter() (string, error) {
	once.Do(func() {
		if p := os.Getenv("KVROUTE_WASM"); p != "" {
			path = p
			return
		}
		path, err = Build("github.com/kvroute/kvroute/filter", "kvroute.wasm")
	})
	return path, err
}

// Build compiles the main package pkg as a WASI reactor (what Envoy loads) into a
// temporary directory and returns the module's path.
func Build(pkg, name string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// One fixed place per checkout, so test runs do not pile up modules in /tmp; each
	// build lands under a temporary name and is renamed into place, so test binaries
	// running in parallel never read a half-written module.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("kvroute-wasm-%08x", crc32.ChecksumIEEE([]byte(root))))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, name+".*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", tmp.Name(), pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s for wasip1: %v\n%s", pkg, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the kvroute module")
	}
	return filepath.Dir(mod), nil
}
