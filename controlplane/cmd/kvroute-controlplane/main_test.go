package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestFlagErrors(t *testing.T) {
	cases := map[string][]string{
		"no engines":        {},
		"engine needs addr": {"--engine", "model=m"},
		"bad engines file":  {"--engines-file", "/nonexistent/engines.yaml"},
		"stray argument":    {"--engine", "model=m,addr=127.0.0.1:1", "extra"},
		"bad log level":     {"--log-level", "loud", "--engine", "model=m,addr=127.0.0.1:1"},
		"exposed, no token": {"--listen", "0.0.0.0:0", "--engine", "model=m,addr=127.0.0.1:1"},
		"bad kv-bind-allow": {"--kv-bind-allow", "10.0.0.0/99", "--engine", "model=m,addr=127.0.0.1:1"},
	}
	for name, args := range cases {
		if err := run(args); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	bad := filepath.Join(t.TempDir(), "engines.yaml")
	os.WriteFile(bad, []byte("engines: [{model: m, addr: 1.2.3.4:5, typo: 1}]\n"), 0o600)
	if err := run([]string{"--engines-file", bad}); err == nil || !strings.Contains(err.Error(), "typo") {
		t.Errorf("unknown field: %v", err)
	}
}

func TestHelp(t *testing.T) {
	stdout := os.Stdout
	f, _ := os.CreateTemp(t.TempDir(), "help")
	os.Stdout = f
	err := run([]string{"--help"})
	os.Stdout = stdout
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	b, _ := os.ReadFile(f.Name())
	// Sizes the help quotes are measured ones the docs give: a number copied into the
	// help goes stale when the docs are measured again.
	var docs []byte
	for _, f := range []string{"../../../docs/controlplane.md", "../../../README.md"} {
		d, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d...)
	}
	for _, size := range regexp.MustCompile(`\d[\d,.-]* (B|KB|MB|bytes)\b`).FindAllString(string(b), -1) {
		if !strings.Contains(string(docs), size) {
			t.Errorf("--help quotes %q, which neither docs/controlplane.md nor README.md says", size)
		}
	}
	for _, want := range []string{"-listen", "127.0.0.1:8080", "-max-keys", "-max-index-bytes", "-insecure-no-token", "-kv-bind-allow", "-engines-file", "-engine", "-k8s-selector", "-kv-bind", "-stride", "-spec-ttl", "-publish-interval", "-scrape-interval", "-token-file", "GET /v1/table"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}
