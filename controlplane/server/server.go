// Package server is the control plane's HTTP API: the table for filters, their reports,
// and the operator's endpoints (/debug/state, /metrics, /healthz, /readyz).
package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/controlplane/affinity"
	"github.com/kvroute/kvroute/controlplane/front"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/publish"
	"github.com/kvroute/kvroute/controlplane/shares"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults.
const (
	DefaultMaxBodyBytes = 8 << 20
	DefaultBodyTimeout  = 10 * time.Second
	MaxWait             = 30 * time.Second
)

// Server holds what the handlers need. Fields are set before Handler is called.
type Server struct {
	Index     *index.Index
	Publisher *publish.Publisher
	// Affinity is the Responses affinity the reports carry, served to every proxy
	// (api.AffinityPath); Handler makes one of the defaults, in the publisher's epoch,
	// when it is nil.
	Affinity *affinity.Map
	// Shares is the fleet's per-tenant admitted prefill the proxies post and are answered
	// (api.SharesPath); Handler makes one when it is nil.
	Shares *shares.Fleet
	// Token, when set, is required as "Authorization: Bearer <token>" on the table,
	// reports and debug endpoints.
	Token string
	// MaxBodyBytes bounds a report batch (default 8 MiB).
	MaxBodyBytes int64
	// MaxBytesInFlight bounds the report body bytes read and not yet applied (default
	// 2 x MaxBodyBytes): each chunk is charged as it is read, and a batch whose chunk
	// would exceed it is refused with 429 and counted, so concurrent large posts cannot
	// multiply the memory one batch takes, and a body that stalls holds only what it
	// sent.
	MaxBytesInFlight int64
	// BodyTimeout bounds reading a request's body, on every endpoint and either
	// listener (default DefaultBodyTimeout; a filter posts a report batch within its
	// call timeout, wait_ms + 1 s by default). Requests without a body (polls, long
	// ones included) keep the listener's deadlines.
	BodyTimeout time.Duration
	Gatherer    prometheus.Gatherer
	Metrics     *Metrics
	// Ready, when set, is an extra readiness condition: an error says why not, and
	// /readyz answers 503 with it.
	Ready func() error
	// TakeoverAfter, when positive: for this long after Handler is called, a poll that
	// names another epoch (a filter that holds another replica's table) is answered 503,
	// and the filter asks its next replica, which has heard its reports for longer; a
	// poll without an epoch is served at once. A replica learns the filters' text keys
	// only from their reports, so one that just started would hand them a table without
	// them.
	TakeoverAfter time.Duration
	// Warmup, when set, is how complete a starting control plane's index is, for
	// /debug/state.
	Warmup func() WarmupState
	Now    func() time.Time

	inflightMu sync.Mutex
	inflight   int64
	busy       atomic.Uint64

	// What a table answer's headers and counters need, made once rather than per poll
	// (a poll is tiny; thousands of proxies make tens of thousands a second).
	frameCounters [3]prometheus.Counter // full, delta, not_modified
	versionHdrs   atomic.Pointer[versionHeaders]
	epoch         string   // the publisher's epoch, in decimal
	epochHdr      []string // api.TableEpochHeader's value
	started       time.Time
}

// versionHeaders are the header values every answer of one version shares.
type versionHeaders struct {
	version uint64
	value   []string // X-Kvroute-Version
	etag    []string
}

// Header values shared by every table answer: net/http only reads them.
var (
	hdrTableType = []string{api.TableContentType}
	hdrNoStore   = []string{"no-store"}
	hdrVary      = []string{api.TableFormatsHeader}
	hdrFrame     = [...][]string{table.Full: {"full"}, table.Delta: {"delta"}}
)

