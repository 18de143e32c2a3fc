// Package wasmbuild compiles a Go package into a proxy-wasm module the way `make wasm`
// does (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared), for tests that load a plugin into
// the host. The Go build cache makes repeated builds cheap.
package wasmbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Build compiles the package in directory dir into the module file out.
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
