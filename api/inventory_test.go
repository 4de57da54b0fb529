package api_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

func inventory(mutate ...func(*api.GPUInventory)) *api.GPUInventory {
	inv := &api.GPUInventory{
		APIVersion:    api.Version,
		Kind:          api.KindGPUInventory,
		MemoryUnitMiB: 1024,
		Resources:     []string{string(api.ResourceGPU), string(api.ResourceGPUMemory)},
		GPUs: []api.InventoryGPU{
			{Index: 0, UUID: uuid0, Model: "A100", MemoryMiB: 40960, MemoryUnits: 40, NUMANode: 0, Healthy: true},
			{Index: 1, UUID: uuid1, Model: "A100", MemoryMiB: 40960, MemoryUnits: 40, NUMANode: 1, Reason: "XID 79"},
		},
		Links:         [][]string{{"X", "NVS12"}, {"NVS12", "X"}},
		NVLinkCliques: [][]int{{0, 1}},
	}
	for _, m := range mutate {
		m(inv)
	}
	return inv
}

func TestGPUInventoryRoundTrip(t *testing.T) {
	in := inventory()
	ann := map[string]string{}
	if err := api.SetGPUInventory(ann, in); err != nil {
		t.Fatalf("SetGPUInventory: %v", err)
	}
	got, ok, err := api.GetGPUInventory(ann)
	if err != nil || !ok {
		t.Fatalf("GetGPUInventory = ok %v, err %v", ok, err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestGPUInventoryErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*api.GPUInventory)
		want   string
	}{
		{"version", func(i *api.GPUInventory) { i.APIVersion = "v1" }, "apiVersion"},
		{"unit", func(i *api.GPUInventory) { i.MemoryUnitMiB = 0 }, "memoryUnitMiB"},
		{"resource", func(i *api.GPUInventory) { i.Resources = []string{"nvidia.com/gpu"} }, `resources[0]: "nvidia.com/gpu"`},
		{"uuid", func(i *api.GPUInventory) { i.GPUs[1].UUID = uuid0 }, "gpus[1].uuid"},
		{"memory", func(i *api.GPUInventory) { i.GPUs[0].MemoryMiB = 0 }, "gpus[0].memoryMiB"},
		{"numa", func(i *api.GPUInventory) { i.GPUs[0].NUMANode = -2 }, "gpus[0].numaNode"},
		{"healthy with reason", func(i *api.GPUInventory) { i.GPUs[0].Reason = "x" }, "gpus[0].reason"},
		{"rows", func(i *api.GPUInventory) { i.Links = i.Links[:1] }, "links: must have 2 rows"},
		{"diagonal", func(i *api.GPUInventory) { i.Links[0][0] = "NV1" }, "links[0][0]"},
		{"asymmetric", func(i *api.GPUInventory) { i.Links[0][1] = "NV2" }, "links[0][1]: must equal links[1][0]"},
		{"unknown link", func(i *api.GPUInventory) { i.Links[0][1], i.Links[1][0] = "QPI", "QPI" }, `"QPI" is not a link`},
		{"clique", func(i *api.GPUInventory) { i.NVLinkCliques = [][]int{{0, 7}} }, "nvlinkCliques[0][1]"},
		{"withheld from whole unknown", func(i *api.GPUInventory) { i.WithheldFromWhole = []string{uuid0, "GPU-ffffffff"} }, `withheldFromWhole[1]: "GPU-ffffffff" is not the UUID of one of gpus`},
		{"withheld from shared twice", func(i *api.GPUInventory) { i.WithheldFromShared = []string{uuid1, uuid1} }, "withheldFromShared[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{}
			err := api.SetGPUInventory(ann, inventory(tc.mutate))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SetGPUInventory error = %v, want one containing %q", err, tc.want)
			}
			if len(ann) != 0 {
				t.Errorf("SetGPUInventory(invalid) wrote %v", ann)
			}
		})
	}
}

func TestGPUInventoryWithheld(t *testing.T) {
	in := inventory(func(i *api.GPUInventory) {
		i.WithheldFromWhole, i.WithheldFromShared = []string{uuid0}, []string{uuid1}
	})
	value, err := api.EncodeGPUInventory(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(value, `"withheldFromWhole":["`+uuid0+`"]`) || !strings.Contains(value, `"withheldFromShared":["`+uuid1+`"]`) {
		t.Errorf("encoded %s lacks the withheld lists", value)
	}
	got, err := api.ParseGPUInventory(value)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// Absent lists (an agent before the fields existed) mean nothing
	// withheld, and are not written when empty.
	plain, err := api.EncodeGPUInventory(inventory())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "withheld") {
		t.Errorf("encoded %s names withheld lists", plain)
	}
}

func TestGetGPUInventoryMalformed(t *testing.T) {
	_, ok, err := api.GetGPUInventory(map[string]string{api.AnnotationGPUInventory: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GPUInventory","bogus":true}`})
	if !ok || err == nil || !strings.Contains(err.Error(), `unknown field "bogus"`) {
		t.Errorf("GetGPUInventory(unknown field) = ok %v, err %v; want ok and an unknown-field error", ok, err)
	}
}

// TestGPUInventoryDynamicMIG: the agent's dynamic-MIG flag round-trips,
// is absent (false) when off, and is parsed strictly.
func TestGPUInventoryDynamicMIG(t *testing.T) {
	on := inventory(func(i *api.GPUInventory) { i.DynamicMIG = true })
	value, err := api.EncodeGPUInventory(on)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(value, `"dynamicMIG":true`) {
		t.Fatalf("encoded %s", value)
	}
	got, err := api.ParseGPUInventory(value)
	if err != nil || !got.DynamicMIG {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	off, err := api.EncodeGPUInventory(inventory())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(off, "dynamicMIG") {
		t.Fatalf("off is written: %s", off)
	}
	if got, err := api.ParseGPUInventory(off); err != nil || got.DynamicMIG {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	if _, err := api.ParseGPUInventory(strings.Replace(value, `"dynamicMIG":true`, `"dynamicMIG":"yes"`, 1)); err == nil {
		t.Fatal("a string dynamicMIG parsed")
	}
}
