package preferred

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// machineTopology builds the topology model of a mock machine.
func machineTopology(t testing.TB, m *nvmlmock.Machine) *topology.Topology {
	t.Helper()
	dir := t.TempDir()
	if err := m.WriteSysfs(dir); err != nil {
		t.Fatal(err)
	}
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func mustPolicy(t testing.TB, topo *topology.Topology) *GPUPolicy {
	t.Helper()
	p, err := NewGPUPolicy(topo)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// uuids maps GPU indices to the machine's UUIDs.
func uuids(m *nvmlmock.Machine, idx []int) []string {
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, m.UUID(i))
	}
	return out
}

// indices maps UUIDs back to sorted indices.
func indices(m *nvmlmock.Machine, us []string) []int {
	out := []int{}
	for _, u := range us {
		for i := 0; i < len(m.Profile().GPUs); i++ {
			if m.UUID(i) == u {
				out = append(out, i)
			}
		}
	}
	sort.Ints(out)
	return out
}

func TestLinkTypesMatchGoGPUAllocator(t *testing.T) {
	want := map[uint]string{
		linkCrossCPU:                   "P2PLinkCrossCPU",
		linkSameCPU:                    "P2PLinkSameCPU",
		linkHostBridge:                 "P2PLinkHostBridge",
		linkMultiSwitch:                "P2PLinkMultiSwitch",
		linkSingleSwitch:               "P2PLinkSingleSwitch",
		linkSameBoard:                  "P2PLinkSameBoard",
		linkOneNVLink:                  "SingleNVLINKLink",
		linkOneNVLink + 1:              "TwoNVLINKLinks",
		linkOneNVLink + 11:             "TwelveNVLINKLinks",
		linkOneNVLink + maxNVLinks - 1: "EighteenNVLINKLinks",
	}
	for typ, name := range want {
		if got := fmt.Sprint(p2pLink(nil, typ).Type); got != name {
			t.Errorf("link type %d is go-gpuallocator's %q, want %q", typ, got, name)
		}
	}
}

// linkNames renders a device's links to each peer as sorted type names.
func linkNames(d *gpuallocator.Device) map[int]string {
	out := map[int]string{}
	for peer, ls := range d.Links {
		var names []string
		for _, l := range ls {
			names = append(names, fmt.Sprint(l.Type))
		}
		sort.Strings(names)
		out[peer] = strings.Join(names, "+")
	}
	return out
}

// On machines without NVSwitch our devices must carry exactly the links
// go-gpuallocator builds from NVML itself; on NVSwitch machines ours add the
// fabric's NVLinks to every pair.
func TestLinksMatchGoGPUAllocatorsOwn(t *testing.T) {
	for _, name := range nvmlmock.ProfileNames() {
		t.Run(name, func(t *testing.T) {
			m := nvmlmock.Builtin(name)
			topo := machineTopology(t, m)
			p := mustPolicy(t, topo)
			theirs, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(m.NVML()))
			if err != nil {
				t.Fatal(err)
			}
			nvswitch := m.Profile().NVSwitch != nil
			for i, d := range theirs {
				want := linkNames(d)
				if nvswitch {
					for peer := range want {
						want[peer] = strings.Join(append([]string{want[peer]}, fmt.Sprint(p2pLink(nil, linkOneNVLink+uint(m.Profile().NVSwitch.LinksPerGPU)-1).Type)), "+")
						parts := strings.Split(want[peer], "+")
						sort.Strings(parts)
						want[peer] = strings.Join(parts, "+")
					}
				}
				if diff := cmp.Diff(want, linkNames(p.byUUID[m.UUID(i)])); diff != "" {
					t.Errorf("GPU %d links (-go-gpuallocator +ours):\n%s", i, diff)
				}
			}
		})
	}
}

