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

// Series of one key that differ in other labels add up; a histogram
// without labels is keyed by "".
func TestParseHistogramsMerges(t *testing.T) {
	const text = `scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="scheduled",le="0.001"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="scheduled",le="0.002"} 3
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="scheduled",le="+Inf"} 4
scheduler_scheduling_attempt_duration_seconds_sum{profile="a",result="scheduled"} 0.01
scheduler_scheduling_attempt_duration_seconds_count{profile="a",result="scheduled"} 4
scheduler_scheduling_attempt_duration_seconds_bucket{profile="b",result="scheduled",le="0.001"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{profile="b",result="scheduled",le="0.002"} 2
scheduler_scheduling_attempt_duration_seconds_bucket{profile="b",result="scheduled",le="+Inf"} 2
scheduler_scheduling_attempt_duration_seconds_sum{profile="b",result="scheduled"} 0.002
scheduler_scheduling_attempt_duration_seconds_count{profile="b",result="scheduled"} 2
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 5
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf"} 6
scheduler_scheduling_algorithm_duration_seconds_sum 0.012
scheduler_scheduling_algorithm_duration_seconds_count 6
`
	hs, err := parseHistograms(strings.NewReader(text), schedulerAttemptMetric, "result")
	if err != nil {
		t.Fatal(err)
	}
	h := hs["scheduled"]
	if len(hs) != 1 || h == nil || h.count != 6 || math.Abs(h.sum-0.012) > 1e-12 || len(h.buckets) != 3 {
		t.Fatalf("merged: %+v", hs)
	}
	if h.buckets[0].count != 1 || h.buckets[1].count != 5 || h.buckets[2].count != 6 {
		t.Errorf("merged buckets %+v, want cumulative 1, 5, 6", h.buckets)
	}
	if q := h.quantile(0.5); math.Abs(q-0.0015) > 1e-12 {
		t.Errorf("p50 = %v, want 0.0015", q)
	}
	alg, err := parseHistograms(strings.NewReader(text), schedulerAlgorithmMetric, "")
	if err != nil {
		t.Fatal(err)
	}
	if a := alg[""]; a == nil || a.count != 6 || math.Abs(a.mean()-0.002) > 1e-12 {
		t.Errorf("algorithm histogram %+v", alg)
	}
}

func TestSchedulerAddr(t *testing.T) {
	log := `I1122 02:56:04.327749   29254 flags.go:64] FLAG: --secure-port="44301"
I1122 02:56:04.627838   29254 secure_serving.go:211] Serving securely on 127.0.0.1:44301
`
	if got, err := schedulerAddr(log); err != nil || got != "127.0.0.1:44301" {
		t.Errorf("schedulerAddr = %q, %v", got, err)
	}
	if _, err := schedulerAddr("nothing here\n"); err == nil {
		t.Error("schedulerAddr of a log without the line: no error")
	}
}
