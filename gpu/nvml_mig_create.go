package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGSpec is a MIG instance to create: its profile ("3g.20gb", as
// MIGProfileName names it) at a placement in the GPU's memory slices.
type MIGSpec struct {
	Profile     string
	Start, Size int
}

// giProfileIDs are the GPU instance profiles SetMIGLayout may create (the
// +me, +gfx and -me variants are left out: their names would collide with
// the plain ones).
var giProfileIDs = []int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE,
	nvml.GPU_INSTANCE_PROFILE_6_SLICE,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE,
	nvml.GPU_INSTANCE_PROFILE_8_SLICE,
}

// SetMIGLayout implements Interface.
func (l *nvmlLib) SetMIGLayout(index int, want []MIGSpec) error {
	d, err := l.handle(index)
	if err != nil {
		return err
	}
	info, err := l.MIG(index)
	if err != nil {
		return err
	}
	if !info.Enabled {
		return fmt.Errorf("GPU %d is not in MIG mode: %w", index, ErrNotSupported)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("GetMemoryInfo", index, ret)
	}
	// Resolve every wanted profile before destroying anything.
	profiles := map[string]nvml.GpuInstanceProfileInfo{}
	for _, id := range giProfileIDs {
		p, ret := d.GetGpuInstanceProfileInfo(id)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fail(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", id), index, ret)
		}
		name := MIGProfileName(p.SliceCount, p.SliceCount, p.MemorySizeMB, mem.Total)
		if _, dup := profiles[name]; !dup {
			profiles[name] = p
		}
	}
	for i, w := range want {
		if _, ok := profiles[w.Profile]; !ok {
			return fmt.Errorf("GPU %d: instance %d: profile %q is not one this GPU creates", index, i, w.Profile)
		}
	}
	for _, in := range info.Instances {
		if err := l.destroyMIG(d, index, in); err != nil {
			return err
		}
	}
	for i, w := range want {
		p := profiles[w.Profile]
		place := nvml.GpuInstancePlacement{Start: uint32(w.Start), Size: uint32(w.Size)}
		gi, ret := d.CreateGpuInstanceWithPlacement(&p, &place)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("instance %d (%s at %d+%d): %w", i, w.Profile, w.Start, w.Size, fail("CreateGpuInstanceWithPlacement", index, ret))
		}
		if err := createComputeInstance(gi, p.SliceCount, index); err != nil {
			// A GPU instance without its compute instance is no MIG
			// device: take it back.
			return errors.Join(fmt.Errorf("instance %d (%s at %d+%d): %w", i, w.Profile, w.Start, w.Size, err), fail("GPU instance Destroy", index, gi.Destroy()))
		}
	}
	return nil
}

// createComputeInstance creates gi's compute instance over all its slices.
func createComputeInstance(gi nvml.GpuInstance, slices uint32, index int) error {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		p, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fail(fmt.Sprintf("GetComputeInstanceProfileInfo(%d)", id), index, ret)
		}
		if p.SliceCount != slices {
			continue
		}
		_, ret = gi.CreateComputeInstance(&p)
		return fail("CreateComputeInstance", index, ret)
	}
	return fmt.Errorf("GPU %d: no compute instance profile of %d slices: %w", index, slices, ErrNotSupported)
}

// destroyMIG destroys a MIG device: its compute instance, then its GPU
// instance.
func (l *nvmlLib) destroyMIG(d nvml.Device, index int, in MIGInstance) error {
	gi, ret := d.GetGpuInstanceById(in.GPUInstanceID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("GetGpuInstanceById(%d)", in.GPUInstanceID), index, ret)
	}
	ci, ret := gi.GetComputeInstanceById(in.ComputeInstanceID)
	switch ret {
	case nvml.SUCCESS:
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			return fail(fmt.Sprintf("compute instance %d/%d Destroy", in.GPUInstanceID, in.ComputeInstanceID), index, ret)
		}
	case nvml.ERROR_NOT_FOUND:
	default:
		return fail(fmt.Sprintf("GetComputeInstanceById(%d)", in.ComputeInstanceID), index, ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("GPU instance %d Destroy", in.GPUInstanceID), index, ret)
	}
	return nil
}
