package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// syncBuffer is the command's stdout, read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds; the deadline only guards against a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitUpTo(t, 30*time.Second, what, cond)
}

func waitUpTo(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startEngine runs a kvroute-enginesim replica as `kvroute-enginesim --profile fast
// --served-model-name llama --kv-events-config {...}` would, on loopback ports of its
// own choosing.
func startEngine(t *testing.T) *server.Server {
	t.Helper()
	return startEngineServing(t, "llama")
}

// startEngineServing is startEngine serving model.
func startEngineServing(t *testing.T, model string) *server.Server {
	t.Helper()
	prof, err := timing.ByName("fast")
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.Start(server.Config{
		Host: "127.0.0.1", ModelName: model, DefaultMaxTokens: 16,
		Replica: replica.Config{
			Engine:    sched.Config{Profile: prof},
			TimeScale: 1,
			Events: publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq",
				Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0",
				BufferSteps: publisher.DefaultBufferSteps, HWM: publisher.DefaultHWM, MaxQueueSize: publisher.DefaultQueueSize},
			EventsOptions: publisher.Options{Encoding: kvevents.Map, BindHost: "127.0.0.1"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runMesh runs the command with args until the test ends, and returns its stdout once
// the banner, curl line included, is out.
func runMesh(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	o, err := parse(append([]string{"--proxy", "127.0.0.1:0", "--controlplane", "127.0.0.1:0", "--wasm", "", "--log-level", "error"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, &out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	// The command builds the filter (--wasm ""), compiles it in the host and waits up to
	// 15 s for a table before it prints the banner: under -race with every core busy, that
	// took longer than waitFor's 30 s (24 of 120 runs).
	waitUpTo(t, 3*time.Minute, "the banner", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("run ended: %v\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), "curl")
	})
	return &out
}

// The banner's curl names the model the engine serves (its /v1/models), says when
// --engine named another, and counts engines in English.
func TestBannerNamesTheServedModel(t *testing.T) {
	e := startEngineServing(t, "qwen")
	banner := runMesh(t, "--engine", fmt.Sprintf("model=foo,addr=%s", e.Addr())).String()
	if !strings.Contains(banner, `"model": "qwen"`) {
		t.Errorf("the curl does not name the served model qwen:\n%s", banner)
	}
	if !strings.Contains(banner, `serves qwen, not "foo"`) {
		t.Errorf("no word that --engine names another model than the engine serves:\n%s", banner)
	}
	if !strings.Contains(banner, "in front of 1 engine ...") {
		t.Errorf("one engine, in English:\n%s", banner)
	}
}

// `kvroute-mesh --engine ...` puts the real filter and the control plane in front of
// engines started separately: requests through the proxy reach them, the control plane
// indexes their KV events, and a repeated prefix goes back to the engine that holds it.
func TestBringYourOwnEngines(t *testing.T) {
	engines := []*server.Server{startEngine(t), startEngine(t)}
	var args []string
	for _, e := range engines {
		args = append(args, "--engine", fmt.Sprintf("model=llama,addr=%s,kv=%s,replay=%s", e.Addr(), e.EventsEndpoint(), e.ReplayEndpoint()))
	}
	banner := runMesh(t, args...).String()
	p := regexp.MustCompile(`proxy \(kvroute\.wasm, \d VMs\)\s+(http://\S+)`).FindStringSubmatch(banner)
	c := regexp.MustCompile(`control plane\s+(http://\S+)`).FindStringSubmatch(banner)
	if p == nil || c == nil {
		t.Fatalf("the banner names no proxy or control plane:\n%s", banner)
	}
	proxyURL, cpURL := p[1], c[1]
	if !strings.Contains(banner, `"model": "llama"`) || !strings.Contains(banner, "in front of 2 engines") || strings.Contains(banner, "kvroute-mesh: http") {
		t.Errorf("the banner's curl names llama, with no warning:\n%s", banner)
	}
	for _, e := range engines {
		if !strings.Contains(banner, e.URL()) || !strings.Contains(banner, e.EventsEndpoint()) {
			t.Errorf("the banner does not name engine %s and its KV events %s:\n%s", e.URL(), e.EventsEndpoint(), banner)
		}
	}
	if strings.Contains(banner, "simulated") {
		t.Errorf("simulated replicas started next to the given engines:\n%s", banner)
	}

	system := mesh.SystemPrompt(3, 600) // 600 tokens: 37 blocks of 16
	served := func() []int64 {
		var n []int64
		for _, e := range engines {
			n = append(n, e.Replica().Metrics().PromptTokens)
		}
		return n
	}
	// send runs one chat request through the proxy and returns the engine that served it
	// and the cached prompt tokens the engine reported.
	send := func(question string) (int, int) {
		t.Helper()
		before := served()
		body, _ := json.Marshal(map[string]any{"model": "llama", "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": question}}})
		resp, err := http.Post(proxyURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct{ Usage mesh.Usage }
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		after, who := served(), -1
		for i := range after {
			if after[i] > before[i] {
				if who >= 0 {
					t.Fatalf("both engines served one request")
				}
				who = i
			}
		}
		if who < 0 {
			t.Fatalf("no engine served the request")
		}
		cached := 0
		if r.Usage.Details != nil {
			cached = r.Usage.Details.CachedTokens
		}
		return who, cached
	}

	owner, _ := send("Where is my order 1?")
	ownerAddr := engines[owner].Addr()
	waitFor(t, "the control plane indexes the owner's KV events", func() bool {
		resp, err := http.Get(cpURL + "/debug/state")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			Replicas []struct {
				Address   string `json:"address"`
				TokenKeys int    `json:"token_keys"`
			}
		}
		if json.NewDecoder(resp.Body).Decode(&st) != nil {
			return false
		}
		for _, r := range st.Replicas {
			if r.Address == ownerAddr && r.TokenKeys > 0 {
				return true
			}
		}
		return false
	})
	for i := 2; i <= 6; i++ {
		who, cached := send(fmt.Sprintf("Where is my order %d?", i))
		if who != owner {
			t.Fatalf("request %d with the same prefix went to engine %d, not %d which holds it", i, who, owner)
		}
		if cached < 512 {
			t.Errorf("request %d: %d cached prompt tokens, want the 600-token prefix's complete blocks", i, cached)
		}
	}
}