// Metrics are the API's own Prometheus metrics.
type Metrics struct {
	Requests      *prometheus.CounterVec // by endpoint, code
	TableFrames   *prometheus.CounterVec // by kind (full, delta, not_modified)
	TableBytes    prometheus.Counter
	ReportBatches *prometheus.CounterVec // by result
	ReportBytes   prometheus.Gauge       // report body bytes held in flight
	Report        index.ReportMetrics

	// TakeoversDeclined counts polls of another epoch answered 503 (Server.TakeoverAfter).
	TakeoversDeclined prometheus.Counter
	// AffinityEntries counts the Responses affinity entries by result (added, evicted,
	// expired, refused); AffinityServed those answered to polls.
	AffinityEntries *prometheus.CounterVec
	AffinityServed  prometheus.Counter
	// SharesTenants counts the tenants of the fleet's shares by result (added, evicted,
	// expired); SharesPosts the proxies' posts by result (accepted, bad_method, too_large,
	// bad_body).
	SharesTenants *prometheus.CounterVec
	SharesPosts   *prometheus.CounterVec
}

// NewMetrics registers the API's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_http_requests_total", Help: "HTTP requests by endpoint and status code."}, []string{"endpoint", "code"}),
		TableFrames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_table_responses_total", Help: "Table responses by kind: full, delta, not_modified."}, []string{"kind"}),
		TableBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_controlplane_table_bytes_total", Help: "Bytes of table frames served."}),
		ReportBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_report_batches_total", Help: "Report batches by result."}, []string{"result"}),
		TakeoversDeclined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_controlplane_takeovers_declined_total", Help: "Table polls naming another replica's epoch answered 503 because this replica started less than --takeover-after ago."}),
		AffinityEntries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_affinity_entries_total", Help: "Responses affinity entries from reports by result: added, evicted (past the entry cap), expired (past the age limit), refused (too many distinct replica addresses)."}, []string{"result"}),
		AffinityServed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_controlplane_affinity_served_total", Help: "Responses affinity entries answered to proxies' polls."}),
		SharesTenants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_share_tenants_total", Help: "Tenants of the fleet's admitted-prefill shares by result: added, evicted (past the tenant cap), expired (decayed below a token)."}, []string{"result"}),
		SharesPosts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_controlplane_share_posts_total", Help: "Proxies' posts of admitted prefill per tenant by result: accepted, bad_method, too_large, bad_body."}, []string{"result"}),
		ReportBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_controlplane_report_bytes_in_flight", Help: "Report body bytes read and not yet applied (a batch past --max-report-bytes-in-flight gets 429)."}),
		Report: index.ReportMetrics{
			Reports: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kvroute_controlplane_reports_total", Help: "Reports by kind and result (accepted, unknown_model, unknown_replica, config_mismatch, oversized, over_budget)."}, []string{"kind", "result"}),
			FalseHits: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kvroute_controlplane_false_hits_total", Help: "Outcomes where the engine had fewer cached tokens than the filter predicted."}),
		},
	}
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvroute_controlplane_cached_tokens_error",
		Help:    "Predicted minus actual cached tokens per outcome (positive: over-prediction).",
		Buckets: []float64{-8192, -2048, -512, -128, -16, 0, 16, 128, 512, 2048, 8192},
	})
	m.Report.CachedError = hist
	reg.MustRegister(m.Requests, m.TableFrames, m.TableBytes, m.ReportBatches, m.ReportBytes, m.TakeoversDeclined, m.Report.Reports, m.Report.FalseHits, hist,
		m.AffinityEntries, m.AffinityServed, m.SharesTenants, m.SharesPosts)
	return m
}

// FrontRoutes are the requests every proxy's leader makes many times a second: the
// control plane's front (controlplane/front) serves them without net/http's
// per-request work, through the same Handler.
var FrontRoutes = []front.Route{{Method: http.MethodGet, Path: api.TablePath}, {Method: http.MethodPost, Path: api.ReportsPath},
	{Method: http.MethodGet, Path: api.AffinityPath}, {Method: http.MethodPost, Path: api.SharesPath}}

// FrontHeaders are every request header the handlers of FrontRoutes read (auth, the
// formats a poll lists, a report batch's type); a lean request's handler sees no other.
var FrontHeaders = []string{"Authorization", "Content-Type", api.TableFormatsHeader}

