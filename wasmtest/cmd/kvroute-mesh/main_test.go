package main

import (
	"bytes"
	"errors"
	"flag"
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
