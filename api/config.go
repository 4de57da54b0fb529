package api

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// KindNodeAgentConfig is the kind of the node agent's configuration file.
const KindNodeAgentConfig = "NodeAgentConfig"

// Device list strategies: how Allocate tells the container runtime which
// GPUs a container gets. See NodeAgentConfig.DeviceListStrategy.
const (
	// DeviceListCDICRI names CDI devices in the CRI's CDIDevices field
	// (containerd 1.7+, CRI-O 1.23+).
	DeviceListCDICRI = "cdi-cri"
	// DeviceListCDIAnnotations names CDI devices in a cdi.k8s.io/
	// container annotation.
	DeviceListCDIAnnotations = "cdi-annotations"
	// DeviceListEnvvar sets NVIDIA_VISIBLE_DEVICES to the GPU UUIDs, for
	// the NVIDIA container runtime in legacy mode.
	DeviceListEnvvar = "envvar"
	// DeviceListVolumeMounts passes the GPU UUIDs as volume mounts under
	// /var/run/nvidia-container-devices, which an image cannot override
	// (the NVIDIA container runtime's accept-nvidia-visible-devices-as-
	// volume-mounts mode).
	DeviceListVolumeMounts = "volume-mounts"
)

// CDI device naming: what follows "=" in a CDI device name.
const (
	// CDINameUUID names a GPU by UUID: nvidia.com/gpu=GPU-....
	CDINameUUID = "uuid"
	// CDINameIndex names a GPU by NVML index: nvidia.com/gpu=0.
	CDINameIndex = "index"
)

// What the NRI plugin does with a container the kubelet allocated no Tessera
// resource to. See NRIConfig.NonGPUContainers.
const (
	// NonGPUContainersVoid hides every GPU from it: NVIDIA_VISIBLE_DEVICES
	// is set to void, NVIDIA device nodes are removed and the device
	// cgroup denies them, whatever its image or pod spec asks for.
	NonGPUContainersVoid = "void"
	// NonGPUContainersLeave leaves it as the runtime creates it: a pod
	// with NVIDIA_VISIBLE_DEVICES=all then sees every GPU of the node
	// through the NVIDIA container runtime.
	NonGPUContainersLeave = "leave"
)

// NRIConfig configures the node agent's NRI plugin.
type NRIConfig struct {
	// NonGPUContainers is what the plugin does with a container that holds
	// no Tessera resource (a pod without GPU requests, or a container of a
	// GPU pod that requests none): void (default) or leave.
	NonGPUContainers string `json:"nonGPUContainers,omitempty"`
	// NonGPUExemptNamespaces are namespaces whose containers without a
	// Tessera resource are left alone even when NonGPUContainers is void:
	// for node-wide GPU monitoring (DCGM exporter, GPU feature discovery)
	// that must see every GPU. Whoever may create pods in them may use
	// every GPU of the node.
	NonGPUExemptNamespaces []string `json:"nonGPUExemptNamespaces,omitempty"`
}

// DefaultIgnoredXIDs are the XID errors an application causes (a bad memory
// access, a program exception, a reset channel): they say nothing about the
// GPU's health and are ignored unless configured otherwise.
var defaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// DefaultIgnoredXIDs returns the XIDs ignored by default: 13, 31, 43, 45, 68,
// 109.
func DefaultIgnoredXIDs() []uint64 { return append([]uint64(nil), defaultIgnoredXIDs...) }

// Defaults of NodeAgentConfig.
const (
	DefaultCDIKind             = "nvidia.com/gpu"
	DefaultHealthCheckInterval = 30 * time.Second
	DefaultXIDRecoveryDelay    = 5 * time.Minute
	DefaultKubeletSyncInterval = 2 * time.Second
	DefaultAllocationGrace     = 2 * time.Minute
)