// Handler returns the API's routes.
func (s *Server) Handler() http.Handler {
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if s.MaxBytesInFlight <= 0 {
		s.MaxBytesInFlight = 2 * s.MaxBodyBytes
	}
	if s.BodyTimeout <= 0 {
		s.BodyTimeout = DefaultBodyTimeout
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	s.started = time.Now()
	s.epoch = strconv.FormatUint(s.Publisher.Epoch(), 10)
	s.epochHdr = []string{s.epoch}
	if s.Metrics != nil {
		for i, kind := range []string{"full", "delta", "not_modified"} {
			s.frameCounters[i] = s.Metrics.TableFrames.WithLabelValues(kind)
		}
	}
	if s.Affinity == nil {
		var c affinity.Counts
		if s.Metrics != nil {
			e := s.Metrics.AffinityEntries
			c = affinity.Counts{Added: e.WithLabelValues("added"), Evicted: e.WithLabelValues("evicted"),
				Expired: e.WithLabelValues("expired"), Refused: e.WithLabelValues("refused")}
		}
		s.Affinity = affinity.New(s.Publisher.Epoch(), 0, 0, c)
	}
	if s.Shares == nil {
		var c shares.Counts
		if s.Metrics != nil {
			e := s.Metrics.SharesTenants
			c = shares.Counts{Added: e.WithLabelValues("added"), Evicted: e.WithLabelValues("evicted"), Expired: e.WithLabelValues("expired")}
		}
		s.Shares = shares.New(c)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(api.TablePath, s.count("table", s.auth(s.table)))
	mux.HandleFunc(api.ReportsPath, s.count("reports", s.auth(s.reports)))
	mux.HandleFunc(api.AffinityPath, s.count("affinity", s.auth(s.affinity)))
	mux.HandleFunc(api.SharesPath, s.count("shares", s.auth(s.shares)))
	mux.HandleFunc("/debug/state", s.count("debug", s.auth(s.debug)))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", s.readyz)
	if s.Gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(s.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s", r.URL.Path)
	})
	return s.bodyDeadline(mux)
}

// bodyDeadline gives a request with a body (a declared length, or chunked) BodyTimeout
// to send it: a stalled body is cut there, whether its handler reads it or net/http
// discards it after the answer (before, net/http waited on a stalled chunked body for
// as long as its client did).
func (s *Server) bodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			// Not supported only by a ResponseWriter no listener of ours gives (tests'
			// recorders).
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.BodyTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) { w.code = c; w.ResponseWriter.WriteHeader(c) }

// Unwrap lets http.ResponseController reach the connection (reports' read deadline).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) count(name string, h http.HandlerFunc) http.HandlerFunc {
	var byCode sync.Map // status code -> prometheus.Counter
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: 200}
		h(sw, r)
		if s.Metrics == nil {
			return
		}
		c, ok := byCode.Load(sw.code)
		if !ok {
			c, _ = byCode.LoadOrStore(sw.code, s.Metrics.Requests.WithLabelValues(name, strconv.Itoa(sw.code)))
		}
		c.(prometheus.Counter).Inc()
	}
}

func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.Token == "" {
		return h
	}
	want := []byte("Bearer " + s.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

type errorBody struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(errorBody{Error: fmt.Sprintf(format, args...), Status: code})
}

// refuseMethod answers 405 for a method the path does not take: Allow lists the ones it
// does, the message names the one to use.
func refuseMethod(w http.ResponseWriter, r *http.Request, allow, use string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "%s %s: use %s", r.Method, r.URL.Path, use)
}

