package deviceplugin

import (
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// The inventory's withheld lists: a withholding is published at once; a
// release only once the device list that offers the GPU again has been
// sent to the kubelet (for shared units, every shared resource's list);
// everything until a list was first sent (after each registration with a
// kubelet), and everything once the agent stops.
func TestInventoryViewReleasesOnlyAfterTheListWasSent(t *testing.T) {
	m, kinds := testKinds(t, api.ResourceGPU, api.ResourceGPUMemory, api.ResourceGPUCore)
	s := newState(klog.Background(), m, kinds, time.Hour, time.Now, nil)
	changes := 0
	s.onChange = func() { changes++ }
	want := func(what string, whole, shared []string) {
		t.Helper()
		_, w, sh := s.inventoryView()
		if !slices.Equal(w, whole) || !slices.Equal(sh, shared) {
			t.Errorf("%s: withheld from whole %v, from shared %v; want %v, %v", what, w, sh, whole, shared)
		}
	}
	send := func(r ...string) {
		for _, k := range kinds {
			if slices.Contains(r, string(k.Resource())) {
				list, _ := s.devices(k.Resource())
				s.markSent(k.Resource(), list, 1)
			}
		}
	}
	all := []string{"GPU-a", "GPU-b"}
	// Until a resource's first list was sent, the kubelet offers none of
	// its devices: every GPU is withheld from that kind.
	want("start, nothing sent", all, all)
	send(string(api.ResourceGPU))
	want("whole GPUs sent", nil, all)
	send(string(api.ResourceGPUMemory), string(api.ResourceGPUCore))
	want("every list sent", nil, nil)

	// A slice assigned to GPU-a: withheld from whole use, published before
	// the kubelet was sent the list.
	s.setAssigned(map[string]bool{"GPU-a": true})
	want("assigned, not sent yet", []string{"GPU-a"}, nil)
	if changes == 0 {
		t.Error("a changed device list did not call onChange")
	}
	send(string(api.ResourceGPU))
	s.setAssigned(map[string]bool{})
	want("released, the kubelet still has the old list", []string{"GPU-a"}, nil)
	before := changes
	send(string(api.ResourceGPU))
	if changes == before {
		t.Error("a sent list did not call onChange")
	}
	want("released and sent", nil, nil)

	// GPU-b allocated whole: its units are withheld until both shared
	// resources' lists offering them again were sent.
	s.setKubelet([]devices.Allocation{{Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-b"}}})
	want("allocated whole", nil, []string{"GPU-b"})
	send(string(api.ResourceGPUMemory), string(api.ResourceGPUCore))
	s.setKubelet(nil)
	want("freed by the kubelet, nothing sent", nil, []string{"GPU-b"})
	send(string(api.ResourceGPUMemory))
	want("memory units sent, cores not", nil, []string{"GPU-b"})
	send(string(api.ResourceGPUCore))
	want("both sent", nil, nil)

	// An unhealthy GPU is the inventory's health, not a withholding.
	s.setHealth(devices.HealthMap{"GPU-a": {Healthy: false, Reason: "XID 79"}})
	send(string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore))
	want("unhealthy", nil, nil)

	// The kubelet restarted: withheld until the lists are sent again (the
	// unhealthy GPU is not listed).
	s.clearSent()
	want("kubelet restarted", []string{"GPU-b"}, []string{"GPU-b"})
	send(string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore))
	want("sent again", nil, nil)

	// The agent stops: everything withheld, whatever is sent.
	s.stop()
	send(string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore))
	want("stopping", []string{"GPU-b"}, []string{"GPU-b"})
}
