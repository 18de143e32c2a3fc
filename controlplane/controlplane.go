// Package controlplane wires kvroute's control plane: discovery lists the engines; per
// replica a scraper reads /metrics and a subscription reads KV events; the index keeps
// who holds which prefix keys; the publisher turns its changes into table versions; the
// server hands them to the filters and takes their reports.
//
// A test (or main) starts one in-process:
//
//	cp, err := controlplane.New(controlplane.Options{Listen: "127.0.0.1:0", Engines: engines})
//	err = cp.Start(ctx) // serves until ctx ends; cp.Wait() returns after shutdown
//	url := "http://" + cp.Addr() + api.TablePath
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/front"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/publish"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/controlplane/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Options configure a control plane; zero values take the defaults the flags document.
type Options struct {
	// Listen is the HTTP address (default 127.0.0.1:8080; tests use 127.0.0.1:0).
	Listen string
	// Listener, when set, is served instead of a listener on Listen (which is then its
	// address): for a caller that holds the port from before the control plane starts.
	// Start takes it over and closes it at shutdown.
	Listener net.Listener
	// Engines is the static engine list (file and --engine flags).
	Engines []discovery.Engine
	// Kubernetes, when set, discovers engines instead (or in addition: both lists are
	// merged, Kubernetes' entries winning on equal IDs).
	Kubernetes *discovery.Kubernetes
	// KVBind, when set, binds a SUB socket there for engines that connect to us; DP
	// rank r connects to its port + r, so ranks 1..MaxDPRanks-1 bind port + r too.
	KVBind     string
	MaxDPRanks int
	// KVBindAllow: addresses that may publish any replica's topic on KVBind, besides
	// each engine's own (kvpeers.go).
	KVBindAllow []netip.Prefix
	Index       index.Config
	// PublishInterval: at most one table version per interval (default 50 ms).
	PublishInterval time.Duration
	// ScrapeInterval and ScrapeTimeout of each replica's /metrics (default 100 ms, 1 s).
	ScrapeInterval time.Duration
	ScrapeTimeout  time.Duration
	// HealthInterval: how often replica health is checked for the log and /readyz
	// (health.go; default 1 s).
	HealthInterval time.Duration
	// History is how many versions deltas can start from (default 600).
	History int
	// Token, when set, is required as a bearer token on the table, reports and debug.
	Token string
	// InsecureNoToken allows listening on a non-loopback address without a Token
	// (anyone who reaches the port could then post reports and read the state).
	InsecureNoToken bool
	MaxBodyBytes    int64
	// MaxReportBytesInFlight bounds the report bodies being read and applied at once
	// (default 2 x MaxBodyBytes); a batch beyond it is refused with 429 and counted.
	MaxReportBytesInFlight int64
	// BodyTimeout bounds reading a request's body (default 10 s).
	BodyTimeout time.Duration
	// MaxConnections bounds the HTTP connections held at once (default 20,480): four
	// fifths in the lean loop, the rest in net/http (front.DefaultMaxConns and
	// DefaultMaxFallbackConns). Past it a connection is answered 503, closed and counted.
	MaxConnections int
	// ReplayTimeout bounds one KV-event replay request (default 2 s).
	ReplayTimeout time.Duration
	// WarmUp, when positive, holds the first table until every KV-event stream the
	// control plane dials has applied the engine's replay buffer, or WarmUp has passed
	// (warmup.go); 0 publishes it as soon as discovery lists replicas.
	WarmUp time.Duration
	// TakeoverAfter is server.Server.TakeoverAfter: for this long after the start, a
	// filter holding another replica's table is sent back to it (0: off; for replicas).
	TakeoverAfter time.Duration
	// ShutdownTimeout bounds draining HTTP requests on shutdown (default 5 s).
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
	// Now is the index's clock (speculative TTLs, state ages); default time.Now. Tests
	// move it forward instead of waiting.
	Now func() time.Time
}

// ControlPlane is one running control plane.
type ControlPlane struct {
	o         Options
	Index     *index.Index
	Publisher *publish.Publisher
	Registry  *prometheus.Registry
	log       *slog.Logger

	ln      net.Listener
	srv     *front.Front
	kvAddrs []net.Addr
	done    chan struct{}
	err     error

	mu         sync.Mutex
	ctx        context.Context
	workers    map[string]context.CancelFunc
	replicas   map[string]discovery.Replica
	static     []discovery.Engine
	dynamic    []discovery.Engine
	haveDyn    bool
	wg         sync.WaitGroup
	scrapeHTTP *http.Client

	pubMu       sync.Mutex
	versions    prometheus.Counter
	publishTime prometheus.Observer
	unknownTop  prometheus.Counter
	handOffs    *prometheus.CounterVec // by front.HandOff
	refused     prometheus.Counter     // connections past MaxConnections
	events      countedEvents          // the index's KV-event handler, drops counted
	warm        *warmup
	impostors   prometheus.Counter
	peers       peerCache
	health      health
}

