package route

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
)

// Request is one request as a proxy holds it when it routes: the filter fills it from
// Envoy's callbacks, the fleet simulator from its workload. Route does the rest, so the
// two cannot drift apart (TestFilterAndSimulatorRouteAlike in filter/ holds them to it).
type Request struct {
	// ID keys the request's ledger entry (the filter's context number).
	ID     uint64
	Schema prompt.Schema
	// Body is the whole request body (nil when there was none).
	Body []byte
	// Oversized: the body was let through unread because it is, or could become,
	// larger than max_body_bytes; Size is how many bytes of it had arrived.
	Oversized bool
	Size      int
	// Unread: the body arrived but the host would not hand it over.
	Unread bool
	// ModelHeader is the configured model header's value ("" for none or unset); it
	// wins over the body's "model".
	ModelHeader string
	// Tenant is who the request belongs to (api.Tenants.Source says where it came from).
	Tenant string
	// Class is the class header's value (api.Overload.ClassHeader), "" for none.
	Class string
	// Session is the replica that served the request's session last ("" for none, or
	// no session), and SessionBlocks that request's complete blocks (its
	// Decision.Blocks): the replica is credited with as many of this prompt's blocks
	// cached, and the rule's cost decides (affinity.go).
	Session       string
	SessionBlocks int
}

// Action is what Route did with a request.
type Action uint8

const (
	// Unrouted: no table, or a model the table does not have; the endpoint header stays
	// unset and Envoy's fallback load balancer decides.
	Unrouted Action = iota
	// Placed: the rule picked the replicas; Result.Placement is the placement report.
	Placed
	// NoPrompt: nothing to match (unparsable, oversized, no prompt); the replicas are in
	// least-queued order.
	NoPrompt
)

// Refusal says why a request must not be forwarded: its tenant is isolated with
// inject_cache_salt and its body cannot carry the tenant's cache_salt, so the engine
// would cache its prompt where other tenants can hit it.
type Refusal uint8

const (
	NotRefused Refusal = iota
	// RefusedOversized: the body is larger than max_body_bytes, so it is never read
	// whole and cannot be salted (HTTP 413).
	RefusedOversized
	// RefusedUnparsable: the body is not a request kvroute can parse (HTTP 400).
	RefusedUnparsable
	// RefusedUnread: the host did not hand over the body, or would not take the salted
	// one back (HTTP 503: a retry may succeed).
	RefusedUnread
	// RefusedPath: a body on a path kvroute does not parse, or whose engine request has
	// no cache_salt (/v1/messages), not listed in tenants.unsalted_paths (HTTP 403).
	RefusedPath
)

// Status is the HTTP status a refusal is answered with.
func (r Refusal) Status() int {
	switch r {
	case RefusedOversized:
		return 413
	case RefusedUnparsable:
		return 400
	case RefusedUnread:
		return 503
	case RefusedPath:
		return 403
	}
	return 0
}

// String names the refusal in the reply's body and the metric's reason.
func (r Refusal) String() string {
	switch r {
	case RefusedOversized:
		return "oversized"
	case RefusedUnparsable:
		return "unparsable"
	case RefusedUnread:
		return "unread"
	case RefusedPath:
		return "path"
	}
	return "none"
}

// Message is the local reply's body: why, and what the operator can change. It names no
// tenant and no prompt text.
func (r Refusal) Message() string {
	const lead = "kvroute: this tenant's prompts are isolated (cache_salt), and "
	switch r {
	case RefusedOversized:
		return lead + "this body is larger than max_body_bytes, so kvroute cannot salt it; send a smaller body or raise max_body_bytes\n"
	case RefusedUnparsable:
		return lead + "this body is not a JSON request kvroute can parse (syntax, or nesting above max_json_depth), so kvroute cannot salt it\n"
	case RefusedUnread:
		return lead + "kvroute could not read or rewrite this body to salt it; retry\n"
	case RefusedPath:
		return lead + "kvroute does not salt requests on this path; an operator may list it in tenants.unsalted_paths if the engine caches nothing for it\n"
	}
	return ""
}

