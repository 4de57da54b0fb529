package extender

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

// The status views as metrics, computed on every scrape (the Grafana
// dashboard charts/tessera/dashboards/tessera.json reads them).
var (
	descGPUs = prometheus.NewDesc("tessera_extender_gpus",
		"GPUs in the extender's ledger by node, model and use (free, whole, shared, mig, unhealthy, whole+shared; mig: in MIG mode, offered as MIG instances only, whether pods hold them or not). free counts the GPUs of cordoned nodes too: see tessera_extender_node_cordoned.",
		[]string{"node", "model", "use"}, nil)
	descCordoned = prometheus.NewDesc("tessera_extender_node_cordoned",
		"1 when the node is cordoned (unschedulable: its free GPUs take no new pod), else 0; one series per node of the ledger.",
		[]string{"node"}, nil)
	descSliceMemory = prometheus.NewDesc("tessera_extender_gpu_slice_memory_used_bytes",
		"GPU memory given to slices (tessera.dev/gpu-memory) by node and model.",
		[]string{"node", "model"}, nil)
	descFragmented = prometheus.NewDesc("tessera_extender_node_fragmented_gpus",
		"The node's fragmentation against the extender's default workload (FGD's measure, allocator.NodeFrag), in GPUs: idle GPU compute the expected shapes cannot use.",
		[]string{"node", "model"}, nil)
	descPending = prometheus.NewDesc("tessera_extender_pending_gpu_pods",
		"GPU pods not bound yet, by whether some node fits them now (fits: true or false).",
		[]string{"fits"}, nil)
	descQueueShare = prometheus.NewDesc("tessera_extender_queue_share",
		"A Queue's share (recent and current use over its entitlement; the smaller goes first).",
		[]string{"queue"}, nil)
	descQueue = func() map[string]*prometheus.Desc {
		out := map[string]*prometheus.Desc{}
		for name, help := range map[string]string{
			"used":       "What the Queue's subtree runs or has planned.",
			"pending":    "What the Queue's subtree waits for.",
			"guaranteed": "The Queue's guarantee.",
			"fair_share": "The Queue's fair share now (hierarchical water-filling).",
			"borrowed":   "Use above the guarantee.",
		} {
			out[name] = prometheus.NewDesc("tessera_extender_queue_"+name, help, []string{"queue", "resource"}, nil)
		}
		return out
	}()
)

// StatusCollector exports the status views as gauges.
type StatusCollector struct {
	Status *Status
	meter  *allocator.FragMeter
}

// Collector returns the views' metrics collector.
func (s *Status) Collector() *StatusCollector {
	m, err := allocator.NewFragMeter(DefaultWorkload())
	if err != nil {
		panic(err) // DefaultWorkload is a constant
	}
	return &StatusCollector{Status: s, meter: m}
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUs, descCordoned, descSliceMemory, descFragmented, descPending, descQueueShare} {
		ch <- d
	}
	for _, d := range descQueue {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	snap, err := c.Status.Take(context.Background())
	if err != nil {
		return
	}
	for _, m := range StatusMetrics(snap, c.meter) {
		ch <- m
	}
}

// StatusMetrics computes the gauges of snap (meter measures
// fragmentation).
func StatusMetrics(snap *Snapshot, meter *allocator.FragMeter) []prometheus.Metric {
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	uses := []string{gpustatus.UseFree, gpustatus.UseWhole, gpustatus.UseShared, gpustatus.UseMIG, gpustatus.UseUnhealthy, gpustatus.UseOvercommitted}
	for _, n := range OccupancyView(snap).Nodes {
		cordoned := 0.0
		if n.Cordoned {
			cordoned = 1
		}
		gauge(descCordoned, cordoned, n.Name)
		type key struct{ model, use string }
		count := map[key]int{}
		mem := map[string]int64{}
		for _, g := range n.GPUs {
			model := gpustatus.ShortModel(g.Model)
			for _, u := range uses { // zeros too: dashboards see 0, not gaps
				count[key{model, u}] += 0
			}
			count[key{model, g.Use()}]++
			mem[model] += g.MemoryUsedMiB
		}
		for k, v := range count {
			gauge(descGPUs, float64(v), n.Name, k.model, k.use)
		}
		for model, v := range mem {
			gauge(descSliceMemory, float64(v)*(1<<20), n.Name, model)
		}
		if st := snap.Nodes[n.Name]; st != nil && st.Info.HasInventory && st.Info.Err == nil && meter != nil {
			gauge(descFragmented, meter.Amount(st.View(allocator.Shared)).Fragmented()/1000, n.Name, gpustatus.ShortModel(st.Info.Model))
		}
	}
	fits := map[bool]int{true: 0, false: 0}
	for _, p := range PendingView(snap, false) {
		fits[p.Fitting > 0]++
	}
	gauge(descPending, float64(fits[true]), "true")
	gauge(descPending, float64(fits[false]), "false")
	for _, q := range QueuesView(snap) {
		gauge(descQueueShare, q.Share, q.Name)
		for name, r := range map[string]quota.Resources{"used": q.Used, "pending": q.Pending, "guaranteed": q.Guaranteed, "fair_share": q.FairShare, "borrowed": q.Borrowed} {
			for res, v := range r {
				gauge(descQueue[name], float64(v), q.Name, string(res))
			}
		}
	}
	return out
}
