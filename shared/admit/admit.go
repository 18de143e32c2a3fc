// Package admit decides, past the fleet's capacity, which requests a proxy forwards and
// which it refuses at once (HTTP 429 with Retry-After) so that the rest meet their time
// to first token. Every request has a priority class (api.Overload) with a TTFT budget.
// The rule's own estimate decides: on the replica the rule picked, the queue Q ahead of
// the request and its predicted wait (Q + U) / speed (the pick's cost without the share
// it charges the other requests there; package rule), in seconds, scaled by what the
// proxy observes (calibrate.go).
//
//   - Nothing is refused unless the fleet is saturated: the mean queue over the replicas
//     the rule may pick is past half the lowest class limit. Below that some replicas
//     are nearly idle and a long queue on one is the rule's choice, not a lack of room.
//   - A request whose queue on the pick is past its class's limit, or whose predicted
//     wait is past its budget, is refused (reason "wait"). A class's limit is its budget,
//     capped at a share of the strictest budget above it that shrinks down the list
//     ((n - i) / n for the i-th of n classes), so the lower classes are shed first and
//     the queue a critical request finds stays below its budget.
//   - Critical classes are never shed.
//   - A tenant whose share of the prefill tokens this proxy admitted lately is above its
//     weight's share is refused (reason "fairness"): in tokens, not requests, so one
//     tenant's 100k-token prompts cannot starve the others. Fairness holds while the
//     fleet is saturated, and with api.Overload.FairnessHoldMs for that long after:
//     shedding keeps the fleet at the edge of saturation, and a tenant admitted freely
//     in between takes what it sends (docs/overload.md).
//
// A request is never refused because its state is unknown: without a table, in the
// stale or blind regime, or on the rule's fallback, it is admitted. docs/overload.md has
// the measurements behind these choices, and why the proxy refuses instead of holding.
//
// A Controller is per proxy (per VM in the filter) and not safe for concurrent use.
package admit

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/shared/api"
)

// Reason is why a request was refused.
type Reason uint8

const (
	Admitted Reason = iota
	// ShedWait: the predicted wait is above the class's shed limit.
	ShedWait
	// ShedFairness: the fleet is saturated and the tenant is above its share.
	ShedFairness
)

// Reasons lists the refusal reasons, for metrics.
var Reasons = []Reason{ShedWait, ShedFairness}

// String names the reason in metrics.
func (r Reason) String() string {
	switch r {
	case ShedWait:
		return "wait"
	case ShedFairness:
		return "fairness"
	}
	return "admitted"
}

// Verdict is what Admit decided for one request.
type Verdict struct {
	// Class is the request's class, an index into api.Overload.Classes.
	Class  int
	Reason Reason
	// RetryAfter is the Retry-After a refusal carries, in whole seconds: how long the
	// queue needs to drain to the class's limit.
	RetryAfter int
}

// Shed reports whether the request must be refused.
func (v Verdict) Shed() bool { return v.Reason != Admitted }

// Status is the HTTP status a refusal is answered with.
const Status = 429

// Message is a refusal's body; it names no tenant and no prompt text.
func (v Verdict) Message() string {
	if v.Reason == ShedFairness {
		return "kvroute: the fleet is saturated and this tenant is above its share of it; retry after Retry-After\n"
	}
	return "kvroute: the fleet is saturated and this request's class would miss its time-to-first-token budget; retry after Retry-After\n"
}

// maxRetryAfter bounds Retry-After: past a minute the queue's estimate means little.
const maxRetryAfter = 60

// Controller holds one proxy's classes and tenant shares.
type Controller struct {
	cfg    *api.Overload
	limit  []float64 // each class's shed limit in seconds (+Inf: critical)
	lowest float64   // the lowest limit: past saturation x it the fleet is saturated
	rate   float64   // tokens/s for replicas whose table lists no speed
	shares shares
	cal    calibration
	// saturatedAt is when a request last found the fleet saturated; fairness holds for
	// fairHold after it (api.Overload.FairnessHoldMs).
	saturatedAt time.Time
	fairHold    time.Duration
}