// Result is what a proxy needs besides the decision: what to count, and what to change
// in the request.
type Result struct {
	Action Action
	// Refused, when set, means the request must be answered with Refused.Status() and
	// not forwarded; nothing else in the Result applies.
	Refused Refusal
	// ParseError is set when the body did not parse (not for oversized bodies or bodies
	// without a prompt). It names no prompt text.
	ParseError error
	// Oversized: the body was larger than max_body_bytes (unread, or refused by the parser).
	Oversized bool
	// Body, when not nil, replaces the request body: an isolated tenant's request with
	// vLLM's cache_salt set to the tenant's (tenants.inject_cache_salt).
	Body []byte
	// Placement is the placement report (Action == Placed).
	Placement api.Report
	// Verdict is the admission's (Router.Admit); when Verdict.Shed(), the request must be
	// answered with 429 and Verdict.RetryAfter and not forwarded: Route recorded nothing.
	Verdict admit.Verdict
	// Follow says whether the request continued a stored response (Router.Follows) and
	// whether it went to that response's replica first.
	Follow FollowOutcome
	// LocalKeys is the tail of Placement.Keys past what the table lists the picked
	// replica as holding: what Route recorded in Local, and what a proxy's other worker
	// VMs need to record (filter/placed.go). The keys before it add nothing to a match
	// on that replica while the table holds them (a match counts a replica's longest
	// held checkpoint), and once the table drops them the engine has too. Empty when
	// the table already knows the whole chain there: the common case of a prefix sent
	// to its owner, which used to rewrite all its keys (125 for 8,000 tokens) in Local
	// on every VM of the proxy for every request.
	LocalKeys []uint64
}

// FollowOutcome is what became of a request that continues a stored response.
type FollowOutcome uint8

const (
	// NoFollow: the request names no previous response (or no Follows is set).
	NoFollow FollowOutcome = iota
	// Followed: it went to the replica that answered the previous response first.
	Followed
	// FollowLost: that replica is unknown, gone from the table or unhealthy; the rule
	// placed the request alone (the engine may not find the response).
	FollowLost
)

// Route runs one request through the whole sequence: parse the body, resolve the model
// (LoRA adapters route on their base model's replicas), choose the chain's salt (tenant
// isolation, or the client's cache_salt), hash the chain, decide on table t, record the
// pick in the ledger and build the placement report. A request without a prompt to
// match goes least-queued. tableAge is how long ago t was last confirmed current.
//
// The caller sets the endpoint header from the decision's addresses, forwards
// Result.Body when set, counts the result and queues the placement report; when it
// cannot set the header it calls r.Done(req.ID).
func (r *Router) Route(t *table.Table, req *Request, tableAge time.Duration, now time.Time) (Decision, Result) {
	var res Result
	cfg := &r.Config
	// An isolated tenant's body is salted before anything else can fail, and one that
	// cannot be salted is refused: forwarded unsalted, its prompt would be cached where
	// another tenant can hit it (docs/threat-model.md).
	mustSalt := cfg.MustSalt(req.Tenant)
	if req.Oversized || req.Unread {
		res.Oversized = req.Oversized
		if mustSalt {
			res.Refused = RefusedUnread
			if req.Oversized {
				res.Refused = RefusedOversized
			}
			return Decision{}, res
		}
		r.aff = affinity{session: req.Session, sessionBlocks: req.SessionBlocks}
		defer func() { r.aff = affinity{} }()
		return r.routeWithoutPrompt(t, req, req.ModelHeader, float64(req.Size)/4, tableAge, now, res)
	}
	// The parser's memory of earlier bodies (shared/prompt's strmemo.go) serves an
	// isolated tenant's requests only, and shared tenants' only each other's.
	tenantSalt, isolated := cfg.TenantSalt(req.Tenant)
	r.parser.Partition = tenantSalt
	pr, err := r.parser.Parse(req.Schema, req.Body, prompt.Limits{MaxBytes: cfg.MaxBodyBytes, MaxDepth: cfg.MaxJSONDepth})
	r.aff = r.affinityOf(pr.PreviousResponseID, req)
	defer func() { r.aff = affinity{} }()
	model := pr.Model
	if req.ModelHeader != "" {
		model = req.ModelHeader
	}
	if err != nil {
		switch {
		case errors.Is(err, prompt.ErrTooLarge):
			res.Oversized = true
			res.Refused = RefusedOversized
		case errors.Is(err, prompt.ErrNoPrompt):
			// A request object without a prompt: salted all the same, in case the
			// engine finds something to cache in it.
			r.salt(tenantSalt, isolated, &pr, req.Body, &res)
		default:
			res.ParseError = err
			res.Refused = RefusedUnparsable
		}
		if !mustSalt {
			res.Refused = NotRefused
		} else if res.Refused != NotRefused {
			return Decision{}, res
		}
		return r.routeWithoutPrompt(t, req, model, float64(len(req.Body))/4, tableAge, now, res)
	}
	salt := r.salt(tenantSalt, isolated, &pr, req.Body, &res)
	base, lora := r.resolveModel(model)
	if t, tableAge = r.tableFor(t, tableAge, base); t == nil {
		return Decision{}, res
	}
	m := t.Models[base]
	if m == nil || len(m.Replicas) == 0 {
		return Decision{}, res
	}
	chain := newChain(m.Config, Identity{Model: base, LoRA: lora, Salt: salt}, &pr, r.keys, &r.memo)
	r.keys = chain.Keys
	d := r.Decide(m, &chain, tableAge, now)
	if len(d.Addrs) == 0 {
		return d, res
	}
	if r.Admit != nil {
		res.Verdict = r.Admit.Admit(req.ID, r.Admit.Class(req.Class, req.Tenant), req.Tenant, r.predictedWait(&d), d.Uncached, now)
		if res.Verdict.Shed() {
			return Decision{}, res
		}
	}
	r.Ledger.Add(req.ID, d.Addrs[0], d.Uncached, now)
	res.Action = Placed
	res.Follow = r.followOutcome(d.Addrs[0])
	var ckpts []uint64
	if r.Reuse {
		ckpts = r.ckpts[:0]
	}
	res.Placement = placement(m, &chain, &d, now, ckpts)
	if r.Reuse {
		r.ckpts = res.Placement.Keys
	}
	// The next request sees this placement at once, not only once the table has it.
	stride := max(int(m.Config.Stride), 1)
	known := min(r.inTable[d.Order[0]]/stride, len(res.Placement.Keys))
	res.LocalKeys = res.Placement.Keys[known:]
	r.Local.Add(m.Name, res.LocalKeys, d.Addrs[0], now)
	return d, res
}

