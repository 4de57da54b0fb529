package api

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"
)

// KindMockMachine is the kind of a MockMachine file.
const KindMockMachine = "MockMachine"

// MockMachine describes a GPU machine for the mock NVML backend
// (`--nvml=mock:PATH`): its GPUs, NUMA nodes and how the GPUs are wired. It is
// written as YAML or JSON; see docs/mock-machines.md.
type MockMachine struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Name identifies the machine; it seeds the GPU UUIDs that are not given.
	Name string `json:"name"`
	// DriverVersion is what NVML reports as the driver version.
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is what NVML reports as the CUDA driver version
	// (e.g. 12040 for 12.4).
	CUDADriverVersion int `json:"cudaDriverVersion,omitempty"`
	// NUMANodes lists the machine's NUMA nodes and their CPUs.
	NUMANodes []MockNUMANode `json:"numaNodes"`
	// GPUs lists the GPUs in NVML index order.
	GPUs []MockGPU `json:"gpus"`
	// NVLinks is the matrix of direct GPU-to-GPU NVLink counts:
	// NVLinks[i][j] links between GPU i and GPU j. It must be symmetric with
	// zeros on the diagonal. Omit it when no GPU has a direct NVLink.
	NVLinks [][]int `json:"nvlinks,omitempty"`
	// NVSwitch connects the GPUs through an NVSwitch fabric.
	NVSwitch *MockNVSwitch `json:"nvswitch,omitempty"`
	// PCIe is the matrix of PCIe paths between GPUs in `nvidia-smi topo -m`
	// notation: X (self), PIX (one PCIe switch), PXB (several PCIe switches),
	// PHB (a PCIe host bridge), NODE (host bridges within one NUMA node), SYS
	// (across the inter-socket link). Omitted, it is derived from the NUMA
	// nodes: NODE within one NUMA node, SYS across.
	PCIe [][]string `json:"pcie,omitempty"`
}

// MockNUMANode is one NUMA node of a MockMachine.
type MockNUMANode struct {
	ID int `json:"id"`
	// CPUs is a Linux CPU list, e.g. "0-63,128-191".
	CPUs string `json:"cpus"`
}

// MockGPU is one GPU of a MockMachine.
type MockGPU struct {
	// UUID is optional; by default it is derived from the machine's name and
	// the GPU's index, so it is stable across runs.
	UUID string `json:"uuid,omitempty"`
	// Model is the product name NVML reports, e.g. "NVIDIA A100-SXM4-40GB".
	Model string `json:"model"`
	// MemoryMiB is the GPU's total memory.
	MemoryMiB uint64 `json:"memoryMiB"`
	// NUMANode is the NUMA node the GPU is attached to; -1 means the
	// platform does not report one (sysfs numa_node holds -1).
	NUMANode int `json:"numaNode"`
	// PCIBusID is the GPU's PCI address, "0000:07:00.0" (domain, bus,
	// device, function).
	PCIBusID string `json:"pciBusID"`
	// MIG, when set, puts the GPU in MIG mode with these instances (static
	// MIG: a GPU instance with one compute instance over all its slices).
	MIG *MockMIG `json:"mig,omitempty"`
}

// MockMIG is the MIG layout of a GPU of a MockMachine.
type MockMIG struct {
	// Instances may be empty: MIG mode on, nothing created yet.
	Instances []MockMIGInstance `json:"instances"`
}

// MockMIGInstance is one MIG instance: its profile and its placement in
// the GPU's memory slices (MIGSlices of them).
type MockMIGInstance struct {
	// Profile is NVIDIA's name, e.g. "1g.5gb" (ValidMIGProfile).
	Profile string `json:"profile"`
	// Start and Size are the placement: slices [Start, Start+Size).
	Start int `json:"start"`
	Size  int `json:"size"`
	// UUID is optional; by default derived from the GPU's UUID and Start.
	UUID string `json:"uuid,omitempty"`
}

// MockNVSwitch is an NVSwitch fabric that connects GPUs all-to-all.
type MockNVSwitch struct {
	// Switches is the number of NVSwitch chips.
	Switches int `json:"switches"`
	// LinksPerGPU is the number of NVLinks each GPU has into the fabric,
	// spread evenly over the switches.
	LinksPerGPU int `json:"linksPerGPU"`
	// GPUs lists the indices of the GPUs on the fabric; empty means all.
	GPUs []int `json:"gpus,omitempty"`
}

// PCIe path levels accepted in MockMachine.PCIe.
const (
	PCIeSelf         = "X"
	PCIeSingleSwitch = "PIX"
	PCIeMultiSwitch  = "PXB"
	PCIeHostBridge   = "PHB"
	PCIeNUMANode     = "NODE"
	PCIeSystem       = "SYS"
)

