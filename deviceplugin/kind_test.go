package deviceplugin

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

func testKinds(t *testing.T, resources ...corev1.ResourceName) (*devices.Model, []Kind) {
	t.Helper()
	cfg := &api.NodeAgentConfig{Resources: resources}
	cfg.Default()
	gpus := []devices.GPU{
		{Index: 0, UUID: "GPU-a", NUMANode: 0, MemoryMiB: 4096},
		{Index: 1, UUID: "GPU-b", NUMANode: -1, MemoryMiB: 8192},
	}
	m, err := devices.New(gpus, devices.Options{Resources: cfg.Resources, MemoryUnitMiB: cfg.MemoryUnitMiB, MemoryReserveMiB: cfg.MemoryReserveMiB})
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := newKinds(kindEnv{cfg: cfg, resources: cfg.Resources, model: m})
	if err != nil {
		t.Fatal(err)
	}
	return m, kinds
}

func TestNewKindsFollowsTheConfiguredResources(t *testing.T) {
	_, kinds := testKinds(t, api.ResourceGPUCore, api.ResourceGPU)
	var got []corev1.ResourceName
	for _, k := range kinds {
		got = append(got, k.Resource())
	}
	if want := []corev1.ResourceName{api.ResourceGPUCore, api.ResourceGPU}; !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	if _, err := newKinds(kindEnv{resources: []corev1.ResourceName{"tessera.dev/gpu-clock"}}); err == nil {
		t.Fatal("newKinds accepted a resource without a kind")
	}
}

func TestKindsTraits(t *testing.T) {
	_, kinds := testKinds(t)
	for _, k := range kinds {
		_, pa := k.(PreferredAllocator)
		_, wh := k.(Withholder)
		_, ar := k.(AssignedReader)
		_, sh := k.(SharedKind)
		whole := k.Resource() == api.ResourceGPU
		if !pa || !wh || ar != (whole || sh) || sh == whole || sh != api.IsSharedResource(k.Resource()) {
			t.Errorf("%s: preferred %v, withholder %v, assigned reader %v, shared %v", k.Resource(), pa, wh, ar, sh)
		}
	}
}

// The kinds' lists equal the device model's for every use of the GPUs.
func TestKindDevicesEqualTheModel(t *testing.T) {
	m, kinds := testKinds(t)
	healths := []devices.HealthMap{nil, {"GPU-b": {Healthy: false, Reason: "XID 79"}}}
	usages := []devices.Usage{
		{},
		{Whole: map[string]bool{"GPU-a": true}},
		{Shared: map[string]bool{"GPU-b": true}},
		{Assigned: map[string]bool{"GPU-a": true}, Shared: map[string]bool{"GPU-a": true}, Whole: map[string]bool{"GPU-b": true}},
	}
	for _, k := range kinds {
		for _, h := range healths {
			for _, u := range usages {
				got, want := kindDevices(k, h, u), m.Devices(k.Resource(), h, u)
				if !slices.Equal(got, want) {
					t.Errorf("%s, health %v, usage %+v: %d devices differ from the model's %d", k.Resource(), h, u, len(got), len(want))
				}
			}
		}
	}
}
