package api

import (
	"encoding/json"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
)

// AnnotationGPUInventory is the Node annotation in which the node agent
// publishes the node's GPUs for the scheduler extender. Its value is a
// GPUInventory as JSON.
const AnnotationGPUInventory = Domain + "/gpu-inventory"

// ConditionSharedGPUIsolation is the Node condition in which the node agent
// reports whether shared GPU units can be isolated: True when the NRI plugin
// is connected, False (reason ReasonNRINotConnected) while the node refuses
// to allocate tessera.dev/gpu-memory and tessera.dev/gpu-core.
const ConditionSharedGPUIsolation corev1.NodeConditionType = Domain + "/SharedGPUIsolation"

// Reasons of ConditionSharedGPUIsolation.
const (
	ReasonNRIConnected    = "NRIPluginConnected"
	ReasonNRINotConnected = "NRIPluginNotConnected"
)

// Events of GPU health (tessera-node), once per change of a GPU's health.
const (
	// EventGPUUnhealthy: on the Node (Warning) when one of its GPUs turns
	// unhealthy (a critical XID, a failed NVML health check, the GPU off
	// the bus), naming the GPU and why; and on every pod that holds the
	// GPU then (whole, by shared units or by a MIG instance of it).
	EventGPUUnhealthy = "GPUUnhealthy"
	// EventGPUHealthy: on the Node (Normal) when the GPU is healthy again.
	EventGPUHealthy = "GPUHealthy"
)

// KindGPUInventory is the kind of a GPUInventory.
const KindGPUInventory = "GPUInventory"

// GPUInventory is the value of AnnotationGPUInventory: the node's GPUs, how
// they are wired, and their health, as the node agent sees them.
type GPUInventory struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// MemoryUnitMiB is the size of one tessera.dev/gpu-memory device.
	MemoryUnitMiB uint64 `json:"memoryUnitMiB"`
	// MemoryReserveMiB is kept back on every GPU, not advertised.
	MemoryReserveMiB uint64 `json:"memoryReserveMiB,omitempty"`
	// Resources lists the extended resources the node advertises.
	Resources []string `json:"resources"`
	// SharedIsolation is true when the NRI plugin that isolates shared
	// containers is connected; without it the node refuses shared units.
	SharedIsolation bool `json:"sharedIsolation"`
	// DynamicMIG is true when the node agent serves MIG layout requests
	// (tessera-node --dynamic-mig, AnnotationMIGLayoutRequest): the
	// extender asks only such nodes to repartition. Optional (absent: the
	// node serves none).
	DynamicMIG bool `json:"dynamicMIG,omitempty"`
	// GPUs are the node's GPUs by index.
	GPUs []InventoryGPU `json:"gpus"`
	// Links[i][j] is the connection between GPUs[i] and GPUs[j] in the
	// notation of `nvidia-smi topo -m`: X (self), NV<n> (n direct NVLinks),
	// NVS<n> (an NVSwitch fabric, n links into it), BOARD (one board),
	// PIX, PXB, PHB, NODE, SYS (the PCIe path).
	Links [][]string `json:"links"`
	// NVLinkCliques are the maximal sets of GPU indices all NVLink- or
	// NVSwitch-connected to each other, largest first.
	NVLinkCliques [][]int `json:"nvlinkCliques"`
	// WithheldFromWhole are the UUIDs of the GPUs whose tessera.dev/gpu
	// device the node agent withholds from the kubelet (reports
	// unhealthy) because the GPU serves, or is assigned to, shared units;
	// WithheldFromShared those whose memory and core units it withholds
	// because the GPU is allocated whole. A GPU leaves a list only after
	// the kubelet has been sent the device list that offers it again, so
	// the scheduler extender places the other kind on it only once the
	// kubelet can admit it. Both are optional (absent: nothing withheld);
	// the GPUs' own health is in GPUs.
	WithheldFromWhole  []string `json:"withheldFromWhole,omitempty"`
	WithheldFromShared []string `json:"withheldFromShared,omitempty"`
}

