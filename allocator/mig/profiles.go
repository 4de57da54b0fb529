// Package mig is the pure placement core of MIG (Multi-Instance GPU): the
// profile table of each MIG-capable GPU model, a GPU's layout of
// instances, where a profile can be placed on it, and which of those
// placements to take (first fit, or the one that leaves the most useful
// profiles placeable, in the spirit of FGD). It does no I/O and knows no
// Kubernetes types; placements are api.MIGPlacement.
package mig

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// ComputeSlices is the number of compute slices (GPCs) of a GPU in MIG
// mode: a profile "<c>g.<m>gb" has c of them.
const ComputeSlices = 7

// Profile is one GPU instance profile of a GPU model.
type Profile struct {
	// Name is NVIDIA's name, e.g. "1g.5gb" (api.ValidMIGProfile holds).
	Name string
	// Compute is the number of compute slices, of ComputeSlices.
	Compute int
	// Size is the number of memory slices an instance occupies, of
	// api.MIGSlices.
	Size int
	// Starts are the memory slices an instance may start at, ascending.
	Starts []int
	// MemoryMiB is the memory the name promises (its GB read as GiB).
	// NVML reports a little less usable memory (e.g. 4864 MiB for the
	// A100-SXM4-40GB's 1g.5gb, as go-nvml's dgxa100 mock has it).
	MemoryMiB int64
}

// Model is a MIG-capable GPU model and its profiles.
type Model struct {
	// Name is the model as NVML names it without the "NVIDIA " prefix,
	// e.g. "A100-SXM4-40GB".
	Name string
	// Aliases are other names Lookup accepts (e.g. the PCIe product).
	Aliases []string
	// Profiles are ordered from the smallest (fewest memory slices, then
	// fewest compute slices) to the largest.
	Profiles []Profile

	placeable [][1 << api.MIGSlices]bool // per profile, per free mask: see Placeable
}

