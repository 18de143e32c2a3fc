// Package api holds what the filter and the control plane exchange besides the table:
// the filter's plugin configuration (which the manifests also carry) and the reports the
// filter sends back.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/rule"
)

// DefaultEndpointHeader is the header Envoy's override_host policy reads (the Gateway API
// inference extension's name for it).
const DefaultEndpointHeader = "x-gateway-destination-endpoint"

// Long polls: the default control_plane.wait_ms, and the most the control plane holds a
// poll (controlplane/server MaxWait).
const (
	DefaultWaitMs = 1000
	MaxWaitMs     = 30000
)

// How long a request that arrives before its model's first table may be held
// (first_table_wait_ms): the default and the most.
const (
	DefaultFirstTableWaitMs = 500
	MaxFirstTableWaitMs     = 10000
)

// Tenant policies.
const (
	// Shared tenants may hit cache entries other shared tenants created.
	PolicyShared = "shared"
	// Isolated tenants get their own chains (tenant salt) and, optionally, vLLM's
	// cache_salt so the engine keeps their blocks apart too: a cache hit is a timing
	// side channel between tenants (seeds 000 and 001).
	PolicyIsolated = "isolated"
)

// Config is the filter's plugin configuration: Envoy's `configuration` / Istio's
// WasmPlugin `pluginConfig`, as JSON. Durations are milliseconds. Unknown fields are
// rejected so that a misspelt knob is a start-up error, not a silent default.
type Config struct {
	// ControlPlane is the one control plane that serves every model. Set it or Shards,
	// not both; it is the same as one shard with no models (see Shards).
	ControlPlane ControlPlane `json:"control_plane"`
	// Shards, instead of ControlPlane: one control plane per model or pool of models.
	// A request is routed on the table of the shard that serves its (base) model, and
	// its reports go to that shard's control plane (shards.go).
	Shards []Shard `json:"shards,omitempty"`
	// EndpointHeader receives "ip:port,ip:port,..." (best first).
	EndpointHeader string `json:"endpoint_header,omitempty"`
	// ModelHeader, when set, names a header that carries the model and wins over the
	// body's "model" field (for gateways that already resolved it).
	ModelHeader string  `json:"model_header,omitempty"`
	Tenants     Tenants `json:"tenants,omitempty"`
	// Overload is priorities, shedding and fairness past capacity (overload.go); off
	// without classes.
	Overload Overload `json:"overload,omitempty"`
	// SessionHeader, when set, names a header that carries a session id (an agent's
	// x-session-id): a session's requests prefer the replica of its previous one while
	// the rule's cost allows (shared/route/affinity.go). Trusted as it arrives, like
	// tenants.header: set it only where the mesh sets or strips it (docs/threat-model.md).
	// Unset, no header is read.
	SessionHeader string `json:"session_header,omitempty"`
	// Adapters maps a LoRA adapter's model name to its base model: the adapter's
	// requests route on the base model's replicas, with chains seeded by the adapter.
	Adapters map[string]string `json:"adapters,omitempty"`
	// BlockBytes and BlockTokens are used until the first table says otherwise.
	BlockBytes  int `json:"block_bytes,omitempty"`
	BlockTokens int `json:"block_tokens,omitempty"`
	// MaxBodyBytes: larger request bodies are not parsed; they route by least queued.
	// Keep it below Envoy's buffer limit (per_connection_buffer_limit_bytes, 1 MiB by
	// default) by at least one read: Envoy adds each chunk to a paused filter's buffer
	// before the filter sees it and answers 413 past the limit (Context::decodeData,
	// FilterManager requestDataTooLarge), so the default leaves 64 KiB of margin.
	MaxBodyBytes int `json:"max_body_bytes,omitempty"`
	// MaxJSONDepth bounds nesting in request bodies.
	MaxJSONDepth int    `json:"max_json_depth,omitempty"`
	Guards       Guards `json:"guards,omitempty"`
	// LedgerTimeoutMs drops a local queue entry whose response never started (lost
	// stream); the engine's own metrics take over by then.
	LedgerTimeoutMs int `json:"ledger_timeout_ms,omitempty"`
	// FirstTableWaitMs: for this long after the plugin starts, a whole request that finds
	// no table for its model yet (the proxy just started, or its control plane is still
	// warming up) is held until the table arrives (checked on each tick), instead of
	// being left to Envoy at once: a request Envoy places is reported to no control
	// plane, so the next request with its prefix copies it again
	// (shared/route/hold.go). Default 500; negative: never held.
	FirstTableWaitMs int `json:"first_table_wait_ms,omitempty"`
}

