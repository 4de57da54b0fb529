package consistency_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/extender"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/nri"
	"github.com/tessera-gpu/tessera/topology"
)

// The test node: four 40 GiB GPUs with a 500 MiB reserve and 1 GiB units,
// so each shares 39 units (39936 MiB): a core-only slice of c cores gets
// ceil(c × 39936 / 100) MiB.
const (
	nodeGPUs   = 4
	gpuMemMiB  = 40960
	reserveMiB = 500
	unitMiB    = 1024
	capMiB     = 39 * unitMiB
)

// Verdicts besides a refusal code. A component's expected verdict is the
// row's want unless the row overrides it.
const (
	accept gpureq.Code = ""
	// accepted overrides a refusal with acceptance: the component sees one
	// container or one resource at a time and cannot see the pod's rule
	// (the extender refuses such a pod at filter, so it never gets there
	// through the scheduler).
	accepted gpureq.Code = "accepted"
	// unseen: the component never sees such a request (the API server
	// refuses quantities that are not integers, the kubelet more devices
	// than the node has).
	unseen gpureq.Code = "unseen"
)

// ctr is one container of a row, with its quantities as a user writes them
// ("": not set), as limits unless requests is set.
type ctr struct {
	name              string
	kind              gpureq.Kind
	whole, mem, cores string
	requests          bool
}

type row struct {
	name     string
	ctrs     []ctr
	overhead corev1.ResourceList
	// count is the pod's tessera.dev/gpu-count annotation ("": none):
	// how many GPUs each slice of the request spans. gpus is the number
	// of distinct GPUs an accepted row's slices span (0: 1).
	count string
	gpus  int

	// want is the pod's verdict: the extender's at filter, and the other
	// components' unless overridden.
	want                  gpureq.Code
	allocate, nri, quotaV gpureq.Code // overrides: accepted or unseen; "": want

	// For accepted pods: the slice of each shared container on each of its
	// GPUs of the test node, what the pod's slices take of each of their
	// GPUs at once, its whole GPUs, and what it counts against quota.
	slices map[string]gpureq.Amount
	peak   gpureq.Amount
	whole  int
	quota  quota.Resources
	// cpuMilli is the pod's effective CPU request, when checked.
	cpuMilli int64
}

func core(c int64) gpureq.Amount { return gpureq.Amount{MemMiB: (c*capMiB + 99) / 100, Cores: c} }
func mem(units, cores int64) gpureq.Amount {
	return gpureq.Amount{MemMiB: units * unitMiB, Cores: cores}
}
func res(gpu, memUnits, cores int64) quota.Resources {
	out := quota.Resources{}
	for name, v := range map[corev1.ResourceName]int64{api.ResourceGPU: gpu, api.ResourceGPUMemory: memUnits, api.ResourceGPUCore: cores} {
		if v > 0 {
			out[name] = v
		}
	}
	return out
}

