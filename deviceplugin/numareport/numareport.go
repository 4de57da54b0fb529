// Package numareport builds the node's NUMA report (api.NUMATopology): per
// NUMA node, the CPUs (and memory) the kubelet may give a container
// exclusively and which pods hold them, with the kubelet's topology manager
// policy and scope. The node agent publishes it on the Node so that the
// scheduler extender places a pod only where its GPUs and exclusive CPUs can
// meet on one NUMA node (docs/numa.md).
//
// What is held comes from the kubelet's own record: its PodResources API
// (GetAllocatableResources and List), or where that cannot be reached the CPU
// manager's checkpoint. The policies come from the kubelet's configuration
// file, flags overriding it.
package numareport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/cpuset"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/topology"
)

// DefaultKubeletConfig is where kubeadm writes the kubelet's configuration.
const DefaultKubeletConfig = "/var/lib/kubelet/config.yaml"

// DefaultCPUManagerState is the kubelet's CPU manager checkpoint.
const DefaultCPUManagerState = "/var/lib/kubelet/cpu_manager_state"

// KubeletConfig is what the report needs of the kubelet's configuration.
type KubeletConfig struct {
	TopologyManagerPolicy string
	TopologyManagerScope  string
	CPUManagerPolicy      string
	// Reserved are the CPUs the kubelet keeps from exclusive use
	// (reservedSystemCPUs); ReservedCount how many when only a quantity is
	// configured (kubeReserved + systemReserved cpu, rounded up). Only the
	// checkpoint fallback needs them.
	Reserved      cpuset.CPUSet
	ReservedCount int
}

// kubeletConfigFile is the part of a KubeletConfiguration read here.
type kubeletConfigFile struct {
	Kind                  string            `json:"kind"`
	TopologyManagerPolicy string            `json:"topologyManagerPolicy"`
	TopologyManagerScope  string            `json:"topologyManagerScope"`
	CPUManagerPolicy      string            `json:"cpuManagerPolicy"`
	ReservedSystemCPUs    string            `json:"reservedSystemCPUs"`
	KubeReserved          map[string]string `json:"kubeReserved"`
	SystemReserved        map[string]string `json:"systemReserved"`
}

// LoadKubeletConfig reads a KubeletConfiguration file. A missing file gives
// the kubelet's defaults (policy none, scope container, CPU manager none)
// and found false; a malformed one is an error.
func LoadKubeletConfig(path string) (cfg KubeletConfig, found bool, err error) {
	cfg = KubeletConfig{TopologyManagerPolicy: api.TopologyPolicyNone, TopologyManagerScope: api.TopologyScopeContainer, CPUManagerPolicy: api.CPUManagerPolicyNone}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, false, nil
	}
	if err != nil {
		return cfg, false, fmt.Errorf("reading the kubelet configuration: %w", err)
	}
	var f kubeletConfigFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		return cfg, true, fmt.Errorf("kubelet configuration %s: %w", path, err)
	}
	if f.Kind != "" && f.Kind != "KubeletConfiguration" {
		return cfg, true, fmt.Errorf("kubelet configuration %s: kind %q, want KubeletConfiguration", path, f.Kind)
	}
	if f.TopologyManagerPolicy != "" {
		cfg.TopologyManagerPolicy = f.TopologyManagerPolicy
	}
	if f.TopologyManagerScope != "" {
		cfg.TopologyManagerScope = f.TopologyManagerScope
	}
	if f.CPUManagerPolicy != "" {
		cfg.CPUManagerPolicy = f.CPUManagerPolicy
	}
	if f.ReservedSystemCPUs != "" {
		if cfg.Reserved, err = cpuset.Parse(f.ReservedSystemCPUs); err != nil {
			return cfg, true, fmt.Errorf("kubelet configuration %s: reservedSystemCPUs: %w", path, err)
		}
	}
	var milli int64
	for _, m := range []map[string]string{f.KubeReserved, f.SystemReserved} {
		if v, ok := m["cpu"]; ok {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return cfg, true, fmt.Errorf("kubelet configuration %s: reserved cpu %q: %w", path, v, err)
			}
			milli += q.MilliValue()
		}
	}
	cfg.ReservedCount = int(math.Ceil(float64(milli) / 1000))
	return cfg, true, cfg.Validate()
}