// writeBinary answers 200 with body, of contentType, never cached (the lean calls'
// answers: the affinity entries, the tenants' shares).
func writeBinary(w http.ResponseWriter, contentType string, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{contentType}
	h["Cache-Control"] = hdrNoStore
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// table: GET /v1/table?version=V&epoch=E&model=M&wait_ms=W. A version counted in
// another epoch than this process's (another replica's, or this one's before a restart)
// is answered as no version: a full table, at once.
func (s *Server) table(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		refuseMethod(w, r, "GET, HEAD", "GET")
		return
	}
	q := r.URL.RawQuery
	var have uint64
	hasHave := false
	if v := queryGet(q, "version"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "version %q: want an unsigned integer", v)
			return
		}
		have, hasHave = n, true
	}
	if e := queryGet(q, "epoch"); e != "" && e != s.epoch {
		if s.TakeoverAfter > 0 && time.Since(s.started) < s.TakeoverAfter {
			if s.Metrics != nil {
				s.Metrics.TakeoversDeclined.Inc()
			}
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "epoch %q is another replica's: this one started %v ago, ask that one", e, time.Since(s.started).Round(time.Millisecond))
			return
		}
		have, hasHave = 0, false
	}
	model := queryGet(q, "model")
	if len(model) > table.MaxStringLen {
		writeError(w, http.StatusBadRequest, "model name longer than %d bytes", table.MaxStringLen)
		return
	}
	var wait time.Duration
	var arrived time.Time
	if v := queryGet(q, "wait_ms"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			writeError(w, http.StatusBadRequest, "wait_ms %q: want milliseconds", v)
			return
		}
		wait = min(time.Duration(n)*time.Millisecond, MaxWait)
		arrived = time.Now() // the hold is real time, as the long poll's wait is
	}
	if hasHave && wait > 0 {
		if changed := s.Publisher.Changed(have); changed != nil {
			// Long poll: answer as soon as a new version exists, or 304 at the deadline.
			t := timers.Get().(*time.Timer)
			t.Reset(wait)
			select {
			case <-changed:
			case <-t.C:
			case <-r.Context().Done():
			}
			t.Stop()
			timers.Put(t)
		}
	}
	res := s.Publisher.FrameFormat(have, hasHave, model, tableFormat(r.Header.Get(api.TableFormatsHeader)))
	h := w.Header()
	h["Vary"] = hdrVary
	switch {
	case res.NotReady:
		h.Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no table yet: waiting for discovery")
		return
	case res.Current:
		vh := s.versionHeaders(res.Version)
		h[api.TableAgeHeader] = []string{s.ageMs(res)}
		setHeld(h, arrived)
		h["X-Kvroute-Version"], h["Etag"] = vh.value, vh.etag
		h[api.TableEpochHeader] = s.epochHdr
		w.WriteHeader(http.StatusNotModified)
		if s.Metrics != nil {
			s.frameCounters[2].Inc()
		}
		return
	}
	vh := s.versionHeaders(res.Version)
	h["Content-Type"] = hdrTableType
	h["Content-Length"] = []string{strconv.Itoa(len(res.Body))}
	h["Cache-Control"] = hdrNoStore
	h["X-Kvroute-Version"] = vh.value
	h["X-Kvroute-Frame"] = hdrFrame[res.Kind]
	h[api.TableAgeHeader] = []string{s.ageMs(res)}
	setHeld(h, arrived)
	h["Etag"] = vh.etag
	if res.Kind == table.Full {
		// A delta is only ever of the epoch the poll named: a ninth header there would
		// grow the header map on every poll.
		h[api.TableEpochHeader] = s.epochHdr
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(res.Body)
	}
	if s.Metrics != nil {
		s.frameCounters[res.Kind-1].Inc() // full 0, delta 1
		s.Metrics.TableBytes.Add(float64(len(res.Body)))
	}
}

// timers are the long polls' deadlines, reused (Go 1.23 timers: Stop and Reset leave no
// stale tick behind).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// versionHeaders are version v's header values, made once per version.
func (s *Server) versionHeaders(v uint64) *versionHeaders {
	if vh := s.versionHdrs.Load(); vh != nil && vh.version == v {
		return vh
	}
	n := strconv.FormatUint(v, 10)
	vh := &versionHeaders{version: v, value: []string{n}, etag: []string{strconv.Quote(n)}}
	s.versionHdrs.Store(vh)
	return vh
}

// queryGet is url.Values.Get of the parsed raw query, without building the map: the
// first value of key, unescaped, skipping pairs ParseQuery skips (a semicolon, a bad
// escape).
func queryGet(raw, key string) string {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" || strings.Contains(pair, ";") {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(k, "%+") {
			var err error
			if k, err = url.QueryUnescape(k); err != nil {
				continue
			}
		}
		if k != key {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			var err error
			if v, err = url.QueryUnescape(v); err != nil {
				continue
			}
		}
		return v
	}
	return ""
}

// ageMs is how old the answered version is.
func (s *Server) ageMs(res publish.Result) string {
	return strconv.FormatInt(max(0, s.Now().UnixMilli()-res.GeneratedMs), 10)
}

