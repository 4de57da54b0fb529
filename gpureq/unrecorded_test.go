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