// FirstTableWait is FirstTableWaitMs as a duration; 0 when requests are never held.
func (c *Config) FirstTableWait() time.Duration {
	return time.Duration(max(c.FirstTableWaitMs, 0)) * time.Millisecond
}

// ControlPlane says where the table comes from and where reports go.
type ControlPlane struct {
	// Cluster is the Envoy cluster of the control plane, e.g.
	// "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local".
	Cluster string `json:"cluster"`
	// Authority is the :authority of calls to it.
	Authority string `json:"authority"`
	// Failover lists more replicas of the same control plane, tried in turn after
	// Cluster when a poll is refused, fails or times out (Targets).
	Failover []Endpoint `json:"failover,omitempty"`
	// Token, when set, is sent as "Authorization: Bearer <token>".
	Token string `json:"token,omitempty"`
	// PollMs is how often the leader asks for a new table version.
	PollMs int `json:"poll_ms,omitempty"`
	// WaitMs makes each table poll a long poll: the control plane answers as soon as a
	// version newer than the filter's exists, or 304 after WaitMs, and the leader asks
	// again at once, so a version reaches the proxy when it is published. 0 takes the
	// default (1000); a negative value turns long polling off (a poll every PollMs).
	WaitMs int `json:"wait_ms,omitempty"`
	// TimeoutMs bounds each call; it must exceed WaitMs (default WaitMs + 1000).
	TimeoutMs int `json:"timeout_ms,omitempty"`
	// ReportMs is how often the leader posts queued reports.
	ReportMs int `json:"report_ms,omitempty"`
	// MaxReportBatch caps reports per POST.
	MaxReportBatch int `json:"max_report_batch,omitempty"`
}

// Endpoint is one control-plane replica as the proxy reaches it.
type Endpoint struct {
	Cluster   string `json:"cluster"`
	Authority string `json:"authority"`
}

// MaxFailover bounds control_plane.failover.
const MaxFailover = 8

// Targets are the replicas a filter polls, in the order it tries them: Cluster, then
// Failover's.
func (cp *ControlPlane) Targets() []Endpoint {
	return append([]Endpoint{{Cluster: cp.Cluster, Authority: cp.Authority}}, cp.Failover...)
}

// isZero: no field set (a configuration with shards has no control_plane block).
func (cp *ControlPlane) isZero() bool { return reflect.ValueOf(*cp).IsZero() }

func (cp *ControlPlane) fillDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cp.PollMs, 100)
	def(&cp.WaitMs, DefaultWaitMs)
	def(&cp.TimeoutMs, max(cp.WaitMs, 0)+1000)
	def(&cp.ReportMs, 100)
	def(&cp.MaxReportBatch, 512)
}

// validate reports cp's problems, each named from path ("control_plane", or a shard's).
func (cp *ControlPlane) validate(path string, bad func(string, ...any)) {
	if cp.Cluster == "" {
		bad("%s.cluster is required (e.g. outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local)", path)
	}
	if cp.Authority == "" {
		bad("%s.authority is required", path)
	}
	if len(cp.Failover) > MaxFailover {
		bad("%s.failover: %d endpoints, at most %d", path, len(cp.Failover), MaxFailover)
	}
	seen := map[string]bool{cp.Cluster: true}
	for i, e := range cp.Failover {
		if e.Cluster == "" || e.Authority == "" {
			bad("%s.failover[%d]: cluster and authority are required", path, i)
		}
		if seen[e.Cluster] {
			bad("%s.failover[%d].cluster %q is listed twice", path, i, e.Cluster)
		}
		seen[e.Cluster] = true
	}
	if cp.PollMs < 10 {
		bad("%s.poll_ms %d is below 10", path, cp.PollMs)
	}
	if cp.TimeoutMs < 1 || cp.ReportMs < 10 || cp.MaxReportBatch < 1 {
		bad("%s timeout_ms, report_ms (>=10) and max_report_batch must be positive", path)
	}
	if w := cp.WaitMs; w > MaxWaitMs {
		bad("%s.wait_ms %d is above %d (the control plane holds a poll at most that long)", path, w, MaxWaitMs)
	} else if w > 0 && cp.TimeoutMs <= w {
		bad("%s.timeout_ms %d must exceed wait_ms %d, or every long poll times out (e.g. timeout_ms %d)",
			path, cp.TimeoutMs, w, w+1000)
	}
}

