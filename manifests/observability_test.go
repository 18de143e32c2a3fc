package manifests_test

// The dashboard and alert rules in observability/: they decode as the typed objects they
// are (Grafana's dashboard schema with grafana-foundation-sdk's strict decoder, the
// Prometheus Operator's PrometheusRule/PodMonitor types), every PromQL expression parses
// with Prometheus' own parser, and every metric and label a query names is one the code
// exports. The exported set is collected from the code, not listed here: the filter's
// proxy-wasm metric names from filter/metrics.go (Envoy exports them under those names
// with no labels of their own), the control plane's /metrics from a running control
// plane plus the Describe of its per-replica collectors (series that need data before
// they appear), and vLLM's names from the repository's vLLM simulator page.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	grafanaprom "github.com/grafana/grafana-foundation-sdk/go/prometheus"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	promql "github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/controlplane"
	"github.com/kvroute/kvroute/controlplane/discovery"
	vllmmetrics "github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

func init() {
	// Let the strict decoding of every manifest (strict_test.go) know these kinds.
	kubeTypes["monitoring.coreos.com/v1/PrometheusRule"] = func() any { return &monitoringv1.PrometheusRule{} }
	kubeTypes["monitoring.coreos.com/v1/PodMonitor"] = func() any { return &monitoringv1.PodMonitor{} }
}

// targetLabels are the labels Prometheus and the Operator's PodMonitors attach to every
// scraped series.
var targetLabels = []string{"job", "instance", "namespace", "pod", "container", "endpoint"}

// grafanaVars stand in for the dashboard's variables so queries parse as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${model}", ".*", "$model", ".*")

// exported maps a series name to the labels it carries.
type exported map[string]map[string]bool

func (e exported) add(name string, labels ...string) {
	if e[name] == nil {
		e[name] = map[string]bool{}
	}
	for _, l := range append(labels, targetLabels...) {
		e[name][l] = true
	}
}

// addFamily adds a parsed metric family, with the series a histogram or summary expands to.
func (e exported) addFamily(mf *dto.MetricFamily) {
	var lbls []string
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			lbls = append(lbls, lp.GetName())
		}
	}
	name := mf.GetName()
	switch mf.GetType() {
	case dto.MetricType_HISTOGRAM:
		e.add(name+"_bucket", append(lbls, "le")...)
		e.add(name+"_sum", lbls...)
		e.add(name+"_count", lbls...)
	case dto.MetricType_SUMMARY:
		e.add(name, append(lbls, "quantile")...)
		e.add(name+"_sum", lbls...)
		e.add(name+"_count", lbls...)
	default:
		e.add(name, lbls...)
	}
}

func parseExposition(t *testing.T, r io.Reader, into exported) {
	t.Helper()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range fams {
		into.addFamily(mf)
	}
}