// Validate checks the policies.
func (c KubeletConfig) Validate() error {
	switch c.TopologyManagerPolicy {
	case api.TopologyPolicyNone, api.TopologyPolicyBestEffort, api.TopologyPolicyRestricted, api.TopologyPolicySingleNUMANode:
	default:
		return fmt.Errorf("topology manager policy %q: want none, best-effort, restricted or single-numa-node", c.TopologyManagerPolicy)
	}
	switch c.TopologyManagerScope {
	case api.TopologyScopeContainer, api.TopologyScopePod:
	default:
		return fmt.Errorf("topology manager scope %q: want container or pod", c.TopologyManagerScope)
	}
	switch c.CPUManagerPolicy {
	case api.CPUManagerPolicyNone, api.CPUManagerPolicyStatic:
	default:
		return fmt.Errorf("CPU manager policy %q: want none or static", c.CPUManagerPolicy)
	}
	return nil
}

// PodHold is what one pod holds exclusively.
type PodHold struct {
	// Namespace and Name (PodResources) or UID (checkpoint) name the pod.
	Namespace, Name, UID string
	CPUs                 cpuset.CPUSet
	// MemMiB is pinned memory per NUMA node.
	MemMiB map[int]int64
}

// Snapshot is what the kubelet says of its exclusive CPUs and memory.
type Snapshot struct {
	// Source is api.NUMASourcePodResources or api.NUMASourceCPUManagerState.
	Source string
	// Allocatable are the CPUs the kubelet may give exclusively.
	Allocatable cpuset.CPUSet
	// MemMiB is the memory the memory manager may pin, per NUMA node (nil
	// when it pins none).
	MemMiB map[int]int64
	Pods   []PodHold
	// CPUManagerPolicy is the policy the source reports ("" when it does
	// not say).
	CPUManagerPolicy string
}

// Reader reads a Snapshot.
type Reader interface {
	Read(ctx context.Context) (Snapshot, error)
	// Name says where from, for logs.
	Name() string
}

