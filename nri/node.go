package nri

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/topology"
)

// DeviceSource gives the static facts of a GPU; gpu.Interface satisfies it.
type DeviceSource interface {
	Device(index int) (gpu.DeviceInfo, error)
}

// GPUsFromTopology lists the node's GPUs for the plugin: the topology's
// GPUs with the minor numbers of their device nodes from src.
func GPUsFromTopology(t *topology.Topology, src DeviceSource) ([]GPU, error) {
	var out []GPU
	for _, g := range t.GPUs {
		info, err := src.Device(g.Index)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", g.Index, err)
		}
		gg := GPU{Index: g.Index, UUID: g.UUID, Minor: info.Minor, NUMANode: g.NUMANode, MemoryMiB: g.MemoryMiB}
		if g.MIG != nil {
			gg.MIGMode = true
			for _, in := range g.MIG.Instances {
				gg.MIG = append(gg.MIG, MIGInstance{UUID: in.UUID, Profile: in.Profile, Start: in.Start, Size: in.Size,
					GPUInstanceID: in.GPUInstanceID, ComputeInstanceID: in.ComputeInstanceID})
			}
		}
		out = append(out, gg)
	}
	return out, nil
}

// UVMMajor reads the major number of the nvidia-uvm character device from
// procRoot/devices (procRoot is /proc on a host). It returns -1 and no error
// when the module is not loaded.
func UVMMajor(procRoot string) (int64, error) {
	return charMajor(procRoot, "nvidia-uvm")
}

// charMajor reads the major number of the named character device from
// procRoot/devices; -1 and no error when it is not listed.
func charMajor(procRoot, name string) (int64, error) {
	f, err := os.Open(filepath.Join(procRoot, "devices"))
	if err != nil {
		return -1, fmt.Errorf("reading device majors: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	inChar := false
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		switch line {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		fields := strings.Fields(line)
		if !inChar || len(fields) != 2 || fields[1] != name {
			continue
		}
		m, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return -1, fmt.Errorf("%s: bad major %q for %s", f.Name(), fields[0], name)
		}
		return m, nil
	}
	if err := s.Err(); err != nil {
		return -1, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return -1, nil
}

// KubeletAllocations implements Allocations over a kubeletstate.Source (the
// kubelet's PodResources API, or its device manager checkpoint), read on
// every call: the kubelet records a container's devices at admission, before
// the runtime creates it.
type KubeletAllocations struct {
	Source kubeletstate.Source
	// InitContainers (optional, the device manager's checkpoint) is asked
	// about a container Source lists no device for: the PodResources API
	// leaves out regular (non-sidecar) init containers, which the kubelet
	// does allocate devices to. Without it such a container is taken to
	// hold none, and sees no GPU.
	InitContainers kubeletstate.Source
}

var _ Allocations = KubeletAllocations{}

// ContainerDevices implements Allocations.
func (k KubeletAllocations) ContainerDevices(ctx context.Context, pod Pod, container string) (Devices, error) {
	allocs, err := k.Source.Allocations(ctx)
	if err != nil {
		return Devices{}, err
	}
	d := containerDevices(allocs, pod, container)
	if d.Empty() && k.InitContainers != nil {
		more, err := k.InitContainers.Allocations(ctx)
		if err != nil {
			return Devices{}, fmt.Errorf("the kubelet lists no device for the container and its checkpoint cannot be read: %w", err)
		}
		// The checkpoint names pods by UID only: match on it.
		d = containerDevices(more, Pod{UID: pod.UID}, container)
	}
	return d, nil
}

// containerDevices sums the Tessera devices allocs give container of pod.
func containerDevices(allocs []kubeletstate.ContainerDevices, pod Pod, container string) Devices {
	var d Devices
	for _, a := range allocs {
		if a.Container != container {
			continue
		}
		samePod := (a.Namespace != "" && a.Namespace == pod.Namespace && a.Name == pod.Name) || (a.PodUID != "" && a.PodUID == pod.UID)
		if !samePod {
			continue
		}
		switch a.Resource {
		case api.ResourceGPU:
			d.Whole = append(d.Whole, a.DeviceIDs...)
		case api.ResourceGPUMemory:
			d.MemoryUnits += len(a.DeviceIDs)
		case api.ResourceGPUCore:
			d.CoreUnits += len(a.DeviceIDs)
		default:
			if profile, ok := api.MIGProfileOf(a.Resource); ok {
				for _, id := range a.DeviceIDs {
					d.MIG = append(d.MIG, MIGDevice{UUID: id, Profile: profile})
				}
			}
		}
	}
	return d
}

// DefaultCPUManagerState is the kubelet's CPU manager checkpoint.
const DefaultCPUManagerState = "/var/lib/kubelet/cpu_manager_state"

// CPUManagerState implements CPUAssignments from the kubelet's CPU manager
// checkpoint: with the static policy, a container with exclusive CPUs has an
// entry of its own. A missing file means no exclusive CPUs (policy none).
type CPUManagerState struct {
	Path string
}

var _ CPUAssignments = CPUManagerState{}

type cpuManagerCheckpoint struct {
	PolicyName    string                       `json:"policyName"`
	DefaultCPUSet string                       `json:"defaultCpuSet"`
	Entries       map[string]map[string]string `json:"entries,omitempty"`
}

// HasExclusiveCPUs implements CPUAssignments.
func (s CPUManagerState) HasExclusiveCPUs(podUID, container string) (bool, error) {
	b, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the kubelet's CPU manager state: %w", err)
	}
	var c cpuManagerCheckpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return false, fmt.Errorf("kubelet CPU manager state %s: %w", s.Path, err)
	}
	if c.PolicyName != "static" {
		return false, nil
	}
	cpus, ok := c.Entries[podUID][container]
	return ok && cpus != "", nil
}