func rows() []row {
	slice := func(name, m, c string) ctr { return ctr{name: name, mem: m, cores: c} }
	whole := func(name, n string) ctr { return ctr{name: name, whole: n} }
	init := func(c ctr) ctr { c.kind = gpureq.Init; return c }
	side := func(c ctr) ctr { c.kind = gpureq.Sidecar; return c }
	return []row{
		// Accepted.
		{name: "core-only", ctrs: []ctr{slice("main", "", "30")},
			slices: map[string]gpureq.Amount{"main": core(30)}, peak: core(30), quota: res(0, 0, 30)},
		{name: "core-only, one core", ctrs: []ctr{slice("main", "", "1")},
			slices: map[string]gpureq.Amount{"main": core(1)}, peak: core(1), quota: res(0, 0, 1)},
		{name: "core-only, rounded up", ctrs: []ctr{slice("main", "", "33")},
			slices: map[string]gpureq.Amount{"main": {MemMiB: 13179, Cores: 33}}, peak: core(33), quota: res(0, 0, 33)},
		{name: "core-only, a whole GPU of cores", ctrs: []ctr{slice("main", "", "100")},
			slices: map[string]gpureq.Amount{"main": core(100)}, peak: core(100), quota: res(0, 0, 100)},
		{name: "memory-only", ctrs: []ctr{slice("main", "4", "")},
			slices: map[string]gpureq.Amount{"main": mem(4, 0)}, peak: mem(4, 0), quota: res(0, 4, 0)},
		{name: "memory-only, all of a GPU", ctrs: []ctr{slice("main", "39", "")},
			slices: map[string]gpureq.Amount{"main": mem(39, 0)}, peak: mem(39, 0), quota: res(0, 39, 0)},
		{name: "memory and cores", ctrs: []ctr{slice("main", "8", "30")},
			slices: map[string]gpureq.Amount{"main": mem(8, 30)}, peak: mem(8, 30), quota: res(0, 8, 30)},
		{name: "memory and cores, all of a GPU", ctrs: []ctr{slice("main", "39", "100")},
			slices: map[string]gpureq.Amount{"main": mem(39, 100)}, peak: mem(39, 100), quota: res(0, 39, 100)},
		{name: "one unit, one core", ctrs: []ctr{slice("main", "1", "1")},
			slices: map[string]gpureq.Amount{"main": mem(1, 1)}, peak: mem(1, 1), quota: res(0, 1, 1)},
		{name: "explicit zero cores is memory-only", ctrs: []ctr{slice("main", "4", "0")},
			slices: map[string]gpureq.Amount{"main": mem(4, 0)}, peak: mem(4, 0), quota: res(0, 4, 0)},
		{name: "requests without limits", ctrs: []ctr{{name: "main", mem: "2", cores: "20", requests: true}},
			slices: map[string]gpureq.Amount{"main": mem(2, 20)}, peak: mem(2, 20), quota: res(0, 2, 20)},
		{name: "one whole GPU", ctrs: []ctr{whole("main", "1")}, whole: 1, quota: res(1, 0, 0)},
		{name: "four whole GPUs", ctrs: []ctr{whole("main", "4")}, whole: 4, quota: res(4, 0, 0)},
		{name: "whole GPUs in two containers", ctrs: []ctr{whole("a", "1"), whole("b", "2")}, whole: 3, quota: res(3, 0, 0)},
		{name: "no GPU", ctrs: []ctr{{name: "main"}}, quota: res(0, 0, 0)},
		{name: "two slices add up", ctrs: []ctr{slice("a", "4", "20"), slice("b", "6", "30")},
			slices: map[string]gpureq.Amount{"a": mem(4, 20), "b": mem(6, 30)}, peak: mem(10, 50), quota: res(0, 10, 50)},
		{name: "three slices to exactly 100 cores", ctrs: []ctr{slice("a", "1", "30"), slice("b", "1", "30"), slice("c", "1", "40")},
			slices: map[string]gpureq.Amount{"a": mem(1, 30), "b": mem(1, 30), "c": mem(1, 40)}, peak: mem(3, 100), quota: res(0, 3, 100)},
		{name: "core-only and memory-only containers", ctrs: []ctr{slice("a", "", "20"), slice("b", "2", "")},
			slices: map[string]gpureq.Amount{"a": core(20), "b": mem(2, 0)}, peak: core(20).Add(mem(2, 0)), quota: res(0, 2, 20)},
		{name: "init slice does not add to the main one", ctrs: []ctr{init(slice("init", "30", "60")), slice("main", "30", "60")},
			slices: map[string]gpureq.Amount{"init": mem(30, 60), "main": mem(30, 60)}, peak: mem(30, 60), quota: res(0, 30, 60)},
		{name: "init core-only slices", ctrs: []ctr{init(slice("init", "", "50")), slice("main", "", "50")},
			slices: map[string]gpureq.Amount{"init": core(50), "main": core(50)}, peak: core(50), quota: res(0, 0, 50)},
		{name: "sidecar slice adds up", ctrs: []ctr{side(slice("side", "2", "10")), slice("main", "4", "20")},
			slices: map[string]gpureq.Amount{"side": mem(2, 10), "main": mem(4, 20)}, peak: mem(6, 30), quota: res(0, 6, 30)},
		{name: "core-only sidecar", ctrs: []ctr{side(slice("side", "", "10")), slice("main", "4", "20")},
			slices: map[string]gpureq.Amount{"side": core(10), "main": mem(4, 20)}, peak: core(10).Add(mem(4, 20)), quota: res(0, 4, 30)},
		{name: "init beside an earlier sidecar", ctrs: []ctr{side(slice("side", "2", "10")), init(slice("init", "10", "60")), slice("main", "1", "10")},
			slices: map[string]gpureq.Amount{"side": mem(2, 10), "init": mem(10, 60), "main": mem(1, 10)}, peak: mem(12, 70), quota: res(0, 12, 70)},
		{name: "init whole GPUs: the larger", ctrs: []ctr{init(whole("init", "2")), whole("main", "1")}, whole: 2, quota: res(2, 0, 0)},
		{name: "sidecar whole GPU adds up", ctrs: []ctr{side(whole("side", "1")), whole("main", "2")}, whole: 3, quota: res(3, 0, 0)},
		{name: "pod overhead counts for CPU, not GPUs", ctrs: []ctr{slice("main", "2", "10")},
			overhead: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			slices:   map[string]gpureq.Amount{"main": mem(2, 10)}, peak: mem(2, 10), quota: res(0, 2, 10), cpuMilli: 250},

		// Multi-GPU slices (tessera.dev/gpu-count): each container's
		// request split evenly over that many GPUs; quota counts the whole
		// request.
		{name: "gpu-count 1", count: "1", ctrs: []ctr{slice("main", "8", "30")},
			slices: map[string]gpureq.Amount{"main": mem(8, 30)}, peak: mem(8, 30), quota: res(0, 8, 30)},
		{name: "gpu-count 2: 16 GiB and 40 %", count: "2", gpus: 2, ctrs: []ctr{slice("main", "16", "40")},
			slices: map[string]gpureq.Amount{"main": mem(8, 20)}, peak: mem(8, 20), quota: res(0, 16, 40)},
		{name: "gpu-count 4", count: "4", gpus: 4, ctrs: []ctr{slice("main", "8", "100")},
			slices: map[string]gpureq.Amount{"main": mem(2, 25)}, peak: mem(2, 25), quota: res(0, 8, 100)},
		{name: "gpu-count 2: two whole GPUs' worth", count: "2", gpus: 2, ctrs: []ctr{slice("main", "78", "200")},
			slices: map[string]gpureq.Amount{"main": mem(39, 100)}, peak: mem(39, 100), quota: res(0, 78, 200)},
		{name: "gpu-count 2: core-only", count: "2", gpus: 2, ctrs: []ctr{slice("main", "", "60")},
			slices: map[string]gpureq.Amount{"main": core(30)}, peak: core(30), quota: res(0, 0, 60)},
		{name: "gpu-count 4: memory-only", count: "4", gpus: 4, ctrs: []ctr{slice("main", "12", "")},
			slices: map[string]gpureq.Amount{"main": mem(3, 0)}, peak: mem(3, 0), quota: res(0, 12, 0)},
		{name: "gpu-count 2: two containers on the same two GPUs", count: "2", gpus: 2, ctrs: []ctr{slice("a", "4", "20"), slice("b", "2", "40")},
			slices: map[string]gpureq.Amount{"a": mem(2, 10), "b": mem(1, 20)}, peak: mem(3, 30), quota: res(0, 6, 60)},
		{name: "gpu-count 2: a sidecar and an init container", count: "2", gpus: 2, ctrs: []ctr{side(slice("side", "2", "20")), init(slice("init", "10", "100")), slice("main", "4", "40")},
			slices: map[string]gpureq.Amount{"side": mem(1, 10), "init": mem(5, 50), "main": mem(2, 20)}, peak: mem(6, 60), quota: res(0, 12, 120)},

		// Refused: the GPU count. The device plugin sees one resource of
		// one container, never the annotation; the NRI plugin sees one
		// container.
		{name: "gpu-count not an integer", count: "two", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count fractional", count: "1.5", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count 0", count: "0", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count negative", count: "-2", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count with a leading zero", count: "02", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count with a space", count: " 2", ctrs: []ctr{slice("main", "2", "20")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count above 16", count: "17", ctrs: []ctr{slice("main", "17", "17")}, want: gpureq.CodeInvalidGPUCount, allocate: accepted},
		{name: "gpu-count above the node's GPUs", count: "8", ctrs: []ctr{slice("main", "8", "8")},
			want: gpureq.CodeGPUCountAboveNode, allocate: accepted, quotaV: accepted},
		{name: "gpu-count 16 on a node of 4", count: "16", ctrs: []ctr{slice("main", "16", "")},
			want: gpureq.CodeGPUCountAboveNode, allocate: accepted, quotaV: accepted},
		{name: "gpu-count: memory does not split", count: "2", ctrs: []ctr{slice("main", "3", "20")}, want: gpureq.CodeGPUCountUneven, allocate: accepted},
		{name: "gpu-count: cores do not split", count: "4", ctrs: []ctr{slice("main", "4", "30")}, want: gpureq.CodeGPUCountUneven, allocate: accepted},
		{name: "gpu-count: a sidecar does not split", count: "2", ctrs: []ctr{side(slice("side", "1", "")), slice("main", "2", "20")}, want: gpureq.CodeGPUCountUneven, allocate: accepted},
		{name: "gpu-count on a whole-GPU-only pod", count: "2", ctrs: []ctr{whole("main", "2")},
			want: gpureq.CodeGPUCountWithoutSlice, allocate: accepted, nri: accepted},
		{name: "gpu-count on a pod without GPUs", count: "1", ctrs: []ctr{{name: "main"}},
			want: gpureq.CodeGPUCountWithoutSlice, allocate: accepted, nri: accepted},
		{name: "gpu-count 2: 101 cores on each GPU", count: "2", ctrs: []ctr{slice("main", "2", "202")}, want: gpureq.CodeCoresAboveGPU, allocate: accepted},
		{name: "gpu-count 4: 101 cores on each of the node's GPUs", count: "4", ctrs: []ctr{slice("main", "4", "404")}, want: gpureq.CodeCoresAboveGPU, allocate: unseen},
		{name: "gpu-count 2: containers above 100 cores per GPU together", count: "2", gpus: 2, ctrs: []ctr{slice("a", "2", "120"), slice("b", "2", "100")},
			want: gpureq.CodeCoresAboveGPU, allocate: accepted, nri: accepted},
		{name: "gpu-count 2: 40 units on each GPU", count: "2", ctrs: []ctr{slice("main", "80", "")},
			want: gpureq.CodeSliceTooLarge, allocate: accepted, quotaV: accepted},
		// More devices than the node has: the kubelet never calls Allocate.
		{name: "gpu-count 4: 40 units on each of the node's GPUs", count: "4", ctrs: []ctr{slice("main", "160", "")},
			want: gpureq.CodeSliceTooLarge, allocate: unseen, quotaV: accepted},

		// Refused: one container.
		{name: "whole and memory in one container", ctrs: []ctr{{name: "main", whole: "1", mem: "2"}},
			want: gpureq.CodeWholeAndShared, allocate: accepted},
		{name: "whole and cores in one container", ctrs: []ctr{{name: "main", whole: "1", cores: "10"}},
			want: gpureq.CodeWholeAndShared, allocate: accepted},
		{name: "101 cores", ctrs: []ctr{slice("main", "1", "101")}, want: gpureq.CodeCoresAboveGPU, allocate: accepted},
		{name: "150 core-only cores", ctrs: []ctr{slice("main", "", "150")}, want: gpureq.CodeCoresAboveGPU, allocate: accepted},
		{name: "a sidecar of 101 cores", ctrs: []ctr{side(slice("side", "1", "101")), slice("main", "1", "1")}, want: gpureq.CodeCoresAboveGPU, allocate: accepted},
		{name: "fractional memory", ctrs: []ctr{slice("main", "1.5", "10")}, want: gpureq.CodeInvalidQuantity, allocate: unseen, nri: unseen},
		{name: "fractional cores", ctrs: []ctr{slice("main", "1", "500m")}, want: gpureq.CodeInvalidQuantity, allocate: unseen, nri: unseen},
		{name: "fractional whole GPU", ctrs: []ctr{whole("main", "500m")}, want: gpureq.CodeInvalidQuantity, allocate: unseen, nri: unseen},
		{name: "negative cores", ctrs: []ctr{slice("main", "1", "-5")}, want: gpureq.CodeInvalidQuantity, allocate: unseen, nri: unseen},
		{name: "negative whole GPUs", ctrs: []ctr{whole("main", "-1")}, want: gpureq.CodeInvalidQuantity, allocate: unseen, nri: unseen},
		{name: "more GPUs than a node can have", ctrs: []ctr{whole("main", "65")}, want: gpureq.CodeTooManyGPUs, allocate: unseen, nri: unseen},

		// Refused: the pod's containers together.
		{name: "whole and shared containers", ctrs: []ctr{whole("a", "1"), slice("b", "1", "10")},
			want: gpureq.CodeWholeAndShared, allocate: accepted, nri: accepted},
		{name: "whole init, shared main", ctrs: []ctr{init(whole("init", "1")), slice("main", "1", "10")},
			want: gpureq.CodeWholeAndShared, allocate: accepted, nri: accepted},
		{name: "two containers above 100 cores", ctrs: []ctr{slice("a", "1", "60"), slice("b", "1", "60")},
			want: gpureq.CodeCoresAboveGPU, allocate: accepted, nri: accepted},
		{name: "sidecar and main above 100 cores", ctrs: []ctr{side(slice("side", "1", "60")), slice("main", "1", "60")},
			want: gpureq.CodeCoresAboveGPU, allocate: accepted, nri: accepted},

		// Refused on the node: more memory than a GPU shares (quota, node
		// independent, counts it).
		{name: "a slice above a GPU's 39 units", ctrs: []ctr{slice("main", "40", "10")}, want: gpureq.CodeSliceTooLarge, allocate: accepted, quotaV: accepted},
		{name: "memory-only above a GPU", ctrs: []ctr{slice("main", "60", "")}, want: gpureq.CodeSliceTooLarge, allocate: accepted, quotaV: accepted},
		{name: "an init slice above a GPU", ctrs: []ctr{init(slice("init", "40", "")), slice("main", "1", "")}, want: gpureq.CodeSliceTooLarge, allocate: accepted, quotaV: accepted},
		{name: "two slices above a GPU together", ctrs: []ctr{slice("a", "20", "10"), slice("b", "25", "10")},
			want: gpureq.CodeSliceTooLarge, allocate: accepted, nri: accepted, quotaV: accepted},
	}
}