// filterMetrics reads the names passed to the proxy-wasm Define*Metric helpers in
// defineMetrics (filter/metrics.go).
func filterMetrics(t *testing.T, into exported) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../filter/metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		fd, ok := node.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "defineMetrics" {
			return true
		}
		ast.Inspect(fd.Body, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				name, err := strconv.Unquote(lit.Value)
				if err == nil && strings.HasPrefix(name, "kvroute_") {
					into.add(name)
					n++
				}
			}
			return true
		})
		return false
	})
	if n < 10 {
		t.Fatalf("found %d filter metrics in filter/metrics.go: did defineMetrics change shape?", n)
	}
}

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// controlPlaneMetrics runs a control plane with one engine (fake vLLM metrics, a KV-event
// endpoint nobody serves), exercises its API, and reads /metrics; then adds what its
// per-replica collectors describe, for series that appear only with data.
func controlPlaneMetrics(t *testing.T, into exported) {
	t.Helper()
	page := func(w io.Writer) {
		vllmmetrics.Write(w, vllmmetrics.Snapshot{ModelName: "m", Engine: "0", PrefixQueries: 100, PrefixHits: 40, KVUsage: 0.5,
			TTFT: vllmmetrics.NewHistogram(vllmmetrics.TTFTBuckets), CacheConfig: []vllmmetrics.Label{{Name: "block_size", Value: "16"}, {Name: "num_gpu_blocks", Value: "1000"}}})
	}
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { page(w) }))
	defer engine.Close()
	// vLLM's own names, from the simulator page the control plane scrapes.
	var buf bytes.Buffer
	page(&buf)
	parseExposition(t, &buf, into)

	cp, err := controlplane.New(controlplane.Options{
		Listen: "127.0.0.1:0",
		Engines: []discovery.Engine{{ID: "e1", Model: "m", Addr: strings.TrimPrefix(engine.URL, "http://"),
			Metrics: engine.URL + "/metrics", KV: "tcp://127.0.0.1:1"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); cp.Wait() }()
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	base := "http://" + cp.Addr()
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/table?version=0", ""},
		{"POST", "/v1/reports", `{"reports":[]}`},
		{"GET", "/debug/state", ""},
	} {
		r, _ := http.NewRequest(req.method, base+req.path, strings.NewReader(req.body))
		r.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(r); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parseExposition(t, resp.Body, into)

	ch := make(chan *prometheus.Desc)
	go func() {
		cp.Index.Collector().Describe(ch)
		cp.Index.BudgetCollector().Describe(ch)
		close(ch)
	}()
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var lbls []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(l), "c("), ")"); l != "" {
				lbls = append(lbls, l)
			}
		}
		into.add(m[1], lbls...)
	}
	for _, must := range []string{"kvroute_controlplane_replica_queue_tokens", "kvroute_controlplane_cached_tokens_error_bucket", "kvroute_controlplane_table_versions_total"} {
		if into[must] == nil {
			t.Fatalf("the control plane's /metrics lacks %s: the collection broke", must)
		}
	}
}

var (
	knownOnce sync.Once
	known     exported
)

// exportedMetrics is every series the code exports, plus Prometheus' own `up`.
func exportedMetrics(t *testing.T) exported {
	t.Helper()
	knownOnce.Do(func() {
		e := exported{}
		filterMetrics(t, e)
		controlPlaneMetrics(t, e)
		e.add("up")
		known = e
	})
	if known == nil {
		t.Fatal("collecting the exported metrics failed")
	}
	return known
}

// checkQuery parses expr (Grafana variables substituted) and checks every selector's
// metric and label matchers, and every by/without/on/ignoring label, against known. It
// returns the labels the selected series carry, for legend and annotation templates.
func checkQuery(expr string, known exported) (map[string]bool, error) {
	q := grafanaVars.Replace(expr)
	if strings.Contains(q, "$") {
		return nil, fmt.Errorf("%q: unknown Grafana variable", expr)
	}
	e, err := promql.ParseExpr(q)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", expr, err)
	}
	var errs []string
	avail := map[string]bool{}
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		vs, ok := n.(*promql.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
			}
		}
		lbls, ok := known[name]
		if !ok {
			errs = append(errs, fmt.Sprintf("metric %q is not exported", name))
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel && !lbls[m.Name] {
				errs = append(errs, fmt.Sprintf("%s has no label %q", name, m.Name))
			}
		}
		for l := range lbls {
			avail[l] = true
		}
		return nil
	})
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		var grouping []string
		switch x := n.(type) {
		case *promql.AggregateExpr:
			grouping = x.Grouping
		case *promql.BinaryExpr:
			if x.VectorMatching != nil {
				grouping = x.VectorMatching.MatchingLabels
			}
		}
		for _, l := range grouping {
			if !avail[l] {
				errs = append(errs, fmt.Sprintf("no series in the query has label %q", l))
			}
		}
		return nil
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%q: %s", expr, strings.Join(errs, "; "))
	}
	return avail, nil
}

var templateLabelRE = regexp.MustCompile(`\{\{\s*\$?labels?\.(\w+)|\{\{\s*(\w+)\s*\}\}`)

// checkTemplateLabels checks {{label}} (Grafana legends) and {{ $labels.x }} (alert
// annotations) against the labels the query's series carry.
func checkTemplateLabels(s string, avail map[string]bool) error {
	for _, m := range templateLabelRE.FindAllStringSubmatch(s, -1) {
		l := m[1] + m[2]
		if !avail[l] {
			return fmt.Errorf("%q names label %q that no series of its query has", s, l)
		}
	}
	return nil
}

