package gpu

import (
	"fmt"
	"math"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGInfo is a GPU's MIG state: whether MIG mode is on and, when it is,
// the MIG instances that exist on it.
type MIGInfo struct {
	// Enabled is true when the GPU's current MIG mode is on. A GPU that
	// does not support MIG, or whose MIG mode is off, is not enabled.
	Enabled bool
	// Pending is true when MIG mode is set to change at the next GPU reset
	// (pending mode differs from the current one).
	Pending bool
	// Instances are the MIG devices (a GPU instance with a compute
	// instance), ordered by placement start.
	Instances []MIGInstance
}

// MIGInstance is one MIG device of a GPU.
type MIGInstance struct {
	// UUID is the MIG device's UUID, "MIG-<uuid>".
	UUID string
	// Profile is NVIDIA's name for it, as nvidia-smi shows it: "1g.5gb"
	// (compute slices, memory in GB), or "1c.2g.10gb" when the compute
	// instance holds fewer slices than its GPU instance.
	Profile string
	// GPUInstanceID and ComputeInstanceID are NVML's IDs of the instance.
	GPUInstanceID     int
	ComputeInstanceID int
	// Start and Size are the GPU instance's placement in the GPU's memory
	// slices: [Start, Start+Size).
	Start, Size int
	// MemoryMiB is the instance's memory.
	MemoryMiB uint64
}

// MIGProfileName names a MIG instance as nvidia-smi and NVIDIA's device
// plugin do: "<g>g.<GB>gb", with the memory rounded to the eighths of the
// GPU's memory the instance holds, or "<c>c.<g>g.<GB>gb" when the compute
// instance has fewer slices than its GPU instance.
func MIGProfileName(gpuSlices, computeSlices uint32, memoryMiB, gpuMemoryBytes uint64) string {
	gb := migMemoryGB(gpuMemoryBytes, memoryMiB)
	if computeSlices != 0 && computeSlices != gpuSlices {
		return fmt.Sprintf("%dc.%dg.%dgb", computeSlices, gpuSlices, gb)
	}
	return fmt.Sprintf("%dg.%dgb", gpuSlices, gb)
}

// migMemoryGB is the memory part of a profile name: the instance's share
// of the GPU's memory rounded up to an eighth, times the GPU's memory in
// whole GB (rounded up), as go-nvlib computes it.
func migMemoryGB(gpuMemoryBytes, memoryMiB uint64) uint64 {
	const eighths = 8
	const gib = 1 << 30
	if gpuMemoryBytes == 0 {
		return 0
	}
	frac := float64(memoryMiB) * (1 << 20) / float64(gpuMemoryBytes)
	frac = math.Ceil(frac*eighths) / eighths
	totalGB := float64((gpuMemoryBytes + gib - 1) / gib)
	return uint64(math.Round(frac * totalGB))
}

// MIG reads GPU index's MIG state. A GPU without MIG support (NVML says
// not supported) or with MIG mode off is not enabled and no error. A GPU
// off the bus, or any NVML failure while listing the instances, is an
// error: an instance is never left out silently.
func (l *nvmlLib) MIG(index int) (MIGInfo, error) {
	d, err := l.handle(index)
	if err != nil {
		return MIGInfo{}, err
	}
	current, pending, ret := d.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return MIGInfo{}, nil
	}
	if ret != nvml.SUCCESS {
		return MIGInfo{}, fail("GetMigMode", index, ret)
	}
	info := MIGInfo{Enabled: current == nvml.DEVICE_MIG_ENABLE, Pending: current != pending}
	if !info.Enabled {
		return info, nil
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return MIGInfo{}, fail("GetMemoryInfo", index, ret)
	}
	slots, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return MIGInfo{}, fail("GetMaxMigDeviceCount", index, ret)
	}
	for k := 0; k < slots; k++ {
		md, ret := d.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			return MIGInfo{}, fail(fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", k), index, ret)
		}
		in, err := l.migInstance(d, md, index, k, mem.Total)
		if err != nil {
			return MIGInfo{}, err
		}
		info.Instances = append(info.Instances, in)
	}
	sort.Slice(info.Instances, func(i, j int) bool { return info.Instances[i].Start < info.Instances[j].Start })
	return info, nil
}

func (l *nvmlLib) migInstance(parent, md nvml.Device, index, k int, gpuMemoryBytes uint64) (MIGInstance, error) {
	op := func(call string) string { return fmt.Sprintf("MIG device %d %s", k, call) }
	var in MIGInstance
	var ret nvml.Return
	if in.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
		return MIGInstance{}, fail(op("GetUUID"), index, ret)
	}
	if in.GPUInstanceID, ret = md.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return MIGInstance{}, fail(op("GetGpuInstanceId"), index, ret)
	}
	if in.ComputeInstanceID, ret = md.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return MIGInstance{}, fail(op("GetComputeInstanceId"), index, ret)
	}
	attrs, ret := md.GetAttributes()
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fail(op("GetAttributes"), index, ret)
	}
	in.MemoryMiB = attrs.MemorySizeMB
	in.Profile = MIGProfileName(attrs.GpuInstanceSliceCount, attrs.ComputeInstanceSliceCount, attrs.MemorySizeMB, gpuMemoryBytes)
	gi, ret := parent.GetGpuInstanceById(in.GPUInstanceID)
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fail(fmt.Sprintf("GetGpuInstanceById(%d)", in.GPUInstanceID), index, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fail(fmt.Sprintf("GPU instance %d GetInfo", in.GPUInstanceID), index, ret)
	}
	in.Start, in.Size = int(giInfo.Placement.Start), int(giInfo.Placement.Size)
	return in, nil
}