// InventoryGPU is one GPU of a GPUInventory.
type InventoryGPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// MemoryUnits is the number of tessera.dev/gpu-memory devices the GPU
	// provides.
	MemoryUnits int `json:"memoryUnits"`
	// NUMANode is -1 when the platform does not report one.
	NUMANode int  `json:"numaNode"`
	Healthy  bool `json:"healthy"`
	// Reason says why an unhealthy GPU is unhealthy, e.g. "XID 79".
	Reason string `json:"reason,omitempty"`
	// MIG is set when the GPU is in MIG mode: it is then offered only as
	// its MIG instances (tessera.dev/mig-<profile>), never whole or as
	// slices (MemoryUnits 0).
	MIG *InventoryMIG `json:"mig,omitempty"`
}

// InventoryMIG is the MIG layout of a GPU of a GPUInventory.
type InventoryMIG struct {
	Instances []InventoryMIGInstance `json:"instances"`
}

// InventoryMIGInstance is one MIG instance of a GPU.
type InventoryMIGInstance struct {
	// UUID is the instance's MIG UUID (its device ID in the kubelet).
	UUID string `json:"uuid"`
	// Profile is its profile, e.g. "1g.5gb": it is a device of the
	// resource MIGResource(Profile).
	Profile string `json:"profile"`
	MIGPlacement
	// Healthy is false when the instance (or its GPU) is unhealthy.
	Healthy bool `json:"healthy"`
}

var linkPattern = regexp.MustCompile(`^(X|NVS?[1-9][0-9]?|BOARD|PIX|PXB|PHB|NODE|SYS)$`)

