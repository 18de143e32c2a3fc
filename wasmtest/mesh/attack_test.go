package mesh_test

// Attacks on the whole mesh, on loopback: the engines' admin paths through the
// proxy, request-target tricks aimed at the control plane, clients leaving mid-stream,
// and a mesh started on a taken port.
//
// Without the fixes: POST /admin/restart and /reset_prefix_cache through the
// proxy reset the replicas' caches (200); mesh.Start on a taken proxy port (or with a bad
// profile) ended in a nil-pointer panic in its deferred m.Close (the named result was
// already nil), leaking the engines it had started.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// raw sends raw bytes to addr and returns the response status (0: none).
func raw(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Only the OpenAI API and health reach the engines: their admin paths, vLLM's and the
// control plane's get 404 (or 400 for targets Envoy's codec refuses), and a cached prefix
// survives every attempt.
func TestAttackAdminPathsAndTargets(t *testing.T) {
	m := start(t, mesh.Options{})
	addr := strings.TrimPrefix(m.URL(), "http://")
	cp := strings.TrimPrefix(m.ControlPlaneURL(), "http://")
	system := mesh.SystemPrompt(3, 1500)
	owner := send(t, m, system, "first").addr
	known(t, m, owner)
	warm := send(t, m, system, "second")
	require.Positive(t, warm.CachedTokens, "the prefix is warm before the attack")

	post := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: kvroute\r\nContent-Length: 2\r\n\r\n{}"
	}
	get := func(target string) string { return "GET " + target + " HTTP/1.1\r\nHost: kvroute\r\n\r\n" }
	cases := []struct {
		raw  string
		want int
	}{
		{post("/admin/restart"), 404},
		{post("/admin/reset-prefix-cache"), 404},
		{post("/admin/fail-fraction"), 404},
		{get("/admin/state"), 404},
		{post("/reset_prefix_cache"), 404},
		{post("/sleep"), 404},
		{post("/wake_up"), 404},
		{post("/tokenize"), 404},
		{get("/metrics"), 404},
		{get("/version"), 404},
		{get("http:@" + cp + "/debug/state"), 400},
		{get("http:@" + owner + "/admin/state"), 400},
		{get("http://" + cp + "/debug/state"), 404},
		{get("http://" + owner + "/reset_prefix_cache"), 404},
		{get("//" + cp + "/debug/state"), 404},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400},
		{"POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400},
	}
	refused := 0
	for _, c := range cases {
		got := raw(t, addr, c.raw)
		assert.Equal(t, c.want, got, "%q", strings.SplitN(c.raw, "\r\n", 2)[0])
		if got >= 400 && got < 500 {
			refused++
		}
	}
	for i, e := range m.Engines {
		assert.Zero(t, e.Replica().State().Waiting+e.Replica().State().Running, "engine %d busy", i)
	}
	after := send(t, m, system, "third")
	assert.Positive(t, after.CachedTokens, "the prefix is still cached: no admin path reached an engine")
	health := raw(t, addr, get("/health"))
	assert.Equal(t, 200, health)
	st := m.Proxy.Stats()
	t.Logf("admin paths and targets: %d requests, %d refused (%d bad request, %d no route, %d framing), cached tokens after %d of %d",
		len(cases), refused, st.BadRequests, st.NoRoute, st.FramingErrors, after.CachedTokens, after.PromptTokens)
}

// Clients that leave in the middle of a streamed answer: the engines see every stream
// end (nothing left waiting or running), and the next requests are served.
func TestAttackMidStreamDisconnects(t *testing.T) {
	m := start(t, mesh.Options{})
	addr := strings.TrimPrefix(m.URL(), "http://")
	before := runtime.NumGoroutine()
	const n = 30
	body := mesh.ChatBody("llama", mesh.SystemPrompt(5, 1500), "tell me everything", 2000)
	var wg sync.WaitGroup
	var started sync.WaitGroup
	peak := 0
	for i := 0; i < n; i++ {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(started.Done)
			defer once()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = bufio.NewReader(resp.Body).ReadString('\n') // the first event, then gone
			once()
		}()
	}
	started.Wait()
	peak = runtime.NumGoroutine()
	wg.Wait()
	waitFor(t, "the engines drop the abandoned streams", func() bool {
		for _, e := range m.Engines {
			if s := e.Replica().State(); s.Waiting+s.Running > 0 {
				return false
			}
		}
		return true
	})
	waitFor(t, "the proxy closes every client connection", func() bool { return m.Proxy.Stats().OpenConnections == 0 })
	r := send(t, m, "You are terse.", "still there?")
	assert.Positive(t, r.PromptTokens)
	client.CloseIdleConnections()
	after := runtime.NumGoroutine()
	t.Logf("mid-stream disconnects: %d clients left after their first event; engines idle again; goroutines %d/%d/%d (before/peak/after)",
		n, before, peak, after)
}