// setHeld says how long a long poll (one that arrived at arrived) was held, rounded
// down (api.TableHeldHeader); nothing on an answer to a poll without wait_ms.
func setHeld(h http.Header, arrived time.Time) {
	if !arrived.IsZero() {
		h[api.TableHeldHeader] = []string{strconv.FormatInt(time.Since(arrived).Milliseconds(), 10)}
	}
}

// reports: POST /v1/reports with an api.ReportBatch.
func (s *Server) reports(w http.ResponseWriter, r *http.Request) {
	result := "accepted"
	defer func() {
		if s.Metrics != nil {
			s.Metrics.ReportBatches.WithLabelValues(result).Inc()
		}
	}()
	if r.Method != http.MethodPost {
		result = "bad_method"
		refuseMethod(w, r, "POST", "POST")
		return
	}
	// Binary batches from current filters, JSON from older ones (a rollout runs both);
	// ParseReportBatch tells them apart by their first bytes.
	if ct := strings.ToLower(r.Header.Get("Content-Type")); ct != "" && !strings.HasPrefix(ct, "application/json") &&
		!strings.HasPrefix(ct, api.ReportsContentType) {
		result = "bad_content_type"
		writeError(w, http.StatusUnsupportedMediaType, "content type %q: want %s or application/json", ct, api.ReportsContentType)
		return
	}
	body, held, err := s.readBody(w, r)
	defer s.reserve(-held)
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.Is(err, errBusy):
			result = "busy"
			s.busy.Add(1)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, "report batches of %d bytes already in flight: retry later", s.MaxBytesInFlight)
		case errors.As(err, &tooBig):
			result = "too_large"
			writeError(w, http.StatusRequestEntityTooLarge, "report batch larger than %d bytes", s.MaxBodyBytes)
		default:
			result = "read_error"
			writeError(w, http.StatusBadRequest, "reading body: %v", err)
		}
		return
	}
	b, rejected, err := api.ParseReportBatch(body)
	if err != nil {
		result = "invalid"
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// Bad reports are dropped one by one (and said so), so one filter's bug or a version
	// skew during a rollout does not cost the whole batch.
	var reasons []string
	for i, e := range rejected {
		if i == 3 {
			break
		}
		reasons = append(reasons, e.Error())
	}
	if len(rejected) > 0 {
		result = "partly_invalid"
		if s.Metrics != nil {
			s.Metrics.Report.Reports.WithLabelValues("any", "invalid").Add(float64(len(rejected)))
		}
	}
	var met *index.ReportMetrics
	if s.Metrics != nil {
		met = &s.Metrics.Report
	}
	applied := s.Index.ApplyReports(&b, s.Now(), met)
	s.Affinity.Add(&b, s.Now())
	writeJSON(w, struct {
		Received int      `json:"received"`
		Applied  int      `json:"applied"`
		Rejected int      `json:"rejected"`
		Errors   []string `json:"errors,omitempty"`
	}{len(b.Reports) + len(rejected), applied, len(rejected), reasons})
}

// affinity: GET /v1/affinity?since=S&epoch=E&proxy=P (api.AffinityPath).
func (s *Server) affinity(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		refuseMethod(w, r, "GET", "GET")
		return
	}
	var n [3]uint64
	for i, name := range []string{"since", "epoch", "proxy"} {
		if v := queryGet(r.URL.RawQuery, name); v != "" {
			var err error
			if n[i], err = strconv.ParseUint(v, 10, 64); err != nil {
				writeError(w, http.StatusBadRequest, "%s %q: want an unsigned integer", name, v)
				return
			}
		}
	}
	body, served := s.Affinity.Answer(nil, n[0], n[1], n[2], s.Now())
	writeBinary(w, api.AffinityContentType, body)
	if s.Metrics != nil {
		s.Metrics.AffinityServed.Add(float64(served))
	}
}

