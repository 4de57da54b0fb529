package api

import "fmt"

// Names the NRI plugin sets on, or reads from, the containers it isolates.

// AnnotationNUMAAlignment is the pod annotation by which a pod opts out of
// NUMA alignment: with the value "false" (or "disabled") the NRI plugin
// leaves the cpuset of the pod's containers as the kubelet set it. Absent,
// "true" or "enabled", a container without exclusive CPUs is pinned to the
// CPUs and memory of its GPUs' NUMA node(s). Any other value is refused at
// the pod's creation (CheckNUMAAlignment); one that got past it aligns.
const AnnotationNUMAAlignment = Domain + "/numa-alignment"

// NUMAAlignmentDisabled reports whether a pod's annotations opt it out of NUMA
// alignment.
func NUMAAlignmentDisabled(annotations map[string]string) bool {
	switch annotations[AnnotationNUMAAlignment] {
	case "false", "disabled":
		return true
	}
	return false
}

// CheckNUMAAlignment refuses an AnnotationNUMAAlignment value other than
// "true", "enabled", "false" or "disabled" (a typo such as "flase" would
// otherwise align the pod silently).
func CheckNUMAAlignment(annotations map[string]string) error {
	v, ok := annotations[AnnotationNUMAAlignment]
	if !ok {
		return nil
	}
	switch v {
	case "true", "enabled", "false", "disabled":
		return nil
	}
	return fmt.Errorf("annotation %s: %q is none of \"true\", \"enabled\", \"false\" (opt out of NUMA alignment) or \"disabled\"", AnnotationNUMAAlignment, v)
}

// Environment the NVIDIA container stack and CUDA read, which the NRI plugin
// sets.
const (
	// EnvNVIDIAVisibleDevices lists the GPUs (by UUID) the NVIDIA
	// container runtime exposes.
	EnvNVIDIAVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvDockerResourceGPU is the swarm-resource variable the NVIDIA
	// container toolkit reads in place of EnvNVIDIAVisibleDevices where its
	// configuration names it (swarm-resource).
	EnvDockerResourceGPU = "DOCKER_RESOURCE_GPU"
	// EnvNVIDIAIMEXChannels asks the toolkit for IMEX channels.
	EnvNVIDIAIMEXChannels = "NVIDIA_IMEX_CHANNELS"
	// EnvNVIDIAMIGConfigDevices and EnvNVIDIAMIGMonitorDevices ask the
	// toolkit for the MIG configuration and monitoring capabilities of
	// GPUs.
	EnvNVIDIAMIGConfigDevices  = "NVIDIA_MIG_CONFIG_DEVICES"
	EnvNVIDIAMIGMonitorDevices = "NVIDIA_MIG_MONITOR_DEVICES"
	// VisibleDevicesVoid is the EnvNVIDIAVisibleDevices value under which
	// the NVIDIA container runtime gives a container no GPU, no device node
	// and no driver library (unlike "none", which still mounts the driver),
	// even when its image asks for all of them.
	VisibleDevicesVoid = "void"
	// NRISentinelPath is the container path of the sentinel mount the
	// device plugin adds to every container it allocates Tessera devices
	// to when the node runs the NRI plugin, and that the NRI plugin takes
	// out again when it isolates the container. It lies inside /proc, where
	// runc refuses to mount anything: a container the NRI plugin did not
	// see (the runtime created it while the plugin was away, before its
	// reconnection and Synchronize) fails to be created, and the kubelet
	// tries again, instead of running without its isolation.
	NRISentinelPath = "/proc/tessera-nri-required"

	// EnvMPSPipeDirectory is where a CUDA client finds its MPS control
	// daemon's pipes.
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	// EnvMPSPinnedDeviceMemLimit caps the device memory an MPS client may
	// allocate, per device ordinal: "0=2048M".
	EnvMPSPinnedDeviceMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSActiveThreadPercentage caps the share of SMs an MPS client's
	// kernels may use, in percent.
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Environment describing a container's assignment to the workload, set by
// the NRI plugin on every container that holds Tessera resources.
const (
	// EnvGPUUUIDs lists the UUIDs of the container's GPUs (whole and
	// shared), comma-separated, ordered by NVML index.
	EnvGPUUUIDs = "TESSERA_GPU_UUIDS"
	// EnvGPUIndices lists the node-wide NVML indices of the same GPUs.
	EnvGPUIndices = "TESSERA_GPU_INDICES"
	// EnvGPUShared is "true" when the container uses a slice of a shared
	// GPU, "false" when it holds whole GPUs only.
	EnvGPUShared = "TESSERA_GPU_SHARED"
	// EnvGPUMemoryLimitMiB is the GPU memory the container may use on its
	// shared GPU, in MiB (set for shared containers only).
	EnvGPUMemoryLimitMiB = "TESSERA_GPU_MEMORY_LIMIT_MIB"
	// EnvGPUCores is the container's share of its shared GPU's compute in
	// percent (set for shared containers with a core limit only).
	EnvGPUCores = "TESSERA_GPU_CORES"
)

// MPSPipeMountPath is where the NRI plugin mounts a shared GPU's MPS pipe
// directory inside the container; EnvMPSPipeDirectory points there.
const MPSPipeMountPath = "/run/tessera/mps"

// Where else the NVIDIA container runtime reads a container's devices.
const (
	// NVIDIAVolumeMountsDir is where the volume-mounts device list
	// strategy lists GPUs, one mount per GPU.
	NVIDIAVolumeMountsDir = "/var/run/nvidia-container-devices"
	// CDIAnnotationPrefix is the prefix of the container annotations by
	// which device plugins' Allocate and the NVIDIA container runtime's CDI
	// mode request CDI devices: a comma-separated list of fully qualified
	// device names.
	CDIAnnotationPrefix = "cdi.k8s.io/"
)
