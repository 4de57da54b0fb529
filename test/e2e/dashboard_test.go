package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/extender"
)

// dashboardFile is the Grafana dashboard the Helm chart ships.
const dashboardFile = "charts/tessera/dashboards/tessera.json"

// promqlKeywords are PromQL words that look like metric names.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true, "atan2": true,
}

var (
	promqlStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlVariables = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_:]*\}?`)
	promqlNumbers   = regexp.MustCompile(`\b\d[\d.eE+-]*[a-zA-Z]*\b`)
	promqlIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	// labelValues is Grafana's label_values(METRIC, LABEL) and
	// label_values(LABEL) template query.
	labelValues = regexp.MustCompile(`label_values\(\s*([^,()]+?)\s*(?:,\s*[A-Za-z_][A-Za-z0-9_]*\s*)?\)`)
)

// promqlMetricNames returns the metric names a PromQL expression selects:
// identifiers that are not functions or aggregations (followed by "("),
// keywords, label names (inside {...}, by (...)), durations, numbers,
// strings or Grafana variables. It is deliberately simple: the test below
// checks it on the shapes the dashboard uses.
func promqlMetricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlVariables.ReplaceAllString(s, " ")
	for prev := ""; prev != s; {
		prev = s
		s = promqlMatchers.ReplaceAllString(s, " ")
	}
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlNumbers.ReplaceAllString(s, " ")
	seen := map[string]bool{}
	var out []string
	for _, m := range promqlIdent.FindAllStringSubmatch(s, -1) {
		name := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		if m[1] != "" || promqlKeywords[strings.ToLower(name)] || seen[name] {
			continue // a function or aggregation, or a keyword
		}
		seen[name] = true
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func TestPromQLMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`tessera_extender_gpus`, []string{"tessera_extender_gpus"}},
		{`sum by (node, use) (tessera_extender_gpus{node=~"$node", use!="free"})`, []string{"tessera_extender_gpus"}},
		{`histogram_quantile(0.99, sum by (verb, le) (rate(tessera_extender_request_duration_seconds_bucket[$__rate_interval])))`, []string{"tessera_extender_request_duration_seconds_bucket"}},
		{`sum(a_total{x="by (y) {z}"}) / on (node) group_left(model) b_info offset 5m`, []string{"a_total", "b_info"}},
		{`tessera_nri_connected == 0 or vector(1) > bool 2e3`, []string{"tessera_nri_connected"}},
		{`increase(x_total{ignored="false"}[5m:1m]) unless without(instance) y`, []string{"x_total", "y"}},
		{`{__name__="only_matchers"}`, nil},
		{`label_values(tessera_extender_gpus, node)`, []string{"tessera_extender_gpus"}},
	} {
		got := promqlMetricNames(tc.expr)
		if m := labelValues.FindStringSubmatch(tc.expr); m != nil {
			got = promqlMetricNames(m[1])
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.expr, diff)
		}
	}
}

// dashboardExprs returns every PromQL expression of the dashboard, by
// where it is: panel targets (rows' nested panels too) and template
// variables' queries.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string]string{}
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %s has no expression", p.Title, tg.RefID)
				}
				out[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = tg.Expr
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // a plain string
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(METRIC, LABEL)", v.Name, q.Query)
			continue
		}
		out["variable "+v.Name] = m[1]
	}
	return out
}

type dashPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}
func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedSeries adds to names the series names of the collectors: a
// histogram's _bucket, _sum and _count, a summary's _sum and _count and
// its own name, every other metric's own name.
func exportedSeries(names map[string]string, from string, cs ...prometheus.Collector) {
	for _, c := range cs {
		var suffixes []string
		switch c.(type) {
		case *prometheus.HistogramVec:
			suffixes = histogramSuffixes
		case *prometheus.SummaryVec:
			suffixes = summarySuffixes
		default:
			// prometheus.Histogram and Summary are the same interface:
			// tell them by what they write.
			suffixes = suffixesOf(c)
		}
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descName.FindStringSubmatch(d.String())
			if m == nil {
				continue
			}
			for _, s := range suffixes {
				names[m[1]+s] = from
			}
		}
	}
}

var (
	histogramSuffixes = []string{"_bucket", "_sum", "_count"}
	summarySuffixes   = []string{"", "_sum", "_count"}
)

// suffixesOf returns the series suffixes of a collector that is not a
// vector: a single metric says by what it writes whether it is a histogram
// or a summary (prometheus.Histogram and Summary are the same interface).
func suffixesOf(c prometheus.Collector) []string {
	m, ok := c.(prometheus.Metric)
	if !ok {
		return []string{""}
	}
	var pb dto.Metric
	if err := m.Write(&pb); err == nil {
		switch {
		case pb.Histogram != nil:
			return histogramSuffixes
		case pb.Summary != nil:
			return summarySuffixes
		}
	}
	return []string{""}
}

// scrapedSeries adds the series names of a Prometheus text exposition.
func scrapedSeries(names map[string]string, from string, body []byte) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		names[name] = from
	}
}

// TestDashboardMetricsExported checks that every metric the Grafana
// dashboard queries is one Tessera exports: on the running extender's
// /metrics (its verbs were called by the earlier placements, the status
// gauges are always there), or in the registries of the extender and of
// the node agent's device plugins, whose vectors show on /metrics only
// once a label value was set. A query naming anything else fails the
// test. (The agent's nri and isolation registries are not read here:
// importing them would add modules to test/go.mod; the dashboard does not
// query them.)
func TestDashboardMetricsExported(t *testing.T) {
	exprs := dashboardExprs(t)
	if len(exprs) < 20 {
		t.Fatalf("%s: %d queries, want the full dashboard", dashboardFile, len(exprs))
	}
	names := map[string]string{}
	rec := &recorder{}
	extender.NewMetrics(rec)
	if _, err := deviceplugin.NewMetrics(rec); err != nil {
		t.Fatal(err)
	}
	exportedSeries(names, "registries", rec.collectors...)
	exportedSeries(names, "registries", &extender.QuotaCollector{}, extender.NewStatus(nil, nil, nil, nil).Collector())

	c := getCluster(t)
	base, hc := extenderEndpoint(t, c)
	var body []byte
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		code, b, err := getBody(ctx, hc, base+"/metrics")
		body = b
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("the extender's /metrics: %v", err)
	}
	scrapedSeries(names, "the extender's /metrics", body)
	// The status gauges are on the live extender, not only in a registry.
	for _, n := range []string{"tessera_extender_gpus", "tessera_extender_node_fragmented_gpus", "tessera_extender_pending_gpu_pods", "tessera_extender_workload_reservations"} {
		if !bytes.Contains(body, []byte("\n"+n+"{")) && !bytes.Contains(body, []byte("\n"+n+" ")) {
			t.Errorf("the running extender does not export %s", n)
		}
	}

	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	used := 0
	for _, k := range keys {
		metrics := promqlMetricNames(exprs[k])
		if len(metrics) == 0 {
			t.Errorf("%s: %q names no metric", k, exprs[k])
		}
		for _, m := range metrics {
			used++
			if _, ok := names[m]; !ok {
				t.Errorf("%s: %q queries %s, which Tessera does not export", k, exprs[k], m)
			}
		}
	}
	t.Logf("%d queries, %d metric references checked against %d exported series names", len(exprs), used, len(names))
}