// shares: POST /v1/shares (api.SharesPath): adds the proxy's admitted prefill per tenant
// since its last post and answers the fleet's totals.
func (s *Server) shares(w http.ResponseWriter, r *http.Request) {
	result := "accepted"
	defer func() {
		if s.Metrics != nil {
			s.Metrics.SharesPosts.WithLabelValues(result).Inc()
		}
	}()
	if r.Method != http.MethodPost {
		result = "bad_method"
		refuseMethod(w, r, "POST", "POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(api.MaxSharePostBytes)))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		result = "too_large"
		writeError(w, http.StatusRequestEntityTooLarge, "shares post larger than %d bytes", api.MaxSharePostBytes)
		return
	}
	var es []api.ShareEntry
	if err == nil {
		es, err = api.ParseShares(nil, body, api.MaxSharePost)
	}
	if err != nil {
		result = "bad_body"
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	now := s.Now()
	s.Shares.Add(es, now)
	writeBinary(w, api.SharesContentType, s.Shares.Answer(nil, now))
}

// errBusy: the report bodies in flight hold MaxBytesInFlight already.
var errBusy = errors.New("report bytes in flight at their limit")

// readBody reads a report batch's body (within BodyTimeout: bodyDeadline), charging
// each chunk against the bytes in flight as it is read (errBusy past MaxBytesInFlight:
// refuse rather than queue); held is what it charged, to release once the batch is
// applied. The buffer grows as bytes come, never to a declared length: it is at most
// twice held.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (body []byte, held int64, err error) {
	src := http.MaxBytesReader(w, r.Body, s.MaxBodyBytes)
	body = make([]byte, 0, 4<<10)
	for {
		if len(body) == cap(body) {
			body = slices.Grow(body, 1) // as append grows it (and io.ReadAll)
		}
		n, err := src.Read(body[len(body):cap(body)])
		if n > 0 {
			if !s.reserve(int64(n)) {
				return nil, held, errBusy
			}
			held += int64(n)
			body = body[:len(body)+n]
		}
		if err == io.EOF {
			return body, held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}

// reserve adds n bytes in flight if they fit (n < 0 releases).
func (s *Server) reserve(n int64) bool {
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if n > 0 && s.inflight > 0 && s.inflight+n > s.MaxBytesInFlight {
		return false
	}
	s.inflight += n
	if s.Metrics != nil {
		s.Metrics.ReportBytes.Set(float64(s.inflight))
	}
	return true
}

// DebugState is GET /debug/state.
type DebugState struct {
	Version  uint64               `json:"version"`
	Replicas []index.ReplicaState `json:"replicas"`
	// Budget: the index's limits and drops, plus report batches refused as busy.
	Budget index.BudgetState `json:"budget"`
	Warmup *WarmupState      `json:"warmup,omitempty"`
}

// WarmupState is how complete a starting control plane's index is: of the KV-event
// streams it dials, how many have connected and applied the engine's replay buffer, of
// its replicas, how many were scraped, and whether its first table is still held for
// them (at most LimitMs; HeldMs once out).
type WarmupState struct {
	Streams         int     `json:"streams"`
	StreamsRead     int     `json:"streams_read"`
	Replicas        int     `json:"replicas"`
	ReplicasScraped int     `json:"replicas_scraped"`
	Complete        float64 `json:"complete"`
	Held            bool    `json:"held"`
	HeldMs          int64   `json:"held_ms"`
	LimitMs         int64   `json:"limit_ms"`
}

func (s *Server) debug(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		refuseMethod(w, r, "GET", "GET")
		return
	}
	b := s.Index.BudgetState()
	b.Dropped["report_batches"] = map[string]uint64{"busy": s.busy.Load()}
	st := DebugState{Version: s.Publisher.Version(), Replicas: s.Index.DebugState(s.Now()), Budget: b}
	if s.Warmup != nil {
		ws := s.Warmup()
		st.Warmup = &ws
	}
	writeJSON(w, st)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var extra error
	if s.Ready != nil {
		extra = s.Ready()
	}
	switch {
	case !s.Index.Ready():
		writeError(w, http.StatusServiceUnavailable, "not ready: discovery has not listed replicas yet")
	case s.Publisher.Version() == 0:
		writeError(w, http.StatusServiceUnavailable, "not ready: no table built yet")
	case extra != nil:
		writeError(w, http.StatusServiceUnavailable, "not ready: %v", extra)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ready\n")
	}
}
