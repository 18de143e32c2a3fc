// Package server is the engine simulator's HTTP front end: vLLM's OpenAI-compatible
// API (POST /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages,
// /tokenize, GET /v1/models, /health, /version, /metrics, POST /reset_prefix_cache)
// over one replica (package replica), plus loopback-only fault switches under /admin/
// for tests.
//
// Prompt text is never logged: logs carry request ids and token counts.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/metrics"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

// LoRAModule is a served LoRA adapter (vLLM --lora-modules name=path).
type LoRAModule struct{ Name, Path string }

// Config configures a Server.
type Config struct {
	// Host and Port to listen on; Host defaults to 127.0.0.1, Port 0 picks a free port.
	Host string
	Port int
	// ModelName is the served model name (vLLM --served-model-name).
	ModelName   string
	LoRAModules []LoRAModule
	Replica     replica.Config
	// DefaultMaxTokens applies when a request sets no max_tokens (vLLM: 16 for
	// completions; for chat vLLM generates up to the context limit, the simulator 16).
	DefaultMaxTokens int
	// VocabSize bounds token-id prompts (default tokenizer.VocabSize).
	VocabSize int
	// ForceIncludeUsage is vLLM's --enable-force-include-usage: every stream carries
	// usage, in each chunk and in a last chunk of its own, whatever stream_options says
	// (should_include_usage in vllm/entrypoints/serve/utils/api_utils.py @00a5fdd2;
	// releases before vLLM PR #37923 forced only the last chunk).
	ForceIncludeUsage bool
	// SGLangCacheReport is SGLang's --enable-cache-report: usage carries
	// prompt_tokens_details.cached_tokens (--engine sglang; vLLM's always does here).
	SGLangCacheReport bool
	// ResponsesStore is vLLM's VLLM_ENABLE_RESPONSES_API_STORE: off, a Responses
	// request's store=true is silently ignored and previous_response_id is never found.
	ResponsesStore bool
	// ResponsesStoreSize bounds the store (0: DefaultResponseStoreSize; vLLM's is unbounded).
	ResponsesStoreSize int
	// EnableAdmin serves /admin/* (to loopback clients only).
	EnableAdmin bool
	// Version is the vLLM release imitated (zero: version.Default): it picks the
	// error envelope and what GET /version reports. The replica's event layout and
	// replay shape are set from it by the caller (see package version).
	Version version.Version
	Logger  *slog.Logger
}

// Server is one simulated vLLM replica with its HTTP listener.
type Server struct {
	cfg   Config
	log   *slog.Logger
	rep   *replica.Replica
	env   openai.Envelope
	ln    net.Listener
	srv   *http.Server
	loras map[string]int // adapter name -> lora_id (1-based, as vLLM)
	store *responseStore // the Responses API's in-memory store
	ids   atomic.Uint64

	slowMetrics atomic.Int64 // ns
	failMu      sync.Mutex
	failFrac    float64
	failStatus  int
	rng         *rand.Rand
	closeOnce   sync.Once
	served      chan struct{}
}

// Start starts the replica and serves HTTP on cfg.Host:cfg.Port.
func Start(cfg Config) (*Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "kvroute/sim-llama-3.3-70b"
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.VocabSize <= 0 {
		cfg.VocabSize = tokenizer.VocabSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Version = cfg.Version.OrDefault()
	cfg.Replica.ModelName = cfg.ModelName
	cfg.Replica.TPOT = cfg.Version.TPOT()
	if cfg.Replica.Logger == nil {
		cfg.Replica.Logger = cfg.Logger
	}
	s := &Server{cfg: cfg, log: cfg.Logger, loras: map[string]int{}, failStatus: 500,
		rng: rand.New(rand.NewPCG(1, 2)), served: make(chan struct{}),
		store: newResponseStore(cfg.ResponsesStoreSize)}
	if !cfg.Version.NestedErrors() || cfg.Replica.Kind == replica.EngineSGLang {
		s.env = openai.Flat // SGLang's ErrorResponse is vLLM 0.10.0's flat shape (sglang.go)
	}
	for i, m := range cfg.LoRAModules {
		if m.Name == "" || m.Name == cfg.ModelName {
			return nil, fmt.Errorf("lora module %d: invalid name %q", i, m.Name)
		}
		s.loras[m.Name] = i + 1
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.ln = ln
	if s.rep, err = replica.New(cfg.Replica); err != nil {
		ln.Close()
		return nil, err
	}
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http serve", "err", err)
		}
	}()
	s.log.Info("engine simulator listening", "addr", s.Addr(), "model", cfg.ModelName,
		"num_gpu_blocks", s.rep.NumGPUBlocks(), "profile", s.rep.Profile().Name, "time_scale", cfg.Replica.TimeScale)
	return s, nil
}