// The profile tables. The geometry (compute slices, memory slices, and the
// placements nvidia-smi mig -lgipp lists) is that of NVIDIA's MIG user
// guide, "Supported MIG Profiles"
// (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
// on the A100 and H100, a 1-memory-slice 1g profile starts at 0..6, the
// 2-slice 1g (1g.10gb on A100-40GB) at 0, 2, 4, 6, 2g at 0, 2, 4, 3g
// (4 memory slices) at 0, 4, 4g at 0 and 7g (all 8) at 0. The same
// placements appear in go-nvml's dgxa100 mock (mig-profile.go,
// GpuInstancePossiblePlacements) and in an `nvidia-smi mig -lgipp` of an
// A100 80GB ({0,1,2,3,4,5,6}:1, {0,2,4,6}:2, {0,2,4}:2, {0,4}:4, {0}:4,
// {0}:8). The guide says the A100-80GB's names follow the memory
// proportion (1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb); the
// H100 80GB's -lgip lists those same names (1g.10gb 9.75 GiB, ..., 7g.80gb
// 79.25 GiB). The H100 NVL (94 GB) and H200 (141 GB) have the Hopper
// geometry with their own memory in the names; those names were taken from
// MIG configurations written for these GPUs (GPU-operator style
// "all-1g.18gb" ... "all-7g.141gb" lists, with 7/4/3/2/1/1 instances per
// profile), not from NVIDIA's guide itself. The "+me" (media extension)
// and "+gfx" profiles are left out: a resource name cannot hold "+"
// (api.ValidMIGProfile). B200 is left out: its names (1g.23gb ...
// 7g.180gb) appear only in such secondary sources here. A30 (4 memory
// slices) is left out: api.MIGSlices is 8.
var models = []*Model{
	newModel("A100-SXM4-40GB", []string{"A100-PCIE-40GB", "A100-40GB"}, "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
	newModel("A100-SXM4-80GB", []string{"A100-80GB-PCIe", "A100-80GB", "A800-80GB"}, "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
	newModel("H100-80GB-HBM3", []string{"H100-SXM5-80GB", "H100-PCIe", "H100-80GB", "H800-80GB"}, "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
	newModel("H100-NVL", []string{"H100-94GB"}, "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
	newModel("H200", []string{"H200-141GB", "H200-NVL"}, "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}

// newModel builds a model of the A100/H100 geometry from its six profile
// names, in the order: 1g with one memory slice, 1g with two, 2g, 3g, 4g,
// 7g.
func newModel(name string, aliases []string, p1, p1x2, p2, p3, p4, p7 string) *Model {
	geom := []struct {
		name          string
		compute, size int
		starts        []int
	}{
		{p1, 1, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{p1x2, 1, 2, []int{0, 2, 4, 6}},
		{p2, 2, 2, []int{0, 2, 4}},
		{p3, 3, 4, []int{0, 4}},
		{p4, 4, 4, []int{0}},
		{p7, 7, 8, []int{0}},
	}
	m := &Model{Name: name, Aliases: aliases}
	for _, g := range geom {
		c, gb, err := ParseProfile(g.name)
		if err != nil || c != g.compute {
			panic(fmt.Sprintf("mig: model %s: bad profile %q (%v)", name, g.name, err))
		}
		m.Profiles = append(m.Profiles, Profile{Name: g.name, Compute: g.compute, Size: g.size, Starts: g.starts, MemoryMiB: int64(gb) * 1024})
	}
	sort.SliceStable(m.Profiles, func(i, j int) bool {
		a, b := m.Profiles[i], m.Profiles[j]
		if a.Size != b.Size {
			return a.Size < b.Size
		}
		return a.Compute < b.Compute
	})
	m.placeable = make([][1 << api.MIGSlices]bool, len(m.Profiles))
	for pi, p := range m.Profiles {
		for free := 0; free < 1<<api.MIGSlices; free++ {
			for _, s := range p.Starts {
				if uint8(free)&span(s, p.Size) == span(s, p.Size) {
					m.placeable[pi][free] = true
					break
				}
			}
		}
	}
	return m
}

// span is the mask of memory slices [start, start+size).
func span(start, size int) uint8 { return uint8((1<<size - 1) << start) }

// Lookup finds a model by name, alias or NVML product name ("NVIDIA
// A100-SXM4-40GB"), ignoring case, spaces and dashes.
func Lookup(name string) (*Model, bool) {
	key := modelKey(name)
	for _, m := range models {
		if modelKey(m.Name) == key {
			return m, true
		}
		for _, a := range m.Aliases {
			if modelKey(a) == key {
				return m, true
			}
		}
	}
	return nil, false
}

func modelKey(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "nvidia")
	return strings.NewReplacer(" ", "", "-", "", "_", "").Replace(s)
}

// Models lists the models' names.
func Models() []string {
	out := make([]string, len(models))
	for i, m := range models {
		out[i] = m.Name
	}
	return out
}

// Profile returns the model's profile of that name.
func (m *Model) Profile(name string) (Profile, bool) {
	if i := m.profileIndex(name); i >= 0 {
		return m.Profiles[i], true
	}
	return Profile{}, false
}

func (m *Model) profileIndex(name string) int {
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return i
		}
	}
	return -1
}

// Full is the profile that takes the whole GPU (7g).
func (m *Model) Full() Profile { return m.Profiles[len(m.Profiles)-1] }

// Smallest returns the smallest profile of the model (fewest memory slices,
// then fewest compute slices) that covers a sharing request of computeMilli
// thousandths of the GPU's compute and memMiB of its memory:
// Compute/7 >= computeMilli/1000 and MemoryMiB >= memMiB. A request of
// 1000 milli or more gets the full GPU (7g) when its memory fits. ok is
// false when no profile covers the memory, or a value is negative.
func Smallest(m *Model, computeMilli, memMiB int64) (Profile, bool) {
	if m == nil || computeMilli < 0 || memMiB < 0 {
		return Profile{}, false
	}
	if computeMilli > 1000 {
		computeMilli = 1000
	}
	for _, p := range m.Profiles {
		if int64(p.Compute)*1000 >= computeMilli*ComputeSlices && p.MemoryMiB >= memMiB {
			return p, true
		}
	}
	return Profile{}, false
}

// ParseProfile reads a profile name "<c>g.<m>gb" (1 <= c <= 8, 1 <= m <=
// 9999, no leading zero: exactly what api.ValidMIGProfile accepts) into
// its compute slices and memory in GB.
func ParseProfile(name string) (compute, memGB int, err error) {
	if !api.ValidMIGProfile(name) {
		return 0, 0, fmt.Errorf("%q is not a MIG profile like 1g.5gb or 3g.40gb", name)
	}
	c, rest, _ := strings.Cut(name, "g.")
	compute, err = strconv.Atoi(c)
	if err != nil {
		return 0, 0, fmt.Errorf("profile %q: compute slices: %w", name, err)
	}
	memGB, err = strconv.Atoi(strings.TrimSuffix(rest, "gb"))
	if err != nil {
		return 0, 0, fmt.Errorf("profile %q: memory: %w", name, err)
	}
	return compute, memGB, nil
}
