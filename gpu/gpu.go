// Package gpu is Tessera's narrow view of the GPU driver. Consumers depend on
// Interface (or on a smaller interface of their own that it satisfies); the
// implementation adapts any go-nvml nvml.Interface, so the real driver and the
// mock machines of package nvmlmock run through the same code.
package gpu

import (
	"context"
	"errors"
	"fmt"
)

// Interface is what Tessera needs from NVML.
type Interface interface {
	// Init loads the driver library and initialises NVML.
	Init() error
	// Shutdown releases NVML.
	Shutdown() error
	// DriverVersion is the kernel driver's version string.
	DriverVersion() (string, error)
	// DeviceCount is the number of GPUs NVML enumerates, lost ones included.
	DeviceCount() (int, error)
	// Device returns the static facts of the GPU at an NVML index. A GPU
	// that fell off the bus yields an error matching ErrGPULost.
	Device(index int) (DeviceInfo, error)
	// NVLinks lists the GPU's active NVLinks and what each one reaches.
	NVLinks(index int) ([]NVLink, error)
	// CommonAncestor is the closest PCIe topology level two GPUs share.
	CommonAncestor(a, b int) (PCIeLevel, error)
	// P2PReadSupported reports whether GPU a can read GPU b's memory
	// directly (GPUDirect peer-to-peer), over NVLink or PCIe.
	P2PReadSupported(a, b int) (bool, error)
	// MemoryInfo is the GPU's memory use now.
	MemoryInfo(index int) (Memory, error)
	// Processes lists the compute processes running on the GPU.
	Processes(index int) ([]Process, error)
	// CheckHealth returns nil when NVML can talk to the GPU.
	CheckHealth(index int) error
	// MIG is the GPU's MIG state: whether MIG mode is on, and its MIG
	// instances. A GPU without MIG support is not enabled, no error.
	MIG(index int) (MIGInfo, error)
	// SetMIGLayout repartitions a GPU in MIG mode: it destroys every MIG
	// instance of the GPU (compute instances, then GPU instances) and
	// creates want, each a GPU instance at its placement with one compute
	// instance over all its slices. The caller makes sure no process or
	// container uses the GPU. On an error the GPU has what was done so far:
	// read it again with MIG.
	SetMIGLayout(index int, want []MIGSpec) error
	// WatchXIDs delivers the XID errors of every GPU to out until ctx ends.
	// It returns ctx's error when ctx ends, or an error when the event set
	// cannot be created or waited on.
	WatchXIDs(ctx context.Context, out chan<- XIDEvent) error
}

// DeviceInfo holds the static facts of one GPU.
type DeviceInfo struct {
	Index int
	UUID  string
	// Model is NVML's product name, e.g. "NVIDIA A100-SXM4-40GB".
	Model string
	// MemoryMiB is the GPU's total memory.
	MemoryMiB uint64
	// PCIBusID is the PCI address in sysfs form, "0000:07:00.0".
	PCIBusID string
	// Minor is the minor number of /dev/nvidiaN.
	Minor int
}

// NVLinkRemote is what the far end of an NVLink is.
type NVLinkRemote int

// Far ends of an NVLink.
const (
	RemoteUnknown NVLinkRemote = iota
	RemoteGPU
	RemoteSwitch
	RemoteCPU
)

func (r NVLinkRemote) String() string {
	switch r {
	case RemoteGPU:
		return "gpu"
	case RemoteSwitch:
		return "nvswitch"
	case RemoteCPU:
		return "cpu"
	}
	return "unknown"
}

// NVLink is one active NVLink of a GPU.
type NVLink struct {
	Link int
	// RemotePCIBusID is the PCI address (sysfs form) of the far end.
	RemotePCIBusID string
	Remote         NVLinkRemote
}

// PCIeLevel is the closest PCIe topology level two GPUs share, from the
// closest (LevelInternal) to the farthest (LevelSystem).
type PCIeLevel int

// PCIe topology levels, as NVML's nvmlGpuTopologyLevel_t.
const (
	LevelInternal     PCIeLevel = iota // same board
	LevelSingleSwitch                  // PIX: one PCIe switch
	LevelMultiSwitch                   // PXB: several PCIe switches
	LevelHostBridge                    // PHB: a PCIe host bridge
	LevelNUMANode                      // NODE: host bridges within one NUMA node
	LevelSystem                        // SYS: across the inter-socket link
)

// String is the `nvidia-smi topo -m` notation of the level.
func (l PCIeLevel) String() string {
	switch l {
	case LevelInternal:
		return "BOARD"
	case LevelSingleSwitch:
		return "PIX"
	case LevelMultiSwitch:
		return "PXB"
	case LevelHostBridge:
		return "PHB"
	case LevelNUMANode:
		return "NODE"
	case LevelSystem:
		return "SYS"
	}
	return fmt.Sprintf("PCIeLevel(%d)", int(l))
}

// Memory is a GPU's memory use in bytes.
type Memory struct {
	Total, Used, Free uint64
}

// Process is a compute process on a GPU.
type Process struct {
	PID uint32
	// UsedMemory is the GPU memory the process holds, in bytes.
	UsedMemory uint64
}

// XIDEvent is one XID error reported by the driver.
type XIDEvent struct {
	// Index and UUID name the GPU; Index is -1 when the driver did not say
	// which GPU (then the event concerns them all).
	Index int
	UUID  string
	XID   uint64
}

// Errors that callers test for with errors.Is.
var (
	// ErrLibraryNotFound: libnvidia-ml.so.1 could not be loaded.
	ErrLibraryNotFound = errors.New("libnvidia-ml.so.1 could not be loaded (is the NVIDIA driver installed and the library on the loader path?)")
	// ErrGPULost: the GPU fell off the bus.
	ErrGPULost = errors.New("GPU is lost (fell off the bus)")
	// ErrNotSupported: the GPU or driver does not support the call.
	ErrNotSupported = errors.New("not supported by this GPU or driver")
	// ErrNotInitialized: the call came before a successful Init.
	ErrNotInitialized = errors.New("NVML is not initialised")
	// ErrNoDevice: no GPU has that index.
	ErrNoDevice = errors.New("no such GPU")
)