// Addr returns host:port of the HTTP listener.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL returns the base URL, e.g. http://127.0.0.1:34567.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Replica returns the simulated engine behind the server.
func (s *Server) Replica() *replica.Replica { return s.rep }

// EventsEndpoint returns the KV events PUB endpoint ("" when disabled).
func (s *Server) EventsEndpoint() string {
	if p := s.rep.Publisher(); p != nil {
		return p.Endpoint()
	}
	return ""
}

// ReplayEndpoint returns the KV events ROUTER endpoint ("" when disabled).
func (s *Server) ReplayEndpoint() string {
	if p := s.rep.Publisher(); p != nil {
		return p.ReplayEndpoint()
	}
	return ""
}

// Close stops the HTTP server (dropping open connections) and the replica.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		err = s.srv.Close()
		<-s.served
		if e := s.rep.Close(); e != nil && err == nil {
			err = e
		}
	})
	return err
}

// Fault switches.

// Restart simulates an engine restart (see replica.Replica.Restart).
func (s *Server) Restart() { s.rep.Restart() }

// PauseEvents stops (true) or resumes sending KV events; sequence numbers keep
// counting, so subscribers see a gap they can replay.
func (s *Server) PauseEvents(paused bool) {
	if p := s.rep.Publisher(); p != nil {
		p.SetPaused(paused)
	}
}

// SetSlowMetrics delays every GET /metrics by d (0 to stop).
func (s *Server) SetSlowMetrics(d time.Duration) { s.slowMetrics.Store(int64(max(d, 0))) }

// SetFailFraction makes a fraction f of completion requests fail with status (500 or
// 503), chosen by a seeded generator (deterministic sequence).
func (s *Server) SetFailFraction(f float64, status int) error {
	if f < 0 || f > 1 || math.IsNaN(f) {
		return fmt.Errorf("fail fraction %v: want 0..1", f)
	}
	if status != http.StatusInternalServerError && status != http.StatusServiceUnavailable {
		return fmt.Errorf("fail status %d: want 500 or 503", status)
	}
	s.failMu.Lock()
	s.failFrac, s.failStatus = f, status
	s.failMu.Unlock()
	return nil
}

func (s *Server) injectedFailure() *openai.Error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.failFrac == 0 || s.rng.Float64() >= s.failFrac {
		return nil
	}
	return openai.ServerError(s.failStatus, "injected failure (engine simulator fault switch)")
}

// Handler returns the HTTP routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	if s.isSGLang() {
		mux.HandleFunc("GET /v1/models", s.sglangModels)
		s.sglangRoutes(mux)
	} else {
		mux.HandleFunc("GET /v1/models", s.models)
		mux.HandleFunc("POST /v1/responses", s.responses)
		mux.HandleFunc("POST /v1/messages", s.messages)
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version.String() + "+kvroute.enginesim"})
	})
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
		if !s.rep.ResetPrefixCache() {
			s.fail(w, openai.ServerError(http.StatusInternalServerError, "Failed to reset prefix cache: blocks are in use"))
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	if s.cfg.EnableAdmin {
		mux.HandleFunc("POST /admin/restart", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			s.Restart()
			return nil
		}))
		mux.HandleFunc("POST /admin/pause-events", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			on := true
			if v := r.URL.Query().Get("on"); v != "" {
				var err error
				if on, err = strconv.ParseBool(v); err != nil {
					return fmt.Errorf("on=%q: %w", v, err)
				}
			}
			s.PauseEvents(on)
			return nil
		}))
		mux.HandleFunc("POST /admin/resume-events", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			s.PauseEvents(false)
			return nil
		}))
		mux.HandleFunc("POST /admin/slow-metrics", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			ms, err := strconv.ParseFloat(r.URL.Query().Get("ms"), 64)
			if err != nil || ms < 0 {
				return fmt.Errorf("ms=%q: want milliseconds >= 0", r.URL.Query().Get("ms"))
			}
			s.SetSlowMetrics(time.Duration(ms * float64(time.Millisecond)))
			return nil
		}))
		mux.HandleFunc("POST /admin/fail-fraction", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			q := r.URL.Query()
			f, err := strconv.ParseFloat(q.Get("f"), 64)
			if err != nil {
				return fmt.Errorf("f=%q: want a fraction 0..1", q.Get("f"))
			}
			status := http.StatusInternalServerError
			if c := q.Get("code"); c != "" {
				if status, err = strconv.Atoi(c); err != nil {
					return fmt.Errorf("code=%q: %w", c, err)
				}
			}
			return s.SetFailFraction(f, status)
		}))
		mux.HandleFunc("POST /admin/reset-prefix-cache", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			if !s.rep.ResetPrefixCache() {
				return errors.New("blocks are in use")
			}
			return nil
		}))
		mux.HandleFunc("GET /admin/state", s.admin(func(w http.ResponseWriter, r *http.Request) error {
			st := s.rep.State()
			out := map[string]any{
				"waiting": st.Waiting, "running": st.Running, "queued_prefill_tokens": st.QueuedPrefillTokens,
				"kv_cache_usage_perc": st.KVUsage, "free_blocks": st.FreeBlocks, "cached_blocks": st.CachedBlocks,
				"num_gpu_blocks": s.rep.NumGPUBlocks(), "simulated_time_s": s.rep.Now().Seconds(),
			}
			if p := s.rep.Publisher(); p != nil {
				out["kv_events_next_seq"] = p.NextSeq()
				out["kv_events_paused"] = p.Paused()
				out["kv_events_endpoint"] = p.Endpoint()
				out["kv_events_replay_endpoint"] = p.ReplayEndpoint()
				out["kv_events_publish_errors"] = s.rep.PublishErrors()
			}
			writeJSON(w, http.StatusOK, out)
			return nil
		}))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" {
			// No route: the mux would answer 404 or 405 in plain text. Let it pick the
			// status (and the Allow header), then answer with FastAPI's JSON body.
			rec := &statusOnly{h: w.Header()}
			mux.ServeHTTP(rec, r)
			w.Header().Del("X-Content-Type-Options")
			openai.WriteDetail(w, rec.status)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// statusOnly records the status and headers a handler writes and drops its body.