// fixture is the test node as each component sees it.
type fixture struct {
	uuids  []string
	model  *devices.Model
	info   *extender.NodeInfo
	policy allocator.Policy
	nriOpt nri.Options
	nriGPU []nri.GPU
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{}
	topo := &topology.Topology{}
	var devGPUs []devices.GPU
	for i := range nodeGPUs {
		uuid := fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i)
		f.uuids = append(f.uuids, uuid)
		topo.GPUs = append(topo.GPUs, topology.GPU{Index: i, UUID: uuid, Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: gpuMemMiB, NUMANode: 0})
		devGPUs = append(devGPUs, devices.GPU{Index: i, UUID: uuid, MemoryMiB: gpuMemMiB})
		f.nriGPU = append(f.nriGPU, nri.GPU{Index: i, UUID: uuid, Minor: i, MemoryMiB: gpuMemMiB})
		var links []topology.Link
		for range nodeGPUs {
			links = append(links, topology.Link{PCIe: "SYS"})
		}
		topo.Links = append(topo.Links, links)
		topo.NVLinkCliques = append(topo.NVLinkCliques, []int{i})
	}
	cfg := &api.NodeAgentConfig{MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB}
	cfg.Default()
	var err error
	if f.model, err = devices.New(devGPUs, devices.Options{Resources: cfg.Resources, MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB}); err != nil {
		t.Fatal(err)
	}
	// The extender reads the inventory the device plugin publishes.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}}}
	if err := api.SetGPUInventory(node.Annotations, deviceplugin.BuildInventory(topo, f.model, cfg, nil, true)); err != nil {
		t.Fatal(err)
	}
	f.info = extender.NewNodeInfo(node)
	if f.info.Err != nil || f.info.SliceBaseMiB != capMiB {
		t.Fatalf("node info: err %v, slice base %d MiB, want %d", f.info.Err, f.info.SliceBaseMiB, capMiB)
	}
	if f.policy, err = extender.NewPolicy(extender.PolicyBinpack, extender.DefaultWorkload(), 1); err != nil {
		t.Fatal(err)
	}
	local, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	f.nriOpt = nri.Options{MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB, UVMMajor: -1, Policy: local,
		MPSPipeDir: func(uuid string) string { return "/run/mps/" + uuid }}
	return f
}

