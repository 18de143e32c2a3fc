package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/scrape"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// logRecords keeps the control plane's log records for a test to read.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// lines are the records at level whose message starts with prefix, as "msg k=v ...".
func (l *logRecords) lines(level slog.Level, prefix string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level != level || !strings.HasPrefix(r.Message, prefix) {
			continue
		}
		s := r.Message
		r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
		out = append(out, s)
	}
	return out
}

// within polls cond until it holds or d passes (the deadline is the requirement: the
// operator is told within d).
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// engineMetrics is an engine's /metrics that can be stopped and started again on the
// same address, as a killed and restarted engine is.
type engineMetrics struct {
	t    *testing.T
	addr string
	srv  *http.Server
}

func startEngineMetrics(t *testing.T, addr string) *engineMetrics {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &engineMetrics{t: t, addr: ln.Addr().String(), srv: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"+
			"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\",engine=\"0\"} 1\n")
	})}}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close() })
	return e
}

// run starts a control plane that stops when the test ends.
func run(t *testing.T, o Options) *ControlPlane {
	t.Helper()
	cp, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cp.Wait() })
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return cp
}

func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	r, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestDeadEngineSpeaks: a control plane whose only engine dies answers /readyz 503 with
// the reason and logs one WARN, within 5 s; when the engine is back, /readyz is 200 and
// an INFO line says so. /healthz (liveness) answers 200 throughout.
func TestDeadEngineSpeaks(t *testing.T) {
	engine := startEngineMetrics(t, "127.0.0.1:0")
	logs := &logRecords{}
	cp := run(t, Options{
		Listen:         "127.0.0.1:0",
		Engines:        []discovery.Engine{{ID: "vllm-0", Model: "m", Addr: engine.addr}},
		ScrapeInterval: 20 * time.Millisecond, ScrapeTimeout: 200 * time.Millisecond, HealthInterval: 50 * time.Millisecond,
		PublishInterval: 10 * time.Millisecond,
		Logger:          slog.New(logs),
	})
	base := "http://" + cp.Addr()
	within(t, 5*time.Second, "ready with the engine up", func() bool { c, _ := readyz(t, base); return c == 200 })

	engine.srv.Close()
	var body string
	within(t, 5*time.Second, "/readyz 503 naming the dead engine, and a WARN line", func() bool {
		var code int
		code, body = readyz(t, base)
		return code == http.StatusServiceUnavailable && len(logs.lines(slog.LevelWarn, "replica unhealthy")) > 0
	})
	for _, want := range []string{"no healthy replica", "vllm-0", engine.addr, "connection refused"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body %q lacks %q", body, want)
		}
	}
	if r, err := http.Get(base + "/healthz"); err != nil || r.StatusCode != 200 {
		t.Errorf("/healthz while the engine is down: %v %v", r, err)
	}

	startEngineMetrics(t, engine.addr)
	within(t, 5*time.Second, "ready again, and an INFO line", func() bool {
		c, _ := readyz(t, base)
		return c == 200 && len(logs.lines(slog.LevelInfo, "replica healthy again")) > 0
	})
	warns := logs.lines(slog.LevelWarn, "")
	if len(warns) != 1 || !strings.Contains(warns[0], "replica=vllm-0") || !strings.Contains(warns[0], "connection refused") {
		t.Errorf("want one WARN naming vllm-0 and the scrape error, got %q", warns)
	}
	t.Log(warns[0])
	t.Log(logs.lines(slog.LevelInfo, "replica healthy again")[0])
}

