// Package nri is the node agent's NRI plugin: it sees every container the
// runtime creates together with its pod, so it knows which pod a GPU serves
// without guessing (the kubelet's Allocate call does not say).
//
// The package is split in two:
//
//   - Decide is a pure function from what the runtime and the kubelet say of
//     a container (Request), the node's state (Node: GPUs, health, the
//     ledger of who uses what) and static Options to a Decision: the plain
//     data adjustment of the container (devices, cgroup device rules, env,
//     mounts, cpuset) and the ledger entry to record, or a *DecisionError
//     naming the pod, the GPU and the reason.
//   - Plugin translates NRI events (containerd/nri pkg/stub) to Decide and
//     Decisions back to NRI adjustments, keeps the Ledger (checkpointed to
//     disk), drives the MPS daemons through MPSController, records locally
//     placed assignments, and reconnects when the runtime restarts.
package nri

import (
	"fmt"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/topology"
)

// GPU is what the plugin knows of one GPU of the node.
type GPU struct {
	Index int
	UUID  string
	// Minor is the minor number of /dev/nvidia<Minor>.
	Minor int
	// NUMANode is -1 when the platform does not report one.
	NUMANode  int
	MemoryMiB uint64
	// MIG lists the GPU's MIG instances when it is in MIG mode (MIGMode);
	// such a GPU is never used whole or shared, only as its instances.
	MIGMode bool
	MIG     []MIGInstance
}

// MIGInstance is one MIG instance of a GPU in MIG mode.
type MIGInstance struct {
	UUID    string
	Profile string
	// Start and Size are its placement in the GPU's memory slices.
	Start, Size int
	// GPUInstanceID and ComputeInstanceID are NVML's IDs of the instance:
	// they name its nvidia-caps access devices (MIGCaps).
	GPUInstanceID, ComputeInstanceID int
}

// Node is the node state a decision is taken on.
type Node struct {
	GPUs      []GPU
	NUMANodes []topology.NUMANode
	// Unhealthy maps the UUIDs of unhealthy GPUs to the reason.
	Unhealthy map[string]string
	// Ledger is every container's recorded GPU use.
	Ledger []Entry
}

// GPU returns the node's GPU with the given UUID.
func (n *Node) GPU(uuid string) (GPU, bool) {
	for _, g := range n.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return GPU{}, false
}

