package kubeletstate_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

// The PodResources API lists no regular init container, yet the kubelet
// keeps its devices allocated to the pod and hands some on to the
// containers after it: s/initw's init container got GPUs 0 and 1, its app
// container reuses GPU 1, and the pod holds both. WithInitContainers adds
// what the checkpoint names for the listed pods' containers PodResources
// names nothing for, and nothing else.
func TestWithInitContainers(t *testing.T) {
	gpu := api.ResourceGPU
	mig := api.MIGResource("1g.5gb")
	listed := []kubeletstate.ContainerDevices{
		{Namespace: "s", Name: "initw", Container: "main", Resource: gpu, DeviceIDs: []string{"GPU-1"}},
		{Namespace: "s", Name: "w2", Container: "c", Resource: gpu, DeviceIDs: []string{"GPU-2", "GPU-3"}},
		{Namespace: "s", Name: "m", Container: "main", Resource: mig, DeviceIDs: []string{"MIG-b"}},
	}
	pods := []kubeletstate.PodRef{{Namespace: "s", Name: "initw"}, {Namespace: "s", Name: "w2"}, {Namespace: "s", Name: "m"}, {Namespace: "s", Name: "nouid"}}
	uids := map[string]string{"s/initw": "uid-initw", "s/w2": "uid-w2", "s/m": "uid-m"}
	checkpoint := []kubeletstate.ContainerDevices{
		{PodUID: "uid-initw", Container: "init", Resource: gpu, DeviceIDs: []string{"GPU-1", "GPU-0"}},
		{PodUID: "uid-initw", Container: "main", Resource: gpu, DeviceIDs: []string{"GPU-1"}},
		{PodUID: "uid-w2", Container: "c", Resource: gpu, DeviceIDs: []string{"GPU-2", "GPU-3"}},
		{PodUID: "uid-m", Container: "init", Resource: mig, DeviceIDs: []string{"MIG-a", "MIG-b"}},
		{PodUID: "uid-m", Container: "main", Resource: mig, DeviceIDs: []string{"MIG-b"}},
		// A pod of the same name that went away, one the kubelet does not
		// list, and a listed pod whose UID the watch does not know.
		{PodUID: "uid-initw-before", Container: "init", Resource: gpu, DeviceIDs: []string{"GPU-3"}},
		{PodUID: "uid-gone", Container: "init", Resource: gpu, DeviceIDs: []string{"GPU-2"}},
		{PodUID: "uid-nouid", Container: "init", Resource: gpu, DeviceIDs: []string{"GPU-0"}},
	}
	in := append([]kubeletstate.ContainerDevices(nil), listed...)
	got := kubeletstate.WithInitContainers(in, pods, checkpoint, func(ns, name string) string { return uids[ns+"/"+name] })
	want := []kubeletstate.ContainerDevices{
		{Namespace: "s", Name: "initw", Container: "init", Resource: gpu, DeviceIDs: []string{"GPU-0", "GPU-1"}},
		{Namespace: "s", Name: "initw", Container: "main", Resource: gpu, DeviceIDs: []string{"GPU-1"}},
		{Namespace: "s", Name: "m", Container: "init", Resource: mig, DeviceIDs: []string{"MIG-a", "MIG-b"}},
		{Namespace: "s", Name: "m", Container: "main", Resource: mig, DeviceIDs: []string{"MIG-b"}},
		{Namespace: "s", Name: "w2", Container: "c", Resource: gpu, DeviceIDs: []string{"GPU-2", "GPU-3"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("WithInitContainers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(listed, in); diff != "" {
		t.Errorf("allocs changed (-was +now):\n%s", diff)
	}
	// Nothing to add: allocs as they are.
	if got := kubeletstate.WithInitContainers(listed, pods, nil, func(string, string) string { return "" }); !cmp.Equal(listed, got) {
		t.Errorf("with no checkpoint: %v", got)
	}
}
