// Package topology models how a node's GPUs are wired: per GPU its NUMA node
// and PCI address, per GPU pair the link between them (NVLinks, NVSwitch, or
// the PCIe path), the NVLink cliques, and the NUMA nodes with their CPUs.
//
// The model is plain data built once from NVML (through the narrow Source
// interface) and sysfs; policies take it as input and never call NVML.
package topology

import (
	"errors"
	"fmt"
	"sort"

	"github.com/tessera-gpu/tessera/gpu"
)

// Source is what the model reads from the GPU driver. gpu.Interface
// satisfies it.
type Source interface {
	DeviceCount() (int, error)
	Device(index int) (gpu.DeviceInfo, error)
	NVLinks(index int) ([]gpu.NVLink, error)
	CommonAncestor(a, b int) (gpu.PCIeLevel, error)
	P2PReadSupported(a, b int) (bool, error)
}

var _ Source = gpu.Interface(nil)

// MIGSource is what the model reads of MIG; gpu.Interface satisfies it. A
// Source that does not implement it has no GPU in MIG mode.
type MIGSource interface {
	MIG(index int) (gpu.MIGInfo, error)
}

var _ MIGSource = gpu.Interface(nil)

// LinkType classifies the connection between two GPUs, best first.
type LinkType string

// Link types.
const (
	LinkSelf LinkType = "self"
	// LinkNVSwitch: both GPUs are on one NVSwitch fabric (all-to-all).
	LinkNVSwitch LinkType = "nvswitch"
	// LinkNVLink: direct NVLinks between the two GPUs.
	LinkNVLink LinkType = "nvlink"
	// LinkPCIeSwitch: one or several PCIe switches, no host bridge (PIX, PXB).
	LinkPCIeSwitch LinkType = "pcie-switch"
	// LinkPCIeHostBridge: through a host bridge within one socket (PHB, NODE).
	LinkPCIeHostBridge LinkType = "pcie-host-bridge"
	// LinkCrossSocket: across the inter-socket link (SYS).
	LinkCrossSocket LinkType = "cross-socket"
)

// Topology is the model of one node.
type Topology struct {
	// GPUs are the GPUs NVML could reach, by index.
	GPUs []GPU `json:"gpus"`
	// Links[i][j] is the link between GPUs[i] and GPUs[j].
	Links [][]Link `json:"links"`
	// NVLinkCliques are the maximal sets of GPU indices in which every pair
	// is NVLink- or NVSwitch-connected, largest first. A GPU without
	// NVLink is a clique of its own.
	NVLinkCliques [][]int `json:"nvlinkCliques"`
	// NUMANodes are the node's NUMA nodes with their CPUs.
	NUMANodes []NUMANode `json:"numaNodes"`
	// LostGPUs are GPUs NVML enumerates but cannot reach (fallen off the
	// bus); they are in no other field.
	LostGPUs []LostGPU `json:"lostGPUs,omitempty"`
}

// GPU is one GPU of the model.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// NUMANode is -1 when the platform does not report one.
	NUMANode int    `json:"numaNode"`
	PCIBusID string `json:"pciBusID"`
	// NVLinks is the number of active NVLinks of the GPU.
	NVLinks int `json:"nvlinks"`
	// NVSwitch is true when the GPU's NVLinks go to an NVSwitch fabric.
	NVSwitch bool `json:"nvswitch,omitempty"`
	// MIG is set when the GPU is in MIG mode: its MIG instances. Such a
	// GPU is served only as its instances, never whole or sliced.
	MIG *MIG `json:"mig,omitempty"`
}

// MIG is the MIG layout of a GPU in MIG mode.
type MIG struct {
	// Instances are ordered by placement start; empty when MIG mode is on
	// and no instance was created.
	Instances []MIGInstance `json:"instances"`
}

// MIGInstance is one MIG device (a GPU instance with its compute
// instance).
type MIGInstance struct {
	UUID string `json:"uuid"`
	// Profile is NVIDIA's name, e.g. "1g.5gb".
	Profile string `json:"profile"`
	// Start and Size are the placement in the GPU's memory slices.
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// GPUInstanceID and ComputeInstanceID are NVML's IDs of the instance
	// (they name its nvidia-caps access devices).
	GPUInstanceID     int `json:"gpuInstanceID"`
	ComputeInstanceID int `json:"computeInstanceID"`
}

