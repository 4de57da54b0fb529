package api

import (
	"encoding/json"
	"fmt"
)

// AnnotationNUMATopology is the Node annotation in which the node agent
// publishes, per NUMA node, the CPUs (and memory) the kubelet can give
// exclusively and which pods hold them, with the kubelet's topology manager
// policy and scope. The scheduler extender reads it to place a pod only where
// its GPUs and exclusive CPUs can be aligned (docs/numa.md). Its value is a
// NUMATopology as JSON. It is separate from AnnotationGPUInventory: it
// changes with every exclusive-CPU pod, the GPU inventory rarely.
const AnnotationNUMATopology = Domain + "/numa-topology"

// KindNUMATopology is the kind of a NUMATopology.
const KindNUMATopology = "NUMATopology"

// The kubelet's topology manager policies (--topology-manager-policy).
const (
	TopologyPolicyNone           = "none"
	TopologyPolicyBestEffort     = "best-effort"
	TopologyPolicyRestricted     = "restricted"
	TopologyPolicySingleNUMANode = "single-numa-node"
)

// The kubelet's topology manager scopes (--topology-manager-scope).
const (
	TopologyScopeContainer = "container"
	TopologyScopePod       = "pod"
)

// The kubelet's CPU manager policies (--cpu-manager-policy).
const (
	CPUManagerPolicyNone   = "none"
	CPUManagerPolicyStatic = "static"
)

// Where a NUMATopology's CPU figures come from.
const (
	// NUMASourcePodResources: the kubelet's PodResources API
	// (GetAllocatableResources and List).
	NUMASourcePodResources = "podresources"
	// NUMASourceCPUManagerState: the CPU manager's checkpoint file, when
	// the PodResources API cannot be reached.
	NUMASourceCPUManagerState = "cpu-manager-state"
)

// NUMATopology is the value of AnnotationNUMATopology.
type NUMATopology struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// TopologyManagerPolicy and TopologyManagerScope are the kubelet's.
	TopologyManagerPolicy string `json:"topologyManagerPolicy"`
	TopologyManagerScope  string `json:"topologyManagerScope"`
	// CPUManagerPolicy is the kubelet's; with "none" no container gets
	// exclusive CPUs.
	CPUManagerPolicy string `json:"cpuManagerPolicy"`
	// Source says where the CPU figures come from (NUMASource...).
	Source string `json:"source"`
	// Zones are the NUMA nodes, by ID.
	Zones []NUMAZone `json:"zones"`
	// Pods are the pods holding exclusive CPUs (or pinned memory).
	Pods []NUMAPodUse `json:"pods,omitempty"`
}

// NUMAZone is one NUMA node of a NUMATopology.
type NUMAZone struct {
	ID int `json:"id"`
	// CPUs is how many of the zone's CPUs the kubelet may give a container
	// exclusively (its allocatable CPUs: reserved CPUs left out).
	CPUs int `json:"cpus"`
	// FreeCPUs is CPUs less those the listed pods hold.
	FreeCPUs int `json:"freeCPUs"`
	// MemoryMiB and FreeMemoryMiB are the memory the kubelet's memory
	// manager may pin to the zone and what is not pinned; both 0 when the
	// kubelet reports no memory (memory manager policy None).
	MemoryMiB     int64 `json:"memoryMiB,omitempty"`
	FreeMemoryMiB int64 `json:"freeMemoryMiB,omitempty"`
}

// NUMAPodUse is what one pod holds exclusively, per zone. A pod is named by
// namespace and name (the PodResources API) or by UID (the checkpoint).
type NUMAPodUse struct {
	Namespace string        `json:"namespace,omitempty"`
	Name      string        `json:"name,omitempty"`
	UID       string        `json:"uid,omitempty"`
	Zones     []NUMAZoneUse `json:"zones"`
}

// Key is namespace/name, or the UID for a pod named by UID.
func (p NUMAPodUse) Key() string {
	if p.UID != "" {
		return p.UID
	}
	return p.Namespace + "/" + p.Name
}

// NUMAZoneUse is what a pod holds of one zone.
type NUMAZoneUse struct {
	ID        int   `json:"id"`
	CPUs      int   `json:"cpus"`
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
}

// Zone returns the zone with id, or nil.
func (t *NUMATopology) Zone(id int) *NUMAZone {
	for i := range t.Zones {
		if t.Zones[i].ID == id {
			return &t.Zones[i]
		}
	}
	return nil
}