// NodeAgentConfig configures the node agent (tessera-node). It is read from
// the file given by --config (YAML or JSON); command-line flags override its
// fields. Every field is optional; Default fills in what is missing.
type NodeAgentConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// Resources lists the extended resources to advertise; empty means all
	// three (tessera.dev/gpu, tessera.dev/gpu-memory, tessera.dev/gpu-core).
	Resources []corev1.ResourceName `json:"resources,omitempty"`
	// MemoryUnitMiB is the size of one tessera.dev/gpu-memory device
	// (default 1024: one GiB).
	MemoryUnitMiB uint64 `json:"memoryUnitMiB,omitempty"`
	// MemoryReserveMiB is kept back on every GPU and not advertised as
	// memory units (for the CUDA context, the driver, monitoring).
	MemoryReserveMiB uint64 `json:"memoryReserveMiB,omitempty"`
	// IgnoredXIDs are XID errors that do not make a GPU unhealthy. Absent
	// (or null), DefaultIgnoredXIDs; an empty list ignores none, and is
	// encoded as one (no omitempty).
	IgnoredXIDs []uint64 `json:"ignoredXIDs"`
	// DeviceListStrategy lists how Allocate passes whole GPUs to the
	// runtime: any of cdi-cri, cdi-annotations, envvar, volume-mounts
	// (default [cdi-cri]).
	DeviceListStrategy []string `json:"deviceListStrategy,omitempty"`
	// CDIKind is the vendor/class of CDI device names (default
	// nvidia.com/gpu, as nvidia-ctk cdi generate writes them).
	CDIKind string `json:"cdiKind,omitempty"`
	// CDIDeviceName is uuid (default) or index: how a GPU is named after
	// the "=" of a CDI device name.
	CDIDeviceName string `json:"cdiDeviceName,omitempty"`
	// HealthCheckInterval is how often every GPU is re-checked through NVML
	// (default 30s).
	HealthCheckInterval *metav1.Duration `json:"healthCheckInterval,omitempty"`
	// XIDRecoveryDelay is how long a GPU stays unhealthy after a critical
	// XID before a sound health check may mark it healthy again
	// (default 5m).
	XIDRecoveryDelay *metav1.Duration `json:"xidRecoveryDelay,omitempty"`
	// KubeletSyncInterval is how often the agent re-reads from the kubelet
	// which devices are allocated, beside reacting to the kubelet's
	// checkpoint file changing (default 2s).
	KubeletSyncInterval *metav1.Duration `json:"kubeletSyncInterval,omitempty"`
	// AllocationGrace is how long a device the agent allocated counts as in
	// use before the kubelet reports it (default 2m).
	AllocationGrace *metav1.Duration `json:"allocationGrace,omitempty"`
	// NRI configures the NRI plugin.
	NRI NRIConfig `json:"nri"`
}

// LoadNodeAgentConfig decodes and validates a configuration file's content.
// Unknown fields are errors; every error names the source and the field.
// Defaults are filled in.
func LoadNodeAgentConfig(data []byte, source string) (*NodeAgentConfig, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("node agent config %s: empty file", source)
	}
	var c NodeAgentConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("node agent config %s: %w", source, err)
	}
	if c.APIVersion != Version {
		return nil, fmt.Errorf("node agent config %s: apiVersion: must be %q, got %q", source, Version, c.APIVersion)
	}
	if c.Kind != KindNodeAgentConfig {
		return nil, fmt.Errorf("node agent config %s: kind: must be %q, got %q", source, KindNodeAgentConfig, c.Kind)
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("node agent config %s: %w", source, err)
	}
	return &c, nil
}

// NewNodeAgentConfig returns the default configuration.
func NewNodeAgentConfig() *NodeAgentConfig {
	c := &NodeAgentConfig{APIVersion: Version, Kind: KindNodeAgentConfig}
	c.Default()
	return c
}

// Default fills in every field left empty.
func (c *NodeAgentConfig) Default() {
	if c.APIVersion == "" {
		c.APIVersion = Version
	}
	if c.Kind == "" {
		c.Kind = KindNodeAgentConfig
	}
	if len(c.Resources) == 0 {
		c.Resources = Resources()
	}
	// No exempt namespace, written [] or left out, is one value (found by
	// FuzzLoadNodeAgentConfig: [] did not survive a round trip).
	if len(c.NRI.NonGPUExemptNamespaces) == 0 {
		c.NRI.NonGPUExemptNamespaces = nil
	}
	if c.MemoryUnitMiB == 0 {
		c.MemoryUnitMiB = DefaultMemoryUnitMiB
	}
	if c.IgnoredXIDs == nil {
		c.IgnoredXIDs = DefaultIgnoredXIDs()
	}
	if len(c.DeviceListStrategy) == 0 {
		c.DeviceListStrategy = []string{DeviceListCDICRI}
	}
	if c.CDIKind == "" {
		c.CDIKind = DefaultCDIKind
	}
	if c.CDIDeviceName == "" {
		c.CDIDeviceName = CDINameUUID
	}
	setDuration(&c.HealthCheckInterval, DefaultHealthCheckInterval)
	setDuration(&c.XIDRecoveryDelay, DefaultXIDRecoveryDelay)
	setDuration(&c.KubeletSyncInterval, DefaultKubeletSyncInterval)
	setDuration(&c.AllocationGrace, DefaultAllocationGrace)
	if c.NRI.NonGPUContainers == "" {
		c.NRI.NonGPUContainers = NonGPUContainersVoid
	}
}

func setDuration(d **metav1.Duration, def time.Duration) {
	if *d == nil {
		*d = &metav1.Duration{Duration: def}
	}
}