// The control plane's port is held from the moment Start picks it: OnListen (which runs
// before the engines start) cannot bind it, as an engine's own listener on port 0 or
// another process could not. Before, Start checked the port and let it go until the
// control plane bound it again after the engines had started; here the intruder then
// held it and Start failed with "control plane address ... is already in use", as
// TestReplicaKilled once did in CI.
func TestControlPlanePortIsHeldFromStart(t *testing.T) {
	var (
		m        *mesh.Mesh
		err      error
		addr     string
		intruder net.Listener
		bindErr  error
	)
	for try := 0; try < 5; try++ {
		probe, perr := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, perr)
		addr = probe.Addr().String()
		probe.Close()
		m, err = mesh.Start(context.Background(), mesh.Options{
			ProxyAddr: "127.0.0.1:0", ControlPlaneAddr: addr, Replicas: 2, TimeScale: timeScale,
			OnListen: func() { intruder, bindErr = net.Listen("tcp", addr) },
		})
		var busy *mesh.PortInUseError
		if intruder != nil || !errors.As(err, &busy) {
			break
		}
		// Taken between the probe and Start, by someone else: another address.
	}
	if intruder != nil {
		defer intruder.Close()
	}
	require.NoError(t, err, "the intruder took the port: %v", intruder != nil)
	defer m.Close()
	require.Error(t, bindErr, "the control plane's port was free to bind while Start ran")
	assert.Equal(t, "http://"+addr, m.ControlPlaneURL())
	waitFor(t, "the filter has a table", func() bool { return m.Summary().TableVersion > 0 })
}

// A taken port, a bad profile or a filter that does not load: Start returns an error,
// never panics, and leaves no engine, goroutine or listener behind.
func TestStartFailuresLeaveNothingBehind(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	runtime.GC()
	before := runtime.NumGoroutine()
	cases := []struct {
		name string
		o    mesh.Options
		part string
	}{
		{"proxy port taken", mesh.Options{ProxyAddr: taken.Addr().String()}, "proxy"},
		{"control plane port taken", mesh.Options{ProxyAddr: "127.0.0.1:0", ControlPlaneAddr: taken.Addr().String()}, "control plane"},
		{"bad profile", mesh.Options{ProxyAddr: "127.0.0.1:0", Profile: "nope"}, ""},
		{"filter does not load (after the engines started)", mesh.Options{ProxyAddr: "127.0.0.1:0", WasmPath: t.TempDir() + "/missing.wasm"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.Replicas, c.o.TimeScale = 2, timeScale
			var m *mesh.Mesh
			var err error
			require.NotPanics(t, func() { m, err = mesh.Start(context.Background(), c.o) })
			require.Error(t, err)
			assert.Nil(t, m)
			var busy *mesh.PortInUseError
			if c.part != "" {
				require.ErrorAs(t, err, &busy)
				assert.Equal(t, c.part, busy.Part)
				assert.Equal(t, taken.Addr().String(), busy.Addr)
			} else {
				assert.False(t, errors.As(err, &busy))
			}
			t.Logf("%v", err)
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	after := runtime.NumGoroutine()
	if after > before+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines %d -> %d: engines or listeners leaked\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
	// The taken port is still the other owner's.
	_, err = net.Listen("tcp", taken.Addr().String())
	require.Error(t, err)
	t.Logf("start failures: %d cases, no panic; goroutines %d before, %d after", len(cases), before, after)
}