// Tenant sources: where a request's tenant comes from (Tenants.Source).
const (
	// SourceWorkload: the proxy's own workload, its Kubernetes namespace as Istio puts it
	// in Envoy's node metadata (NAMESPACE). The filter runs in the client's sidecar, so
	// the tenant is the client's namespace, which the client cannot change. The default.
	SourceWorkload = "workload"
	// SourcePeer: the downstream's mTLS identity (the first URI SAN of its certificate,
	// e.g. spiffe://cluster.local/ns/team-a/sa/app), for a filter in a gateway or a
	// waypoint that mesh clients reach over mTLS. A plaintext downstream has none.
	SourcePeer = "peer"
	// SourceHeader: a request header (Tenants.Header), trusted as it arrives. Only
	// where something the mesh trusts sets it after authenticating the caller (e.g. an
	// ingress gateway's RequestAuthentication outputClaimToHeaders) and outside traffic
	// cannot: the header stripped from client requests first (docs/threat-model.md).
	SourceHeader = "header"
)

// Tenants says who a request belongs to and whether it may share cache.
type Tenants struct {
	// Source is where the tenant comes from: SourceWorkload (the default), SourcePeer or
	// SourceHeader. Never a header a client can set unless chosen explicitly.
	Source string `json:"source,omitempty"`
	// Header carries the tenant with Source "header", and only then.
	Header string `json:"header,omitempty"`
	// DefaultPolicy applies to tenants not in Policies and to requests without a tenant.
	DefaultPolicy string `json:"default_policy,omitempty"`
	// Policies maps a tenant to PolicyShared or PolicyIsolated.
	Policies map[string]string `json:"policies,omitempty"`
	// Secret derives isolated tenants' salts (HMAC-SHA256); required when any tenant
	// can be isolated.
	Secret string `json:"secret,omitempty"`
	// InjectCacheSalt sets vLLM's cache_salt on isolated tenants' requests. A request of
	// an isolated tenant that the filter cannot salt is then refused, never forwarded
	// unsalted (docs/threat-model.md, "Tenant isolation").
	InjectCacheSalt bool `json:"inject_cache_salt,omitempty"`
	// UnsaltedPaths lists request paths (exact, without the query) whose bodies kvroute
	// does not parse, or cannot salt ("/v1/messages": vLLM reads no cache_salt there),
	// but which an isolated tenant may still send unsalted, because the engine keeps no
	// prefix cache for them (e.g. "/v1/embeddings" on a pooling model).
	// Any other request with a body on a path kvroute does not salt is refused for an
	// isolated tenant while InjectCacheSalt is on.
	UnsaltedPaths []string `json:"unsalted_paths,omitempty"`
}

// MustSalt reports whether a request of tenant may reach an engine only with its
// cache_salt set: the tenant is isolated and InjectCacheSalt is on.
func (c *Config) MustSalt(tenant string) bool {
	_, isolated := c.TenantSalt(tenant)
	return isolated && c.Tenants.InjectCacheSalt
}

// MayPassUnsalted reports whether path is one of Tenants.UnsaltedPaths.
func (c *Config) MayPassUnsalted(path string) bool {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for _, p := range c.Tenants.UnsaltedPaths {
		if p == path {
			return true
		}
	}
	return false
}

