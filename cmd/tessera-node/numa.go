package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/deviceplugin/numareport"
	"github.com/tessera-gpu/tessera/topology"
)

// numaFlags configure the NUMA report (docs/numa.md).
type numaFlags struct {
	kubeletConfig    string
	topologyPolicy   string
	topologyScope    string
	cpuManagerPolicy string
	period           time.Duration
}

func (f *numaFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeletConfig, "kubelet-config", numareport.DefaultKubeletConfig, "the kubelet's configuration file, for its topology manager policy and scope and CPU manager policy (a missing file: the kubelet's defaults); the three flags below override it")
	fs.StringVar(&f.topologyPolicy, "topology-manager-policy", "", "the kubelet's --topology-manager-policy (none, best-effort, restricted, single-numa-node), when not in --kubelet-config")
	fs.StringVar(&f.topologyScope, "topology-manager-scope", "", "the kubelet's --topology-manager-scope (container, pod), when not in --kubelet-config")
	fs.StringVar(&f.cpuManagerPolicy, "cpu-manager-policy", "", "the kubelet's --cpu-manager-policy (none, static), when not in --kubelet-config")
	fs.DurationVar(&f.period, "numa-report-period", 2*time.Second, "how often the node's exclusive CPUs per NUMA node are read from the kubelet and published in the "+api.AnnotationNUMATopology+" annotation; 0 turns the report off")
}

// numaReporter builds the reporter of the node's NUMA layout, or nil when
// the report is off.
func numaReporter(ctx context.Context, f *numaFlags, cpuManagerState string, podResources *kubeletstate.PodResources, topo *topology.Topology, pub numareport.Publisher) (*numareport.Reporter, error) {
	if f.period <= 0 {
		return nil, nil
	}
	cfg, found, err := numareport.LoadKubeletConfig(f.kubeletConfig)
	if err != nil {
		return nil, err
	}
	for _, o := range []struct {
		flag, value string
		dst         *string
	}{
		{"topology-manager-policy", f.topologyPolicy, &cfg.TopologyManagerPolicy},
		{"topology-manager-scope", f.topologyScope, &cfg.TopologyManagerScope},
		{"cpu-manager-policy", f.cpuManagerPolicy, &cfg.CPUManagerPolicy},
	} {
		if o.value != "" {
			*o.dst = o.value
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("NUMA report: %w", err)
	}
	all := cpuset.New()
	for _, n := range topo.NUMANodes {
		s, err := cpuset.Parse(n.CPUs)
		if err != nil {
			return nil, fmt.Errorf("NUMA node %d: %w", n.ID, err)
		}
		all = all.Union(s)
	}
	klog.FromContext(ctx).Info("Reporting exclusive CPUs per NUMA node", "kubeletConfig", f.kubeletConfig, "found", found,
		"topologyManagerPolicy", cfg.TopologyManagerPolicy, "topologyManagerScope", cfg.TopologyManagerScope, "cpuManagerPolicy", cfg.CPUManagerPolicy, "numaNodes", len(topo.NUMANodes))
	return &numareport.Reporter{
		Config:    cfg,
		NUMANodes: topo.NUMANodes,
		Reader: numareport.First{
			&numareport.PodResources{PodResources: *podResources},
			&numareport.Checkpoint{Path: cpuManagerState, All: all, Config: cfg},
		},
		Publisher: pub,
		Period:    f.period,
	}, nil
}
