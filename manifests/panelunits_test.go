package manifests_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	promql "github.com/prometheus/prometheus/promql/parser"
)

// What one axis of a dashboard panel may show: a panel draws its series against its
// unit (fieldConfig.defaults.unit), or against a query's own when an override sets one,
// and the series on one axis must be one kind of quantity: rates of counters (and
// ratios of such rates), or gauges of one unit. A version number (about 1.8e12) beside
// versions per second, or 262,144 keys beside a drop rate, flattens one of the two.
// And a panel's series are either per proxy (grouped by pod, named by it in the legend,
// "per proxy" in the title) or totals, never both.

// gaugeUnits names the unit of a gauge by the suffix of its name.
var gaugeUnits = []struct{ suffix, unit string }{
	{"_seconds", "seconds"}, {"_ms", "milliseconds"}, {"_bytes", "bytes"}, {"_tokens", "tokens"},
	{"_keys", "keys"}, {"_perc", "fraction"}, {"_usage", "fraction"}, {"_healthy", "0 or 1"},
	{"_connected", "0 or 1"}, {"_version", "version"},
}

// quantity says what expr's series measure: "counter rate", or "gauge in <unit>" (the
// metric's name when its suffix says no unit).
func quantity(expr string) (string, error) {
	e, err := promql.ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return "", err
	}
	rate := false
	units := map[string]bool{}
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		switch x := n.(type) {
		case *promql.Call:
			rate = rate || slices.Contains([]string{"rate", "irate", "increase"}, x.Func.Name)
		case *promql.VectorSelector:
			unit := x.Name
			for _, g := range gaugeUnits {
				if strings.HasSuffix(x.Name, g.suffix) {
					unit = g.unit
					break
				}
			}
			units[unit] = true
		}
		return nil
	})
	if rate {
		return "counter rate", nil
	}
	if len(units) != 1 {
		return "", fmt.Errorf("%q: gauges of %d units in one expression", expr, len(units))
	}
	for u := range units {
		return "gauge in " + u, nil
	}
	return "", nil
}

// perProxy reports whether expr's series are one per proxy (grouped by pod).
func perProxy(expr string) bool {
	e, err := promql.ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return false
	}
	by := false
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		if a, ok := n.(*promql.AggregateExpr); ok && !a.Without && slices.Contains(a.Grouping, "pod") {
			by = true
		}
		return nil
	})
	return by
}

type unitPanel struct {
	Title       string `json:"title"`
	Type        string `json:"type"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options any    `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID  string `json:"refId"`
		Expr   string `json:"expr"`
		Legend string `json:"legendFormat"`
	} `json:"targets"`
}