// Guards are the rule's guards (see package rule).
type Guards struct {
	MaxKVUsage    float64 `json:"max_kv_usage,omitempty"`
	MaxStateAgeMs int     `json:"max_state_age_ms,omitempty"`
	TieEpsilon    float64 `json:"tie_epsilon,omitempty"`
	MaxEndpoints  int     `json:"max_endpoints,omitempty"`
	// OffloadCost is the load-cost ratio to prefill of a hit in each slower KV medium
	// (vLLM's medium string, case-blind), e.g. {"CPU": 0.046}; "CPU" defaults to
	// DefaultCPULoadCost, a medium not named counts as uncached (tiers.go).
	OffloadCost map[string]float64 `json:"offload_cost,omitempty"`
}

// ParseConfig decodes and validates a plugin configuration, filling defaults.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	if len(bytes.TrimSpace(b)) == 0 {
		return c, errors.New("plugin config is empty: control_plane.cluster and control_plane.authority are required")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("plugin config: %w", err)
	}
	if dec.More() {
		return c, errors.New("plugin config: trailing data after the JSON object")
	}
	c.fillDefaults()
	return c, c.Validate()
}

func (c *Config) fillDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.EndpointHeader == "" {
		c.EndpointHeader = DefaultEndpointHeader
	}
	c.EndpointHeader = strings.ToLower(c.EndpointHeader)
	c.ModelHeader = strings.ToLower(c.ModelHeader)
	c.SessionHeader = strings.ToLower(c.SessionHeader)
	c.Tenants.Header = strings.ToLower(c.Tenants.Header)
	c.Overload.ClassHeader = strings.ToLower(c.Overload.ClassHeader)
	c.Overload.fillDefaults()
	if c.Tenants.Source == "" {
		c.Tenants.Source = SourceWorkload
	}
	if c.Tenants.DefaultPolicy == "" {
		c.Tenants.DefaultPolicy = PolicyShared
	}
	if len(c.Shards) == 0 {
		c.ControlPlane.fillDefaults()
	}
	for i := range c.Shards {
		c.Shards[i].ControlPlane.fillDefaults()
	}
	def(&c.BlockBytes, prefix.DefaultBlockBytes)
	def(&c.BlockTokens, prefix.DefaultBlockTokens)
	def(&c.MaxBodyBytes, 1<<20-64<<10)
	def(&c.MaxJSONDepth, 64)
	def(&c.LedgerTimeoutMs, 30000)
	def(&c.FirstTableWaitMs, DefaultFirstTableWaitMs)
	p := rule.DefaultParams()
	if c.Guards.MaxKVUsage == 0 {
		c.Guards.MaxKVUsage = p.MaxKVUsage
	}
	def(&c.Guards.MaxStateAgeMs, int(p.MaxStateAge/time.Millisecond))
	if c.Guards.TieEpsilon == 0 {
		c.Guards.TieEpsilon = p.TieEpsilon
	}
	def(&c.Guards.MaxEndpoints, p.MaxEndpoints)
	c.Guards.fillOffloadDefaults()
}

