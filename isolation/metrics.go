package isolation

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the isolation metrics. A nil *Metrics records nothing.
type Metrics struct {
	memoryUsed   *prometheus.GaugeVec
	memoryLimit  *prometheus.GaugeVec
	smUtil       *prometheus.GaugeVec
	actions      *prometheus.CounterVec
	unknown      prometheus.Counter
	mpsRestarts  *prometheus.CounterVec
	pollFailures *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	containerLabels := []string{"namespace", "pod", "container", "gpu"}
	m := &Metrics{
		memoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_container_gpu_memory_used_bytes",
			Help: "GPU memory held by a container's processes on a GPU, as NVML reports per process.",
		}, containerLabels),
		memoryLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_container_gpu_memory_limit_bytes",
			Help: "GPU memory limit of a shared container on its GPU.",
		}, containerLabels),
		smUtil: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_container_gpu_sm_utilization_percent",
			Help: "SM utilisation of a container's processes on a GPU over NVML's last sampling window, in percent of the GPU.",
		}, containerLabels),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_watchdog_actions_total",
			Help: "Actions the memory watchdog took on containers over their GPU memory limit, by action and outcome.",
		}, []string{"action", "result"}),
		unknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tessera_watchdog_unknown_processes_total",
			Help: "GPU processes the memory watchdog could not map to a known container (left alone).",
		}),
		mpsRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_mps_daemon_restarts_total",
			Help: "Restarts of a GPU's MPS control daemon after it exited.",
		}, []string{"gpu"}),
		pollFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_watchdog_poll_failures_total",
			Help: "Failed NVML process queries of the memory watchdog, by GPU.",
		}, []string{"gpu"}),
	}
	for _, c := range []prometheus.Collector{m.memoryUsed, m.memoryLimit, m.smUtil, m.actions, m.unknown, m.mpsRestarts, m.pollFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observeMPSRestart(gpu string) {
	if m == nil {
		return
	}
	m.mpsRestarts.WithLabelValues(gpu).Inc()
}
