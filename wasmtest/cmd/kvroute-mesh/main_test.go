package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"os"
	"strings"
	"testing"
)

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := parse([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	help := out.String()
	n := 0
	newFlagSet(&options{}, &bytes.Buffer{}).VisitAll(func(f *flag.Flag) {
		n++
		if f.Usage == "" || !strings.Contains(help, "-"+f.Name+" ") && !strings.Contains(help, "-"+f.Name+"\n") {
			t.Errorf("--help does not document -%s", f.Name)
		}
	})
	if n < 20 {
		t.Errorf("only %d flags found", n)
	}
	if !strings.Contains(help, "round robin") {
		t.Error("--help does not explain the demo")
	}
}

func TestBadFlagsAreErrors(t *testing.T) {
	for _, args := range [][]string{{"--replicas", "0"}, {"--time-scale", "-1"}, {"extra"}, {"--nope"}} {
		if _, err := parse(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// `make run` with a port taken prints one line naming the port and the flag that moves
// it, and exits non-zero (mesh.Start once panicked on a nil *Mesh in its deferred Close,
// after the engines had started).
func TestTakenPortIsOneLineAndExit1(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--proxy", addr, "--controlplane", "127.0.0.1:0"}, "--proxy"},
		{[]string{"--proxy", "127.0.0.1:0", "--controlplane", addr}, "--controlplane"},
	} {
		var stdout, stderr bytes.Buffer
		code := realMain(append(c.args, "--wasm", "", "--replicas", "1"), &stdout, &stderr)
		out := stderr.String()
		if code == 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, addr) || !strings.Contains(out, `make run ARGS="`+c.flag+` ADDR"`) {
			t.Errorf("%v: exit %d, stderr %q: want one line naming %s and %s (also as make run's ARGS), exit non-zero", c.args, code, out, addr, c.flag)
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: stdout %q, want nothing", c.args, stdout.String())
		}
		t.Logf("exit %d: %s", code, strings.TrimSpace(out))
	}
}

// The demo takes free ports unless told otherwise, so it runs next to `make run`.
func TestDemoPicksFreePorts(t *testing.T) {
	o, err := parse([]string{"--demo"}, &bytes.Buffer{})
	if err != nil || o.proxyAddr != "127.0.0.1:0" || o.cpAddr != "127.0.0.1:0" {
		t.Fatalf("--demo: %q %q %v", o.proxyAddr, o.cpAddr, err)
	}
	o, err = parse([]string{"--demo", "--proxy", "127.0.0.1:10001"}, &bytes.Buffer{})
	if err != nil || o.proxyAddr != "127.0.0.1:10001" || o.cpAddr != "127.0.0.1:0" {
		t.Fatalf("--demo --proxy: %q %q %v", o.proxyAddr, o.cpAddr, err)
	}
	if o, _ := parse(nil, &bytes.Buffer{}); o.proxyAddr != "127.0.0.1:10000" || o.cpAddr != "127.0.0.1:18080" {
		t.Fatalf("defaults: %q %q", o.proxyAddr, o.cpAddr)
	}
}

// Only a terminal gets the redrawn table: a buffer, a pipe or a file gets lines.
func TestSummaryTableOnlyOnATerminal(t *testing.T) {
	if isTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is not a terminal")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(w) {
		t.Error("a pipe is not a terminal")
	}
	f, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Error("a file is not a terminal")
	}
}
