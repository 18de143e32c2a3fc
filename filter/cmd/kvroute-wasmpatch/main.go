// Command kvroute-wasmpatch finishes the filter's build: it redirects the Go runtime's
// calls to WASI poll_oneoff to a local function, so the module survives the
// proxy-wasm-cpp-host that Envoy 1.35-1.38 ship (see package wasmpatch for why), and
// points the proxy_on_memory_allocate export at the filter's allocator, which reuses
// its buffers (wasmpatch.UseAllocator).
//
//	kvroute-wasmpatch --in bin/kvroute.go.wasm --out bin/kvroute.wasm
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/filter/wasmpatch"
	"github.com/kvroute/kvroute/internal/cli"
)

const name = "kvroute-wasmpatch"

var help = cli.Help{
	Intro: `finishes the filter's build. It redirects the Go runtime's calls to WASI
poll_oneoff in a compiled proxy-wasm module to a local function that answers as
proxy-wasm-cpp-host >= 94091cd does, so the module survives the cpp-host of Envoy
1.35-1.38, and points proxy_on_memory_allocate at the filter's own allocator when the
module exports one (kvroute_memory_allocate). make wasm runs it.`,
	Usage: []string{"--in MODULE --out MODULE"},
}

func main() { os.Exit(cli.Exit(name, run(os.Args[1:], os.Stdout), os.Stderr)) }

func run(args []string, stdout io.Writer) error {
	fs := cli.NewFlagSet(name, help, stdout)
	in := fs.String("in", "", "module as go build wrote it (required)")
	out := fs.String("out", "", "where to write the patched module (required)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return cli.Usagef("--in and --out are required")
	}
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	patched, res, err := wasmpatch.PollOneoffShim(b)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	alloc, err := wasmpatch.UseAllocator(patched)
	switch {
	case err == nil:
		patched = alloc
	case !errors.Is(err, wasmpatch.ErrNoExport):
		return fmt.Errorf("%s: %w", *in, err)
	}
	if err := os.WriteFile(*out, patched, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s: %d call(s) to poll_oneoff (function %d) now go to function %d\n",
		name, *out, res.CallSites, res.Import, res.Shim)
	if alloc != nil {
		fmt.Fprintf(stdout, "%s: %s: %s is the filter's %s\n", name, *out, wasmpatch.MemoryAllocate, wasmpatch.Allocator)
	}
	return nil
}