// Link is the connection between two GPUs.
type Link struct {
	Type LinkType `json:"type"`
	// NVLinks is the number of NVLinks between the two GPUs; for NVSwitch,
	// the fewer of the two GPUs' links into the fabric.
	NVLinks int `json:"nvlinks"`
	// PCIe is the PCIe path in `nvidia-smi topo -m` notation (PIX, PXB,
	// PHB, NODE, SYS); empty for self.
	PCIe string `json:"pcie,omitempty"`
	// P2P is true when the GPUs can read each other's memory directly
	// (GPUDirect peer-to-peer, both directions); false for self.
	P2P bool `json:"p2p"`
}

// NUMANode is a NUMA node and its CPUs as a Linux CPU list.
type NUMANode struct {
	ID   int    `json:"id"`
	CPUs string `json:"cpus"`
}

// LostGPU is a GPU that could not be reached, with NVML's error.
type LostGPU struct {
	Index int    `json:"index"`
	Error string `json:"error"`
}

// Build reads the model from src and sys. A GPU that fell off the bus is
// listed in LostGPUs and the model is built from the others; any other
// failure is an error.
func Build(src Source, sys Sysfs) (*Topology, error) {
	n, err := src.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("counting GPUs: %w", err)
	}
	t := &Topology{GPUs: []GPU{}, Links: [][]Link{}, NVLinkCliques: [][]int{}}
	var nvlinks [][]gpu.NVLink
	for i := 0; i < n; i++ {
		info, err := src.Device(i)
		if errors.Is(err, gpu.ErrGPULost) {
			t.LostGPUs = append(t.LostGPUs, LostGPU{Index: i, Error: err.Error()})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading GPU %d: %w", i, err)
		}
		links, err := src.NVLinks(i)
		if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			return nil, fmt.Errorf("reading NVLinks of GPU %d: %w", i, err)
		}
		mig, err := readMIG(src, i)
		if errors.Is(err, gpu.ErrGPULost) {
			t.LostGPUs = append(t.LostGPUs, LostGPU{Index: i, Error: err.Error()})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the MIG layout of GPU %d: %w", i, err)
		}
		numa, err := sys.NUMANodeOfPCI(info.PCIBusID)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		g := GPU{
			Index:     info.Index,
			UUID:      info.UUID,
			Model:     info.Model,
			MemoryMiB: info.MemoryMiB,
			NUMANode:  numa,
			PCIBusID:  info.PCIBusID,
			NVLinks:   len(links),
			MIG:       mig,
		}
		for _, l := range links {
			if l.Remote == gpu.RemoteSwitch {
				g.NVSwitch = true
			}
		}
		t.GPUs = append(t.GPUs, g)
		nvlinks = append(nvlinks, links)
	}

	if t.Links, err = buildLinks(src, t.GPUs, nvlinks); err != nil {
		return nil, err
	}
	t.NVLinkCliques = cliques(t.GPUs, t.Links)
	nodes, err := sys.NUMANodes()
	if err != nil {
		return nil, err
	}
	t.NUMANodes = append([]NUMANode{}, nodes...)
	return t, nil
}

// readMIG returns GPU i's MIG layout, nil when MIG mode is off, not
// supported, or src cannot say.
func readMIG(src Source, i int) (*MIG, error) {
	ms, ok := src.(MIGSource)
	if !ok {
		return nil, nil
	}
	info, err := ms.MIG(i)
	if errors.Is(err, gpu.ErrNotSupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !info.Enabled {
		return nil, nil
	}
	mig := &MIG{Instances: []MIGInstance{}}
	for _, in := range info.Instances {
		mig.Instances = append(mig.Instances, MIGInstance{UUID: in.UUID, Profile: in.Profile, Start: in.Start, Size: in.Size, MemoryMiB: in.MemoryMiB,
			GPUInstanceID: in.GPUInstanceID, ComputeInstanceID: in.ComputeInstanceID})
	}
	return mig, nil
}

func buildLinks(src Source, gpus []GPU, nvlinks [][]gpu.NVLink) ([][]Link, error) {
	n := len(gpus)
	byBus := map[string]int{}
	for p, g := range gpus {
		byBus[g.PCIBusID] = p
	}
	direct := make([][]int, n)            // direct[p][q]: NVLinks from GPU p to GPU q
	switches := make([]map[string]int, n) // NVSwitch address -> links from GPU p
	for p := range gpus {
		direct[p] = make([]int, n)
		switches[p] = map[string]int{}
		for _, l := range nvlinks[p] {
			switch l.Remote {
			case gpu.RemoteGPU:
				if q, ok := byBus[l.RemotePCIBusID]; ok {
					direct[p][q]++
				}
			case gpu.RemoteSwitch:
				switches[p][l.RemotePCIBusID]++
			}
		}
	}
	links := make([][]Link, n)
	for p := range gpus {
		links[p] = make([]Link, n)
		for q := range gpus {
			if p == q {
				links[p][q] = Link{Type: LinkSelf}
				continue
			}
			level, err := src.CommonAncestor(gpus[p].Index, gpus[q].Index)
			if err != nil {
				return nil, fmt.Errorf("reading the PCIe path between GPUs %d and %d: %w", gpus[p].Index, gpus[q].Index, err)
			}
			ab, err := src.P2PReadSupported(gpus[p].Index, gpus[q].Index)
			if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
				return nil, fmt.Errorf("reading P2P status between GPUs %d and %d: %w", gpus[p].Index, gpus[q].Index, err)
			}
			ba, err := src.P2PReadSupported(gpus[q].Index, gpus[p].Index)
			if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
				return nil, fmt.Errorf("reading P2P status between GPUs %d and %d: %w", gpus[q].Index, gpus[p].Index, err)
			}
			l := Link{Type: pcieLinkType(level), PCIe: level.String(), P2P: ab && ba}
			if fabric := sharedFabricLinks(switches[p], switches[q]); fabric > 0 {
				l.Type, l.NVLinks = LinkNVSwitch, fabric
			} else if c := min(direct[p][q], direct[q][p]); c > 0 {
				l.Type, l.NVLinks = LinkNVLink, c
			}
			links[p][q] = l
		}
	}
	return links, nil
}