// pod builds the row's pod.
func (r row) pod() *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID("uid-p")}, Spec: corev1.PodSpec{Overhead: r.overhead}}
	if r.count != "" {
		p.Annotations = map[string]string{api.AnnotationGPUCount: r.count}
	}
	always := corev1.ContainerRestartPolicyAlways
	for _, c := range r.ctrs {
		kc := corev1.Container{Name: c.name}
		list := corev1.ResourceList{}
		for name, q := range map[corev1.ResourceName]string{api.ResourceGPU: c.whole, api.ResourceGPUMemory: c.mem, api.ResourceGPUCore: c.cores} {
			if q != "" {
				list[name] = resource.MustParse(q)
			}
		}
		if c.requests {
			kc.Resources.Requests = list
		} else {
			kc.Resources.Limits = list
		}
		switch c.kind {
		case gpureq.Regular:
			p.Spec.Containers = append(p.Spec.Containers, kc)
		case gpureq.Sidecar:
			kc.RestartPolicy = &always
			fallthrough
		default:
			p.Spec.InitContainers = append(p.Spec.InitContainers, kc)
		}
	}
	return p
}

// units are the devices the kubelet allocates a container (integers:
// rows the API server would refuse are unseen by the node).
func (c ctr) units() (whole, mem, cores int) {
	v := func(q string) int {
		if q == "" {
			return 0
		}
		n := resource.MustParse(q)
		return int(n.Value())
	}
	return v(c.whole), v(c.mem), v(c.cores)
}