// New validates options and builds the components; nothing runs until Start.
func New(o Options) (*ControlPlane, error) {
	if o.Listener != nil {
		o.Listen = o.Listener.Addr().String()
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:8080"
	}
	if o.PublishInterval <= 0 {
		o.PublishInterval = 50 * time.Millisecond
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = 100 * time.Millisecond
	}
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = time.Second
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = time.Second
	}
	if o.MaxDPRanks <= 0 {
		o.MaxDPRanks = 1
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = front.DefaultMaxConns + front.DefaultMaxFallbackConns
	}
	if o.MaxConnections < 2 {
		return nil, fmt.Errorf("max connections %d: want at least 2 (one lean, one net/http)", o.MaxConnections)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	for i := range o.Engines {
		if err := o.Engines[i].Validate(); err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
	}
	if o.Kubernetes == nil && len(o.Engines) == 0 {
		return nil, errors.New("no engines: give --engines-file, --engine or --k8s-selector")
	}
	if err := checkExposure(o.Listen, o.Token, o.InsecureNoToken); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ix := index.New(o.Index)
	reg.MustRegister(ix.Collector(), ix.BudgetCollector())
	c := &ControlPlane{
		o: o, Index: ix, Registry: reg, log: o.Logger,
		Publisher:  publish.New(publish.Options{MaxHistory: o.History}),
		done:       make(chan struct{}),
		workers:    map[string]context.CancelFunc{},
		replicas:   map[string]discovery.Replica{},
		static:     o.Engines,
		scrapeHTTP: scrape.Client(o.ScrapeTimeout),
	}
	c.versions = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_controlplane_table_versions_total", Help: "Table versions published."})
	pt := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_controlplane_publish_seconds", Help: "Time to build and apply one table version.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8)})
	c.publishTime = pt
	c.unknownTop = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_controlplane_kv_event_unknown_topic_total", Help: "KV-event messages on the central socket whose topic names no known replica."})
	c.impostors = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_controlplane_kv_event_impostor_total", Help: "KV-event messages on the central socket dropped because their peer's address is not the engine their topic names (nor in --kv-bind-allow)."})
	c.handOffs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_controlplane_http_handoffs_total",
		Help: "Connections the lean HTTP loop gave to net/http, by reason: elsewhere (another endpoint), odd_head (a table poll or report it does not read), long_head (a head above 8 KiB), full (too many connections). Polls and reports served by net/http cost several times more CPU."},
		[]string{"reason"})
	c.refused = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_controlplane_http_connections_refused_total",
		Help: "HTTP connections refused (503, closed unread) because --max-connections were open."})
	reg.MustRegister(c.versions, pt, c.unknownTop, c.impostors, c.handOffs, c.refused)
	c.warm = newWarmup(o.WarmUp, reg)
	c.events = newCountedEvents(ix.Events(), reg)
	c.events.warm = c.warm
	return c, nil
}

// Addr is the HTTP listener's address (after Start).
func (c *ControlPlane) Addr() string { return c.ln.Addr().String() }

// KVAddrs are the central KV-event sockets' addresses (after Start, with KVBind).
func (c *ControlPlane) KVAddrs() []net.Addr { return c.kvAddrs }

