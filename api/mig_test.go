package api_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

func TestMIGNames(t *testing.T) {
	for _, tc := range []struct {
		name    corev1.ResourceName
		profile string
		ok      bool
	}{
		{"tessera.dev/mig-1g.5gb", "1g.5gb", true},
		{"tessera.dev/mig-3g.40gb", "3g.40gb", true},
		{"tessera.dev/mig-7g.80gb", "7g.80gb", true},
		{"tessera.dev/mig-1g.5gb+me", "", false},
		{"tessera.dev/mig-", "", false},
		{"tessera.dev/mig-0g.5gb", "", false},
		{"tessera.dev/mig-1g5gb", "", false},
		{"nvidia.com/mig-1g.5gb", "", false},
		{"tessera.dev/gpu", "", false},
	} {
		p, ok := api.MIGProfileOf(tc.name)
		if p != tc.profile || ok != tc.ok {
			t.Errorf("MIGProfileOf(%s) = %q %v, want %q %v", tc.name, p, ok, tc.profile, tc.ok)
		}
		if api.IsMIGResource(tc.name) != tc.ok {
			t.Errorf("IsMIGResource(%s) != %v", tc.name, tc.ok)
		}
		if tc.ok && (api.MIGResource(tc.profile) != tc.name || !api.IsTesseraResource(tc.name)) {
			t.Errorf("%s: MIGResource or IsTesseraResource disagree", tc.name)
		}
	}
	if !api.ValidMIGUUID("MIG-3b3a5f1c-1b2a-5c4d-9e8f-0a1b2c3d4e5f") || api.ValidMIGUUID("GPU-3b3a5f1c-1b2a-5c4d-9e8f-0a1b2c3d4e5f") {
		t.Error("ValidMIGUUID")
	}
	if err := api.CheckMIGProfile("x", "9g.1gb"); err == nil {
		t.Error("CheckMIGProfile accepted 9g.1gb")
	}
}

func TestCheckMIGPlacements(t *testing.T) {
	p := func(start, size int) api.MIGPlacement { return api.MIGPlacement{Start: start, Size: size} }
	for _, tc := range []struct {
		name   string
		places []api.MIGPlacement
		ok     bool
	}{
		{"seven 1g", []api.MIGPlacement{p(0, 1), p(1, 1), p(2, 1), p(3, 1), p(4, 1), p(5, 1), p(6, 1)}, true},
		{"3g + 2g + 1g", []api.MIGPlacement{p(0, 4), p(4, 2), p(6, 1)}, true},
		{"7g", []api.MIGPlacement{p(0, 8)}, true},
		{"1g on slice 7", []api.MIGPlacement{p(7, 1)}, false},
		{"misaligned 2g", []api.MIGPlacement{p(1, 2)}, false},
		{"size 3", []api.MIGPlacement{p(0, 3)}, false},
		{"overlap", []api.MIGPlacement{p(0, 4), p(2, 2)}, false},
		{"beyond", []api.MIGPlacement{p(8, 1)}, false},
		{"negative", []api.MIGPlacement{p(-2, 2)}, false},
	} {
		err := api.CheckMIGPlacements("mig", tc.places)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestInventoryAndAssignmentMIG(t *testing.T) {
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{"tessera.dev/mig-1g.5gb"},
		GPUs: []api.InventoryGPU{{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000", Model: "A100", MemoryMiB: 40960, Healthy: true,
			MIG: &api.InventoryMIG{Instances: []api.InventoryMIGInstance{
				{UUID: "MIG-00000000-0000-0000-0000-000000000001", Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 1}, Healthy: true},
				{UUID: "MIG-00000000-0000-0000-0000-000000000002", Profile: "3g.20gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 4}, Healthy: true},
			}}}},
		Links: [][]string{{"X"}},
	}
	if err := inv.Validate(); err != nil {
		t.Fatalf("valid inventory: %v", err)
	}
	inv.GPUs[0].MIG.Instances[1].UUID = inv.GPUs[0].MIG.Instances[0].UUID
	if err := inv.Validate(); err == nil {
		t.Error("duplicate MIG UUID accepted")
	}
	inv.GPUs[0].MIG.Instances[1].UUID = "MIG-00000000-0000-0000-0000-000000000002"
	inv.GPUs[0].MemoryUnits = 40
	if err := inv.Validate(); err == nil {
		t.Error("a GPU in MIG mode with memory units accepted")
	}
	a := api.NewAssignment()
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main", MIG: []api.MIGRef{
		{UUID: "MIG-00000000-0000-0000-0000-000000000001", Profile: "1g.5gb", GPU: api.GPURef{UUID: "GPU-00000000-0000-0000-0000-000000000000"}}}})
	if err := a.Validate(); err != nil {
		t.Fatalf("valid assignment: %v", err)
	}
	a.Containers[0].MIG[0].Profile = "1g.5gb+me"
	if err := a.Validate(); err == nil {
		t.Error("bad MIG profile in an assignment accepted")
	}
}