// sharedFabricLinks returns, when two GPUs reach at least one NVSwitch in
// common, the fewer of their NVLink counts into the fabric; else 0.
func sharedFabricLinks(a, b map[string]int) int {
	shared := false
	for sw := range a {
		if b[sw] > 0 {
			shared = true
			break
		}
	}
	if !shared {
		return 0
	}
	total := func(m map[string]int) int {
		n := 0
		for _, c := range m {
			n += c
		}
		return n
	}
	return min(total(a), total(b))
}

func pcieLinkType(l gpu.PCIeLevel) LinkType {
	switch l {
	case gpu.LevelInternal, gpu.LevelSingleSwitch, gpu.LevelMultiSwitch:
		return LinkPCIeSwitch
	case gpu.LevelHostBridge, gpu.LevelNUMANode:
		return LinkPCIeHostBridge
	}
	return LinkCrossSocket
}

// NVLinked reports whether a link carries NVLink traffic.
func (l Link) NVLinked() bool { return l.Type == LinkNVLink || l.Type == LinkNVSwitch }

// cliques returns the maximal NVLink cliques (Bron-Kerbosch with pivoting) as
// sorted GPU indices, largest first, then in index order.
func cliques(gpus []GPU, links [][]Link) [][]int {
	n := len(gpus)
	if n == 0 {
		return [][]int{}
	}
	adj := make([]map[int]bool, n)
	for p := range gpus {
		adj[p] = map[int]bool{}
		for q := range gpus {
			if p != q && links[p][q].NVLinked() {
				adj[p][q] = true
			}
		}
	}
	var out [][]int
	var bk func(r []int, p, x map[int]bool)
	bk = func(r []int, p, x map[int]bool) {
		if len(p) == 0 && len(x) == 0 {
			c := make([]int, len(r))
			for i, pos := range r {
				c[i] = gpus[pos].Index
			}
			sort.Ints(c)
			out = append(out, c)
			return
		}
		pivot, best := -1, -1
		for _, set := range []map[int]bool{p, x} {
			for u := range set {
				deg := 0
				for v := range p {
					if adj[u][v] {
						deg++
					}
				}
				if deg > best {
					pivot, best = u, deg
				}
			}
		}
		for _, v := range sortedKeys(p) {
			if adj[pivot][v] {
				continue
			}
			np, nx := map[int]bool{}, map[int]bool{}
			for w := range p {
				if adj[v][w] {
					np[w] = true
				}
			}
			for w := range x {
				if adj[v][w] {
					nx[w] = true
				}
			}
			bk(append(append([]int{}, r...), v), np, nx)
			delete(p, v)
			x[v] = true
		}
	}
	all := map[int]bool{}
	for p := range gpus {
		all[p] = true
	}
	bk(nil, all, map[int]bool{})
	sort.Slice(out, func(i, j int) bool {
		if len(out[i]) != len(out[j]) {
			return len(out[i]) > len(out[j])
		}
		for k := range out[i] {
			if out[i][k] != out[j][k] {
				return out[i][k] < out[j][k]
			}
		}
		return false
	})
	return out
}

func sortedKeys(m map[int]bool) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}