// The expected sets are go-gpuallocator's own best-effort tests on its
// NewDGX1VoltaNode, which the dgx-1v mock reproduces.
func TestGPUsDGX1VMatchesGoGPUAllocatorTests(t *testing.T) {
	m := nvmlmock.DGX1V()
	p := mustPolicy(t, machineTopology(t, m))
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		name                string
		available, required []int
		size                int
		want                []int
	}{
		{"Single NVLINK, prefer same switch", []int{0, 2, 4, 5}, nil, 2, []int{4, 5}},
		{"Single NVLINK, prefer same socket", []int{0, 4, 5, 6}, nil, 2, []int{5, 6}},
		{"Prefer dual NVLINK same socket", []int{0, 3, 1}, nil, 2, []int{0, 3}},
		{"Prefer dual NVLINK cross socket", []int{0, 1, 4}, nil, 2, []int{0, 4}},
		{"Must include with allocation size 1", all, []int{4}, 1, []int{4}},
		{"Must include with allocation size 2", all, []int{4}, 2, []int{4, 7}},
		{"Must include with allocation size 4", all, []int{4}, 4, []int{4, 5, 6, 7}},
		{"Must include with unavailable device", []int{1, 2, 3, 4, 5, 6, 7}, []int{0, 1, 2, 3}, 4, []int{}},
		{"Must include with full set specified", all, []int{0, 2, 4, 6}, 4, []int{0, 2, 4, 6}},
		{"Must include with too many devices specified", all, []int{1, 2, 3, 4, 5, 6}, 4, []int{}},
		{"Required too many devices than available", []int{1, 2, 3, 4, 5}, []int{1, 2, 3, 4, 5, 6}, 1, []int{}},
		{"Four of all eight: a cube face", all, nil, 4, []int{0, 1, 2, 3}},
		{"Eight of eight", all, nil, 8, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.GPUs(uuids(m, tc.available), uuids(m, tc.required), tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, indices(m, got)); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
			// The answer is exactly go-gpuallocator's best-effort answer on
			// devices it built from NVML itself.
			theirs, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(m.NVML()))
			if err != nil {
				t.Fatal(err)
			}
			pick := func(idx []int) []*gpuallocator.Device {
				var out []*gpuallocator.Device
				for _, i := range idx {
					out = append(out, theirs[i])
				}
				return out
			}
			var ref []int
			for _, d := range gpuallocator.NewBestEffortPolicy().Allocate(pick(tc.available), pick(tc.required), tc.size) {
				ref = append(ref, d.Index)
			}
			sort.Ints(ref)
			if ref == nil {
				ref = []int{}
			}
			if diff := cmp.Diff(ref, indices(m, got)); diff != "" {
				t.Errorf("ours vs go-gpuallocator on NVML devices (-theirs +ours):\n%s", diff)
			}
		})
	}
}

