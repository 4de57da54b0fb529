package extender

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// Metrics are the extender's Prometheus metrics, on their own registry.
type Metrics struct {
	latency    *prometheus.HistogramVec
	placements *prometheus.CounterVec
	rejections *prometheus.CounterVec
	errors     *prometheus.CounterVec
	evictions  *prometheus.CounterVec
	blocked    *prometheus.CounterVec
	leftOut    prometheus.Counter
	// Tessera's priority preemption (Preemptor).
	preemptions *prometheus.CounterVec
	preemptOut  *prometheus.CounterVec
	// Queue reclaim evictions by outcome (planner.QueueReclaimer).
	reclaimOutcome *prometheus.CounterVec
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
	m.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "quota_reclaim_evictions_total",
		Help: "Pods evicted by reclaim, ElasticQuota's or a Queue's, by the namespace they were taken from (queue reclaim's results: reclaim_evictions_total).",
	}, []string{"namespace"})
	m.blocked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "quota_reclaim_blocked_total",
		Help: "Workloads chosen by reclaim, ElasticQuota's or a Queue's, whose eviction a PodDisruptionBudget refused, by namespace.",
	}, []string{"namespace"})
	m.leftOut = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "filter_left_out_total",
		Help: "Fitting nodes that filter did not pass because --filter-shortlist others scored better.",
	})
	m.preemptions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "preemption_evictions_total",
		Help: "Pods evicted by Tessera's priority preemption, by the namespace they were taken from.",
	}, []string{"namespace"})
	m.preemptOut = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "preemptions_unused_total",
		Help: "Preemptions whose room was not used: blocked (a PodDisruptionBudget refused a chosen victim; another choice is made) and useless (the room was held for a pod that did not bind there before the hold expired).",
	}, []string{"outcome"})
	m.reclaimOutcome = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "reclaim_evictions_total",
		Help: "Pods evicted by queue reclaim, by result: useful (a pod the room was reclaimed for got a GPU the evicted workload freed) or useless (none did within the reclaim hold, or they all started elsewhere); counted once the result is known.",
	}, []string{"result"})
	for _, r := range []string{"useful", "useless"} {
		m.reclaimOutcome.WithLabelValues(r) // exported as 0 before the first
	}
	reg.MustRegister(m.latency, m.placements, m.rejections, m.errors, m.evictions, m.blocked, m.leftOut, m.preemptions, m.preemptOut, m.reclaimOutcome)
	return m
}

// Observe records the latency of a call of verb begun at start.
func (m *Metrics) Observe(verb string, start time.Time) {
	if m != nil {
		m.latency.WithLabelValues(verb).Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) shortlisted(n int) {
	if m != nil && n > 0 {
		m.leftOut.Add(float64(n))
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

// Failed counts a call of verb that failed.
func (m *Metrics) Failed(verb string) {
	if m != nil {
		m.errors.WithLabelValues(verb).Inc()
	}
}

// ReclaimEvicted counts a pod of namespace ns evicted by reclaim.
func (m *Metrics) ReclaimEvicted(ns string) {
	if m != nil {
		m.evictions.WithLabelValues(ns).Inc()
	}
}

func (m *Metrics) preempted(ns string) {
	if m != nil {
		m.preemptions.WithLabelValues(ns).Inc()
	}
}

func (m *Metrics) preemptionBlocked() {
	if m != nil {
		m.preemptOut.WithLabelValues("blocked").Inc()
	}
}

func (m *Metrics) preemptionUseless() {
	if m != nil {
		m.preemptOut.WithLabelValues("useless").Inc()
	}
}

// ReclaimSettled counts n pods evicted by queue reclaim whose result is
// known: useful when the pods they were evicted for got a GPU they freed.
func (m *Metrics) ReclaimSettled(useful bool, n int) {
	if m != nil && n > 0 {
		result := "useless"
		if useful {
			result = "useful"
		}
		m.reclaimOutcome.WithLabelValues(result).Add(float64(n))
	}
}

// ReclaimBlocked counts a workload of namespace ns whose eviction a
// budget refused.
func (m *Metrics) ReclaimBlocked(ns string) {
	if m != nil {
		m.blocked.WithLabelValues(ns).Inc()
	}
}

// QuotaCollector exports, on every scrape, each governed namespace's
// quota per resource: tessera_extender_quota_{used,min,max,borrowed,lent}
// {namespace,resource}. State is built afresh from the informers.
type QuotaCollector struct {
	// State returns the current quota state.
	State func() (*quota.State, error)
}

var quotaDescs = func() map[string]*prometheus.Desc {
	out := map[string]*prometheus.Desc{}
	for name, help := range map[string]string{
		"used":     "What the namespace's running and planned pods use.",
		"min":      "The namespace's ElasticQuota min (guaranteed).",
		"max":      "The namespace's ElasticQuota max (absent: uncapped).",
		"borrowed": "Use above min.",
		"lent":     "Min left unused, which other namespaces may borrow.",
	} {
		out[name] = prometheus.NewDesc("tessera_extender_quota_"+name, help, []string{"namespace", "resource"}, nil)
	}
	return out
}()

// Describe implements prometheus.Collector.
func (c *QuotaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range quotaDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *QuotaCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.State()
	if err != nil || st == nil {
		return
	}
	emit := func(name, ns string, r quota.Resources) {
		for res, v := range r {
			ch <- prometheus.MustNewConstMetric(quotaDescs[name], prometheus.GaugeValue, float64(v), ns, string(res))
		}
	}
	for _, rep := range st.Reports() {
		q := st.Quotas[rep.Namespace]
		// Every resource the quota names gets used, borrowed and lent,
		// zero included, so that dashboards see zeros, not gaps.
		zero := quota.Resources{}
		for k := range q.Min {
			zero[k] = 0
		}
		for k := range q.Max {
			zero[k] = 0
		}
		emit("used", rep.Namespace, zero.Add(rep.Used))
		emit("borrowed", rep.Namespace, zero.Add(rep.Borrowed))
		emit("lent", rep.Namespace, zero.Add(rep.Lent))
		emit("min", rep.Namespace, q.Min)
		emit("max", rep.Namespace, q.Max)
	}
}
