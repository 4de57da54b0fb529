package deviceplugin

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/gpu"
)

// Device states in the devices metric.
const (
	stateHealthy   = "healthy"
	stateUnhealthy = "unhealthy"
	stateWithheld  = "withheld"
)

// Metrics are the node agent's Prometheus metrics. Each Metrics registers
// with the registry it is given; there are no global collectors.
type Metrics struct {
	devices       *prometheus.GaugeVec
	gpuHealthy    *prometheus.GaugeVec
	allocations   *prometheus.CounterVec
	preferred     *prometheus.CounterVec
	xids          *prometheus.CounterVec
	registrations *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "devices",
			Help: "Devices advertised to the kubelet by resource and state: healthy, unhealthy (the GPU is) or withheld (reported unhealthy because whole and shared use of one GPU exclude each other).",
		}, []string{"resource", "state"}),
		gpuHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "gpu_healthy",
			Help: "1 when the GPU is healthy, 0 when not.",
		}, []string{"gpu", "uuid"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "allocations_total",
			Help: "Allocate calls from the kubelet by resource and result (success or error).",
		}, []string{"resource", "result"}),
		preferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "preferred_allocations_total",
			Help: "GetPreferredAllocation calls from the kubelet by resource and result (success or error).",
		}, []string{"resource", "result"}),
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "xid_events_total",
			Help: "XID errors seen, by GPU index (-1: not said), XID and whether they were ignored.",
		}, []string{"gpu", "xid", "ignored"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "kubelet_registrations_total",
			Help: "Registrations with the kubelet by resource and result (success or error).",
		}, []string{"resource", "result"}),
	}
	for _, c := range []prometheus.Collector{m.devices, m.gpuHealthy, m.allocations, m.preferred, m.xids, m.registrations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}

func (m *Metrics) observeAllocate(r corev1.ResourceName, err error) {
	if m != nil {
		m.allocations.WithLabelValues(string(r), result(err)).Inc()
	}
}

func (m *Metrics) observePreferred(r corev1.ResourceName, err error) {
	if m != nil {
		m.preferred.WithLabelValues(string(r), result(err)).Inc()
	}
}

func (m *Metrics) observeRegistration(r corev1.ResourceName, err error) {
	if m != nil {
		m.registrations.WithLabelValues(string(r), result(err)).Inc()
	}
}

func (m *Metrics) observeXID(ev gpu.XIDEvent, ignored bool) {
	if m != nil {
		m.xids.WithLabelValues(strconv.Itoa(ev.Index), strconv.FormatUint(ev.XID, 10), strconv.FormatBool(ignored)).Inc()
	}
}

// setDevices records the device states of resource r.
func (m *Metrics) setDevices(r corev1.ResourceName, ds []devices.Device, health devices.HealthMap) {
	if m == nil {
		return
	}
	counts := map[string]float64{stateHealthy: 0, stateUnhealthy: 0, stateWithheld: 0}
	for _, d := range ds {
		switch {
		case d.Healthy:
			counts[stateHealthy]++
		case health.Of(d.GPU).Healthy:
			counts[stateWithheld]++
		default:
			counts[stateUnhealthy]++
		}
	}
	for state, n := range counts {
		m.devices.WithLabelValues(string(r), state).Set(n)
	}
}

func (m *Metrics) setGPUHealth(gpus []devices.GPU, health devices.HealthMap) {
	if m == nil {
		return
	}
	for _, g := range gpus {
		v := 0.0
		if health.Of(g.UUID).Healthy {
			v = 1
		}
		m.gpuHealthy.WithLabelValues(strconv.Itoa(g.Index), g.UUID).Set(v)
	}
}