// Pod is what a decision needs of a pod.
type Pod struct {
	Namespace, Name, UID string
	Annotations          map[string]string
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// DeviceNode is a device node in a container.
type DeviceNode struct {
	// Path is the path inside the container, e.g. /dev/nvidia0.
	Path string
	// Type is "c" (character) or "b" (block).
	Type         string
	Major, Minor int64
}

// Container is what a decision needs of the container being created.
type Container struct {
	ID, Name string
	// Env is the container's environment as the runtime would create it
	// (image, pod spec and the device plugin's Allocate response merged).
	Env map[string]string
	// CDIDevices are the fully qualified CDI device names the container
	// already requests (through the CRI, from Allocate).
	CDIDevices []string
	// DeviceNodes are the device nodes already in the container.
	DeviceNodes []DeviceNode
	// MountDestinations are the container paths of its mounts.
	MountDestinations []string
	// Annotations are the container's annotations (OCI spec annotations,
	// which the NVIDIA container runtime reads cdi.k8s.io/ requests from).
	Annotations map[string]string
	// CPUs is the cpuset the kubelet gave the container ("" when none).
	CPUs string
	// ExclusiveCPUs is true when the kubelet's CPU manager pinned the
	// container to CPUs of its own; its cpuset is then left alone.
	ExclusiveCPUs bool
}

// Devices is what the kubelet allocated to a container of Tessera resources.
type Devices struct {
	// Whole are the device IDs (GPU UUIDs) of tessera.dev/gpu.
	Whole []string
	// MemoryUnits and CoreUnits count tessera.dev/gpu-memory and
	// tessera.dev/gpu-core devices.
	MemoryUnits, CoreUnits int
	// MIG are the devices of tessera.dev/mig-<profile> resources: MIG
	// UUIDs with the profile of the resource they were allocated as.
	MIG []MIGDevice
}

// MIGDevice is one MIG instance the kubelet allocated, as the resource of
// profile Profile.
type MIGDevice struct {
	UUID, Profile string
}

// Empty reports whether the container holds no Tessera resource.
func (d Devices) Empty() bool {
	return len(d.Whole) == 0 && d.MemoryUnits == 0 && d.CoreUnits == 0 && len(d.MIG) == 0
}

// Request is one CreateContainer to decide on.
type Request struct {
	Pod       Pod
	Container Container
	// Devices is what the kubelet allocated to the container.
	Devices Devices
}

// Entry is one container's GPU use in the ledger.
type Entry struct {
	PodUID    string `json:"podUID"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	// ContainerID is the runtime's ID of the latest container created
	// under this name; the watchdog maps processes to it.
	ContainerID string `json:"containerID"`
	// GPUs are the container's whole GPUs, by index.
	GPUs []api.GPURef `json:"gpus,omitempty"`
	// Shared is the container's slice of a shared GPU.
	Shared *api.SharedGPU `json:"shared,omitempty"`
	// MIG are the container's MIG instances, by GPU index and placement.
	MIG []api.MIGRef `json:"mig,omitempty"`
}

// Key names an entry: a pod's container by name. A restarted container
// (new runtime ID, same name) replaces the entry of the old one.
type Key struct{ PodUID, Container string }

// Key returns e's key.
func (e Entry) Key() Key { return Key{PodUID: e.PodUID, Container: e.Container} }

func (e Entry) String() string {
	return fmt.Sprintf("%s/%s container %s", e.Namespace, e.Pod, e.Container)
}

// Mount is a bind mount into a container.
type Mount struct {
	Source, Destination string
	Options             []string
}

// CgroupRule is a device cgroup rule; a nil Major or Minor matches all.
type CgroupRule struct {
	Allow  bool
	Type   string
	Major  *int64
	Minor  *int64
	Access string
}

// EnvVar is one environment variable.
type EnvVar struct{ Name, Value string }

// Annotation is one container annotation.
type Annotation struct{ Key, Value string }

// Adjustment is how a container is to be changed, as plain data.
type Adjustment struct {
	// CDIDevices are CDI device names to add.
	CDIDevices []string
	// AddDeviceNodes are device nodes to create in the container.
	AddDeviceNodes []DeviceNode
	// RemoveDeviceNodes are paths of device nodes to take out (other GPUs).
	RemoveDeviceNodes []string
	// CgroupRules are appended to the container's device cgroup rules, in
	// order: they deny every NVIDIA device, then allow the container's.
	CgroupRules []CgroupRule
	Env         []EnvVar
	Mounts      []Mount
	// RemoveMounts are container paths of mounts to take out.
	RemoveMounts []string
	// SetAnnotations are annotations to set (replacing the container's);
	// RemoveAnnotations are keys of annotations to take out.
	SetAnnotations    []Annotation
	RemoveAnnotations []string
	// CPUSetCPUs and CPUSetMems are set when not empty.
	CPUSetCPUs string
	CPUSetMems string
}

// Action is what a Decision tells the plugin to do with a container.
type Action int

const (
	// ActionLeave leaves the container as the runtime creates it: it holds
	// no Tessera resource and the operator leaves such containers alone
	// (nri.nonGPUContainers: leave, or an exempt namespace).
	ActionLeave Action = iota
	// ActionIsolate gives a container that holds Tessera resources exactly
	// its GPUs: the plugin records Entry in the ledger and applies
	// Adjustment.
	ActionIsolate
	// ActionVoid hides every GPU from a container that holds no Tessera
	// resource: the plugin applies Adjustment and records nothing.
	ActionVoid
)

func (a Action) String() string {
	switch a {
	case ActionLeave:
		return "leave"
	case ActionIsolate:
		return "isolate"
	case ActionVoid:
		return "void"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is the outcome of Decide.
type Decision struct {
	// Action is what to do with the container.
	Action Action
	// Entry is the container's use to record in the ledger (ActionIsolate
	// only).
	Entry Entry
	// Adjustment is what the runtime is to change.
	Adjustment Adjustment
	// PlacedLocally is true when the pod carried no extender assignment
	// for the container's shared units and Decide placed them itself; the
	// assignment must then be recorded on the pod.
	PlacedLocally bool
	// Voided lists what of the container's spec asked for GPUs that
	// ActionVoid takes away (an environment variable, a device node, a
	// mount, a CDI request), for the log.
	Voided []string
}

// DecisionError is why a container must not be created.
type DecisionError struct {
	Pod       string // namespace/name
	Container string
	// GPU names the GPU concerned (UUID, or "" when none is).
	GPU    string
	Reason string
	// Code is the request model's refusal behind the decision
	// (gpureq.Code), or empty when the refusal is about the node rather
	// than the request (an unknown or unhealthy GPU, a malformed
	// annotation, the kubelet and the annotation disagreeing on whole GPUs).
	Code gpureq.Code
}

func (e *DecisionError) Error() string {
	if e.GPU == "" {
		return fmt.Sprintf("tessera: refusing to create container %q of pod %s: %s", e.Container, e.Pod, e.Reason)
	}
	return fmt.Sprintf("tessera: refusing to create container %q of pod %s: GPU %s: %s", e.Container, e.Pod, e.GPU, e.Reason)
}
