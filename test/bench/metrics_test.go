package main

import (
	"math"
	"strings"
	"testing"
)

func TestParseHistograms(t *testing.T) {
	const text = `# HELP tessera_extender_request_duration_seconds Latency of extender verbs.
# TYPE tessera_extender_request_duration_seconds histogram
tessera_extender_request_duration_seconds_bucket{verb="filter",le="0.001"} 0
tessera_extender_request_duration_seconds_bucket{verb="filter",le="0.002"} 50
tessera_extender_request_duration_seconds_bucket{verb="filter",le="0.004"} 100
tessera_extender_request_duration_seconds_bucket{verb="filter",le="+Inf"} 100
tessera_extender_request_duration_seconds_sum{verb="filter"} 0.2
tessera_extender_request_duration_seconds_count{verb="filter"} 100
tessera_extender_request_duration_seconds_bucket{verb="bind",le="0.001"} 1
tessera_extender_request_duration_seconds_bucket{verb="bind",le="+Inf"} 2
tessera_extender_request_duration_seconds_sum{verb="bind"} 10
tessera_extender_request_duration_seconds_count{verb="bind"} 2
tessera_extender_placements_total{policy="binpack"} 7
`
	hs, err := parseHistograms(strings.NewReader(text), latencyMetric, "verb")
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 {
		t.Fatalf("got %d histograms, want 2", len(hs))
	}
	f := hs["filter"]
	if f.count != 100 || f.mean() != 0.002 {
		t.Errorf("filter count %v mean %v", f.count, f.mean())
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if q := f.quantile(0.5); !near(q, 0.002) {
		t.Errorf("p50 = %v, want 0.002", q)
	}
	if q := f.quantile(0.25); !near(q, 0.0015) {
		t.Errorf("p25 = %v, want 0.0015", q)
	}
	if q := f.quantile(0.99); !near(q, 0.00396) {
		t.Errorf("p99 = %v, want 0.00396", q)
	}
	// Beyond the last finite bound: that bound.
	if q := hs["bind"].quantile(0.99); !near(q, 0.001) {
		t.Errorf("bind p99 = %v, want 0.001", q)
	}
}