// predictedWait is the request's predicted wait on the pick: its queue Q and, with its
// own prefill U, the rule's cost without the share it charges the other requests,
// (Q + U) / speed; and the mean queue over the replicas the rule may pick, which says
// whether the fleet is saturated. Unknown (negative) unless the rule decided on fresh
// queue numbers.
func (r *Router) predictedWait(d *Decision) admit.Wait {
	if d.Stale || d.Fallback || len(d.Order) == 0 {
		return admit.Wait{Queue: -1, Total: -1, Fleet: -1}
	}
	pick := &r.cands[d.Order[0]]
	w := admit.Wait{Queue: r.Admit.Seconds(pick.Queued, pick.Speed), Total: r.Admit.Seconds(pick.Queued+d.Uncached, pick.Speed)}
	n := 0
	for i := range r.cands {
		if cd := &r.cands[i]; rule.Eligible(*cd, r.Picker.Params) {
			w.Fleet += r.Admit.Seconds(cd.Queued, cd.Speed)
			n++
		}
	}
	w.Fleet /= float64(max(n, 1))
	return w
}

// routeWithoutPrompt orders the model's replicas by queued tokens: a request with no
// prompt to match (unparsable, oversized) still goes where the least work waits. With no
// model named and one model in the table, that one.
func (r *Router) routeWithoutPrompt(t *table.Table, req *Request, model string, estTokens float64,
	tableAge time.Duration, now time.Time, res Result) (Decision, Result) {
	base, _ := r.resolveModel(model)
	if t, tableAge = r.tableFor(t, tableAge, base); t == nil {
		return Decision{}, res
	}
	var m *table.Model
	if model != "" {
		m = t.Models[base]
	} else if len(t.Models) == 1 {
		for _, only := range t.Models {
			m = only
		}
	}
	if m == nil || len(m.Replicas) == 0 {
		return Decision{}, res
	}
	d := r.LeastQueued(m, tableAge, now)
	if len(d.Addrs) == 0 {
		return d, res
	}
	r.Ledger.Add(req.ID, d.Addrs[0], estTokens, now)
	res.Action = NoPrompt
	res.Follow = r.followOutcome(d.Addrs[0])
	return d, res
}

// tableFor is the table that serves a base model: t, or Tables' answer when set.
func (r *Router) tableFor(t *table.Table, age time.Duration, model string) (*table.Table, time.Duration) {
	if r.Tables == nil {
		return t, age
	}
	return r.Tables(model)
}

// resolveModel maps a LoRA adapter's name to its base model, whose replicas serve it.
func (r *Router) resolveModel(model string) (base, lora string) {
	if b, ok := r.Config.Adapters[model]; ok {
		return b, model
	}
	return model, ""
}

// salt picks the chain salt. Isolated tenants get theirs (and, when configured, vLLM's
// cache_salt is set to it so the engine keeps their blocks apart too); otherwise a
// cache_salt the client sent separates the engine's cache, so it separates ours.
func (r *Router) salt(salt prefix.Salt, isolated bool, pr *prompt.Parsed, body []byte, res *Result) prefix.Salt {
	if !isolated {
		if pr.HasCacheSalt {
			return prefix.SaltFromCacheSalt(pr.CacheSalt)
		}
		return prefix.Salt{}
	}
	// A schema without cache_salt (Messages) is never rewritten: the proxy refuses an
	// isolated tenant's body there before it is read, unless tenants.unsalted_paths
	// lists its path.
	if r.Config.Tenants.InjectCacheSalt && pr.Schema.TakesCacheSalt() {
		if cs := salt.CacheSalt(); !pr.HasCacheSalt || pr.CacheSalt != cs {
			res.Body = prompt.WithCacheSalt(body, pr, cs)
		}
	}
	return salt
}