// MaxNVLinksPerGPU is the most NVLinks one GPU has (NVML's NVLINK_MAX_LINKS).
const MaxNVLinksPerGPU = 18

var (
	pciBusIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
	uuidPattern     = regexp.MustCompile(`^GPU-[0-9a-fA-F-]{8,}$`)
)

// Validate checks a MockMachine and returns an error that names the first
// offending field, e.g. `gpus[3].memoryMiB: must be greater than 0`.
func (m *MockMachine) Validate() error {
	if m.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, m.APIVersion)
	}
	if m.Kind != KindMockMachine {
		return fmt.Errorf("kind: must be %q, got %q", KindMockMachine, m.Kind)
	}
	if strings.TrimSpace(m.Name) == "" {
		return fmt.Errorf("name: must not be empty")
	}
	numa := map[int]bool{}
	for i, n := range m.NUMANodes {
		if n.ID < 0 {
			return fmt.Errorf("numaNodes[%d].id: must be 0 or more, got %d", i, n.ID)
		}
		if numa[n.ID] {
			return fmt.Errorf("numaNodes[%d].id: duplicate NUMA node %d", i, n.ID)
		}
		numa[n.ID] = true
		if err := cpuIDsBounded(n.CPUs); err != nil {
			return fmt.Errorf("numaNodes[%d].cpus: %w", i, err)
		}
		if _, err := cpuset.Parse(n.CPUs); err != nil || n.CPUs == "" {
			return fmt.Errorf("numaNodes[%d].cpus: not a CPU list: %q", i, n.CPUs)
		}
	}
	n := len(m.GPUs)
	if n == 0 {
		return fmt.Errorf("gpus: must list at least one GPU")
	}
	uuids := map[string]int{}
	busIDs := map[string]int{}
	for i, g := range m.GPUs {
		field := fmt.Sprintf("gpus[%d]", i)
		if strings.TrimSpace(g.Model) == "" {
			return fmt.Errorf("%s.model: must not be empty", field)
		}
		if g.MemoryMiB == 0 {
			return fmt.Errorf("%s.memoryMiB: must be greater than 0", field)
		}
		if g.NUMANode < -1 || (g.NUMANode >= 0 && !numa[g.NUMANode]) {
			return fmt.Errorf("%s.numaNode: %d is not one of numaNodes (or -1)", field, g.NUMANode)
		}
		if !pciBusIDPattern.MatchString(g.PCIBusID) {
			return fmt.Errorf("%s.pciBusID: %q is not a PCI address like 0000:07:00.0", field, g.PCIBusID)
		}
		bus := NormalizePCIBusID(g.PCIBusID)
		if j, dup := busIDs[bus]; dup {
			return fmt.Errorf("%s.pciBusID: %q is also gpus[%d]'s", field, g.PCIBusID, j)
		}
		busIDs[bus] = i
		if g.UUID != "" {
			if !uuidPattern.MatchString(g.UUID) {
				return fmt.Errorf("%s.uuid: %q is not a GPU UUID like GPU-<hex>", field, g.UUID)
			}
			if j, dup := uuids[g.UUID]; dup {
				return fmt.Errorf("%s.uuid: %q is also gpus[%d]'s", field, g.UUID, j)
			}
			uuids[g.UUID] = i
		}
		if g.MIG != nil {
			places := make([]MIGPlacement, 0, len(g.MIG.Instances))
			for k, in := range g.MIG.Instances {
				f := fmt.Sprintf("%s.mig.instances[%d]", field, k)
				if err := CheckMIGProfile(f+".profile", in.Profile); err != nil {
					return err
				}
				if in.UUID != "" && !ValidMIGUUID(in.UUID) {
					return fmt.Errorf("%s.uuid: %q is not a MIG UUID like MIG-<hex>", f, in.UUID)
				}
				places = append(places, MIGPlacement{Start: in.Start, Size: in.Size})
			}
			if err := CheckMIGPlacements(field+".mig.instances", places); err != nil {
				return err
			}
		}
	}
	if err := m.validateNVLinks(n); err != nil {
		return err
	}
	if err := m.validateNVSwitch(n); err != nil {
		return err
	}
	return m.validatePCIe(n)
}