type dashboardQuery struct{ panel, expr, legend string }

// sdkErr maps grafana-foundation-sdk v0.0.22's "no error" to nil: its generated strict
// decoders return their error list as is, and an empty cog.BuildErrors is success.
func sdkErr(err error) error {
	if be, ok := err.(cog.BuildErrors); ok && len(be) == 0 {
		return nil
	}
	return err
}

// loadDashboard decodes the dashboard strictly and returns its queries.
//
//lint:ignore SA1019 the shipped JSON is Grafana's classic dashboard schema (schemaVersion 39), which dashboardv2 does not decode
func loadDashboard(b []byte) (*dashboard.Dashboard, []dashboardQuery, error) {
	plugins.RegisterDefaultPlugins()
	//lint:ignore SA1019 as above
	var d dashboard.Dashboard
	if err := sdkErr(d.UnmarshalJSONStrict(b)); err != nil {
		return nil, nil, err
	}
	// PanelOrRowPanel's decoder stops at that empty list for rows (leaving neither set),
	// so decode each panel by its type here, as strictly.
	var raw struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, nil, err
	}
	d.Panels = nil
	for i, rp := range raw.Panels {
		var typ struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(rp, &typ); err != nil {
			return nil, nil, err
		}
		var pr dashboard.PanelOrRowPanel
		var err error
		if typ.Type == "row" {
			pr.RowPanel = &dashboard.RowPanel{}
			err = sdkErr(pr.RowPanel.UnmarshalJSONStrict(rp))
		} else {
			pr.Panel = &dashboard.Panel{}
			err = sdkErr(pr.Panel.UnmarshalJSONStrict(rp))
			// The same empty list from the Prometheus query decoder makes the panel
			// decoder drop every target: decode them here.
			var tg struct {
				Targets []json.RawMessage `json:"targets"`
			}
			if err == nil {
				err = json.Unmarshal(rp, &tg)
			}
			pr.Panel.Targets = nil
			for j, t := range tg.Targets {
				q := &grafanaprom.Dataquery{}
				if err = sdkErr(q.UnmarshalJSONStrict(t)); err != nil {
					err = fmt.Errorf("targets[%d]: %w", j, err)
					break
				}
				pr.Panel.Targets = append(pr.Panel.Targets, q)
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("panels[%d]: %w", i, err)
		}
		d.Panels = append(d.Panels, pr)
	}
	var qs []dashboardQuery
	for i, p := range d.Panels {
		if p.RowPanel != nil {
			continue
		}
		if p.Panel == nil {
			return nil, nil, fmt.Errorf("panel %d: neither panel nor row", i)
		}
		title := ""
		if p.Panel.Title != nil {
			title = *p.Panel.Title
		}
		if title == "" || p.Panel.Datasource == nil || p.Panel.Datasource.Type == nil || *p.Panel.Datasource.Type != "prometheus" || len(p.Panel.Targets) == 0 {
			return nil, nil, fmt.Errorf("panel %d %q: want a title, the prometheus datasource and targets", i, title)
		}
		for _, tg := range p.Panel.Targets {
			pq, ok := tg.(*grafanaprom.Dataquery)
			if !ok {
				return nil, nil, fmt.Errorf("panel %q: target %T is not a Prometheus query", title, tg)
			}
			legend := ""
			if pq.LegendFormat != nil {
				legend = *pq.LegendFormat
			}
			qs = append(qs, dashboardQuery{title, pq.Expr, legend})
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != nil && strings.HasPrefix(*v.Definition, "label_values(") {
			qs = append(qs, dashboardQuery{"variable " + v.Name, *v.Definition, ""})
		}
	}
	return &d, qs, nil
}

// labelValuesRE reads a template variable's label_values(metric, label).
var labelValuesRE = regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)

func checkDashboardQuery(q dashboardQuery, known exported) error {
	if m := labelValuesRE.FindStringSubmatch(q.expr); m != nil {
		if !known[m[1]][m[2]] {
			return fmt.Errorf("%s: %s has no label %q (or is not exported)", q.panel, m[1], m[2])
		}
		return nil
	}
	avail, err := checkQuery(q.expr, known)
	if err != nil {
		return fmt.Errorf("%s: %w", q.panel, err)
	}
	if err := checkTemplateLabels(q.legend, avail); err != nil {
		return fmt.Errorf("%s: %w", q.panel, err)
	}
	return nil
}