// Validate reports every problem at once, so an operator fixes the config in one pass.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Shards) == 0 {
		c.ControlPlane.validate("control_plane", bad)
	} else {
		c.validateShards(bad)
	}
	if !validHeaderName(c.EndpointHeader) {
		bad("endpoint_header %q is not a valid header name", c.EndpointHeader)
	}
	if c.ModelHeader != "" && !validHeaderName(c.ModelHeader) {
		bad("model_header %q is not a valid header name", c.ModelHeader)
	}
	if c.SessionHeader != "" && !validHeaderName(c.SessionHeader) {
		bad("session_header %q is not a valid header name", c.SessionHeader)
	}
	c.Tenants.validateSource(bad)
	c.Overload.validate(bad)
	isolated := c.Tenants.DefaultPolicy == PolicyIsolated
	for _, p := range append([]string{c.Tenants.DefaultPolicy}, mapValues(c.Tenants.Policies)...) {
		switch p {
		case PolicyShared:
		case PolicyIsolated:
			isolated = true
		default:
			bad("tenant policy %q: want %q or %q", p, PolicyShared, PolicyIsolated)
		}
	}
	if isolated && c.Tenants.Secret == "" {
		bad("tenants.secret is required when a tenant is isolated")
	}
	for _, p := range c.Tenants.UnsaltedPaths {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") {
			bad("tenants.unsalted_paths: %q is not a path (exact, starting with /, no query)", p)
		}
	}
	if c.BlockBytes < 1 || c.BlockBytes > 1<<16 || c.BlockTokens < 1 || c.BlockTokens > 1<<12 {
		bad("block_bytes (1..65536) and block_tokens (1..4096) out of range: %d, %d", c.BlockBytes, c.BlockTokens)
	}
	if c.MaxBodyBytes < 1024 {
		bad("max_body_bytes %d is below 1024", c.MaxBodyBytes)
	}
	if c.MaxJSONDepth < 4 || c.MaxJSONDepth > 1000 {
		bad("max_json_depth %d out of range 4..1000", c.MaxJSONDepth)
	}
	if c.Guards.MaxKVUsage <= 0 || c.Guards.MaxKVUsage > 1 {
		bad("guards.max_kv_usage %v out of range (0, 1]", c.Guards.MaxKVUsage)
	}
	if c.Guards.MaxStateAgeMs < 1 || c.Guards.TieEpsilon < 0 || c.Guards.TieEpsilon > 1 {
		bad("guards.max_state_age_ms must be positive and guards.tie_epsilon within [0, 1]")
	}
	if c.Guards.MaxEndpoints < 1 || c.Guards.MaxEndpoints > 16 {
		bad("guards.max_endpoints %d out of range 1..16", c.Guards.MaxEndpoints)
	}
	c.Guards.validateOffload(bad)
	if c.LedgerTimeoutMs < 1 {
		bad("ledger_timeout_ms must be positive")
	}
	if c.FirstTableWaitMs > MaxFirstTableWaitMs {
		bad("first_table_wait_ms %d above %d: a request held that long has waited longer than a cache miss costs", c.FirstTableWaitMs, MaxFirstTableWaitMs)
	}
	for a, base := range c.Adapters {
		if a == "" || base == "" {
			bad("adapters: empty name in %q -> %q", a, base)
		}
	}
	return errors.Join(errs...)
}

// validateSource checks that the tenant comes from where the configuration says, and
// that a header is read only when the header source was chosen explicitly.
func (t *Tenants) validateSource(bad func(string, ...any)) {
	switch t.Source {
	case SourceWorkload, SourcePeer:
		if t.Header != "" {
			bad("tenants.header %q is read only with tenants.source %q (it trusts whoever sets the header: "+
				"set it only where the mesh strips it from client traffic; docs/threat-model.md), not with source %q",
				t.Header, SourceHeader, t.Source)
		}
	case SourceHeader:
		if t.Header == "" {
			bad("tenants.source %q needs tenants.header", SourceHeader)
		} else if !validHeaderName(t.Header) {
			bad("tenants.header %q is not a valid header name", t.Header)
		}
	default:
		bad("tenants.source %q: want %q, %q or %q", t.Source, SourceWorkload, SourcePeer, SourceHeader)
	}
}

// RuleParams converts the guards for package rule.
func (c *Config) RuleParams() rule.Params {
	d := rule.DefaultParams()
	return rule.Params{
		MaxCacheAge:  d.MaxCacheAge,
		LoadBound:    d.LoadBound,
		MaxKVUsage:   c.Guards.MaxKVUsage,
		MaxStateAge:  time.Duration(c.Guards.MaxStateAgeMs) * time.Millisecond,
		TieEpsilon:   c.Guards.TieEpsilon,
		MaxEndpoints: c.Guards.MaxEndpoints,
	}
}

// TenantSalt returns the salt for a tenant: zero for shared tenants.
func (c *Config) TenantSalt(tenant string) (prefix.Salt, bool) {
	policy, ok := c.Tenants.Policies[tenant]
	if !ok {
		policy = c.Tenants.DefaultPolicy
	}
	if policy != PolicyIsolated {
		return prefix.Salt{}, false
	}
	return prefix.TenantSalt([]byte(c.Tenants.Secret), tenant), true
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
