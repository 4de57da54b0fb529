package api

import corev1 "k8s.io/api/core/v1"

// Domain is the prefix of every Tessera resource, annotation and label.
const Domain = "tessera.dev"

// Version is the API version of every versioned Tessera file format and
// annotation value.
const Version = Domain + "/v1alpha1"

// Extended resources advertised by the node agent's device plugins.
const (
	// ResourceGPU counts whole GPUs. One device per healthy GPU; the device ID
	// is the GPU UUID.
	ResourceGPU corev1.ResourceName = Domain + "/gpu"
	// ResourceGPUMemory counts GPU memory units (1 GiB each unless configured
	// otherwise) of GPUs that are shared between containers.
	ResourceGPUMemory corev1.ResourceName = Domain + "/gpu-memory"
	// ResourceGPUCore counts percent of one GPU's compute: 100 per GPU.
	ResourceGPUCore corev1.ResourceName = Domain + "/gpu-core"

	// ResourceNVIDIAGPU is NVIDIA's device plugin resource; quota accounts it
	// beside Tessera's own.
	ResourceNVIDIAGPU corev1.ResourceName = "nvidia.com/gpu"
)

// CoresPerGPU is the number of ResourceGPUCore units one GPU provides.
const CoresPerGPU = 100

// DefaultMemoryUnitMiB is the default size of one ResourceGPUMemory unit.
const DefaultMemoryUnitMiB = 1024

// Resources lists the extended resources Tessera manages, in a fixed order.
func Resources() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceGPU, ResourceGPUMemory, ResourceGPUCore}
}

// SharedResources lists the resources that serve slices of a GPU (memory
// units and compute units), in a fixed order.
func SharedResources() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceGPUMemory, ResourceGPUCore}
}

// IsSharedResource reports whether name is one of SharedResources.
func IsSharedResource(name corev1.ResourceName) bool {
	return name == ResourceGPUMemory || name == ResourceGPUCore
}

// IsTesseraResource reports whether name is one of the resources in
// Resources or a MIG resource (IsMIGResource).
func IsTesseraResource(name corev1.ResourceName) bool {
	switch name {
	case ResourceGPU, ResourceGPUMemory, ResourceGPUCore:
		return true
	}
	return IsMIGResource(name)
}

// Environment of kubectl-tessera: defaults of its --extender and
// --extender-ca flags, for clusters whose extender the API server's
// service proxy does not reach (make demo prints them).
const (
	EnvKubectlExtender   = "TESSERA_EXTENDER"
	EnvKubectlExtenderCA = "TESSERA_EXTENDER_CA"
)