// Validate checks a NUMATopology and names the first offending field. The
// free figures must equal the zone's less what the listed pods hold: an
// inconsistent value is refused, not half believed.
func (t *NUMATopology) Validate() error {
	if t.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, t.APIVersion)
	}
	if t.Kind != KindNUMATopology {
		return fmt.Errorf("kind: must be %q, got %q", KindNUMATopology, t.Kind)
	}
	switch t.TopologyManagerPolicy {
	case TopologyPolicyNone, TopologyPolicyBestEffort, TopologyPolicyRestricted, TopologyPolicySingleNUMANode:
	default:
		return fmt.Errorf("topologyManagerPolicy: must be one of none, best-effort, restricted, single-numa-node, got %q", t.TopologyManagerPolicy)
	}
	switch t.TopologyManagerScope {
	case TopologyScopeContainer, TopologyScopePod:
	default:
		return fmt.Errorf("topologyManagerScope: must be container or pod, got %q", t.TopologyManagerScope)
	}
	switch t.CPUManagerPolicy {
	case CPUManagerPolicyNone, CPUManagerPolicyStatic:
	default:
		return fmt.Errorf("cpuManagerPolicy: must be none or static, got %q", t.CPUManagerPolicy)
	}
	switch t.Source {
	case NUMASourcePodResources, NUMASourceCPUManagerState:
	default:
		return fmt.Errorf("source: must be %s or %s, got %q", NUMASourcePodResources, NUMASourceCPUManagerState, t.Source)
	}
	seen := map[int]int{}
	for i, z := range t.Zones {
		field := fmt.Sprintf("zones[%d]", i)
		if z.ID < 0 {
			return fmt.Errorf("%s.id: must be 0 or more, got %d", field, z.ID)
		}
		if j, dup := seen[z.ID]; dup {
			return fmt.Errorf("%s.id: %d is also zones[%d]'s", field, z.ID, j)
		}
		seen[z.ID] = i
		if z.CPUs < 0 || z.FreeCPUs < 0 || z.FreeCPUs > z.CPUs {
			return fmt.Errorf("%s: freeCPUs %d outside [0, cpus %d]", field, z.FreeCPUs, z.CPUs)
		}
		if z.MemoryMiB < 0 || z.FreeMemoryMiB < 0 || z.FreeMemoryMiB > z.MemoryMiB {
			return fmt.Errorf("%s: freeMemoryMiB %d outside [0, memoryMiB %d]", field, z.FreeMemoryMiB, z.MemoryMiB)
		}
	}
	usedCPUs, usedMem := map[int]int{}, map[int]int64{}
	pods := map[string]int{}
	for i, p := range t.Pods {
		field := fmt.Sprintf("pods[%d]", i)
		if (p.UID == "") == (p.Namespace == "" || p.Name == "") {
			return fmt.Errorf("%s: name a pod by namespace and name or by uid, not both or neither", field)
		}
		if j, dup := pods[p.Key()]; dup {
			return fmt.Errorf("%s: %s is also pods[%d]", field, p.Key(), j)
		}
		pods[p.Key()] = i
		for k, u := range p.Zones {
			if _, ok := seen[u.ID]; !ok {
				return fmt.Errorf("%s.zones[%d].id: %d is not one of zones", field, k, u.ID)
			}
			if u.CPUs < 0 || u.MemoryMiB < 0 {
				return fmt.Errorf("%s.zones[%d]: negative use", field, k)
			}
			usedCPUs[u.ID] += u.CPUs
			usedMem[u.ID] += u.MemoryMiB
		}
	}
	for i, z := range t.Zones {
		if z.CPUs-usedCPUs[z.ID] != z.FreeCPUs {
			return fmt.Errorf("zones[%d].freeCPUs: %d, but cpus %d less the pods' %d is %d", i, z.FreeCPUs, z.CPUs, usedCPUs[z.ID], z.CPUs-usedCPUs[z.ID])
		}
		if z.MemoryMiB > 0 && z.MemoryMiB-usedMem[z.ID] != z.FreeMemoryMiB {
			return fmt.Errorf("zones[%d].freeMemoryMiB: %d, but memoryMiB %d less the pods' %d is %d", i, z.FreeMemoryMiB, z.MemoryMiB, usedMem[z.ID], z.MemoryMiB-usedMem[z.ID])
		}
	}
	return nil
}

// ParseNUMATopology decodes and validates an AnnotationNUMATopology value.
// Unknown fields are errors.
func ParseNUMATopology(value string) (*NUMATopology, error) {
	var t NUMATopology
	if err := decodeStrict(value, &t); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationNUMATopology, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationNUMATopology, err)
	}
	return &t, nil
}

// GetNUMATopology returns the NUMATopology in annotations; ok is false when
// there is none. A value that is present but malformed is an error.
func GetNUMATopology(annotations map[string]string) (t *NUMATopology, ok bool, err error) {
	value, ok := annotations[AnnotationNUMATopology]
	if !ok {
		return nil, false, nil
	}
	t, err = ParseNUMATopology(value)
	return t, true, err
}

// EncodeNUMATopology validates t and returns it as an annotation value.
func EncodeNUMATopology(t *NUMATopology) (string, error) {
	if err := t.Validate(); err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationNUMATopology, err)
	}
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationNUMATopology, err)
	}
	return string(b), nil
}