// Start listens and starts every loop; they run until ctx ends. Wait returns after the
// graceful shutdown that follows.
func (c *ControlPlane) Start(ctx context.Context) error {
	ln := c.o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", c.o.Listen); err != nil {
			return fmt.Errorf("listen %s: %w", c.o.Listen, err)
		}
	}
	c.ln = ln
	c.warm.start(time.Now())
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()

	if c.o.KVBind != "" {
		for r := 0; r < c.o.MaxDPRanks; r++ {
			ep, err := discovery.OffsetEndpoint(c.o.KVBind, r)
			if err == nil {
				var addr net.Addr
				rank := r
				addr, _, err = kvevents.Listen(ctx, ep, func(topic string) (kvevents.Source, bool) { return c.resolveTopic(topic, rank) },
					c.events, func(string) { c.unknownTop.Inc() }, kvevents.Options{ReplayTimeout: c.o.ReplayTimeout, Logger: c.log,
						PeerCheck: func(topic []byte, remote net.Addr) bool { return c.peerAllowed(topic, rank, remote) }})
				c.kvAddrs = append(c.kvAddrs, addr)
			}
			if err != nil {
				cancel()
				ln.Close()
				return err
			}
		}
	}

	srv := &server.Server{
		Index: c.Index, Publisher: c.Publisher, Token: c.o.Token, MaxBodyBytes: c.o.MaxBodyBytes,
		MaxBytesInFlight: c.o.MaxReportBytesInFlight, BodyTimeout: c.o.BodyTimeout,
		Gatherer: c.Registry, Metrics: server.NewMetrics(c.Registry), Now: c.o.Now,
		Ready: c.health.ready, Warmup: c.warm.state, TakeoverAfter: c.o.TakeoverAfter,
	}
	// Requests inherit ctx, so long polls return (304) as soon as shutdown begins
	// instead of holding it up for their wait_ms. The filters' polls and reports go
	// through the lean front, everything else through net/http.
	h := srv.Handler()
	fallback := max(c.o.MaxConnections/5, 1)
	c.srv = &front.Front{Handler: h, Routes: server.FrontRoutes, Headers: server.FrontHeaders, BaseContext: ctx,
		MaxConns: c.o.MaxConnections - fallback, MaxFallbackConns: fallback, Refused: c.refused.Inc,
		HandedOff: func(why front.HandOff) { c.handOffs.WithLabelValues(why.String()).Inc() },
		Fallback: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			BaseContext: func(net.Listener) context.Context { return ctx }}}
	httpDone := make(chan error, 1)
	go func() { httpDone <- c.srv.Serve(ln) }()

	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.publishLoop(ctx) }()
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.healthLoop(ctx, c.o.HealthInterval) }()

	c.setEngines(nil, false)
	if c.o.Kubernetes != nil {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := c.o.Kubernetes.Run(ctx, func(es []discovery.Engine) { c.setEngines(es, true) }); err != nil {
				c.log.Error("kubernetes discovery stopped", "err", err)
			}
		}()
	}

	go func() {
		<-ctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), c.o.ShutdownTimeout)
		err := c.srv.Shutdown(sctx)
		scancel()
		if herr := <-httpDone; herr != nil && !errors.Is(herr, http.ErrServerClosed) && err == nil {
			err = herr
		}
		cancel()
		c.wg.Wait()
		c.err = err
		close(c.done)
	}()
	return nil
}

// Wait blocks until the control plane has shut down.
func (c *ControlPlane) Wait() error {
	<-c.done
	return c.err
}

// setEngines merges static and discovered engines and reconciles replicas, scrapers
// and subscriptions.
func (c *ControlPlane) setEngines(dyn []discovery.Engine, fromDiscovery bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || c.ctx.Err() != nil {
		return
	}
	if fromDiscovery {
		c.dynamic, c.haveDyn = dyn, true
	}
	if c.o.Kubernetes != nil && !c.haveDyn && len(c.static) == 0 {
		return // not ready until discovery has listed
	}
	all := append(append([]discovery.Engine(nil), c.static...), c.dynamic...)
	reps := discovery.Replicas(all)
	specs := make([]index.Spec, 0, len(reps))
	want := map[string]func(context.Context){}
	var streams []kvevents.StreamID
	c.replicas = map[string]discovery.Replica{}
	for _, r := range reps {
		c.replicas[r.ID] = r
		events := c.o.KVBind != ""
		for _, s := range r.Streams {
			if s.Endpoint != "" {
				events = true
			}
		}
		specs = append(specs, index.Spec{ID: r.ID, Model: r.Model, Addr: r.Addr, Kind: r.Kind, Speed: r.Speed, Events: events})
		r := r
		want["scrape|"+r.ID+"|"+r.Metrics+"|"+r.Kind] = func(ctx context.Context) { c.scrapeLoop(ctx, r) }
		for _, s := range r.Streams {
			if s.Endpoint == "" {
				continue
			}
			src := kvevents.Source{ID: kvevents.StreamID{Replica: r.ID, Rank: s.Rank}, Endpoint: s.Endpoint, Topic: s.Topic, Replay: s.Replay}
			streams = append(streams, src.ID)
			want[fmt.Sprintf("kv|%s|%d|%s|%s|%s", r.ID, s.Rank, s.Endpoint, s.Replay, s.Topic)] = func(ctx context.Context) {
				kvevents.Subscribe(ctx, src, c.events, kvevents.Options{ReplayTimeout: c.o.ReplayTimeout, Logger: c.log})
			}
		}
	}
	c.Index.SetReplicas(specs, c.o.Now())
	c.warm.expect(streams, slices.Collect(maps.Keys(c.replicas)))
	for k, stop := range c.workers {
		if _, ok := want[k]; !ok {
			stop()
			delete(c.workers, k)
		}
	}
	for k, run := range want {
		if _, ok := c.workers[k]; ok {
			continue
		}
		wctx, stop := context.WithCancel(c.ctx)
		c.workers[k] = stop
		c.wg.Add(1)
		go func() { defer c.wg.Done(); run(wctx) }()
	}
	c.log.Info("engines", "replicas", len(reps))
}

