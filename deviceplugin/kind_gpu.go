package deviceplugin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/preferred"
)

// gpuKind is tessera.dev/gpu: whole GPUs, one device per GPU with the GPU's
// UUID as its ID. Preferred sets come from go-gpuallocator on the node's
// topology (package preferred); a GPU serving or assigned to shared units is
// withheld; the container gets its GPUs as deviceListStrategy says.
type gpuKind struct {
	cfg    *api.NodeAgentConfig
	model  *devices.Model
	policy *preferred.GPUPolicy
	list   []devices.Device
}

var (
	_ Kind               = (*gpuKind)(nil)
	_ PreferredAllocator = (*gpuKind)(nil)
	_ Withholder         = (*gpuKind)(nil)
	_ AssignedReader     = (*gpuKind)(nil)
)

func newGPUKind(env kindEnv) *gpuKind {
	return &gpuKind{
		cfg:    env.cfg,
		model:  env.model,
		policy: env.policy,
		list:   env.model.Devices(api.ResourceGPU, nil, devices.Usage{}),
	}
}

func (k *gpuKind) Resource() corev1.ResourceName { return api.ResourceGPU }

func (k *gpuKind) Devices() []devices.Device { return k.list }

func (k *gpuKind) Lookup(id string) (devices.GPU, error) {
	return k.model.Lookup(api.ResourceGPU, id)
}

// Withheld implements Withholder: a GPU that serves shared units, or is
// assigned to a slice of a pod on the node, is not offered whole.
func (k *gpuKind) Withheld(uuid string, u devices.Usage) (bool, string) {
	ok, reason := k.model.DeviceHealth(api.ResourceGPU, uuid, nil, u)
	return !ok, reason
}

// ReadsAssigned implements AssignedReader.
func (k *gpuKind) ReadsAssigned() {}

// Preferred implements PreferredAllocator.
func (k *gpuKind) Preferred(usable, mustInclude []string, size int, _ devices.Usage) ([]string, error) {
	return k.policy.GPUs(usable, mustInclude, size)
}

// Allocate checks every container's GPUs (known, not twice, healthy, not
// shared or assigned, not given to two containers) and answers with them.
func (k *gpuKind) Allocate(containers [][]string, h devices.HealthMap, u devices.Usage) ([]*pluginapi.ContainerAllocateResponse, error) {
	var resps []*pluginapi.ContainerAllocateResponse
	taken := map[string]bool{}
	for _, ids := range containers {
		gpus, err := k.model.CheckWhole(ids, h, u)
		if err != nil {
			return nil, err
		}
		for _, g := range gpus {
			if taken[g.UUID] {
				return nil, fmt.Errorf("GPU %d (%s) is requested for two containers", g.Index, g.UUID)
			}
			taken[g.UUID] = true
		}
		resps = append(resps, wholeResponse(k.cfg, gpus))
	}
	return resps, nil
}
