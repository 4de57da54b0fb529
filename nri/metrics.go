package nri

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the NRI plugin's metrics. A nil *Metrics records nothing.
type Metrics struct {
	connected prometheus.Gauge
	decisions *prometheus.CounterVec
	ledger    prometheus.Gauge
}

// Decision outcomes, the values of the "result" label.
const (
	ResultIsolated = "isolated" // a container with Tessera resources was adjusted
	ResultRefused  = "refused"  // its creation was refused
)

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tessera_nri_connected",
			Help: "1 while the NRI plugin is connected to the container runtime and receives its events, else 0.",
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_nri_container_decisions_total",
			Help: "CreateContainer decisions on containers with Tessera resources, by result (isolated, refused).",
		}, []string{"result"}),
		ledger: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tessera_nri_ledger_containers",
			Help: "Containers in the node's GPU ledger.",
		}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.decisions, m.ledger} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) setConnected(c bool) {
	if m == nil {
		return
	}
	v := 0.0
	if c {
		v = 1
	}
	m.connected.Set(v)
}

func (m *Metrics) observeDecision(result string) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(result).Inc()
}

func (m *Metrics) setLedger(n int) {
	if m == nil {
		return
	}
	m.ledger.Set(float64(n))
}
