package deviceplugin

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/preferred"
)

// Kind manages the devices of one advertised resource: one kind of GPU
// device. The plugin servers, the state and the agent reach a resource only
// through Kind and the optional interfaces below (discovered by type
// assertion); what is particular to a kind lives in its own file
// (kind_gpu.go, kind_memory.go, kind_core.go) and in newKinds, which builds
// the kinds the configuration's resources name. docs/deviceplugin.md
// ("Adding a device kind") says what a new kind adds.
type Kind interface {
	// Resource is the extended resource the kind is registered as.
	Resource() corev1.ResourceName
	// Devices lists the kind's devices in a stable order (GPU index, then
	// unit), all healthy: the agent sets each device's health from its
	// GPU's health and, for a Withholder, from what is in use. The list
	// is the kind's own; callers copy it before changing it.
	Devices() []devices.Device
	// Lookup returns the GPU of one of the kind's devices, or an error
	// when this node has no such device.
	Lookup(id string) (devices.GPU, error)
	// Allocate checks the containers of one Allocate request together
	// (all or none) against the GPUs' health and use, and answers each
	// container. The agent records the containers' devices as in use
	// when it succeeds.
	Allocate(containers [][]string, h devices.HealthMap, u devices.Usage) ([]*pluginapi.ContainerAllocateResponse, error)
}

// PreferredAllocator is a Kind that answers GetPreferredAllocation; the
// plugin of a kind without it tells the kubelet it has no preference.
type PreferredAllocator interface {
	Kind
	// Preferred picks size devices among usable (the available devices
	// usable now, and those of mustInclude), keeping mustInclude.
	Preferred(usable, mustInclude []string, size int, u devices.Usage) ([]string, error)
}

// Withholder is a Kind whose devices of a healthy GPU are withheld
// (reported unhealthy to the kubelet, refused at allocation) while the
// GPU is in another use.
type Withholder interface {
	Kind
	// Withheld says whether the kind's devices of the GPU with the given
	// UUID are withheld under u, and why.
	Withheld(uuid string, u devices.Usage) (bool, string)
}

// AssignedReader is a Kind whose choices depend on the GPUs assigned to
// slices of the node's pods, including pods the watch has not shown yet
// (whole GPUs avoid them, units are taken from them first): before its
// GetPreferredAllocation and Allocate the agent reads those GPUs from the
// API server (bounded by assignedReadTimeout) into Usage.Assigned.
type AssignedReader interface {
	Kind
	ReadsAssigned()
}

// SharedKind is a Kind of units that containers share a GPU by: its
// Allocate is refused until the NRI plugin that isolates them is connected
// (fail closed), and the GPU a container's units are served from is the
// shared GPU of its assignment when the pod has one.
type SharedKind interface {
	Kind
	SharesGPU()
}

// kindEnv is what the factory gives the kinds.
type kindEnv struct {
	cfg *api.NodeAgentConfig
	// resources are the served resources (ServedResources), in order.
	resources []corev1.ResourceName
	model     *devices.Model
	policy    *preferred.GPUPolicy
}

// newKinds builds the kinds of the configuration's resources, in its
// order. This and the kind files are the only places that know the
// resources apart.
func newKinds(env kindEnv) ([]Kind, error) {
	var kinds []Kind
	for _, r := range env.resources {
		var k Kind
		switch {
		case r == api.ResourceGPU:
			k = newGPUKind(env)
		case r == api.ResourceGPUMemory:
			k = newMemoryKind(env)
		case r == api.ResourceGPUCore:
			k = newCoreKind(env)
		case api.IsMIGResource(r):
			k = newMIGKind(r, env)
		default:
			return nil, fmt.Errorf("resource %q has no device kind", r)
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// usable is the health of kind k's devices of the GPU with the given UUID:
// the GPU's own, then whether k withholds them.
func usable(k Kind, uuid string, h devices.HealthMap, u devices.Usage) (bool, string) {
	if s := h.Of(uuid); !s.Healthy {
		return false, s.Reason
	}
	if w, ok := k.(Withholder); ok {
		if withheld, reason := w.Withheld(uuid, u); withheld {
			return false, reason
		}
	}
	return true, ""
}

// kindDevices is kind k's device list with the health the kubelet is to
// see.
func kindDevices(k Kind, h devices.HealthMap, u devices.Usage) []devices.Device {
	list := k.Devices()
	if len(list) == 0 {
		return nil
	}
	out := make([]devices.Device, len(list))
	type verdict struct {
		ok     bool
		reason string
	}
	byGPU := map[string]verdict{}
	for i, d := range list {
		v, seen := byGPU[d.GPU]
		if !seen {
			v.ok, v.reason = usable(k, d.GPU, h, u)
			byGPU[d.GPU] = v
		}
		d.Healthy, d.Reason = v.ok, v.reason
		out[i] = d
	}
	return out
}

// sortedIDs is a container's device IDs as the agent records them.
func sortedIDs(ids []string) []string { return slices.Sorted(slices.Values(ids)) }