// Build is the report for a node with numaNodes under cfg, from snap. A CPU
// in no NUMA node of numaNodes is left out.
func Build(cfg KubeletConfig, numaNodes []topology.NUMANode, snap Snapshot) (*api.NUMATopology, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &api.NUMATopology{
		APIVersion: api.Version, Kind: api.KindNUMATopology,
		TopologyManagerPolicy: cfg.TopologyManagerPolicy, TopologyManagerScope: cfg.TopologyManagerScope,
		CPUManagerPolicy: cfg.CPUManagerPolicy, Source: snap.Source,
	}
	if snap.CPUManagerPolicy != "" {
		t.CPUManagerPolicy = snap.CPUManagerPolicy
	}
	zoneCPUs := make(map[int]cpuset.CPUSet, len(numaNodes))
	for _, n := range numaNodes {
		cpus, err := cpuset.Parse(n.CPUs)
		if err != nil {
			return nil, fmt.Errorf("NUMA node %d: CPU list %q: %w", n.ID, n.CPUs, err)
		}
		zoneCPUs[n.ID] = cpus
		mem := snap.MemMiB[n.ID]
		t.Zones = append(t.Zones, api.NUMAZone{ID: n.ID, CPUs: cpus.Intersection(snap.Allocatable).Size(), MemoryMiB: mem})
	}
	sort.Slice(t.Zones, func(i, j int) bool { return t.Zones[i].ID < t.Zones[j].ID })
	used, usedMem := map[int]int{}, map[int]int64{}
	for _, p := range snap.Pods {
		u := api.NUMAPodUse{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
		if u.UID != "" {
			u.Namespace, u.Name = "", ""
		}
		for _, z := range t.Zones {
			// Only allocatable CPUs count: the zone's CPUs are those.
			n := p.CPUs.Intersection(zoneCPUs[z.ID]).Intersection(snap.Allocatable).Size()
			m := int64(0)
			if z.MemoryMiB > 0 {
				m = p.MemMiB[z.ID]
			}
			if n > 0 || m > 0 {
				u.Zones = append(u.Zones, api.NUMAZoneUse{ID: z.ID, CPUs: n, MemoryMiB: m})
				used[z.ID] += n
				usedMem[z.ID] += m
			}
		}
		if len(u.Zones) > 0 {
			t.Pods = append(t.Pods, u)
		}
	}
	sort.Slice(t.Pods, func(i, j int) bool { return t.Pods[i].Key() < t.Pods[j].Key() })
	for i := range t.Zones {
		z := &t.Zones[i]
		if used[z.ID] > z.CPUs || usedMem[z.ID] > z.MemoryMiB && z.MemoryMiB > 0 {
			return nil, fmt.Errorf("NUMA node %d: pods hold %d CPUs and %d MiB, more than its %d CPUs and %d MiB", z.ID, used[z.ID], usedMem[z.ID], z.CPUs, z.MemoryMiB)
		}
		z.FreeCPUs = z.CPUs - used[z.ID]
		if z.MemoryMiB > 0 {
			z.FreeMemoryMiB = z.MemoryMiB - usedMem[z.ID]
		}
	}
	return t, t.Validate()
}

// PodResources reads the kubelet's PodResources API.
type PodResources struct {
	kubeletstate.PodResources
}

var _ Reader = (*PodResources)(nil)

// Read implements Reader: GetAllocatableResources, then List.
func (p *PodResources) Read(ctx context.Context) (Snapshot, error) {
	snap := Snapshot{Source: api.NUMASourcePodResources}
	ctx, cancel := p.Deadline(ctx)
	defer cancel()
	client, done, err := p.Connect()
	if err != nil {
		return snap, err
	}
	defer done()
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return snap, fmt.Errorf("allocatable resources at %s: %w", p.Socket, err)
	}
	snap.Allocatable = cpusOf(alloc.GetCpuIds())
	snap.MemMiB = memoryOf(alloc.GetMemory())
	list, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return snap, fmt.Errorf("listing pod resources at %s: %w", p.Socket, err)
	}
	for _, pod := range list.GetPodResources() {
		h := PodHold{Namespace: pod.GetNamespace(), Name: pod.GetName(), CPUs: cpuset.New()}
		for _, c := range pod.GetContainers() {
			h.CPUs = h.CPUs.Union(cpusOf(c.GetCpuIds()))
			for id, m := range memoryOf(c.GetMemory()) {
				if h.MemMiB == nil {
					h.MemMiB = map[int]int64{}
				}
				h.MemMiB[id] += m
			}
		}
		if h.CPUs.Size() > 0 || len(h.MemMiB) > 0 {
			snap.Pods = append(snap.Pods, h)
		}
	}
	return snap, nil
}

func cpusOf(ids []int64) cpuset.CPUSet {
	out := make([]int, 0, len(ids))
	for _, id := range ids {
		out = append(out, int(id))
	}
	return cpuset.New(out...)
}

// memoryOf sums regular memory (not hugepages) per NUMA node, in MiB; a
// block spread over several NUMA nodes is split evenly.
func memoryOf(blocks []*podresourcesapi.ContainerMemory) map[int]int64 {
	var out map[int]int64
	for _, b := range blocks {
		nodes := b.GetTopology().GetNodes()
		if b.GetMemoryType() != "memory" || len(nodes) == 0 {
			continue
		}
		if out == nil {
			out = map[int]int64{}
		}
		per := int64(b.GetSize()>>20) / int64(len(nodes))
		for _, n := range nodes {
			out[int(n.GetID())] += per
		}
	}
	return out
}

// Checkpoint reads the CPU manager's checkpoint file. It names pods by UID
// and does not say which CPUs are reserved: those are Config.Reserved, or
// else the Config.ReservedCount lowest-numbered CPUs (where the static
// policy usually takes them).
type Checkpoint struct {
	Path string
	// All are the node's CPUs.
	All    cpuset.CPUSet
	Config KubeletConfig
}

