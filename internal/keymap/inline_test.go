package keymap

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestGetIsInlined: Go inlines Get into its callers. Under wazero the call alone costs
// more than a lookup: when a change moved the empty marker into the key, Get's cost
// rose to 113 (budget 80), it stopped being inlined, and BenchmarkGet under wazero went
// from 88-104 to 143-162 ns, the filter's 32 KB request from p50 480-506 to 511-536 us
// (BenchmarkKvrouteRequestPath side by side). Compiles this package's tests with -m=2.
func TestGetIsInlined(t *testing.T) {
	if testing.Short() || runtime.GOOS == "wasip1" {
		t.Skip("compiles the package")
	}
	//lint:ignore SA1019 a test binary runs where it was built, so this is the toolchain under test
	goBin := runtime.GOROOT() + "/bin/go"
	if _, err := os.Stat(goBin); err != nil {
		t.Skipf("no go command: %v", err)
	}
	cmd := exec.Command(goBin, "test", "-c", "-o", os.DevNull, "-gcflags=-m=2", ".")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	const want = "can inline (*Map[go.shape.uint32]).Get"
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "(*Map[go.shape.uint32]).Get") {
			if !strings.Contains(line, want) {
				t.Fatalf("Get is not inlined any more:\n%s", line)
			}
			return
		}
	}
	t.Fatalf("the compiler said nothing of Get:\n%s", out)
}