func (m *MockMachine) validateNVLinks(n int) error {
	if m.NVLinks == nil {
		return nil
	}
	if len(m.NVLinks) != n {
		return fmt.Errorf("nvlinks: must have %d rows (one per GPU), got %d", n, len(m.NVLinks))
	}
	for i, row := range m.NVLinks {
		if len(row) != n {
			return fmt.Errorf("nvlinks[%d]: must have %d columns, got %d", i, n, len(row))
		}
	}
	for i, row := range m.NVLinks {
		total := 0
		for j, c := range row {
			switch {
			case c < 0:
				return fmt.Errorf("nvlinks[%d][%d]: must be 0 or more, got %d", i, j, c)
			case i == j && c != 0:
				return fmt.Errorf("nvlinks[%d][%d]: a GPU has no NVLink to itself, got %d", i, j, c)
			case m.NVLinks[j][i] != c:
				return fmt.Errorf("nvlinks[%d][%d]: must equal nvlinks[%d][%d] (%d != %d)", i, j, j, i, c, m.NVLinks[j][i])
			case c > MaxNVLinksPerGPU:
				// Checked apart from the total, which would overflow.
				return fmt.Errorf("nvlinks[%d][%d]: %d NVLinks, more than the %d a GPU has", i, j, c, MaxNVLinksPerGPU)
			}
			total += c
		}
		if m.NVSwitch != nil && m.NVSwitch.covers(i) {
			total += m.NVSwitch.LinksPerGPU
		}
		if total > MaxNVLinksPerGPU {
			return fmt.Errorf("nvlinks[%d]: GPU %d would have %d NVLinks, more than %d", i, i, total, MaxNVLinksPerGPU)
		}
	}
	return nil
}

func (m *MockMachine) validateNVSwitch(n int) error {
	s := m.NVSwitch
	if s == nil {
		return nil
	}
	if s.Switches <= 0 {
		return fmt.Errorf("nvswitch.switches: must be greater than 0, got %d", s.Switches)
	}
	if s.LinksPerGPU <= 0 || s.LinksPerGPU > MaxNVLinksPerGPU {
		return fmt.Errorf("nvswitch.linksPerGPU: must be 1..%d, got %d", MaxNVLinksPerGPU, s.LinksPerGPU)
	}
	seen := map[int]bool{}
	for k, g := range s.GPUs {
		if g < 0 || g >= n {
			return fmt.Errorf("nvswitch.gpus[%d]: %d is not a GPU index (0..%d)", k, g, n-1)
		}
		if seen[g] {
			return fmt.Errorf("nvswitch.gpus[%d]: GPU %d is listed twice", k, g)
		}
		seen[g] = true
	}
	return nil
}

func (m *MockMachine) validatePCIe(n int) error {
	if m.PCIe == nil {
		return nil
	}
	if len(m.PCIe) != n {
		return fmt.Errorf("pcie: must have %d rows (one per GPU), got %d", n, len(m.PCIe))
	}
	for i, row := range m.PCIe {
		if len(row) != n {
			return fmt.Errorf("pcie[%d]: must have %d columns, got %d", i, n, len(row))
		}
		for j, level := range row {
			switch {
			case i == j && level != PCIeSelf:
				return fmt.Errorf("pcie[%d][%d]: the diagonal must be %q, got %q", i, j, PCIeSelf, level)
			case i != j && !isPCIeLevel(level):
				return fmt.Errorf("pcie[%d][%d]: %q is not one of PIX, PXB, PHB, NODE, SYS", i, j, level)
			case m.PCIe[j][i] != level:
				return fmt.Errorf("pcie[%d][%d]: must equal pcie[%d][%d] (%q != %q)", i, j, j, i, level, m.PCIe[j][i])
			}
		}
	}
	return nil
}

func isPCIeLevel(s string) bool {
	switch s {
	case PCIeSingleSwitch, PCIeMultiSwitch, PCIeHostBridge, PCIeNUMANode, PCIeSystem:
		return true
	}
	return false
}

// covers reports whether GPU i is on the fabric.
func (s *MockNVSwitch) covers(i int) bool {
	if len(s.GPUs) == 0 {
		return true
	}
	for _, g := range s.GPUs {
		if g == i {
			return true
		}
	}
	return false
}

// Covers reports whether GPU index i is connected to the fabric.
func (s *MockNVSwitch) Covers(i int) bool { return s != nil && s.covers(i) }

// NormalizePCIBusID returns a PCI address in the form sysfs uses: a 4-digit
// lower-case domain, "0000:07:00.0". NVML reports an 8-digit domain
// ("00000000:07:00.0"); both name the same device.
func NormalizePCIBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + rest
}

// MaxMockCPU is the largest CPU number a mock machine may name: cpuset
// expands a range CPU by CPU, so "0-4000000000" would take the memory of
// the process that reads the file.
const MaxMockCPU = 1<<16 - 1

// cpuIDsBounded refuses a CPU list naming a CPU above MaxMockCPU (before
// cpuset expands it).
func cpuIDsBounded(list string) error {
	for _, field := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == '-' }) {
		if len(field) > 6 {
			return fmt.Errorf("CPU %q above %d", field, MaxMockCPU)
		}
		if v, err := strconv.Atoi(strings.TrimSpace(field)); err == nil && v > MaxMockCPU {
			return fmt.Errorf("CPU %d above %d", v, MaxMockCPU)
		}
	}
	return nil
}