// Validate checks a defaulted configuration and names the first offending
// field.
func (c *NodeAgentConfig) Validate() error {
	seen := map[corev1.ResourceName]bool{}
	for i, r := range c.Resources {
		if !IsTesseraResource(r) {
			return fmt.Errorf("resources[%d]: %q is not one of %s", i, r, joinResources(Resources()))
		}
		if seen[r] {
			return fmt.Errorf("resources[%d]: %q is listed twice", i, r)
		}
		seen[r] = true
	}
	if c.MemoryUnitMiB == 0 {
		return fmt.Errorf("memoryUnitMiB: must be greater than 0")
	}
	strategies := map[string]bool{}
	for i, s := range c.DeviceListStrategy {
		switch s {
		case DeviceListCDICRI, DeviceListCDIAnnotations, DeviceListEnvvar, DeviceListVolumeMounts:
		default:
			return fmt.Errorf("deviceListStrategy[%d]: %q is not one of %s, %s, %s, %s", i, s, DeviceListCDICRI, DeviceListCDIAnnotations, DeviceListEnvvar, DeviceListVolumeMounts)
		}
		if strategies[s] {
			return fmt.Errorf("deviceListStrategy[%d]: %q is listed twice", i, s)
		}
		strategies[s] = true
	}
	if len(c.DeviceListStrategy) == 0 {
		return fmt.Errorf("deviceListStrategy: must name at least one strategy")
	}
	if strategies[DeviceListEnvvar] && strategies[DeviceListVolumeMounts] {
		return fmt.Errorf("deviceListStrategy: %s and %s both set NVIDIA_VISIBLE_DEVICES; choose one", DeviceListEnvvar, DeviceListVolumeMounts)
	}
	if vendor, class, ok := strings.Cut(c.CDIKind, "/"); !ok || vendor == "" || class == "" || strings.ContainsAny(c.CDIKind, "=, ") {
		return fmt.Errorf("cdiKind: %q is not a CDI kind like nvidia.com/gpu", c.CDIKind)
	}
	if c.CDIDeviceName != CDINameUUID && c.CDIDeviceName != CDINameIndex {
		return fmt.Errorf("cdiDeviceName: must be %q or %q, got %q", CDINameUUID, CDINameIndex, c.CDIDeviceName)
	}
	for _, d := range []struct {
		field string
		value *metav1.Duration
	}{
		{"healthCheckInterval", c.HealthCheckInterval},
		{"xidRecoveryDelay", c.XIDRecoveryDelay},
		{"kubeletSyncInterval", c.KubeletSyncInterval},
		{"allocationGrace", c.AllocationGrace},
	} {
		if d.value == nil || d.value.Duration <= 0 {
			return fmt.Errorf("%s: must be a positive duration", d.field)
		}
	}
	return c.NRI.validate()
}

func (n *NRIConfig) validate() error {
	if n.NonGPUContainers != NonGPUContainersVoid && n.NonGPUContainers != NonGPUContainersLeave {
		return fmt.Errorf("nri.nonGPUContainers: must be %q (hide every GPU from containers without a Tessera resource) or %q (leave them as their spec says), got %q", NonGPUContainersVoid, NonGPUContainersLeave, n.NonGPUContainers)
	}
	seen := map[string]bool{}
	for i, ns := range n.NonGPUExemptNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("nri.nonGPUExemptNamespaces[%d]: %q is not a namespace name: %s", i, ns, strings.Join(errs, "; "))
		}
		if seen[ns] {
			return fmt.Errorf("nri.nonGPUExemptNamespaces[%d]: %q is listed twice", i, ns)
		}
		seen[ns] = true
	}
	return nil
}

// ResourceEnabled reports whether the configuration advertises resource r.
func (c *NodeAgentConfig) ResourceEnabled(r corev1.ResourceName) bool {
	for _, x := range c.Resources {
		if x == r {
			return true
		}
	}
	return false
}

// HasStrategy reports whether the device list strategy includes s.
// CDIName is the fully qualified CDI name of a GPU: kind=UUID, or
// kind=index when by is CDINameIndex.
func CDIName(kind, by, uuid string, index int) string {
	if by == CDINameIndex {
		return kind + "=" + strconv.Itoa(index)
	}
	return kind + "=" + uuid
}

// UsesCDI reports whether Allocate names GPUs by CDI (cdi-cri or
// cdi-annotations), so the node's CDI specs must define them.
func (c *NodeAgentConfig) UsesCDI() bool {
	return c.HasStrategy(DeviceListCDICRI) || c.HasStrategy(DeviceListCDIAnnotations)
}

func (c *NodeAgentConfig) HasStrategy(s string) bool {
	for _, x := range c.DeviceListStrategy {
		if x == s {
			return true
		}
	}
	return false
}

func joinResources(rs []corev1.ResourceName) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}