// ordered is the row's containers in start order: init containers (and
// sidecars) in spec order, then the regular ones.
func (r row) ordered() []ctr {
	var out []ctr
	for _, c := range r.ctrs {
		if c.kind != gpureq.Regular {
			out = append(out, c)
		}
	}
	for _, c := range r.ctrs {
		if c.kind == gpureq.Regular {
			out = append(out, c)
		}
	}
	return out
}

func codeOf(t *testing.T, what string, err error) gpureq.Code {
	t.Helper()
	if err == nil {
		return accept
	}
	var r *gpureq.Refusal
	if errors.As(err, &r) {
		return r.Code
	}
	var de *nri.DecisionError
	if errors.As(err, &de) && de.Code != "" {
		return de.Code
	}
	t.Fatalf("%s: %v is not a refusal of the request model", what, err)
	return ""
}

// extenderVerdict is the extender's filter on the empty test node and, for
// a pod that fits, the placement and the assignment its bind writes.
type extenderResult struct {
	code       gpureq.Code
	slices     map[string]gpureq.Amount
	gpus       map[string][]string // each shared container's GPUs
	peak       gpureq.Amount
	whole      int
	demand     extender.Demand
	assignment *api.Assignment
}

func (f *fixture) extender(t *testing.T, pod *corev1.Pod) extenderResult {
	t.Helper()
	d, err := extender.ParseDemand(pod)
	if err != nil {
		if !errors.Is(err, extender.ErrInvalidDemand) {
			t.Fatalf("ParseDemand: %v does not wrap ErrInvalidDemand", err)
		}
		return extenderResult{code: codeOf(t, "ParseDemand", err)}
	}
	st := extender.BuildNodeState(f.info, nil)
	if v := extender.Filter(st, &d); !v.Fits() {
		switch v.Reason {
		case extender.SliceTooLarge:
			return extenderResult{code: gpureq.CodeSliceTooLarge}
		case extender.GPUCountAboveNode:
			return extenderResult{code: gpureq.CodeGPUCountAboveNode}
		}
		t.Fatalf("Filter: %s (%s), not a reason of the request model", v.Reason, v.Message)
	}
	use, err := extender.ChoosePlacement(f.policy, st, pod.UID, &d)
	if err != nil {
		t.Fatalf("ChoosePlacement after Filter fit: %v", err)
	}
	out := extenderResult{demand: d, whole: use.WholePending, slices: map[string]gpureq.Amount{}, gpus: map[string][]string{}, peak: d.SliceOn(f.info.UnitMiB, f.info.SliceBaseMiB)}
	if r := d.Request(f.info.UnitMiB, f.info.SliceBaseMiB); r.GPUMemMiB != out.peak.MemMiB || r.GPUMilli != gpureq.CoresToMilli(out.peak.Cores) {
		t.Errorf("allocator request %+v, slice peak %+v", r, out.peak)
	}
	for _, s := range use.Shared {
		a := gpureq.Amount{MemMiB: s.MemMiB, Cores: s.Cores}
		if prev, ok := out.slices[s.Container]; ok && prev != a {
			t.Errorf("extender: container %s gets %+v on one GPU and %+v on another", s.Container, prev, a)
		}
		out.slices[s.Container] = a
		out.gpus[s.Container] = append(out.gpus[s.Container], s.UUID)
	}
	if len(use.Shared) > 0 {
		out.assignment = extender.SharedAssignment(nil, use)
		// Bound with that assignment, the pod counts its peak on its GPU.
		bound := pod.DeepCopy()
		bound.Spec.NodeName = "n"
		bound.Annotations = map[string]string{}
		if err := api.SetAssignment(bound.Annotations, out.assignment); err != nil {
			t.Fatal(err)
		}
		st := extender.BuildNodeState(f.info, []*extender.PodUse{extender.NewPodUse(bound)})
		usedGPUs := 0
		for i, g := range st.GPUs {
			used := gpureq.Amount{MemMiB: g.MemUsedMiB, Cores: g.CoresUsed}
			if used == (gpureq.Amount{}) {
				continue
			}
			usedGPUs++
			if used != out.peak {
				t.Errorf("node state of the bound pod uses %+v of GPU %d, the slice peak is %+v", used, i, out.peak)
			}
		}
		if want := max(1, d.GPUCount); usedGPUs != want {
			t.Errorf("node state of the bound pod uses %d GPUs, want %d", usedGPUs, want)
		}
	}
	return out
}