func loadRule(b []byte) (*monitoringv1.PrometheusRule, error) {
	js, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, err
	}
	var r monitoringv1.PrometheusRule
	if err := strictJSON(js, &r); err != nil {
		return nil, err
	}
	if r.APIVersion != "monitoring.coreos.com/v1" || r.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s/%s", r.APIVersion, r.Kind)
	}
	return &r, nil
}

func checkRule(r monitoringv1.Rule, known exported) error {
	if r.Alert == "" {
		return fmt.Errorf("record %q: only alerts expected", r.Record)
	}
	avail, err := checkQuery(r.Expr.String(), known)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Alert, err)
	}
	if strings.TrimSpace(r.Annotations["runbook"]) == "" || r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
		return fmt.Errorf("%s: want a runbook line, a summary and a severity", r.Alert)
	}
	for _, v := range r.Annotations {
		if err := checkTemplateLabels(v, avail); err != nil {
			return fmt.Errorf("%s: %w", r.Alert, err)
		}
	}
	return nil
}

func TestObservabilityDashboard(t *testing.T) {
	b, err := os.ReadFile("observability/kvroute-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	d, qs, err := loadDashboard(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion < 39 || d.Uid == nil || *d.Uid == "" {
		t.Errorf("schemaVersion %d uid %v: want Grafana 11's schema (>= 39) and a uid", d.SchemaVersion, d.Uid)
	}
	if len(qs) < 30 {
		t.Fatalf("%d queries: the decoding lost some", len(qs))
	}
	known := exportedMetrics(t)
	used := map[string]bool{}
	for _, q := range qs {
		if err := checkDashboardQuery(q, known); err != nil {
			t.Error(err)
		}
		if avail, err := promql.ParseExpr(grafanaVars.Replace(q.expr)); err == nil {
			promql.Inspect(avail, func(n promql.Node, _ []promql.Node) error {
				if vs, ok := n.(*promql.VectorSelector); ok {
					used[vs.Name] = true
				}
				return nil
			})
		}
	}
	// The panels an operator looks at first must stay.
	for _, m := range []string{"vllm:prefix_cache_hits_total", "kvroute_controlplane_cached_tokens_error_sum",
		"kvroute_decisions_total", "kvroute_spills_total", "kvroute_fallbacks_total", "kvroute_table_age_ms",
		"kvroute_table_poll_errors_total", "kvroute_controlplane_replica_queue_tokens", "kvroute_controlplane_replica_kv_usage",
		"kvroute_controlplane_kv_event_last_age_seconds", "kvroute_controlplane_kv_event_gaps_total"} {
		if !used[m] {
			t.Errorf("no panel queries %s", m)
		}
	}
}

func TestObservabilityAlerts(t *testing.T) {
	b, err := os.ReadFile("observability/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := loadRule(b)
	if err != nil {
		t.Fatal(err)
	}
	known := exportedMetrics(t)
	var alerts []string
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			alerts = append(alerts, rule.Alert)
			if err := checkRule(rule, known); err != nil {
				t.Error(err)
			}
		}
	}
	for _, a := range []string{"KvrouteTableStale", "KvrouteControlPlaneDown", "KvrouteControlPlaneUnreachable", "KvrouteReplicaEventsDead", "KvroutePredictionDrift", "KvrouteFallbackRateHigh", "KvrouteOutcomesWithoutUsage"} {
		if !slices.Contains(alerts, a) {
			t.Errorf("alert %s missing", a)
		}
	}
}