// checkPanelUnits returns what breaks the two rules above, panel by panel.
func checkPanelUnits(dash []byte) error {
	var d struct {
		Panels []unitPanel `json:"panels"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		return err
	}
	var errs []error
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		// The axis unit of each query: the panel's, or an override's for its refId.
		unit := map[string]string{}
		for _, t := range p.Targets {
			unit[t.RefID] = p.FieldConfig.Defaults.Unit
		}
		for _, o := range p.FieldConfig.Overrides {
			for _, pr := range o.Properties {
				if ref, ok := o.Matcher.Options.(string); ok && o.Matcher.ID == "byFrameRefID" && pr.ID == "unit" {
					unit[ref], _ = pr.Value.(string)
				}
			}
		}
		axes := map[string]map[string][]string{} // axis unit -> quantity -> refIds
		proxies := 0
		for _, t := range p.Targets {
			q, err := quantity(t.Expr)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Title, err))
				continue
			}
			if axes[unit[t.RefID]] == nil {
				axes[unit[t.RefID]] = map[string][]string{}
			}
			axes[unit[t.RefID]][q] = append(axes[unit[t.RefID]][q], t.RefID)
			if perProxy(t.Expr) {
				proxies++
				if !strings.Contains(t.Legend, "{{pod}}") {
					errs = append(errs, fmt.Errorf("%s: query %s is per proxy but its legend %q does not name the pod", p.Title, t.RefID, t.Legend))
				}
			}
		}
		for u, qs := range axes {
			if len(qs) > 1 {
				errs = append(errs, fmt.Errorf("%s: one axis (unit %q) draws %v", p.Title, u, qs))
			}
		}
		titled := strings.Contains(p.Title, "per proxy")
		switch {
		case proxies > 0 && proxies < len(p.Targets):
			errs = append(errs, fmt.Errorf("%s: mixes %d per-proxy series with %d totals", p.Title, proxies, len(p.Targets)-proxies))
		case proxies > 0 && !titled:
			errs = append(errs, fmt.Errorf("%s: per-proxy series, but the title does not say \"per proxy\"", p.Title))
		case proxies == 0 && titled:
			errs = append(errs, fmt.Errorf("%s: says \"per proxy\" but draws totals", p.Title))
		}
	}
	return errors.Join(errs...)
}

func TestDashboardPanelsHaveOneUnitPerAxis(t *testing.T) {
	dash, err := os.ReadFile("observability/kvroute-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPanelUnits(dash); err != nil {
		t.Error(err)
	}
}

// TestPanelUnitChecksFail: panels the dashboard once had, each breaking one rule.
func TestPanelUnitChecksFail(t *testing.T) {
	panel := func(title, unit string, targets ...[2]string) []byte {
		var ts []map[string]string
		for i, tg := range targets {
			ts = append(ts, map[string]string{"refId": string(rune('A' + i)), "expr": tg[0], "legendFormat": tg[1]})
		}
		b, _ := json.Marshal(map[string]any{"panels": []any{map[string]any{"type": "timeseries", "title": title,
			"fieldConfig": map[string]any{"defaults": map[string]string{"unit": unit}}, "targets": ts}}})
		return b
	}
	for _, c := range []struct {
		name, want string
		dash       []byte
	}{
		{"a version beside versions per second", "one axis", panel("Table version", "short",
			[2]string{`max(kvroute_table_version)`, "v"}, [2]string{`max(rate(kvroute_controlplane_table_versions_total[5m]))`, "versions/s"})},
		{"keys beside a drop rate", "one axis", panel("Index budget", "short",
			[2]string{`max(kvroute_controlplane_budget_keys)`, "keys"}, [2]string{`sum(rate(kvroute_controlplane_budget_dropped_total[5m]))`, "dropped"})},
		{"health beside an age in seconds", "one axis", panel("Replica health and state age", "short",
			[2]string{`min(kvroute_controlplane_replica_healthy)`, "healthy"}, [2]string{`max(kvroute_controlplane_replica_state_age_seconds)`, "age"})},
		{"per-proxy series beside totals", "mixes 1 per-proxy series with 1 totals", panel("Reports per proxy", "ops",
			[2]string{`sum by (namespace, pod) (rate(kvroute_reports_dropped_total[5m]))`, "{{namespace}}/{{pod}}"}, [2]string{`sum(rate(kvroute_reports_sent_total[5m]))`, "sent (all)"})},
		{"a per-proxy legend without the pod", "does not name the pod", panel("Table age per proxy", "s",
			[2]string{`max by (namespace, pod) (kvroute_table_age_ms)`, "{{namespace}}"})},
		{"totals under a per-proxy title", "draws totals", panel("Decisions per proxy", "reqps",
			[2]string{`sum(rate(kvroute_decisions_total[5m]))`, "decisions"})},
	} {
		err := checkPanelUnits(c.dash)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
	// A second axis by override is fine.
	b := panel("Index budget", "short", [2]string{`max(kvroute_controlplane_budget_keys)`, "keys"}, [2]string{`sum(rate(kvroute_controlplane_budget_dropped_total[5m]))`, "dropped"})
	b = []byte(strings.Replace(string(b), `"fieldConfig":{"defaults":{"unit":"short"}}`,
		`"fieldConfig":{"defaults":{"unit":"short"},"overrides":[{"matcher":{"id":"byFrameRefID","options":"B"},"properties":[{"id":"unit","value":"ops"}]}]}`, 1))
	if err := checkPanelUnits(b); err != nil {
		t.Errorf("an override's axis: %v", err)
	}
}
