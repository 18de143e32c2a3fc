package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInferencePoolFlag: --inference-pool is parsed, and alone (without --k8s-selector)
// it is enough to need a Kubernetes client.
func TestInferencePoolFlag(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(cfg, []byte("not: [a kubeconfig"), 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--inference-pool", "llama-pool"}, "NAMESPACE/NAME"},
		{[]string{"--inference-pool", "llm/pool="}, "empty model"},
		{[]string{"--inference-pool", "llm/llama-pool=meta-llama/Llama-3.1-8B", "--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig"},
		{[]string{"--inference-pool", "llm/llama-pool", "--kubeconfig", cfg}, "--kubeconfig"},
	}
	for _, c := range cases {
		err := run(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want one naming %q", c.args, err, c.want)
		}
	}
}