// allocate is the device plugin's Allocate checks on what the kubelet
// would ask for each container, one resource at a time.
func (f *fixture) allocate(t *testing.T, r row) gpureq.Code {
	t.Helper()
	ids := func(res corev1.ResourceName, n int) []string {
		per := f.model.Units(res, devices.GPU{MemoryMiB: gpuMemMiB})
		var out []string
		for i := range n {
			out = append(out, devices.DeviceID(res, f.uuids[i/per], i%per))
		}
		return out
	}
	for _, c := range r.ordered() {
		whole, memU, cores := c.units()
		if whole > 0 {
			if _, err := f.model.CheckWhole(f.uuids[:whole], nil, devices.Usage{}); err != nil {
				return codeOf(t, "CheckWhole", err)
			}
		}
		for _, x := range []struct {
			res corev1.ResourceName
			n   int
		}{{api.ResourceGPUMemory, memU}, {api.ResourceGPUCore, cores}} {
			if x.n == 0 {
				continue
			}
			if err := f.model.CheckShared(x.res, ids(x.res, x.n)); err != nil {
				return codeOf(t, "CheckShared", err)
			}
		}
	}
	return accept
}

// nriRun creates the row's containers in start order through nri.Decide
// (a regular init container stops before the next one starts), with the
// pod's assignment or none (the pod bypassed the extender: placed
// locally). It returns the verdict, each shared container's slice of each
// of its GPUs and the most the slices took of one GPU at once; it checks
// that each shared container gets the row's number of distinct GPUs with
// an MPS memory limit for each, and the pipe directory of their group.
func (f *fixture) nri(t *testing.T, r row, a *api.Assignment) (gpureq.Code, map[string]gpureq.Amount, gpureq.Amount) {
	t.Helper()
	pod := nri.Pod{Namespace: "ns", Name: "p", UID: "uid-p", Annotations: map[string]string{}}
	if r.count != "" {
		pod.Annotations[api.AnnotationGPUCount] = r.count
	}
	if a != nil {
		if err := api.SetAssignment(pod.Annotations, a); err != nil {
			t.Fatal(err)
		}
	}
	node := &nri.Node{GPUs: f.nriGPU}
	slices := map[string]gpureq.Amount{}
	var peak gpureq.Amount
	for i, c := range r.ordered() {
		whole, memU, cores := c.units()
		// The kubelet gives whole GPUs no running container holds.
		held := map[string]bool{}
		for _, e := range node.Ledger {
			for _, g := range e.GPUs {
				held[g.UUID] = true
			}
		}
		var free []string
		for _, u := range f.uuids {
			if !held[u] && len(free) < whole {
				free = append(free, u)
			}
		}
		req := nri.Request{Pod: pod, Container: nri.Container{ID: fmt.Sprint("id-", i), Name: c.name},
			Devices: nri.Devices{Whole: free, MemoryUnits: memU, CoreUnits: cores}}
		d, err := nri.Decide(f.nriOpt, node, req)
		if err != nil {
			return codeOf(t, "nri.Decide", err), nil, peak
		}
		if d.Action != nri.ActionIsolate {
			continue
		}
		if s := d.Entry.Shared; s != nil {
			slices[c.name] = gpureq.Amount{MemMiB: s.MemoryMiB, Cores: s.Cores}
			env := map[string]string{}
			for _, e := range d.Adjustment.Env {
				env[e.Name] = e.Value
			}
			uuids := s.UUIDs()
			if n := max(1, r.gpus); len(uuids) != n || len(slices2set(uuids)) != n {
				t.Errorf("container %s: slice on GPUs %v, want %d distinct GPUs", c.name, uuids, n)
			}
			var limits []string
			for i := range uuids {
				limits = append(limits, fmt.Sprintf("%d=%dM", i, s.MemoryMiB))
			}
			if want := strings.Join(limits, ","); env[api.EnvMPSPinnedDeviceMemLimit] != want {
				t.Errorf("container %s: %s=%q, want %q", c.name, api.EnvMPSPinnedDeviceMemLimit, env[api.EnvMPSPinnedDeviceMemLimit], want)
			}
			if want := strings.Join(uuids, ","); env[api.EnvNVIDIAVisibleDevices] != want {
				t.Errorf("container %s: %s=%q, want its slice's GPUs %q", c.name, api.EnvNVIDIAVisibleDevices, env[api.EnvNVIDIAVisibleDevices], want)
			}
			if len(d.Adjustment.Mounts) != 1 || d.Adjustment.Mounts[0].Source != "/run/mps/"+gpureq.GroupKey(uuids) {
				t.Errorf("container %s: mounts %+v, want the pipe directory of its GPUs' MPS daemon", c.name, d.Adjustment.Mounts)
			}
		}
		node.Ledger = append(node.Ledger, d.Entry)
		perGPU := map[string]gpureq.Amount{}
		for _, e := range node.Ledger {
			if e.Shared != nil {
				for _, u := range e.Shared.UUIDs() {
					perGPU[u] = perGPU[u].Add(gpureq.Amount{MemMiB: e.Shared.MemoryMiB, Cores: e.Shared.Cores})
				}
			}
		}
		for _, u := range perGPU {
			peak = gpureq.Amount{MemMiB: max(peak.MemMiB, u.MemMiB), Cores: max(peak.Cores, u.Cores)}
		}
		if c.kind == gpureq.Init {
			node.Ledger = node.Ledger[:len(node.Ledger)-1] // it ran to completion
		}
	}
	return accept, slices, peak
}

