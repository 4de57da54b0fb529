package deviceplugin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/preferred"
)

// unitKind is what the shared kinds (kind_memory.go, kind_core.go) have in
// common: devices that are units of a GPU, withheld while the GPU is
// allocated whole, packed onto few GPUs when preferred, checked against the
// request rules of package gpureq (through devices.Model.CheckShared) and
// answered with no GPU at all: the NRI plugin injects the assigned one.
type unitKind struct {
	resource corev1.ResourceName
	model    *devices.Model
	list     []devices.Device
}

var (
	_ Kind               = (*unitKind)(nil)
	_ PreferredAllocator = (*unitKind)(nil)
	_ Withholder         = (*unitKind)(nil)
	_ SharedKind         = (*unitKind)(nil)
	_ AssignedReader     = (*unitKind)(nil)
)

func newUnitKind(r corev1.ResourceName, env kindEnv) unitKind {
	return unitKind{resource: r, model: env.model, list: env.model.Devices(r, nil, devices.Usage{})}
}

func (k *unitKind) Resource() corev1.ResourceName { return k.resource }

func (k *unitKind) Devices() []devices.Device { return k.list }

func (k *unitKind) Lookup(id string) (devices.GPU, error) {
	return k.model.Lookup(k.resource, id)
}

// Withheld implements Withholder: the units of a GPU allocated whole are
// withheld.
func (k *unitKind) Withheld(uuid string, u devices.Usage) (bool, string) {
	ok, reason := k.model.DeviceHealth(k.resource, uuid, nil, u)
	return !ok, reason
}

// SharesGPU implements SharedKind.
func (k *unitKind) SharesGPU() {}

// Preferred implements PreferredAllocator: units of the GPU(s) of the
// slice the kubelet is admitting first, when the agent could tell which
// (u.Admitting, preferred.UnitsOn: a multi-GPU slice's units spread evenly
// over its GPUs), then those of the GPUs assigned to slices of pods the
// kubelet has not started (the slice being admitted is one of them), then of the GPUs assigned to other slices,
// then of those already shared, packed onto few GPUs, best fit within
// each. The kubelet counts a slice's units on the GPUs their IDs name, and
// the agent withholds a GPU whose units are allocated from whole use:
// units of a GPU no slice is assigned to would withhold it for a slice
// that runs elsewhere, and units put beside a running slice (the better
// fit) would withhold that GPU after the running slice ends. A GPU shared
// but not assigned is most often one whose slice has just ended (the agent
// has not read the kubelet's allocations since).
func (k *unitKind) Preferred(usable, mustInclude []string, size int, u devices.Usage) ([]string, error) {
	rank := make(map[string]int, len(u.Shared)+len(u.Assigned))
	for level, m := range []map[string]bool{u.Shared, u.Assigned, u.Unstarted} {
		for uuid, ok := range m {
			if ok {
				rank[uuid] = level + 1
			}
		}
	}
	if len(u.Admitting) > 0 {
		return preferred.UnitsOn(k.resource, usable, mustInclude, size, u.Admitting, rank)
	}
	return preferred.Units(k.resource, usable, mustInclude, size, rank)
}

// ReadsAssigned implements AssignedReader: Preferred takes units of the
// assigned GPUs first, those of a slice bound a moment ago included.
func (k *unitKind) ReadsAssigned() {}

// Allocate checks every container's units (the request rules, known, not
// twice, usable) and answers with no GPU.
func (k *unitKind) Allocate(containers [][]string, h devices.HealthMap, u devices.Usage) ([]*pluginapi.ContainerAllocateResponse, error) {
	var resps []*pluginapi.ContainerAllocateResponse
	for _, ids := range containers {
		if err := k.model.CheckShared(k.resource, ids); err != nil {
			return nil, err
		}
		for _, id := range ids {
			g, _ := k.model.Lookup(k.resource, id)
			if ok, reason := usable(k, g.UUID, h, u); !ok {
				return nil, fmt.Errorf("%s device %s of GPU %d is not usable: %s", k.resource, id, g.Index, reason)
			}
		}
		resps = append(resps, sharedResponse())
	}
	return resps, nil
}
