package topology_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// build builds the model of m with m's own sysfs.
func build(t *testing.T, m *nvmlmock.Machine) *topology.Topology {
	t.Helper()
	root := t.TempDir()
	if err := m.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	return buildWithSysfs(t, m, root)
}

func buildWithSysfs(t *testing.T, m *nvmlmock.Machine, root string) *topology.Topology {
	t.Helper()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	topo, err := topology.Build(lib, topology.Sysfs{Root: root})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return topo
}

// linkMatrix renders Links as "type/nvlinks/pcie" strings for compact diffs.
func linkMatrix(topo *topology.Topology) [][]string {
	out := make([][]string, len(topo.Links))
	for i, row := range topo.Links {
		for _, l := range row {
			s := string(l.Type)
			if l.NVLinks > 0 {
				s += "/" + itoa(l.NVLinks)
			}
			if l.PCIe != "" {
				s += "/" + l.PCIe
			}
			out[i] = append(out[i], s)
		}
	}
	return out
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}

func TestProfiles(t *testing.T) {
	const (
		self = "self"
		sw   = "nvswitch/12"
		nv1  = "nvlink/1"
		nv2  = "nvlink/2"
	)
	tests := []struct {
		name        string
		machine     *nvmlmock.Machine
		wantNUMA    []int
		wantBusIDs  []string
		wantCliques [][]int
		wantNodes   []topology.NUMANode
		// want is the expected link matrix; for NVLink types the PCIe level
		// is checked separately by wantPCIe.
		want     [][]string
		wantPCIe [][]string
	}{
		{
			name:        "dgx-a100",
			machine:     nvmlmock.DGXA100(),
			wantNUMA:    []int{0, 0, 0, 0, 1, 1, 1, 1},
			wantBusIDs:  []string{"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"},
			wantCliques: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}},
			wantNodes:   []topology.NUMANode{{ID: 0, CPUs: "0-63,128-191"}, {ID: 1, CPUs: "64-127,192-255"}},
			want: [][]string{
				{self, sw, sw, sw, sw, sw, sw, sw},
				{sw, self, sw, sw, sw, sw, sw, sw},
				{sw, sw, self, sw, sw, sw, sw, sw},
				{sw, sw, sw, self, sw, sw, sw, sw},
				{sw, sw, sw, sw, self, sw, sw, sw},
				{sw, sw, sw, sw, sw, self, sw, sw},
				{sw, sw, sw, sw, sw, sw, self, sw},
				{sw, sw, sw, sw, sw, sw, sw, self},
			},
			wantPCIe: [][]string{
				{"", "PXB", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"},
				{"PXB", "", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"},
				{"NODE", "NODE", "", "PXB", "SYS", "SYS", "SYS", "SYS"},
				{"NODE", "NODE", "PXB", "", "SYS", "SYS", "SYS", "SYS"},
				{"SYS", "SYS", "SYS", "SYS", "", "PXB", "NODE", "NODE"},
				{"SYS", "SYS", "SYS", "SYS", "PXB", "", "NODE", "NODE"},
				{"SYS", "SYS", "SYS", "SYS", "NODE", "NODE", "", "PXB"},
				{"SYS", "SYS", "SYS", "SYS", "NODE", "NODE", "PXB", ""},
			},
		},
		{
			// The DGX-1 hybrid cube-mesh of go-gpuallocator's NewDGX1VoltaNode.
			name:        "dgx-1v",
			machine:     nvmlmock.DGX1V(),
			wantNUMA:    []int{0, 0, 0, 0, 1, 1, 1, 1},
			wantBusIDs:  []string{"0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0", "0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"},
			wantCliques: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}},
			wantNodes:   []topology.NUMANode{{ID: 0, CPUs: "0-19,40-59"}, {ID: 1, CPUs: "20-39,60-79"}},
			want: [][]string{
				{self, nv1, nv1, nv2, nv2, "cross-socket/SYS", "cross-socket/SYS", "cross-socket/SYS"},
				{nv1, self, nv2, nv1, "cross-socket/SYS", nv2, "cross-socket/SYS", "cross-socket/SYS"},
				{nv1, nv2, self, nv2, "cross-socket/SYS", "cross-socket/SYS", nv1, "cross-socket/SYS"},
				{nv2, nv1, nv2, self, "cross-socket/SYS", "cross-socket/SYS", "cross-socket/SYS", nv1},
				{nv2, "cross-socket/SYS", "cross-socket/SYS", "cross-socket/SYS", self, nv1, nv1, nv2},
				{"cross-socket/SYS", nv2, "cross-socket/SYS", "cross-socket/SYS", nv1, self, nv2, nv1},
				{"cross-socket/SYS", "cross-socket/SYS", nv1, "cross-socket/SYS", nv1, nv2, self, nv2},
				{"cross-socket/SYS", "cross-socket/SYS", "cross-socket/SYS", nv1, nv2, nv1, nv2, self},
			},
			wantPCIe: [][]string{
				{"", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"},
				{"PIX", "", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"},
				{"PHB", "PHB", "", "PIX", "SYS", "SYS", "SYS", "SYS"},
				{"PHB", "PHB", "PIX", "", "SYS", "SYS", "SYS", "SYS"},
				{"SYS", "SYS", "SYS", "SYS", "", "PIX", "PHB", "PHB"},
				{"SYS", "SYS", "SYS", "SYS", "PIX", "", "PHB", "PHB"},
				{"SYS", "SYS", "SYS", "SYS", "PHB", "PHB", "", "PIX"},
				{"SYS", "SYS", "SYS", "SYS", "PHB", "PHB", "PIX", ""},
			},
		},
		{
			name:        "pcie-2numa",
			machine:     nvmlmock.PCIe2NUMA(),
			wantNUMA:    []int{0, 0, 1, 1},
			wantBusIDs:  []string{"0000:17:00.0", "0000:18:00.0", "0000:b1:00.0", "0000:b2:00.0"},
			wantCliques: [][]int{{0}, {1}, {2}, {3}},
			wantNodes:   []topology.NUMANode{{ID: 0, CPUs: "0-31,64-95"}, {ID: 1, CPUs: "32-63,96-127"}},
			want: [][]string{
				{self, "pcie-switch/PIX", "cross-socket/SYS", "cross-socket/SYS"},
				{"pcie-switch/PIX", self, "cross-socket/SYS", "cross-socket/SYS"},
				{"cross-socket/SYS", "cross-socket/SYS", self, "pcie-switch/PIX"},
				{"cross-socket/SYS", "cross-socket/SYS", "pcie-switch/PIX", self},
			},
			wantPCIe: [][]string{
				{"", "PIX", "SYS", "SYS"},
				{"PIX", "", "SYS", "SYS"},
				{"SYS", "SYS", "", "PIX"},
				{"SYS", "SYS", "PIX", ""},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topo := build(t, tc.machine)
			var numa []int
			var busIDs []string
			for i, g := range topo.GPUs {
				if g.Index != i || g.UUID != tc.machine.UUID(i) {
					t.Errorf("GPUs[%d] = index %d uuid %q, want index %d uuid %q", i, g.Index, g.UUID, i, tc.machine.UUID(i))
				}
				numa = append(numa, g.NUMANode)
				busIDs = append(busIDs, g.PCIBusID)
			}
			if diff := cmp.Diff(tc.wantNUMA, numa); diff != "" {
				t.Errorf("NUMA nodes of the GPUs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBusIDs, busIDs); diff != "" {
				t.Errorf("PCI addresses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCliques, topo.NVLinkCliques); diff != "" {
				t.Errorf("NVLink cliques (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNodes, topo.NUMANodes); diff != "" {
				t.Errorf("NUMA nodes (-want +got):\n%s", diff)
			}
			// Compare types and counts, leaving PCIe to its own matrix.
			got := linkMatrix(topo)
			for i := range got {
				for j := range got[i] {
					if topo.Links[i][j].NVLinked() {
						got[i][j] = strings.TrimSuffix(got[i][j], "/"+topo.Links[i][j].PCIe)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("links (-want +got):\n%s", diff)
			}
			for i, row := range topo.Links {
				for j, l := range row {
					// The mocks grant P2P over NVLink and within a host
					// bridge, as NVML does on common chipsets.
					want := i != j && (l.NVLinked() || l.PCIe == "PIX" || l.PCIe == "PXB" || l.PCIe == "PHB")
					if l.P2P != want {
						t.Errorf("links[%d][%d].p2p = %v, want %v (%s/%s)", i, j, l.P2P, want, l.Type, l.PCIe)
					}
				}
			}
			var pcie [][]string
			for _, row := range topo.Links {
				var r []string
				for _, l := range row {
					r = append(r, l.PCIe)
				}
				pcie = append(pcie, r)
			}
			if diff := cmp.Diff(tc.wantPCIe, pcie); diff != "" {
				t.Errorf("PCIe paths (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSysfsFixtures(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(t *testing.T, root string)
		wantNUMA  []int
		wantNodes []topology.NUMANode
		wantErr   string
	}{
		{
			name:      "as the machine wrote it",
			edit:      func(*testing.T, string) {},
			wantNUMA:  []int{0, 0, 1, 1},
			wantNodes: []topology.NUMANode{{ID: 0, CPUs: "0-31,64-95"}, {ID: 1, CPUs: "32-63,96-127"}},
		},
		{
			name: "numa_node missing for one GPU",
			edit: func(t *testing.T, root string) {
				remove(t, filepath.Join(root, "bus/pci/devices/0000:b1:00.0/numa_node"))
			},
			wantNUMA:  []int{0, 0, -1, 1},
			wantNodes: []topology.NUMANode{{ID: 0, CPUs: "0-31,64-95"}, {ID: 1, CPUs: "32-63,96-127"}},
		},
		{
			name: "platform reports -1",
			edit: func(t *testing.T, root string) {
				write(t, filepath.Join(root, "bus/pci/devices/0000:17:00.0/numa_node"), "-1\n")
			},
			wantNUMA:  []int{-1, 0, 1, 1},
			wantNodes: []topology.NUMANode{{ID: 0, CPUs: "0-31,64-95"}, {ID: 1, CPUs: "32-63,96-127"}},
		},
		{
			name: "kernel without NUMA",
			edit: func(t *testing.T, root string) {
				remove(t, filepath.Join(root, "bus"))
				remove(t, filepath.Join(root, "devices"))
			},
			wantNUMA:  []int{-1, -1, -1, -1},
			wantNodes: []topology.NUMANode{},
		},
		{
			name: "garbage numa_node",
			edit: func(t *testing.T, root string) {
				write(t, filepath.Join(root, "bus/pci/devices/0000:18:00.0/numa_node"), "zero\n")
			},
			wantErr: `0000:18:00.0/numa_node: not a NUMA node number: "zero"`,
		},
		{
			name: "garbage cpulist",
			edit: func(t *testing.T, root string) {
				write(t, filepath.Join(root, "devices/system/node/node1/cpulist"), "32-\n")
			},
			wantErr: "node1/cpulist: not a CPU list",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := nvmlmock.PCIe2NUMA()
			root := t.TempDir()
			if err := m.WriteSysfs(root); err != nil {
				t.Fatal(err)
			}
			tc.edit(t, root)
			lib := gpu.NewNVML(m.NVML())
			if err := lib.Init(); err != nil {
				t.Fatal(err)
			}
			topo, err := topology.Build(lib, topology.Sysfs{Root: root})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Build() error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			var numa []int
			for _, g := range topo.GPUs {
				numa = append(numa, g.NUMANode)
			}
			if diff := cmp.Diff(tc.wantNUMA, numa); diff != "" {
				t.Errorf("NUMA nodes of the GPUs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNodes, topo.NUMANodes); diff != "" {
				t.Errorf("NUMA nodes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLostGPUIsReportedNotFatal(t *testing.T) {
	m := nvmlmock.DGX1V()
	m.SetLost(2, true)
	topo := build(t, m)
	if len(topo.LostGPUs) != 1 || topo.LostGPUs[0].Index != 2 || !strings.Contains(topo.LostGPUs[0].Error, "ERROR_GPU_IS_LOST") {
		t.Fatalf("LostGPUs = %+v, want GPU 2 with ERROR_GPU_IS_LOST", topo.LostGPUs)
	}
	var indices []int
	for _, g := range topo.GPUs {
		indices = append(indices, g.Index)
	}
	if diff := cmp.Diff([]int{0, 1, 3, 4, 5, 6, 7}, indices); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
	// Without GPU 2, {0,1,3} is the largest clique on its side.
	if diff := cmp.Diff([][]int{{4, 5, 6, 7}, {0, 1, 3}, {0, 4}, {1, 5}, {3, 7}}, topo.NVLinkCliques); diff != "" {
		t.Errorf("NVLink cliques (-want +got):\n%s", diff)
	}
	if len(topo.Links) != 7 || len(topo.Links[0]) != 7 {
		t.Errorf("links is %dx%d, want 7x7", len(topo.Links), len(topo.Links[0]))
	}
}

// TestAgreesWithGoGPUAllocator checks our reading of the mock machines
// against go-gpuallocator's own, which reads the same NVML calls its own way:
// direct NVLink counts must match, and on NVSwitch machines go-gpuallocator
// sees no NVLink at all, which is why the model detects the fabric itself.
func TestAgreesWithGoGPUAllocator(t *testing.T) {
	for _, m := range []*nvmlmock.Machine{nvmlmock.DGXA100(), nvmlmock.DGX1V(), nvmlmock.PCIe2NUMA()} {
		t.Run(m.Profile().Name, func(t *testing.T) {
			topo := build(t, m)
			devices, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(m.NVML()))
			if err != nil {
				t.Fatalf("go-gpuallocator NewDevices on the mock: %v", err)
			}
			if len(devices) != len(topo.GPUs) {
				t.Fatalf("go-gpuallocator sees %d GPUs, we see %d", len(devices), len(topo.GPUs))
			}
			for i, d := range devices {
				if d.UUID != topo.GPUs[i].UUID {
					t.Errorf("GPU %d: go-gpuallocator UUID %q, ours %q", i, d.UUID, topo.GPUs[i].UUID)
				}
				for j := range devices {
					if i == j {
						continue
					}
					theirs := 0
					for _, l := range d.Links[j] {
						if n := nvlinkCount(l.Type.String()); n > 0 {
							theirs = n
						}
					}
					ours := topo.Links[i][j]
					want := 0
					if ours.Type == topology.LinkNVLink {
						want = ours.NVLinks
					}
					if theirs != want {
						t.Errorf("GPUs %d-%d: go-gpuallocator counts %d direct NVLinks, we %d (%s)", i, j, theirs, want, ours.Type)
					}
				}
			}
		})
	}
}

// nvlinkCount decodes go-gpuallocator's link type names ("TwoNVLINKLinks").
func nvlinkCount(name string) int {
	words := []string{"Single", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten", "Eleven", "Twelve"}
	for i, w := range words {
		if name == w+"NVLINKLink" || name == w+"NVLINKLinks" {
			return i + 1
		}
	}
	return 0
}

func write(t *testing.T, file, data string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
}