// TestKVEventStreamDropSpeaks: a replica whose KV-event stream drops gets a WARN (once
// the stream had eventsGrace to connect), and an INFO when it connects again.
func TestKVEventStreamDropSpeaks(t *testing.T) {
	engine := startEngineMetrics(t, "127.0.0.1:0")
	open := func(endpoint, replay string) *publisher.Publisher {
		pub, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: endpoint, ReplayEndpoint: replay, BufferSteps: 100, HWM: 1000},
			publisher.Options{Encoding: sim.Map, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	pub := open("tcp://*:0", "tcp://*:0")
	logs := &logRecords{}
	cp := run(t, Options{
		Listen:         "127.0.0.1:0",
		Engines:        []discovery.Engine{{ID: "vllm-0", Model: "m", Addr: engine.addr, KV: pub.Endpoint(), Replay: pub.ReplayEndpoint()}},
		ScrapeInterval: 20 * time.Millisecond, HealthInterval: 50 * time.Millisecond,
		Logger: slog.New(logs),
	})
	within(t, 5*time.Second, "subscribed", pub.Subscribed)
	// The same ports again ("*" binds, as vLLM does).
	endpoint := "tcp://*" + pub.Endpoint()[strings.LastIndexByte(pub.Endpoint(), ':'):]
	replay := "tcp://*" + pub.ReplayEndpoint()[strings.LastIndexByte(pub.ReplayEndpoint(), ':'):]
	pub.Close()
	within(t, eventsGrace+5*time.Second, "a WARN for the dropped stream", func() bool {
		return len(logs.lines(slog.LevelWarn, "replica KV-event stream disconnected")) > 0
	})
	pub = open(endpoint, replay)
	defer pub.Close()
	within(t, 10*time.Second, "an INFO once it is back", func() bool {
		return len(logs.lines(slog.LevelInfo, "replica KV-event stream connected again")) > 0
	})
	// (The subscription logs its own "stream lost" line too, unlimited: kvevents.Subscribe.)
	if w := logs.lines(slog.LevelWarn, "replica "); len(w) != 1 {
		t.Errorf("want one WARN of the health check, got %q", w)
	}
	if c, body := readyz(t, "http://"+cp.Addr()); c != 200 {
		t.Errorf("a replica whose scrapes succeed keeps the control plane ready: %d %s", c, body)
	}
}

// TestHealthLinesAreRateLimited: a replica flapping every second gets healthLogBurst
// lines, then one per healthLogEvery that counts the changes left out, and its state
// at the end is the last line's.
func TestHealthLinesAreRateLimited(t *testing.T) {
	var l healthLine
	t0 := time.Unix(1000, 0)
	lines, lastDown := 0, false
	for i := range 120 { // 2 minutes, down and up every other second
		down := i%2 == 0
		if due, unlogged, _ := l.observe(down, t0.Add(time.Duration(i)*time.Second)); due {
			lines++
			lastDown = down
			if lines <= healthLogBurst && unlogged != 0 {
				t.Errorf("line %d at %ds: %d changes not logged before it", lines, i, unlogged)
			}
			if lines > healthLogBurst && unlogged == 0 {
				t.Errorf("line %d at %ds does not count the changes left out", lines, i)
			}
		}
	}
	// The burst, then about one per 30 s over the remaining ~116 s.
	if lines < healthLogBurst+3 || lines > healthLogBurst+5 {
		t.Errorf("%d lines in 2 minutes of flapping", lines)
	}
	// Settled: the next allowed line tells the state as it is.
	end := t0.Add(200 * time.Second)
	if due, _, _ := l.observe(!lastDown, end); !due {
		t.Errorf("the settled state differs from the last line and is not logged")
	}
	if due, _, _ := l.observe(!lastDown, end.Add(time.Second)); due {
		t.Errorf("the same state logged twice")
	}
}

// TestReadyzNamesAFewDownReplicas: /readyz's reason names the first maxNamedDown
// replicas and counts the rest, so its size does not grow with the fleet; one healthy
// replica of any model keeps the control plane ready.
func TestReadyzNamesAFewDownReplicas(t *testing.T) {
	cp, err := New(Options{Engines: []discovery.Engine{{ID: "x", Model: "m", Addr: "127.0.0.1:1"}}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	var specs []index.Spec
	for i := range 30 {
		model := "a"
		if i == 29 {
			model = "b"
		}
		specs = append(specs, index.Spec{ID: fmt.Sprintf("r%02d", i), Model: model, Addr: fmt.Sprintf("10.0.0.%d:8000", i)})
	}
	cp.Index.SetReplicas(specs, now)
	fail := func(n int) {
		for _, s := range specs[:n] {
			for range 3 {
				cp.Index.ApplyScrape(s.ID, scrape.Sample{}, errors.New("connection refused"), now)
			}
			cp.health.scraped(s.ID, errors.New("connection refused"))
		}
		cp.checkHealth(now)
	}
	fail(29)
	if err := cp.health.ready(); err != nil {
		t.Errorf("model b still has a healthy replica: %v", err)
	}
	fail(30)
	err = cp.health.ready()
	if err == nil || !strings.Contains(err.Error(), "r00 (10.0.0.0:8000, model a): connection refused") || !strings.Contains(err.Error(), "and 22 more") || strings.Contains(err.Error(), "r08") {
		t.Errorf("reason %v: want r00..r07 named and 22 more counted", err)
	}
}