// New returns the controller of o, nil when o has no classes (overload off).
func New(o *api.Overload) *Controller {
	if !o.Enabled() {
		return nil
	}
	c := &Controller{cfg: o, limit: Limits(o), lowest: math.Inf(1), rate: o.PrefillTokensPerSecond}
	for _, l := range c.limit {
		c.lowest = min(c.lowest, l)
	}
	c.fairHold = time.Duration(o.FairnessHoldMs) * time.Millisecond
	c.shares.init(o)
	return c
}

// Limits is each class's shed limit in seconds (see the package doc); +Inf for critical
// classes.
func Limits(o *api.Overload) []float64 {
	n := len(o.Classes)
	out := make([]float64, n)
	above := math.Inf(1) // the strictest budget of the classes listed before
	for i, c := range o.Classes {
		budget := float64(c.TTFTBudgetMs) / 1000
		switch {
		case c.Critical:
			out[i] = math.Inf(1)
		case c.ShedAboveMs > 0:
			out[i] = float64(c.ShedAboveMs) / 1000
		default:
			out[i] = min(budget, above*float64(n-i)/float64(n))
		}
		above = min(above, budget)
	}
	return out
}

// Class is a request's class (api.Overload.ClassOf).
func (c *Controller) Class(header, tenant string) int { return c.cfg.ClassOf(header, tenant) }

// Seconds converts a wait of tokens on a replica of speed tokens/s (0: the table lists
// none) to seconds.
func (c *Controller) Seconds(tokens, speed float64) float64 {
	if speed <= 0 {
		speed = c.rate
	}
	return tokens / speed
}

// Wait is a request's predicted wait in seconds on the pick: Queue before its prefill can
// start, Total until its first token (Queue and its own prefill); and Fleet, the mean
// queue over the replicas the rule may pick. Negative: unknown.
type Wait struct{ Queue, Total, Fleet float64 }

// saturation is the share of the lowest class limit that the fleet's mean queue must
// exceed for the fleet to be saturated: below it nothing is refused (docs/overload.md:
// at 0.5, 8 of 2,392 standard requests were refused at 0.8x capacity; at 1, the critical
// class missed its budget at 1.5x).
const saturation = 0.5

// Admit decides request id, of class and tenant, that would wait w by the rule and brings
// tokens of prefill; an admitted request's tokens count in its tenant's share, and its
// first byte (Started) calibrates the waits.
func (c *Controller) Admit(id uint64, class int, tenant string, w Wait, tokens float64, now time.Time) Verdict {
	v := Verdict{Class: class}
	raw := w
	k := c.cal.scale()
	w.Queue, w.Total, w.Fleet = w.Queue*k, w.Total*k, w.Fleet*k
	saturated := w.Queue >= 0 && w.Fleet > saturation*c.lowest
	if saturated {
		c.saturatedAt = now
	}
	if w.Queue >= 0 && !c.cfg.Classes[class].Critical {
		budget := float64(c.cfg.Classes[class].TTFTBudgetMs) / 1000
		switch {
		case saturated && w.Queue > c.limit[class]:
			v.Reason, v.RetryAfter = ShedWait, retryAfter(w.Queue-c.limit[class])
		case saturated && w.Total > budget:
			v.Reason, v.RetryAfter = ShedWait, retryAfter(w.Total-budget)
		case (saturated || c.fairHold > 0 && !c.saturatedAt.IsZero() && now.Sub(c.saturatedAt) <= c.fairHold) && c.shares.over(tenant, now):
			v.Reason, v.RetryAfter = ShedFairness, retryAfter(w.Fleet-saturation*c.lowest)
		}
	}
	if v.Reason == Admitted {
		c.cal.placed(id, raw, now)
		c.shares.add(tenant, tokens, now)
	}
	return v
}

func retryAfter(s float64) int {
	return min(max(int(math.Ceil(s)), 1), maxRetryAfter)
}
