package gpu_test

import (
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// FuzzMIGNames checks the mock's rule for MIG profile names against the
// adapter's: whenever a mock machine accepts an instance named
// <g>g.<gb>gb of size memory slices on a GPU of memoryMiB, NVML through the
// adapter reads back exactly that name and placement. The two
// implementations of NVIDIA's naming (the mock's memory sizes, the
// adapter's rounding) must agree on every GPU size.
func FuzzMIGNames(f *testing.F) {
	f.Add(uint32(40960), uint8(1), uint16(5), uint8(0), uint8(1))
	f.Add(uint32(40960), uint8(3), uint16(20), uint8(0), uint8(4))
	f.Add(uint32(81559), uint8(1), uint16(10), uint8(6), uint8(1))
	f.Add(uint32(81559), uint8(3), uint16(40), uint8(4), uint8(4))
	f.Add(uint32(196608), uint8(7), uint16(192), uint8(0), uint8(8))
	f.Add(uint32(24576), uint8(1), uint16(3), uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, memoryMiB uint32, g uint8, gb uint16, start, size uint8) {
		profile := fmt.Sprintf("%dg.%dgb", g, gb)
		m, err := nvmlmock.New(&api.MockMachine{
			APIVersion: api.Version, Kind: api.KindMockMachine, Name: "fuzz",
			NUMANodes: []api.MockNUMANode{{ID: 0, CPUs: "0-3"}},
			GPUs: []api.MockGPU{{Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: uint64(memoryMiB), NUMANode: 0, PCIBusID: "0000:01:00.0",
				MIG: &api.MockMIG{Instances: []api.MockMIGInstance{{Profile: profile, Start: int(start), Size: int(size)}}}}},
		})
		if err != nil {
			return // not a machine NVIDIA makes
		}
		lib := gpu.NewNVML(m.NVML())
		if err := lib.Init(); err != nil {
			t.Fatal(err)
		}
		info, err := lib.MIG(0)
		if err != nil {
			t.Fatalf("MIG(0) on an accepted machine: %v", err)
		}
		if !info.Enabled || len(info.Instances) != 1 {
			t.Fatalf("MIG(0) = %+v, want one instance", info)
		}
		in := info.Instances[0]
		if in.Profile != profile || in.Start != int(start) || in.Size != int(size) || in.UUID != m.MIGUUIDs(0)[0] {
			t.Errorf("GPU of %d MiB: the mock accepted %s at %d+%d, NVML reads %s at %d+%d (%s)", memoryMiB, profile, start, size, in.Profile, in.Start, in.Size, in.UUID)
		}
		// The name is one a resource can carry.
		if !api.ValidMIGProfile(in.Profile) {
			t.Errorf("NVML names the instance %q, not a servable profile", in.Profile)
		}
	})
}
