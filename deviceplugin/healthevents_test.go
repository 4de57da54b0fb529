package deviceplugin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/health"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

func TestHealthEvents(t *testing.T) {
	gpus := []health.GPU{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1"}, {Index: 2, UUID: "GPU-2"}}
	sick := func(reason string) devices.Health { return devices.Health{Reason: reason} }
	well := devices.Health{Healthy: true}
	a := podHold{Namespace: "ns", Name: "a", UID: "uid-a"}
	b := podHold{Namespace: "ns", Name: "slice-b", UID: "uid-b"}
	c := podHold{Namespace: "other", Name: "slice-c"}
	nodeWarn := func(idx, uuid, reason string) healthEvent {
		return healthEvent{Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy, Message: "GPU " + idx + " (" + uuid + ") is unhealthy: " + reason + "; its devices are withheld until it is healthy again"}
	}
	podWarn := func(p podHold, idx, uuid, reason string) healthEvent {
		return healthEvent{Pod: &p, Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy, Message: "GPU " + idx + " (" + uuid + ") on node n1, which this pod uses, is unhealthy: " + reason}
	}
	nodeNormal := func(idx, uuid, was string) healthEvent {
		return healthEvent{Type: corev1.EventTypeNormal, Reason: api.EventGPUHealthy, Message: "GPU " + idx + " (" + uuid + ") is healthy again (it was unhealthy: " + was + ")"}
	}
	tests := []struct {
		name       string
		prev, next devices.HealthMap
		holders    map[string][]podHold
		want       []healthEvent
	}{
		{
			name: "healthy to unhealthy, no pod holds it",
			prev: devices.HealthMap{"GPU-0": well, "GPU-1": well, "GPU-2": well},
			next: devices.HealthMap{"GPU-0": well, "GPU-1": sick("XID 79"), "GPU-2": well},
			want: []healthEvent{nodeWarn("1", "GPU-1", "XID 79")},
		},
		{
			name:    "healthy to unhealthy: the Node and every pod that holds it, whole or a slice",
			prev:    devices.HealthMap{"GPU-0": well, "GPU-1": well},
			next:    devices.HealthMap{"GPU-0": well, "GPU-1": sick("GPU lost (fell off the bus)")},
			holders: map[string][]podHold{"GPU-1": {a, b, c}, "GPU-0": {{Namespace: "ns", Name: "elsewhere"}}},
			want: []healthEvent{
				nodeWarn("1", "GPU-1", "GPU lost (fell off the bus)"),
				podWarn(a, "1", "GPU-1", "GPU lost (fell off the bus)"),
				podWarn(b, "1", "GPU-1", "GPU lost (fell off the bus)"),
				podWarn(c, "1", "GPU-1", "GPU lost (fell off the bus)"),
			},
		},
		{
			name:    "unhealthy to healthy: the Node only",
			prev:    devices.HealthMap{"GPU-1": sick("XID 48")},
			next:    devices.HealthMap{"GPU-1": well},
			holders: map[string][]podHold{"GPU-1": {a}},
			want:    []healthEvent{nodeNormal("1", "GPU-1", "XID 48")},
		},
		{
			name:    "unchanged: none",
			prev:    devices.HealthMap{"GPU-0": well, "GPU-1": sick("XID 79")},
			next:    devices.HealthMap{"GPU-0": well, "GPU-1": sick("XID 79")},
			holders: map[string][]podHold{"GPU-1": {a}, "GPU-0": {b}},
		},
		{
			name:    "a new reason while unhealthy: none",
			prev:    devices.HealthMap{"GPU-1": sick("XID 79")},
			next:    devices.HealthMap{"GPU-1": sick("GPU lost (fell off the bus)")},
			holders: map[string][]podHold{"GPU-1": {a}},
		},
		{
			name: "a GPU gone from the map is healthy, as the device lists count it",
			prev: devices.HealthMap{"GPU-0": sick("XID 79"), "GPU-1": well},
			next: devices.HealthMap{"GPU-1": well},
			want: []healthEvent{nodeNormal("0", "GPU-0", "XID 79")},
		},
		{
			name:    "a GPU new in the map, unhealthy",
			prev:    devices.HealthMap{},
			next:    devices.HealthMap{"GPU-2": sick("XID 79")},
			holders: map[string][]podHold{"GPU-2": {c}},
			want:    []healthEvent{nodeWarn("2", "GPU-2", "XID 79"), podWarn(c, "2", "GPU-2", "XID 79")},
		},
		{
			name: "nil maps: every GPU healthy",
		},
		{
			name: "a GPU that is not watched: none",
			prev: devices.HealthMap{"GPU-9": well},
			next: devices.HealthMap{"GPU-9": sick("XID 79")},
		},
		{
			name:    "an XID without a GPU: every GPU, in index order, a pod on two of them once for each",
			prev:    devices.HealthMap{"GPU-0": well, "GPU-1": well, "GPU-2": sick("XID 48")},
			next:    devices.HealthMap{"GPU-0": sick("XID 79"), "GPU-1": sick("XID 79"), "GPU-2": sick("XID 79")},
			holders: map[string][]podHold{"GPU-0": {a}, "GPU-1": {a, b}, "GPU-2": {c}},
			want: []healthEvent{
				nodeWarn("0", "GPU-0", "XID 79"),
				podWarn(a, "0", "GPU-0", "XID 79"),
				nodeWarn("1", "GPU-1", "XID 79"),
				podWarn(a, "1", "GPU-1", "XID 79"),
				podWarn(b, "1", "GPU-1", "XID 79"),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := healthEvents("n1", gpus, tc.prev, tc.next, tc.holders)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("healthEvents (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHealthEventObject(t *testing.T) {
	p := podHold{Namespace: "ns", Name: "a", UID: "uid-a"}
	if diff := cmp.Diff(&corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: "a", UID: "uid-a"}, healthEvent{Pod: &p}.object("n1")); diff != "" {
		t.Errorf("pod Event's object (-want +got):\n%s", diff)
	}
	// The kubelet's Node Events carry the node's name as its UID; kubectl
	// describe node lists those.
	if diff := cmp.Diff(&corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "n1", UID: "n1"}, healthEvent{}.object("n1")); diff != "" {
		t.Errorf("Node Event's object (-want +got):\n%s", diff)
	}
}

func TestPodsOn(t *testing.T) {
	gpus := []devices.GPU{
		{Index: 0, UUID: "GPU-0", MemoryMiB: 40960},
		{Index: 1, UUID: "GPU-1", MemoryMiB: 40960},
		{Index: 2, UUID: "GPU-2", MemoryMiB: 40960},
		{Index: 3, UUID: "GPU-3", MemoryMiB: 40960, MIGMode: true, MIG: []devices.MIGInstance{
			{UUID: migID(3, 0), Profile: "1g.5gb", Start: 0, Size: 1},
			{UUID: migID(3, 1), Profile: "1g.5gb", Start: 1, Size: 1},
		}},
	}
	cfg := api.NewNodeAgentConfig()
	resources, _ := ServedResources(cfg, gpus)
	m, err := devices.New(gpus, devices.Options{Resources: resources, MemoryUnitMiB: cfg.MemoryUnitMiB})
	if err != nil {
		t.Fatal(err)
	}
	mem := func(uuid string, n ...int) []string {
		var ids []string
		for _, i := range n {
			ids = append(ids, devices.DeviceID(api.ResourceGPUMemory, uuid, i))
		}
		return ids
	}
	core := func(uuid string, n ...int) []string {
		var ids []string
		for _, i := range n {
			ids = append(ids, devices.DeviceID(api.ResourceGPUCore, uuid, i))
		}
		return ids
	}
	allocs := []kubeletstate.ContainerDevices{
		// Whole GPU 0, two containers: the pod once.
		{Namespace: "ns", Name: "whole", Container: "a", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-0"}},
		{Namespace: "ns", Name: "whole", Container: "b", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-0"}},
		// Slices of GPU 1: memory and cores in one container (once), and
		// one whose unit IDs name GPU 0 (nominal) but is placed on GPU 1.
		{Namespace: "ns", Name: "slice-a", Container: "c", Resource: api.ResourceGPUMemory, DeviceIDs: mem("GPU-1", 0, 1)},
		{Namespace: "ns", Name: "slice-a", Container: "c", Resource: api.ResourceGPUCore, DeviceIDs: core("GPU-1", 0)},
		{Namespace: "ns", Name: "slice-b", Container: "c", Resource: api.ResourceGPUMemory, DeviceIDs: mem("GPU-0", 5)},
		// A multi-GPU slice placed on GPUs 1 and 2; its UID from the
		// allocation itself.
		{Namespace: "team", Name: "wide", PodUID: "uid-wide", Container: "c", Resource: api.ResourceGPUCore, DeviceIDs: core("GPU-1", 7, 8)},
		// A MIG instance of GPU 3.
		{Namespace: "ns", Name: "mig", Container: "c", Resource: mig1g, DeviceIDs: []string{migID(3, 1)}},
		// Not counted: the checkpoint's nameless record, a resource that
		// is not Tessera's, a device this node lacks.
		{PodUID: "uid-nameless", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-2"}},
		{Namespace: "ns", Name: "foreign", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-2"}},
		{Namespace: "ns", Name: "ghost", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-9"}},
	}
	placements := map[kubeletstate.ContainerKey]string{
		{Namespace: "ns", Name: "slice-b", Container: "c"}: "GPU-1",
		{Namespace: "team", Name: "wide", Container: "c"}:  "GPU-1,GPU-2",
	}
	uids := map[string]types.UID{"ns/whole": "uid-whole", "ns/slice-a": "uid-a", "team/wide": "from-the-watch"}
	uid := func(namespace, name string) types.UID { return uids[namespace+"/"+name] }
	want := map[string][]podHold{
		"GPU-0": {{Namespace: "ns", Name: "whole", UID: "uid-whole"}},
		"GPU-1": {
			{Namespace: "ns", Name: "slice-a", UID: "uid-a"},
			{Namespace: "ns", Name: "slice-b"},
			{Namespace: "team", Name: "wide", UID: "uid-wide"},
		},
		"GPU-2": {{Namespace: "team", Name: "wide", UID: "uid-wide"}},
		"GPU-3": {{Namespace: "ns", Name: "mig"}},
	}
	if diff := cmp.Diff(want, podsOn(m, allocs, placements, uid)); diff != "" {
		t.Errorf("podsOn (-want +got):\n%s", diff)
	}
	// Without placements, a slice counts on the GPU its unit IDs name;
	// without a watch, pods have the allocation's UID or none.
	want = map[string][]podHold{
		"GPU-0": {{Namespace: "ns", Name: "slice-b"}, {Namespace: "ns", Name: "whole"}},
		"GPU-1": {{Namespace: "ns", Name: "slice-a"}, {Namespace: "team", Name: "wide", UID: "uid-wide"}},
		"GPU-3": {{Namespace: "ns", Name: "mig"}},
	}
	if diff := cmp.Diff(want, podsOn(m, allocs, nil, nil)); diff != "" {
		t.Errorf("podsOn without placements (-want +got):\n%s", diff)
	}
}