// resolveTopic maps a central-socket topic to a replica's stream: an engine's configured
// topic, else llm-d's convention kv@<pod id>@<model> with the pod id being the replica's
// ID, address or IP.
func (c *ControlPlane) resolveTopic(topic string, rank int) (kvevents.Source, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.replicas {
		for _, s := range r.Streams {
			if s.Topic != "" && s.Topic == topic && s.Rank == rank {
				return kvevents.Source{ID: kvevents.StreamID{Replica: r.ID, Rank: rank}, Topic: topic}, true
			}
		}
	}
	parts := strings.Split(topic, "@")
	if len(parts) < 2 || parts[0] != "kv" {
		return kvevents.Source{}, false
	}
	pod := parts[1]
	for _, r := range c.replicas {
		host, _, _ := net.SplitHostPort(r.Addr)
		if pod == r.ID || pod == r.Addr || pod == host {
			if len(parts) >= 3 && parts[2] != "" && parts[2] != r.Model {
				continue
			}
			return kvevents.Source{ID: kvevents.StreamID{Replica: r.ID, Rank: rank}, Topic: topic}, true
		}
	}
	return kvevents.Source{}, false
}

func (c *ControlPlane) scrapeLoop(ctx context.Context, r discovery.Replica) {
	t := time.NewTicker(c.o.ScrapeInterval)
	defer t.Stop()
	for {
		// The sample is dated when the scrape was sent, the earliest the engine can have
		// measured it: dated when the answer was read, a slow answer would make numbers
		// taken before a request started look newer than its start, and the proxies'
		// ledgers would keep it queued (TestStateAgeCountsFromWhenTheScrapeWasSent). An
		// engine that stamps its queued-tokens gauge dates that one exactly: dated at
		// asked, a request sent while the scrape was on its way, which the gauge counts,
		// would count as sent after it.
		asked := c.o.Now()
		s, err := scrape.Fetch(ctx, c.scrapeHTTP, r.Metrics, r.Kind)
		if ctx.Err() != nil {
			return
		}
		s.DateQueued(asked, c.o.Now())
		c.Index.ApplyScrape(r.ID, s, err, asked)
		c.health.scraped(r.ID, err)
		if err == nil {
			c.warm.scraped(r.ID)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publishLoop makes a version at most every PublishInterval, when anything changed.
func (c *ControlPlane) publishLoop(ctx context.Context) {
	t := time.NewTicker(c.o.PublishInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.PublishNow(false)
	}
}

// PublishNow flushes the index into a new version if anything changed (or force),
// and returns the current version. The first version is made as soon as discovery
// has listed replicas, even an empty one, and the warm-up allows it (warmup.go).
func (c *ControlPlane) PublishNow(force bool) uint64 {
	c.pubMu.Lock() // flush and publish in one order
	defer c.pubMu.Unlock()
	now := c.o.Now()
	if !c.Index.Ready() || !c.warm.mayPublish(time.Now()) {
		return c.Publisher.Version()
	}
	start := time.Now()
	ups := c.Index.Flush(now, force || c.Publisher.Version() == 0)
	c.Index.Reclaim(now) // the budget's recount; memory back from what shrank or expired
	if ups == nil {
		return c.Publisher.Version()
	}
	v, err := c.Publisher.Publish(ups, now)
	if err != nil {
		// A bug, not an input problem: the index produced an inconsistent delta.
		c.log.Error("publish failed", "err", err)
		return c.Publisher.Version()
	}
	c.warm.publishedFirst(time.Now())
	c.versions.Inc()
	c.publishTime.Observe(time.Since(start).Seconds())
	return v
}

// checkExposure refuses a listen address other hosts can reach when no token guards the
// API, unless insecure says so: without one, anyone who reaches the port can post
// reports (state the control plane must hold) and read /debug/state.
func checkExposure(listen, token string, insecure bool) error {
	if token != "" || insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without a token: set --token-file (or $KVROUTE_CONTROLPLANE_TOKEN), or pass --insecure-no-token", listen)
}