func TestOneRequestModel(t *testing.T) {
	f := newFixture(t)
	all := rows()
	if len(all) < 40 {
		t.Fatalf("the table has %d rows, want at least 40", len(all))
	}
	for _, r := range all {
		t.Run(r.name, func(t *testing.T) {
			pod := r.pod()
			want := func(override gpureq.Code) gpureq.Code {
				switch override {
				case "":
					return r.want
				case accepted:
					return accept
				}
				return override
			}

			// The extender's filter and bind.
			ext := f.extender(t, pod)
			if ext.code != r.want {
				t.Fatalf("extender: %q, want %q", ext.code, r.want)
			}

			// Quota.
			qu, err := gpureq.QuotaUse(pod)
			if got, w := codeOf(t, "QuotaUse", err), want(r.quotaV); got != w {
				t.Errorf("quota: %q, want %q", got, w)
			}
			if diff := cmp.Diff(equota.Use(pod), qu); diff != "" {
				t.Errorf("quota.Use and gpureq.QuotaUse differ (-extender +gpureq):\n%s", diff)
			}

			// The device plugin's Allocate.
			if w := want(r.allocate); w != unseen {
				if got := f.allocate(t, r); got != w {
					t.Errorf("Allocate: %q, want %q", got, w)
				}
			}

			// The NRI plugin, placed locally (the pod bypassed the
			// extender, or the extender refused it).
			w := want(r.nri)
			if w != unseen {
				got, slices, _ := f.nri(t, r, nil)
				if got != w {
					t.Errorf("NRI placed locally: %q, want %q", got, w)
				}
				if got == accept && r.want == accept {
					if diff := cmp.Diff(r.slices, nilIfEmpty(slices)); diff != "" {
						t.Errorf("NRI placed locally: slices (-want +got):\n%s", diff)
					}
				}
			}
			if r.want != accept {
				return
			}

			// Accepted: the amounts agree everywhere.
			if diff := cmp.Diff(r.slices, nilIfEmpty(ext.slices)); diff != "" {
				t.Errorf("extender: slices (-want +got):\n%s", diff)
			}
			if ext.peak != r.peak || ext.whole != r.whole {
				t.Errorf("extender: peak %+v and %d whole GPUs, want %+v and %d", ext.peak, ext.whole, r.peak, r.whole)
			}
			var podGPUs []string
			for name, gpus := range ext.gpus {
				if n := max(1, r.gpus); len(gpus) != n || len(slices2set(gpus)) != n {
					t.Errorf("extender: container %s on GPUs %v, want %d distinct GPUs", name, gpus, n)
				}
				if podGPUs != nil && gpureq.GroupKey(podGPUs) != gpureq.GroupKey(gpus) {
					t.Errorf("extender: the pod's slices are on GPUs %v and %v, want the same", podGPUs, gpus)
				}
				podGPUs = gpus
			}
			if diff := cmp.Diff(r.quota, qu); diff != "" {
				t.Errorf("quota (-want +got):\n%s", diff)
			}
			memU, cores := ext.demand.SharedTotals()
			if got := res(int64(ext.demand.WholeGPUs), memU, cores); !cmp.Equal(got, qu) {
				t.Errorf("extender's demand %v, quota counts %v", got, qu)
			}
			if r.cpuMilli != 0 && ext.demand.CPUMilli != r.cpuMilli {
				t.Errorf("extender: CPU %dm, want %dm", ext.demand.CPUMilli, r.cpuMilli)
			}
			got, slices, peak := f.nri(t, r, ext.assignment)
			if got != accept {
				t.Fatalf("NRI with the extender's assignment: %q, want it accepted", got)
			}
			if diff := cmp.Diff(r.slices, nilIfEmpty(slices)); diff != "" {
				t.Errorf("NRI with the extender's assignment: slices (-want +got):\n%s", diff)
			}
			if peak != r.peak {
				t.Errorf("NRI with the extender's assignment: the GPU's peak use %+v, want %+v", peak, r.peak)
			}
		})
	}
}