// Validate checks a GPUInventory and names the first offending field.
func (inv *GPUInventory) Validate() error {
	if inv.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, inv.APIVersion)
	}
	if inv.Kind != KindGPUInventory {
		return fmt.Errorf("kind: must be %q, got %q", KindGPUInventory, inv.Kind)
	}
	if inv.MemoryUnitMiB == 0 {
		return fmt.Errorf("memoryUnitMiB: must be greater than 0")
	}
	for i, r := range inv.Resources {
		if !IsTesseraResource(corev1.ResourceName(r)) {
			return fmt.Errorf("resources[%d]: %q is not a Tessera resource", i, r)
		}
	}
	uuids := map[string]int{}
	for i, g := range inv.GPUs {
		field := fmt.Sprintf("gpus[%d]", i)
		if g.Index < 0 {
			return fmt.Errorf("%s.index: must be 0 or more, got %d", field, g.Index)
		}
		if !uuidPattern.MatchString(g.UUID) {
			return fmt.Errorf("%s.uuid: %q is not a GPU UUID like GPU-<hex>", field, g.UUID)
		}
		if j, dup := uuids[g.UUID]; dup {
			return fmt.Errorf("%s.uuid: %q is also gpus[%d]'s", field, g.UUID, j)
		}
		uuids[g.UUID] = i
		if g.MemoryMiB == 0 {
			return fmt.Errorf("%s.memoryMiB: must be greater than 0", field)
		}
		if g.MemoryUnits < 0 {
			return fmt.Errorf("%s.memoryUnits: must be 0 or more, got %d", field, g.MemoryUnits)
		}
		if g.NUMANode < -1 {
			return fmt.Errorf("%s.numaNode: must be -1 or more, got %d", field, g.NUMANode)
		}
		if g.Healthy && g.Reason != "" {
			return fmt.Errorf("%s.reason: a healthy GPU has no reason, got %q", field, g.Reason)
		}
		if g.MIG != nil {
			if g.MemoryUnits != 0 {
				return fmt.Errorf("%s.memoryUnits: a GPU in MIG mode is not sliced, got %d", field, g.MemoryUnits)
			}
			places := make([]MIGPlacement, 0, len(g.MIG.Instances))
			for k, in := range g.MIG.Instances {
				f := fmt.Sprintf("%s.mig.instances[%d]", field, k)
				if !ValidMIGUUID(in.UUID) {
					return fmt.Errorf("%s.uuid: %q is not a MIG UUID like MIG-<hex>", f, in.UUID)
				}
				if j, dup := uuids[in.UUID]; dup {
					return fmt.Errorf("%s.uuid: %q is also gpus[%d]'s", f, in.UUID, j)
				}
				uuids[in.UUID] = i
				if err := CheckMIGProfile(f+".profile", in.Profile); err != nil {
					return err
				}
				places = append(places, in.MIGPlacement)
			}
			if err := CheckMIGPlacements(field+".mig.instances", places); err != nil {
				return err
			}
		}
	}
	n := len(inv.GPUs)
	if len(inv.Links) != n {
		return fmt.Errorf("links: must have %d rows (one per GPU), got %d", n, len(inv.Links))
	}
	// Every row's length first: the symmetry check reads links[j][i].
	for i, row := range inv.Links {
		if len(row) != n {
			return fmt.Errorf("links[%d]: must have %d columns, got %d", i, n, len(row))
		}
	}
	for i, row := range inv.Links {
		for j, l := range row {
			if !linkPattern.MatchString(l) || (i == j) != (l == "X") {
				return fmt.Errorf("links[%d][%d]: %q is not a link (X on the diagonal only, NV<n>, NVS<n>, BOARD, PIX, PXB, PHB, NODE, SYS)", i, j, l)
			}
			if inv.Links[j][i] != l {
				return fmt.Errorf("links[%d][%d]: must equal links[%d][%d] (%q != %q)", i, j, j, i, l, inv.Links[j][i])
			}
		}
	}
	indices := map[int]bool{}
	for _, g := range inv.GPUs {
		indices[g.Index] = true
	}
	for i, c := range inv.NVLinkCliques {
		for k, idx := range c {
			if !indices[idx] {
				return fmt.Errorf("nvlinkCliques[%d][%d]: %d is not the index of one of gpus", i, k, idx)
			}
		}
	}
	for _, l := range []struct {
		field string
		uuids []string
	}{{"withheldFromWhole", inv.WithheldFromWhole}, {"withheldFromShared", inv.WithheldFromShared}} {
		seen := map[string]int{}
		for i, u := range l.uuids {
			if _, ok := uuids[u]; !ok {
				return fmt.Errorf("%s[%d]: %q is not the UUID of one of gpus", l.field, i, u)
			}
			if j, dup := seen[u]; dup {
				return fmt.Errorf("%s[%d]: %q is also %s[%d]", l.field, i, u, l.field, j)
			}
			seen[u] = i
		}
	}
	return nil
}

// ParseGPUInventory decodes and validates an AnnotationGPUInventory value.
// Unknown fields are errors.
func ParseGPUInventory(value string) (*GPUInventory, error) {
	var inv GPUInventory
	if err := decodeStrict(value, &inv); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationGPUInventory, err)
	}
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationGPUInventory, err)
	}
	return &inv, nil
}

// GetGPUInventory returns the GPUInventory in annotations; ok is false when
// there is none. A value that is present but malformed is an error.
func GetGPUInventory(annotations map[string]string) (inv *GPUInventory, ok bool, err error) {
	value, ok := annotations[AnnotationGPUInventory]
	if !ok {
		return nil, false, nil
	}
	inv, err = ParseGPUInventory(value)
	if err != nil {
		return nil, true, err
	}
	return inv, true, nil
}

// EncodeGPUInventory validates inv and returns it as an annotation value.
func EncodeGPUInventory(inv *GPUInventory) (string, error) {
	if err := inv.Validate(); err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationGPUInventory, err)
	}
	b, err := json.Marshal(inv)
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationGPUInventory, err)
	}
	return string(b), nil
}

// SetGPUInventory validates inv and stores it in annotations, which must not
// be nil. On error annotations is left unchanged.
func SetGPUInventory(annotations map[string]string, inv *GPUInventory) error {
	value, err := EncodeGPUInventory(inv)
	if err != nil {
		return err
	}
	annotations[AnnotationGPUInventory] = value
	return nil
}
