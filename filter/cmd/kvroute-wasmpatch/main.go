// Command kvroute-wasmpatch finishes the filter's build: it redirects the Go runtime's
// calls to WASI poll_oneoff to a local function, so the module survives the
// proxy-wasm-cpp-host that Envoy 1.35-1.38 ship (see package wasmpatch for why).
//
//	kvroute-wasmpatch -in bin/kvroute.go.wasm -out bin/kvroute.wasm
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/filter/wasmpatch"
)

func main() {
	flags := flag.NewFlagSet("kvroute-wasmpatch", flag.ContinueOnError)
	flags.Usage = func() {
		fmt.Fprint(flags.Output(), "Usage: kvroute-wasmpatch -in MODULE -out MODULE\n\n"+
			"Redirects the Go runtime's calls to WASI poll_oneoff in a compiled proxy-wasm module\n"+
			"to a local function that answers as proxy-wasm-cpp-host >= 94091cd does.\n\n")
		flags.PrintDefaults()
	}
	in := flags.String("in", "", "module as go build wrote it")
	out := flags.String("out", "", "where to write the patched module")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return
		}
		os.Exit(2)
	}
	if *in == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "kvroute-wasmpatch: -in and -out are required (see --help)")
		os.Exit(2)
	}
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-wasmpatch:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	patched, res, err := wasmpatch.PollOneoffShim(b)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := os.WriteFile(out, patched, 0o644); err != nil {
		return err
	}
	fmt.Printf("kvroute-wasmpatch: %s: %d call(s) to poll_oneoff (function %d) now go to function %d\n",
		out, res.CallSites, res.Import, res.Shim)
	return nil
}
