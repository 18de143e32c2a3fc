package host_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// pluginPath is the conformance plugin (testdata/plugin) built once for the package.
var pluginPath string

func TestMain(m *testing.M) {
	path, cleanup, err := wasmbuild.BuildTemp("testdata/plugin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginPath = path
	code := m.Run()
	cleanup()
	os.Exit(code)
}

var readFile = os.ReadFile