var _ Reader = (*Checkpoint)(nil)

// Name implements Reader.
func (c *Checkpoint) Name() string { return "CPU manager checkpoint " + c.Path }

type cpuManagerCheckpoint struct {
	PolicyName    string                       `json:"policyName"`
	DefaultCPUSet string                       `json:"defaultCpuSet"`
	Entries       map[string]map[string]string `json:"entries,omitempty"`
	Checksum      uint64                       `json:"checksum"`
}

// Read implements Reader.
func (c *Checkpoint) Read(context.Context) (Snapshot, error) {
	snap := Snapshot{Source: api.NUMASourceCPUManagerState}
	b, err := os.ReadFile(c.Path)
	if err != nil {
		return snap, fmt.Errorf("reading the kubelet's CPU manager state: %w", err)
	}
	var cp cpuManagerCheckpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return snap, fmt.Errorf("kubelet CPU manager state %s: %w", c.Path, err)
	}
	snap.CPUManagerPolicy = cp.PolicyName
	if cp.PolicyName != api.CPUManagerPolicyStatic {
		snap.Allocatable = cpuset.New()
		return snap, nil
	}
	reserved := c.Config.Reserved
	if reserved.Size() == 0 && c.Config.ReservedCount > 0 {
		reserved = cpuset.New(c.All.List()[:min(c.Config.ReservedCount, c.All.Size())]...)
	}
	snap.Allocatable = c.All.Difference(reserved)
	uids := make([]string, 0, len(cp.Entries))
	for uid := range cp.Entries {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	for _, uid := range uids {
		h := PodHold{UID: uid, CPUs: cpuset.New()}
		for ctr, v := range cp.Entries[uid] {
			s, err := cpuset.Parse(v)
			if err != nil {
				return snap, fmt.Errorf("kubelet CPU manager state %s: pod %s container %s: %w", c.Path, uid, ctr, err)
			}
			h.CPUs = h.CPUs.Union(s)
		}
		if h.CPUs.Size() > 0 {
			snap.Pods = append(snap.Pods, h)
		}
	}
	return snap, nil
}

// First reads from the first Reader that answers.
type First []Reader

var _ Reader = First(nil)

// Name implements Reader.
func (f First) Name() string {
	if len(f) == 0 {
		return "nothing"
	}
	return f[0].Name()
}

// Read implements Reader.
func (f First) Read(ctx context.Context) (Snapshot, error) {
	var errs []error
	for _, r := range f {
		s, err := r.Read(ctx)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", r.Name(), err))
	}
	return Snapshot{}, errors.Join(errs...)
}

// Publisher writes the report.
type Publisher interface {
	PublishNUMATopology(ctx context.Context, t *api.NUMATopology) error
}

// Reporter publishes the report every Period until its context ends.
type Reporter struct {
	Config    KubeletConfig
	NUMANodes []topology.NUMANode
	Reader    Reader
	Publisher Publisher
	// Period between reads; 2s when zero.
	Period time.Duration
}

// Once reads, builds and publishes the report once.
func (r *Reporter) Once(ctx context.Context) error {
	snap, err := r.Reader.Read(ctx)
	if err != nil {
		return fmt.Errorf("reading the kubelet's exclusive CPUs: %w", err)
	}
	t, err := Build(r.Config, r.NUMANodes, snap)
	if err != nil {
		return fmt.Errorf("building the NUMA report: %w", err)
	}
	return r.Publisher.PublishNUMATopology(ctx, t)
}

// Run calls Once every Period until ctx ends, logging failures (the last
// report stays on the Node meanwhile; the extender then still counts the
// pods it placed since as held).
func (r *Reporter) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	period := r.Period
	if period <= 0 {
		period = 2 * time.Second
	}
	t := time.NewTicker(period)
	defer t.Stop()
	var failing bool
	for {
		if err := r.Once(ctx); err != nil {
			if !failing {
				logger.Error(err, "NUMA report not published")
			}
			failing = true
		} else if failing {
			logger.Info("NUMA report published again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
