package gpureq

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

func TestUnrecorded(t *testing.T) {
	gpu := func(i int) api.GPURef { return api.GPURef{UUID: "GPU-" + string(rune('0'+i)), Index: i} }
	assign := func(cs ...api.ContainerAssignment) *api.Assignment {
		a := api.NewAssignment()
		a.Containers = cs
		return a
	}
	for _, tc := range []struct {
		name      string
		h         Holds
		a         *api.Assignment
		wantWhole int
		wantMIG   map[string]int
	}{
		{"whole, none recorded", Holds{Whole: 2}, nil, 2, nil},
		{"whole, one recorded", Holds{Whole: 3}, assign(api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{gpu(0)}}), 2, nil},
		{"whole, all recorded", Holds{Whole: 1}, assign(api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{gpu(0)}}), 0, nil},
		{"a slice not recorded holds the GPUs it spans", Holds{SliceGPUs: 2}, nil, 2, nil},
		{"a slice recorded holds no whole GPU", Holds{SliceGPUs: 1}, assign(api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: gpu(1), MemoryMiB: 1024}}), 0, nil},
		{"MIG, one of two recorded", Holds{MIG: map[string]int{"1g.5gb": 2, "3g.20gb": 1}},
			assign(api.ContainerAssignment{Name: "c", MIG: []api.MIGRef{{UUID: "MIG-1", Profile: "1g.5gb", GPU: gpu(0)}}}), 0, map[string]int{"1g.5gb": 1, "3g.20gb": 1}},
		{"nothing", Holds{}, nil, 0, nil},
		// An init container of 2 GPUs before a container of 1: the kubelet
		// hands one of the init container's GPUs on, and the pod holds 2.
		{"an init container's GPUs, one handed on, all recorded", Holds{Whole: 2},
			assign(api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}}, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(1)}}), 0, nil},
		// A GPU named twice counts once: 2 of the pod's 3 are recorded.
		{"a GPU handed on counts once", Holds{Whole: 3},
			assign(api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}}, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(0), gpu(1)}}), 1, nil},
		{"a MIG instance handed on counts once", Holds{MIG: map[string]int{"1g.5gb": 2}},
			assign(api.ContainerAssignment{Name: "init", MIG: []api.MIGRef{{UUID: "MIG-1", Profile: "1g.5gb", GPU: gpu(0)}}}, api.ContainerAssignment{Name: "main", MIG: []api.MIGRef{{UUID: "MIG-1", Profile: "1g.5gb", GPU: gpu(0)}}}), 0, map[string]int{"1g.5gb": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole, mig := Unrecorded(tc.h, tc.a)
			if whole != tc.wantWhole {
				t.Errorf("whole %d, want %d", whole, tc.wantWhole)
			}
			if diff := cmp.Diff(tc.wantMIG, mig); diff != "" {
				t.Errorf("MIG (-want +got):\n%s", diff)
			}
		})
	}
}

// Recorded names each GPU and MIG instance once, in the order first named:
// the kubelet hands a regular init container's devices on to the
// containers after it, and the node agent records them for both.
func TestRecorded(t *testing.T) {
	gpu := func(i int) api.GPURef { return api.GPURef{UUID: "GPU-" + string(rune('0'+i)), Index: i} }
	mig := func(i int) api.MIGRef {
		return api.MIGRef{UUID: "MIG-" + string(rune('0'+i)), Profile: "1g.5gb", GPU: gpu(0)}
	}
	a := api.NewAssignment()
	a.Containers = []api.ContainerAssignment{
		{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}},
		{Name: "main", GPUs: []api.GPURef{gpu(1)}},
		{Name: "side", GPUs: []api.GPURef{gpu(3)}},
		{Name: "x", MIG: []api.MIGRef{mig(1), mig(2)}},
		{Name: "y", MIG: []api.MIGRef{mig(2)}},
	}
	whole, instances := Recorded(a)
	if diff := cmp.Diff([]api.GPURef{gpu(0), gpu(1), gpu(3)}, whole); diff != "" {
		t.Errorf("whole (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]api.MIGRef{mig(1), mig(2)}, instances); diff != "" {
		t.Errorf("MIG (-want +got):\n%s", diff)
	}
	if w, m := Recorded(nil); w != nil || m != nil {
		t.Errorf("Recorded(nil) = %v, %v", w, m)
	}
}