// TestObservabilityChecksFail proves the checks above can fail: each case is a query,
// dashboard or rule that names something the code does not export, or is malformed.
func TestObservabilityChecksFail(t *testing.T) {
	known := exportedMetrics(t)
	dash, err := os.ReadFile("observability/kvroute-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	rule, err := os.ReadFile("observability/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, want string
		check      func() error
	}{
		{"unknown metric", "not exported", func() error { _, err := checkQuery(`rate(kvroute_decisions_totl[5m])`, known); return err }},
		{"unknown label on a filter metric", `no label "model"`, func() error {
			_, err := checkQuery(`sum(rate(kvroute_decisions_total{model="m"}[5m]))`, known)
			return err
		}},
		{"unknown label on a control-plane metric", `no label "pool"`, func() error {
			_, err := checkQuery(`kvroute_controlplane_replica_kv_usage{pool="x"}`, known)
			return err
		}},
		{"unknown grouping label", `label "replica"`, func() error {
			_, err := checkQuery(`sum by (replica) (rate(kvroute_spills_total[5m]))`, known)
			return err
		}},
		{"histogram without its suffix", "not exported", func() error {
			_, err := checkQuery(`rate(kvroute_controlplane_cached_tokens_error[5m])`, known)
			return err
		}},
		{"not PromQL", "unclosed left parenthesis", func() error { _, err := checkQuery(`sum(rate(kvroute_decisions_total[5m])`, known); return err }},
		{"unknown Grafana variable", "Grafana variable", func() error { _, err := checkQuery(`kvroute_table_age_ms{pod="$proxy"}`, known); return err }},
		{"legend names a label the query lacks", `label "replica"`, func() error {
			return checkDashboardQuery(dashboardQuery{"p", `sum by (namespace, pod) (kvroute_table_age_ms)`, "{{replica}}"}, known)
		}},
		{"variable on a missing label", `no label "engine"`, func() error {
			return checkDashboardQuery(dashboardQuery{"variable", `label_values(kvroute_controlplane_replica_queue_tokens, engine)`, ""}, known)
		}},
		{"dashboard with an unknown panel field", "colour", func() error {
			_, _, err := loadDashboard(bytes.Replace(dash, []byte(`"gridPos"`), []byte(`"colour": "red", "gridPos"`), 1))
			return err
		}},
		{"dashboard query with an unknown field", "legendFromat", func() error {
			_, _, err := loadDashboard(bytes.Replace(dash, []byte(`"legendFormat"`), []byte(`"legendFromat"`), 1))
			return err
		}},
		{"dashboard query on a renamed metric", "not exported", func() error {
			_, qs, err := loadDashboard(bytes.ReplaceAll(dash, []byte("kvroute_spills_total"), []byte("kvroute_spill_total")))
			if err != nil {
				return err
			}
			var errs []string
			for _, q := range qs {
				if err := checkDashboardQuery(q, known); err != nil {
					errs = append(errs, err.Error())
				}
			}
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}},
		{"rule with an unknown field", "unknown field", func() error {
			_, err := loadRule(bytes.Replace(rule, []byte("      for: 2m\n"), []byte("      for: 2m\n      severity: page\n"), 1))
			return err
		}},
		{"alert annotation on a label the query lacks", `label "replica"`, func() error {
			r, err := loadRule(rule)
			if err != nil {
				return err
			}
			a := r.Spec.Groups[0].Rules[0]
			a.Annotations = map[string]string{"summary": "{{ $labels.replica }}", "runbook": "x"}
			return checkRule(a, known)
		}},
		{"alert without a runbook", "runbook", func() error {
			r, err := loadRule(rule)
			if err != nil {
				return err
			}
			a := r.Spec.Groups[0].Rules[0]
			delete(a.Annotations, "runbook")
			return checkRule(a, known)
		}},
	}
	for _, c := range cases {
		err := c.check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// TestObservabilityRenders builds the kustomization: the two PodMonitors and the rule.
func TestObservabilityRenders(t *testing.T) {
	kinds := map[string]int{}
	for _, o := range render(t, "observability") {
		kinds[o.Kind]++
		if pm, ok := o.Value.(*monitoringv1.PodMonitor); ok && pm.Name == "kvroute-proxies" {
			// The filters run in the overlays' workloads, selected by this label.
			if len(pm.Spec.Selector.MatchExpressions) != 1 || pm.Spec.Selector.MatchExpressions[0].Key != "kvroute.io/filter" || !pm.Spec.NamespaceSelector.Any {
				t.Errorf("kvroute-proxies selects %+v", pm.Spec.Selector)
			}
		}
	}
	if kinds["PodMonitor"] != 2 || kinds["PrometheusRule"] != 1 || len(kinds) != 2 {
		t.Errorf("rendered %v", kinds)
	}
}