func TestGPUsDGXA100(t *testing.T) {
	m := nvmlmock.DGXA100()
	p := mustPolicy(t, machineTopology(t, m))
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		name                string
		available, required []int
		size                int
		want                []int
	}{
		{"two: one PCIe switch pair", all, nil, 2, []int{0, 1}},
		{"four: one NUMA node", all, nil, 4, []int{0, 1, 2, 3}},
		{"two next to a must-include on NUMA 1", all, []int{6}, 2, []int{6, 7}},
		{"four with a must-include on NUMA 1", all, []int{5}, 4, []int{4, 5, 6, 7}},
		{"two from scattered GPUs stay on one NUMA node", []int{0, 3, 5, 6}, nil, 2, []int{0, 3}},
		{"two from scattered GPUs, one per node left on NUMA 0", []int{0, 5, 6}, nil, 2, []int{5, 6}},
		{"two without a PCIe pair prefer one NUMA node", []int{1, 2, 4}, nil, 2, []int{1, 2}},
		{"one", []int{3, 7}, nil, 1, []int{3}},
		{"more than available", []int{3, 7}, nil, 3, []int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.GPUs(uuids(m, tc.available), uuids(m, tc.required), tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, indices(m, got)); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
}

// A machine whose PCIe paths say nothing about sockets: every pair scores
// the same, so only the NUMA tie-break keeps a pair on one node.
func TestGPUsNUMATieBreak(t *testing.T) {
	topo := &topology.Topology{}
	numa := []int{1, 0, 1, 0}
	for i, n := range numa {
		topo.GPUs = append(topo.GPUs, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08d", i), NUMANode: n})
	}
	for i := range numa {
		row := make([]topology.Link, len(numa))
		for j := range numa {
			row[j] = topology.Link{Type: topology.LinkPCIeHostBridge, PCIe: "PHB"}
			if i == j {
				row[j] = topology.Link{Type: topology.LinkSelf}
			}
		}
		topo.Links = append(topo.Links, row)
	}
	p := mustPolicy(t, topo)
	all := []string{"GPU-00000000", "GPU-00000001", "GPU-00000002", "GPU-00000003"}
	got, err := p.GPUs(all, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"GPU-00000000", "GPU-00000002"}, got); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
	// Without a tie-break go-gpuallocator's answer spans both nodes; the
	// test above would be vacuous otherwise.
	var raw []*gpuallocator.Device
	for _, u := range all {
		raw = append(raw, p.byUUID[u])
	}
	sortDevices(raw)
	if best := p.best.Allocate(raw, nil, 2); p.numaSpan(best) < 2 {
		t.Fatalf("go-gpuallocator alone already picks one NUMA node (%v); the tie-break is untested", best)
	}
}

func TestGPUsErrors(t *testing.T) {
	m := nvmlmock.PCIe2NUMA()
	p := mustPolicy(t, machineTopology(t, m))
	if _, err := p.GPUs([]string{"GPU-nope"}, nil, 1); err == nil || !strings.Contains(err.Error(), `"GPU-nope" is no GPU`) {
		t.Errorf("unknown available = %v", err)
	}
	if _, err := p.GPUs(uuids(m, []int{0}), []string{"GPU-x"}, 1); err == nil || !strings.Contains(err.Error(), "must-include") {
		t.Errorf("unknown must-include = %v", err)
	}
	if _, err := p.GPUs(uuids(m, []int{0}), nil, 0); err == nil {
		t.Error("size 0 gave no error")
	}
}

func unitIDs(r string, gpuUnits map[string][]int) []string {
	var out []string
	for u, ns := range gpuUnits {
		for _, n := range ns {
			out = append(out, devices.DeviceID(api.ResourceGPUMemory, u, n))
		}
	}
	sort.Strings(out)
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func TestUnits(t *testing.T) {
	const a, b, c = "GPU-aaaa0000", "GPU-bbbb0000", "GPU-cccc0000"
	mem := func(u string, n int) string { return devices.DeviceID(api.ResourceGPUMemory, u, n) }
	// per GPU: a has 10 free, b 4, c 6.
	avail := unitIDs("", map[string][]int{a: seq(0, 10), b: seq(20, 24), c: seq(0, 6)})
	for _, tc := range []struct {
		name string
		must []string
		size int
		rank map[string]int
		want map[string]int // units per GPU
	}{
		{"best fit: the smallest GPU that fits", nil, 4, nil, map[string]int{b: 4}},
		{"best fit skips GPUs too small", nil, 5, nil, map[string]int{c: 5}},
		{"a ranked GPU preferred among those that fit", nil, 3, map[string]int{a: 1}, map[string]int{a: 3}},
		{"a ranked GPU preferred over a better fit", nil, 4, map[string]int{c: 1}, map[string]int{c: 4}},
		{"a ranked GPU that cannot fit is filled before another GPU is opened", nil, 8, map[string]int{c: 1}, map[string]int{c: 6, b: 2}},
		{"the ranked GPUs first, best fit among them", nil, 5, map[string]int{a: 1, c: 1}, map[string]int{c: 5}},
		{"a higher rank before a better fit of a lower rank", nil, 4, map[string]int{a: 2, b: 1}, map[string]int{a: 4}},
		{"a higher rank that cannot fit is filled before a lower rank", nil, 12, map[string]int{a: 2, c: 1}, map[string]int{a: 10, c: 2}},
		{"larger than any GPU: fewest GPUs", nil, 14, nil, map[string]int{a: 10, b: 4}},
		{"must-include GPU filled first", []string{mem(c, 2)}, 6, nil, map[string]int{c: 6}},
		{"must-include overflows to best fit", []string{mem(c, 2)}, 9, nil, map[string]int{c: 6, b: 3}},
		{"everything", nil, 20, nil, map[string]int{a: 10, b: 4, c: 6}},
		{"too many", nil, 21, nil, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Units(api.ResourceGPUMemory, avail, tc.must, tc.size, tc.rank)
			if err != nil {
				t.Fatal(err)
			}
			per := perGPU(t, api.ResourceGPUMemory, got)
			if diff := cmp.Diff(tc.want, per); diff != "" {
				t.Errorf("units per GPU (-want +got):\n%s", diff)
			}
			for _, id := range tc.must {
				if !slices.Contains(got, id) {
					t.Errorf("must-include %s missing from %v", id, got)
				}
			}
		})
	}
	if _, err := Units(api.ResourceGPUMemory, []string{"junk"}, nil, 1, nil); err == nil {
		t.Error("malformed available unit gave no error")
	}
	if got, err := Units(api.ResourceGPUMemory, avail, []string{mem(c, 99)}, 1, nil); err != nil || len(got) != 0 {
		t.Errorf("must-include not available = %v, %v; want empty", got, err)
	}
}

func BenchmarkGPUs(b *testing.B) {
	for _, name := range []string{nvmlmock.DGXA100Name, nvmlmock.DGX1VName} {
		m := nvmlmock.Builtin(name)
		p := mustPolicy(b, machineTopology(b, m))
		all := uuids(m, []int{0, 1, 2, 3, 4, 5, 6, 7})
		for _, size := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("%s/size=%d", name, size), func(b *testing.B) {
				for b.Loop() {
					if got, err := p.GPUs(all, nil, size); err != nil || len(got) != size {
						b.Fatalf("GPUs = %v, %v", got, err)
					}
				}
			})
		}
	}
}

// perGPU counts the units ids chose per GPU, failing on a unit chosen
// twice or an ID that names no GPU.
func perGPU(t *testing.T, r corev1.ResourceName, ids []string) map[string]int {
	t.Helper()
	per := map[string]int{}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("unit %s chosen twice", id)
		}
		seen[id] = true
		u, _, err := devices.ParseDeviceID(r, id)
		if err != nil {
			t.Fatal(err)
		}
		per[u]++
	}
	return per
}
