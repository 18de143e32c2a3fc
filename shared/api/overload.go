package api

import (
	"fmt"
	"slices"
)

// DefaultPrefillTokensPerSecond converts the rule's cost to seconds for replicas whose
// table lists no speed: 1 / 71.3 us, docs/rule.md's prefill time per token (Llama 3.3 70B
// on two H200s at 50% MFU).
const DefaultPrefillTokensPerSecond = 14025

// Overload is what the filter does past the fleet's capacity: priority classes with a
// TTFT budget each, shedding of the requests whose budget cannot be met, and fairness
// between tenants in prefill tokens (shared/admit). With no classes it is off and the
// filter admits every request, as it always did.
type Overload struct {
	// Classes are listed most important first. A request gets one from ClassHeader, then
	// TenantClasses, then DefaultClass.
	Classes []Class `json:"classes,omitempty"`
	// ClassHeader names a request header that carries the class, trusted as it arrives:
	// set it only where something the mesh trusts sets the header and strips it from
	// client traffic (as tenants.header; docs/threat-model.md). Unset, no header is read.
	ClassHeader string `json:"class_header,omitempty"`
	// DefaultClass is the class of a request that no header or tenant names; required
	// with more than one class.
	DefaultClass string `json:"default_class,omitempty"`
	// TenantClasses maps a tenant (tenants.source) to its class.
	TenantClasses map[string]string `json:"tenant_classes,omitempty"`
	// TenantWeights are the tenants' shares of the fleet's prefill under saturation; a
	// tenant not listed weighs DefaultWeight (1).
	TenantWeights map[string]float64 `json:"tenant_weights,omitempty"`
	// FairnessHoldMs keeps tenants to their shares for this long after a request last
	// found the fleet saturated, not only while it is: shedding keeps the fleet at the
	// edge of saturation, and a tenant admitted freely between those moments takes what
	// it sends. Strict shares at the cost of refusing some work the fleet could have
	// served (docs/overload.md measures both); 0, the default, holds only while saturated.
	FairnessHoldMs int `json:"fairness_hold_ms,omitempty"`
	// PrefillTokensPerSecond converts a predicted wait in tokens to seconds for
	// replicas whose table lists no speed (DefaultPrefillTokensPerSecond).
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second,omitempty"`
}

// Class is one priority class.
type Class struct {
	// Name is what the class header and tenant_classes say: [a-z0-9_], it names metrics.
	Name string `json:"name"`
	// TTFTBudgetMs is the time to first token the class's requests are promised.
	TTFTBudgetMs int `json:"ttft_budget_ms"`
	// Critical classes are never shed by kvroute.
	Critical bool `json:"critical,omitempty"`
	// ShedAboveMs, when set, is the predicted wait above which the class is shed; by
	// default its budget, capped to keep room for the classes above it (shared/admit).
	ShedAboveMs int `json:"shed_above_ms,omitempty"`
}

// DefaultWeight is the weight of a tenant Overload.TenantWeights does not list.
const DefaultWeight = 1

// Enabled reports whether any class is configured: without one the filter admits
// every request.
func (o *Overload) Enabled() bool { return len(o.Classes) > 0 }

// ClassIndex is the position of the class named name, or -1.
func (o *Overload) ClassIndex(name string) int {
	return slices.IndexFunc(o.Classes, func(c Class) bool { return c.Name == name })
}

// ClassOf is a request's class: the class header's value when it names a class (header
// is "" when none is configured or sent), else the tenant's class, else DefaultClass.
func (o *Overload) ClassOf(header, tenant string) int {
	if header != "" {
		if i := o.ClassIndex(header); i >= 0 {
			return i
		}
	}
	if name, ok := o.TenantClasses[tenant]; ok {
		return o.ClassIndex(name)
	}
	return max(o.ClassIndex(o.DefaultClass), 0)
}

func (o *Overload) fillDefaults() {
	if !o.Enabled() {
		return
	}
	if o.PrefillTokensPerSecond == 0 {
		o.PrefillTokensPerSecond = DefaultPrefillTokensPerSecond
	}
	if o.DefaultClass == "" && len(o.Classes) == 1 {
		o.DefaultClass = o.Classes[0].Name
	}
}

// validate reports o's problems.
func (o *Overload) validate(bad func(string, ...any)) {
	if !o.Enabled() {
		if o.ClassHeader != "" || o.DefaultClass != "" || len(o.TenantClasses) > 0 || len(o.TenantWeights) > 0 || o.FairnessHoldMs != 0 {
			bad("overload: class_header, default_class, tenant_classes, tenant_weights and fairness_hold_ms need overload.classes")
		}
		return
	}
	for i, c := range o.Classes {
		if !validClassName(c.Name) {
			bad("overload.classes[%d].name %q: want 1 to 32 of [a-z0-9_] (it names metrics)", i, c.Name)
		}
		if o.ClassIndex(c.Name) != i {
			bad("overload.classes: %q is listed twice", c.Name)
		}
		if c.TTFTBudgetMs < 1 {
			bad("overload.classes[%d] (%s): ttft_budget_ms must be positive", i, c.Name)
		}
		if c.ShedAboveMs < 0 || c.Critical && c.ShedAboveMs != 0 {
			bad("overload.classes[%d] (%s): shed_above_ms must be positive, and unset on a critical class", i, c.Name)
		}
	}
	if o.FairnessHoldMs < 0 || o.FairnessHoldMs > 60000 {
		bad("overload.fairness_hold_ms %d: want 0 to 60000", o.FairnessHoldMs)
	}
	if o.ClassHeader != "" && !validHeaderName(o.ClassHeader) {
		bad("overload.class_header %q is not a valid header name", o.ClassHeader)
	}
	if o.ClassIndex(o.DefaultClass) < 0 {
		bad("overload.default_class %q is not one of overload.classes", o.DefaultClass)
	}
	for t, c := range o.TenantClasses {
		if o.ClassIndex(c) < 0 {
			bad("overload.tenant_classes: tenant %q has class %q, not one of overload.classes", t, c)
		}
	}
	for t, w := range o.TenantWeights {
		if !(w > 0) || w > 1e6 {
			bad("overload.tenant_weights: tenant %q weighs %v, want (0, 1e6]", t, w)
		}
	}
	if !(o.PrefillTokensPerSecond > 0) {
		bad("overload.prefill_tokens_per_second %v must be positive", o.PrefillTokensPerSecond)
	}
}

func validClassName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// String names o's classes for the start-up log.
func (o *Overload) String() string {
	if !o.Enabled() {
		return "overload off"
	}
	s := "classes"
	for _, c := range o.Classes {
		s += fmt.Sprintf(" %s(%d ms)", c.Name, c.TTFTBudgetMs)
	}
	return s
}