type statusOnly struct {
	h      http.Header
	status int
}

func (s *statusOnly) Header() http.Header { return s.h }
func (s *statusOnly) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return len(b), nil
}
func (s *statusOnly) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
}

// fail answers with e in the imitated release's error envelope.
func (s *Server) fail(w http.ResponseWriter, e *openai.Error) {
	if s.isSGLang() {
		e = sglangError(e)
	}
	e.WriteAs(w, s.env)
}

// admin wraps a fault switch: loopback clients only; 204 on success, 400 on bad input.
func (s *Server) admin(f func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			s.fail(w, &openai.Error{Status: http.StatusForbidden, Type: "ForbiddenError", Message: "admin endpoints are loopback-only"})
			return
		}
		if err := f(w, r); err != nil {
			s.fail(w, openai.BadRequest("%v", err))
			return
		}
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusNoContent)
		}
		s.log.Info("admin", "path", r.URL.Path, "query", r.URL.RawQuery)
	}
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if d := time.Duration(s.slowMetrics.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	write := metrics.Write
	if s.cfg.Replica.Kind == replica.EngineSGLang {
		o := metrics.SGLangPage{NewLabels: s.cfg.Replica.SGLang.NewLabels(), PageSize: s.rep.Profile().BlockSize}
		write = func(w io.Writer, snap metrics.Snapshot) error { return metrics.WriteSGLang(w, snap, o) } // SGLang's names (metrics/sglang.go)
	}
	if err := write(w, s.rep.Metrics()); err != nil {
		s.log.Debug("metrics write", "err", err)
	}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	now := time.Now().Unix()
	entry := func(id, root string, parent *string) openai.Model {
		return openai.Model{ID: id, Object: "model", Created: now, OwnedBy: "vllm", Root: root, Parent: parent,
			MaxModelLen: s.rep.Profile().MaxModelLen,
			Permission: []openai.Permission{{ID: fmt.Sprintf("modelperm-%016x", s.ids.Add(1)), Object: "model_permission",
				Created: now, AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}}}
	}
	list := openai.ModelList{Object: "list", Data: []openai.Model{entry(s.cfg.ModelName, s.cfg.ModelName, nil)}}
	for _, m := range s.cfg.LoRAModules {
		base := s.cfg.ModelName
		list.Data = append(list.Data, entry(m.Name, m.Path, &base))
	}
	writeJSON(w, http.StatusOK, list)
}

// model resolves a request's model to a LoRA adapter ("" = base model).
func (s *Server) model(name string) (lora string, loraID int, e *openai.Error) {
	if s.isSGLang() {
		return s.sglangModel(name)
	}
	if name == "" || name == s.cfg.ModelName {
		return "", 0, nil
	}
	if id, ok := s.loras[name]; ok {
		return name, id, nil
	}
	return "", 0, openai.NotFound("model", "The model `%s` does not exist.", name)
}

const maxBody = 64 << 20

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *openai.Error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return nil, openai.BadRequest("could not read the request body: %v", err)
	}
	return b, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
