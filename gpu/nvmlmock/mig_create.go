package nvmlmock

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/tessera-gpu/tessera/api"
)

// migGIProfiles are the GPU instance profiles the mock creates: NVML's
// profile ID -> compute slices and memory slices (A100/H100/H200
// geometry). The +me, +gfx and -me variants are not supported.
var migGIProfiles = map[int]struct{ compute, memory int }{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {1, 1},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {2, 2},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {3, 4},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {4, 4},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {7, 8},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {1, 2},
}

// migCIProfiles are the compute instance profiles: ID -> compute slices.
var migCIProfiles = map[int]uint32{
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
	nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
	nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
	nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}

// FailMIGCreates makes the next n CreateGpuInstanceWithPlacement calls on
// GPU i fail with ERROR_UNKNOWN (a driver failure mid-repartition).
func (m *Machine) FailMIGCreates(i, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus[i].migFail = n
}

// addMIGCreate sets the calls that repartition a GPU in MIG mode: GPU
// instance profiles, creating a GPU instance at a placement (destroying
// one and its compute instance are on their handles).
func (m *Machine) addMIGCreate(d *mock.Device, g *gpuState, live func() (gpuState, nvml.Return)) {
	gpuMiB := m.profile.GPUs[g.index].MemoryMiB
	enabled := m.profile.GPUs[g.index].MIG != nil
	d.GetGpuInstanceProfileInfoFunc = func(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.GpuInstanceProfileInfo{}, r
		}
		p, ok := migGIProfiles[id]
		if !enabled || !ok {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.GpuInstanceProfileInfo{
			Id:                  uint32(id),
			SliceCount:          uint32(p.compute),
			InstanceCount:       uint32(api.MIGSlices / p.memory),
			MultiprocessorCount: uint32(p.compute * 14),
			MemorySizeMB:        migMemoryMiB(p.memory, gpuMiB),
		}, nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, place *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nil, r
		}
		if info == nil || place == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := migGIProfiles[int(info.Id)]
		if !enabled || !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if g.migFail > 0 {
			g.migFail--
			return nil, nvml.ERROR_UNKNOWN
		}
		want := api.MIGPlacement{Start: int(place.Start), Size: int(place.Size)}
		if want.Size != p.memory {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if api.CheckMIGPlacements("", []api.MIGPlacement{want}) != nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		places := []api.MIGPlacement{want}
		ids := map[int]bool{}
		for _, s := range g.mig {
			places = append(places, api.MIGPlacement{Start: s.start, Size: s.size})
			ids[s.gpuInstanceID] = true
		}
		if len(g.mig) >= maxMIGDevices || api.CheckMIGPlacements("", places) != nil {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		id := 1
		for ids[id] {
			id++
		}
		g.migGen++
		s := &migState{
			uuid:          derivedMIGUUID(fmt.Sprintf("%s/created-%d", g.uuid, g.migGen), want.Start),
			profile:       fmt.Sprintf("%dg.%dgb", p.compute, migProfileGB(p.memory, gpuMiB)),
			start:         want.Start,
			size:          want.Size,
			gpuInstanceID: id,
			slices:        uint32(p.compute),
			memoryMiB:     migMemoryMiB(p.memory, gpuMiB),
		}
		s.dev = m.migDevice(d, s, live)
		at, _ := slices.BinarySearchFunc(g.mig, s.start, func(x *migState, start int) int { return x.start - start })
		g.mig = slices.Insert(g.mig, at, s)
		return m.gpuInstance(d, g, s, live), m.migChangedLocked(nvml.SUCCESS)
	}
}

// migMemoryMiB is what the driver reports for an instance of size memory
// slices: a little under the slices' share of the GPU's memory (95%).
func migMemoryMiB(size int, gpuMiB uint64) uint64 {
	return uint64(size) * gpuMiB / api.MIGSlices * 95 / 100
}

// destroyGPUInstance removes a GPU instance; one that still has its
// compute instance is in use.
func (m *Machine) destroyGPUInstance(g *gpuState, s *migState, live func() (gpuState, nvml.Return)) nvml.Return {
	if _, r := live(); r != nvml.SUCCESS {
		return r
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.compute {
		return nvml.ERROR_IN_USE
	}
	k := slices.Index(g.mig, s)
	if k < 0 {
		return nvml.ERROR_NOT_FOUND
	}
	g.mig = slices.Delete(g.mig, k, k+1)
	return m.migChangedLocked(nvml.SUCCESS)
}

func (m *Machine) computeProfileInfo(profile, engine int, live func() (gpuState, nvml.Return)) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if _, r := live(); r != nvml.SUCCESS {
		return nvml.ComputeInstanceProfileInfo{}, r
	}
	n, ok := migCIProfiles[profile]
	if !ok || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.ComputeInstanceProfileInfo{Id: uint32(profile), SliceCount: n, InstanceCount: 1, MultiprocessorCount: n * 14}, nvml.SUCCESS
}

// createComputeInstance gives a GPU instance its one compute instance over
// all its slices (the only kind the mock has).
func (m *Machine) createComputeInstance(parent *mock.Device, g *gpuState, s *migState, info *nvml.ComputeInstanceProfileInfo, live func() (gpuState, nvml.Return)) (nvml.ComputeInstance, nvml.Return) {
	if _, r := live(); r != nvml.SUCCESS {
		return nil, r
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(g.mig, s) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	if info.SliceCount != s.slices {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if s.compute {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	s.compute = true
	return m.computeInstance(g, s, live), m.migChangedLocked(nvml.SUCCESS)
}

func (m *Machine) computeInstanceByID(g *gpuState, s *migState, id int, live func() (gpuState, nvml.Return)) (nvml.ComputeInstance, nvml.Return) {
	if _, r := live(); r != nvml.SUCCESS {
		return nil, r
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if id != 0 || !s.compute || !slices.Contains(g.mig, s) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return m.computeInstance(g, s, live), nvml.SUCCESS
}

func (m *Machine) computeInstance(g *gpuState, s *migState, live func() (gpuState, nvml.Return)) *mock.ComputeInstance {
	return &mock.ComputeInstance{
		DestroyFunc: func() nvml.Return {
			if _, r := live(); r != nvml.SUCCESS {
				return r
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if !s.compute || !slices.Contains(g.mig, s) {
				return nvml.ERROR_NOT_FOUND
			}
			s.compute = false
			return m.migChangedLocked(nvml.SUCCESS)
		},
	}
}
