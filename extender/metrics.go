package extender

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the extender's Prometheus metrics, on their own registry.
type Metrics struct {
	latency    *prometheus.HistogramVec
	placements *prometheus.CounterVec
	rejections *prometheus.CounterVec
	errors     *prometheus.CounterVec
}

// NewMetrics registers the extender's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "tessera", Subsystem: "extender", Name: "request_duration_seconds",
			Help:    "Latency of extender verbs.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"verb"}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "extender", Name: "placements_total",
			Help: "Pods bound by the extender, by kind of GPU demand (shared, whole, cpu-only).",
		}, []string{"kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "extender", Name: "rejections_total",
			Help: "Nodes rejected by filter, by reason.",
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "extender", Name: "errors_total",
			Help: "Verb calls answered with an error, by verb.",
		}, []string{"verb"}),
	}
	reg.MustRegister(m.latency, m.placements, m.rejections, m.errors)
	return m
}

func (m *Metrics) observe(verb string, start time.Time) {
	if m != nil {
		m.latency.WithLabelValues(verb).Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) placed(kind string) {
	if m != nil {
		m.placements.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) rejected(r Reason, n int) {
	if m != nil && n > 0 {
		m.rejections.WithLabelValues(string(r)).Add(float64(n))
	}
}

func (m *Metrics) failed(verb string) {
	if m != nil {
		m.errors.WithLabelValues(verb).Inc()
	}
}