func slices2set(s []string) map[string]bool {
	out := map[string]bool{}
	for _, v := range s {
		out[v] = true
	}
	return out
}

func nilIfEmpty(m map[string]gpureq.Amount) map[string]gpureq.Amount {
	if len(m) == 0 {
		return nil
	}
	return m
}

// TestTableCoversTheModel keeps the table honest: every refusal code of a
// request appears in it, and so do core-only, memory-only, sidecar, init and
// overhead rows.
func TestTableCoversTheModel(t *testing.T) {
	seen := map[gpureq.Code]bool{}
	var coreOnly, memOnly, sidecar, initC, overhead bool
	for _, r := range rows() {
		seen[r.want] = true
		overhead = overhead || len(r.overhead) > 0
		for _, c := range r.ctrs {
			coreOnly = coreOnly || (c.cores != "" && c.mem == "")
			memOnly = memOnly || (c.mem != "" && c.cores == "")
			sidecar = sidecar || c.kind == gpureq.Sidecar
			initC = initC || c.kind == gpureq.Init
		}
	}
	counts := map[string]bool{}
	for _, r := range rows() {
		if r.want == accept && r.count != "" {
			counts[r.count] = true
		}
	}
	for _, n := range []string{"1", "2", "4"} {
		if !counts[n] {
			t.Errorf("no accepted row with gpu-count %s", n)
		}
	}
	for _, c := range []gpureq.Code{accept, gpureq.CodeInvalidQuantity, gpureq.CodeWholeAndShared, gpureq.CodeCoresAboveGPU, gpureq.CodeTooManyGPUs, gpureq.CodeSliceTooLarge,
		gpureq.CodeInvalidGPUCount, gpureq.CodeGPUCountAboveNode, gpureq.CodeGPUCountUneven, gpureq.CodeGPUCountWithoutSlice} {
		if !seen[c] {
			t.Errorf("no row with verdict %q", c)
		}
	}
	var missing []string
	for name, ok := range map[string]bool{"core-only": coreOnly, "memory-only": memOnly, "sidecar": sidecar, "init": initC, "overhead": overhead} {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("no %s rows", strings.Join(missing, ", "))
	}
}
