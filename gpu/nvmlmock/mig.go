package nvmlmock

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/tessera-gpu/tessera/api"
)

// maxMIGDevices is what GetMaxMigDeviceCount reports on a GPU in MIG mode
// (A100, H100: 7 instances at most).
const maxMIGDevices = 7

// migState is one MIG instance of a mock GPU: a GPU instance with one
// compute instance over all its slices.
type migState struct {
	uuid          string
	profile       string
	start, size   int
	gpuInstanceID int
	slices        uint32 // compute slices, the <g> of the profile name
	memoryMiB     uint64
	dev           *mock.Device
	// compute is true when the GPU instance has its compute instance (a
	// MIG device exists); an instance created through NVML has none until
	// CreateComputeInstance.
	compute bool
}

// migDevices are the instances that are MIG devices (have a compute
// instance), in order.
func migDevices(all []*migState) []*migState {
	var out []*migState
	for _, s := range all {
		if s.compute {
			out = append(out, s)
		}
	}
	return out
}

// newMIGStates reads a GPU's MIG layout from its profile. Its UUIDs are the
// given ones or derived from the GPU's UUID and the placement's start.
func newMIGStates(g api.MockGPU, gpuUUID string) ([]*migState, error) {
	if g.MIG == nil {
		return nil, nil
	}
	out := make([]*migState, 0, len(g.MIG.Instances))
	for k, in := range g.MIG.Instances {
		var slices, gb uint64
		if _, err := fmt.Sscanf(in.Profile, "%dg.%dgb", &slices, &gb); err != nil {
			return nil, fmt.Errorf("instances[%d].profile: %q: %w", k, in.Profile, err)
		}
		// NVIDIA names an instance by its memory: its slices' share of
		// the GPU's memory in whole GB (rounded up), as NVML reports it.
		if want := migProfileGB(in.Size, g.MemoryMiB); gb != want {
			return nil, fmt.Errorf("instances[%d].profile: %s: an instance of %d memory slices on a GPU of %d MiB is named %dg.%dgb", k, in.Profile, in.Size, g.MemoryMiB, slices, want)
		}
		if slices > uint64(api.MIGSlices) || slices == 0 {
			return nil, fmt.Errorf("instances[%d].profile: %s: %d compute slices", k, in.Profile, slices)
		}
		uuid := in.UUID
		if uuid == "" {
			uuid = derivedMIGUUID(gpuUUID, in.Start)
		}
		out = append(out, &migState{
			uuid:          uuid,
			profile:       in.Profile,
			start:         in.Start,
			size:          in.Size,
			gpuInstanceID: k + 1,
			slices:        uint32(slices),
			// What the driver reports is a little under the slices' share
			// of the GPU's memory (an A100-40GB's 1g.5gb has 4864 MiB): 95%.
			memoryMiB: uint64(in.Size) * g.MemoryMiB / api.MIGSlices * 95 / 100,
		})
	}
	return out, nil
}

// migProfileGB is the GB in the profile name of an instance of size memory
// slices on a GPU of gpuMiB: its share of the GPU's memory in whole GB
// (rounded up), rounded to the nearest GB.
func migProfileGB(size int, gpuMiB uint64) uint64 {
	totalGB := (gpuMiB + 1023) / 1024
	return (uint64(size)*totalGB*2 + api.MIGSlices) / (2 * api.MIGSlices)
}

// derivedMIGUUID is a stable MIG UUID for the instance at start of a GPU.
func derivedMIGUUID(gpuUUID string, start int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("tessera-mock-mig/%s/%d", gpuUUID, start)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("MIG-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// migCapable reports whether a GPU model supports MIG (its mode can be
// read, off) when its profile sets no MIG layout.
func migCapable(model string) bool {
	for _, s := range []string{"A100", "A30", "H100", "H200", "H20", "H800", "A800", "B200", "GB200"} {
		if strings.Contains(model, s) {
			return true
		}
	}
	return false
}

// MIGUUIDs returns the UUIDs of GPU i's MIG instances, in profile order.
func (m *Machine) MIGUUIDs(i int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, s := range m.gpus[i].mig {
		out = append(out, s.uuid)
	}
	return out
}

// addMIG sets the MIG calls of a GPU's device: its mode, its MIG device
// handles and its GPU instances, answered from the profile's layout.
func (m *Machine) addMIG(d *mock.Device, g *gpuState, live func() (gpuState, nvml.Return)) {
	model := m.profile.GPUs[g.index].Model
	enabled := m.profile.GPUs[g.index].MIG != nil
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return 0, 0, r
		}
		switch {
		case enabled:
			return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
		case migCapable(model):
			return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
		}
		return 0, 0, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return 0, r
		}
		if !migCapable(model) && !enabled {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return maxMIGDevices, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nil, r
		}
		if !enabled {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if k < 0 || k >= maxMIGDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		devs := migDevices(g.mig)
		if k >= len(devs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devs[k].dev, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nil, r
		}
		if !enabled {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, s := range g.mig {
			if s.gpuInstanceID == id {
				return m.gpuInstance(d, g, s, live), nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	for _, s := range g.mig {
		s.dev = m.migDevice(d, s, live)
		s.compute = true
	}
	m.addMIGCreate(d, g, live)
}

func (m *Machine) gpuInstance(parent *mock.Device, g *gpuState, s *migState, live func() (gpuState, nvml.Return)) *mock.GpuInstance {
	return &mock.GpuInstance{
		DestroyFunc:                       func() nvml.Return { return m.destroyGPUInstance(g, s, live) },
		GetComputeInstanceProfileInfoFunc: func(p, e int) (nvml.ComputeInstanceProfileInfo, nvml.Return) { return m.computeProfileInfo(p, e, live) },
		CreateComputeInstanceFunc: func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			return m.createComputeInstance(parent, g, s, info, live)
		},
		GetComputeInstanceByIdFunc: func(id int) (nvml.ComputeInstance, nvml.Return) { return m.computeInstanceByID(g, s, id, live) },
		GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			if _, r := live(); r != nvml.SUCCESS {
				return nvml.GpuInstanceInfo{}, r
			}
			return nvml.GpuInstanceInfo{
				Device:    parent,
				Id:        uint32(s.gpuInstanceID),
				Placement: nvml.GpuInstancePlacement{Start: uint32(s.start), Size: uint32(s.size)},
			}, nvml.SUCCESS
		},
	}
}

// migDevice is the handle of one MIG device. Every call fails with
// ERROR_GPU_IS_LOST while its GPU is lost.
func (m *Machine) migDevice(parent *mock.Device, s *migState, live func() (gpuState, nvml.Return)) *mock.Device {
	d := &mock.Device{}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) { _, r := live(); return s.uuid, r }
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { _, r := live(); return s.gpuInstanceID, r }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { _, r := live(); return 0, r }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { _, r := live(); return parent, r }
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.DeviceAttributes{}, r
		}
		return nvml.DeviceAttributes{
			GpuInstanceSliceCount:     s.slices,
			ComputeInstanceSliceCount: s.slices,
			MemorySizeMB:              s.memoryMiB,
			MultiprocessorCount:       s.slices * 14,
		}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		_, r := live()
		b := s.memoryMiB << 20
		return nvml.Memory{Total: b, Free: b}, r
	}
	return d
}
