package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// latencyMetric is the extender's per-verb latency histogram
// (extender/metrics.go).
const latencyMetric = "tessera_extender_request_duration_seconds"

// placementsMetric counts the pods the extender bound, labelled kind
// (extender/metrics.go).
const placementsMetric = "tessera_extender_placements_total"

// kube-scheduler's histograms (pkg/scheduler/metrics): the scheduling
// algorithm (filter and score, extender calls included) and the whole
// attempt (algorithm and binding), per pod.
const (
	schedulerAlgorithmMetric = "scheduler_scheduling_algorithm_duration_seconds"
	schedulerAttemptMetric   = "scheduler_scheduling_attempt_duration_seconds"
	// schedulerExtensionPointMetric: the time of each extension point of
	// the framework (its plugins), per call, labelled extension_point.
	schedulerExtensionPointMetric = "scheduler_framework_extension_point_duration_seconds"
)

// histogram is one label set's cumulative buckets, as exposed.
type histogram struct {
	buckets []bucket // sorted by upper bound, +Inf last
	count   float64
	sum     float64
}

type bucket struct {
	le    float64
	count float64 // cumulative
}

// quantile estimates the q-quantile like Prometheus' histogram_quantile:
// linear interpolation inside the bucket that holds it. A quantile that
// falls in the +Inf bucket returns the largest finite bound.
func (h *histogram) quantile(q float64) float64 {
	if h.count == 0 || len(h.buckets) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for _, b := range h.buckets {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			in := b.count - below
			if in <= 0 {
				return b.le
			}
			return lower + (b.le-lower)*(rank-below)/in
		}
		lower, below = b.le, b.count
	}
	return lower
}

// add adds n to the cumulative count of the bucket with upper bound le.
func (h *histogram) add(le, n float64) {
	for i := range h.buckets {
		if h.buckets[i].le == le {
			h.buckets[i].count += n
			return
		}
	}
	h.buckets = append(h.buckets, bucket{le: le, count: n})
}

func (h *histogram) mean() float64 {
	if h.count == 0 {
		return math.NaN()
	}
	return h.sum / h.count
}

// parseHistograms reads the Prometheus text exposition in r and returns
// the histograms of metric name, keyed by the value of label key. Series
// that differ only in other labels (kube-scheduler's profile, say) are
// added up.
func parseHistograms(r io.Reader, name, key string) (map[string]*histogram, error) {
	out := map[string]*histogram{}
	get := func(k string) *histogram {
		h := out[k]
		if h == nil {
			h = &histogram{}
			out[k] = h
		}
		return h
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		metric, labelText, _ := strings.Cut(series, "{")
		labels, err := parseLabels(strings.TrimSuffix(labelText, "}"))
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		h := get(labels[key])
		switch strings.TrimPrefix(metric, name) {
		case "_bucket":
			le, err := strconv.ParseFloat(labels["le"], 64)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: le: %w", line, err)
			}
			h.add(le, v)
		case "_count":
			h.count += v
		case "_sum":
			h.sum += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	for _, h := range out {
		sort.Slice(h.buckets, func(i, j int) bool { return h.buckets[i].le < h.buckets[j].le })
	}
	return out, nil
}

// parseLabels parses `a="x",b="y"` (values without escaped quotes, which
// is all the extender's labels need).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, `="`)
		if !ok {
			return nil, fmt.Errorf("bad labels %q", s)
		}
		v, rest, ok := strings.Cut(rest, `"`)
		if !ok {
			return nil, fmt.Errorf("bad labels %q", s)
		}
		out[k] = v
		s = strings.TrimPrefix(rest, ",")
	}
	return out, nil
}

// parseCounters reads the Prometheus text exposition in r and returns the
// values of counter name, keyed by the value of label key.
func parseCounters(r io.Reader, name, key string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		labels, err := parseLabels(strings.TrimSuffix(strings.TrimPrefix(series, name+"{"), "}"))
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[labels[key]] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}
