package numa

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/gpureq"
	"k8s.io/utils/cpuset"
)

// machineZones are the zones of a mock machine, empty: its GPUs and CPUs
// per NUMA node, reserved CPUs taken from NUMA node 0.
func machineZones(t *testing.T, profile string, reserved int) []Zone {
	t.Helper()
	m, err := nvmlmock.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	var zones []Zone
	for _, n := range m.NUMANodes {
		cpus, err := cpuset.Parse(n.CPUs)
		if err != nil {
			t.Fatal(err)
		}
		z := Zone{ID: n.ID, CPUs: cpus.Size()}
		if n.ID == 0 {
			z.CPUs -= reserved
		}
		z.FreeCPUs = z.CPUs
		for _, g := range m.GPUs {
			if g.NUMANode == n.ID {
				z.GPUs++
				z.FreeGPUs++
			}
		}
		zones = append(zones, z)
	}
	return zones
}

// take uses gpus and cpus of zone id.
func take(zones []Zone, id, gpus, cpus int) []Zone {
	out := append([]Zone(nil), zones...)
	for i := range out {
		if out[i].ID == id {
			out[i].FreeGPUs -= gpus
			out[i].FreeCPUs -= cpus
		}
	}
	return out
}

func TestCheckOnMockMachines(t *testing.T) {
	a100 := machineZones(t, "dgx-a100", 1) // 4 GPUs and 127/128 CPUs per NUMA node
	pcie := machineZones(t, "pcie-2numa", 1)
	if len(a100) != 2 || a100[0].GPUs != 4 || a100[1].CPUs != 128 || a100[0].CPUs != 127 {
		t.Fatalf("dgx-a100 zones = %+v", a100)
	}
	pod4x32 := []Need{{GPUs: 4, CPUs: 32}}
	tests := []struct {
		name    string
		policy  Policy
		zones   []Zone
		held    []Held
		needs   []Need
		wantErr string // "" fits
		tooBig  bool
	}{
		{name: "empty dgx-a100", policy: SingleNUMANode, zones: a100, needs: pod4x32},
		{name: "GPU side's CPUs taken, other side's GPUs taken", policy: SingleNUMANode,
			zones: take(take(a100, 0, 0, 100), 1, 4, 0), needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
		{name: "CPUs taken on both sides, node total still enough", policy: SingleNUMANode,
			zones: take(take(a100, 0, 0, 100), 1, 0, 100), needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
		{name: "same under restricted", policy: Restricted,
			zones: take(take(a100, 0, 0, 100), 1, 0, 100), needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
		{name: "best-effort never refuses", policy: BestEffort,
			zones: take(take(a100, 0, 0, 100), 1, 0, 100), needs: pod4x32},
		{name: "none never refuses", policy: None, zones: take(a100, 0, 4, 127), needs: pod4x32},
		{name: "one side has both", policy: SingleNUMANode, zones: take(a100, 0, 1, 0), needs: pod4x32},
		{name: "8 GPUs never fit one dgx-a100 NUMA node", policy: SingleNUMANode, zones: a100,
			needs: []Need{{GPUs: 8}}, wantErr: "no NUMA node has 8 GPUs even when empty", tooBig: true},
		{name: "restricted leaves 8 GPUs to the kubelet", policy: Restricted, zones: a100, needs: []Need{{GPUs: 8}}},
		{name: "the kubelet gives a pending pod the first NUMA node with room", policy: SingleNUMANode, zones: take(a100, 1, 0, 100),
			held: []Held{{Need: Need{GPUs: 4}, Zone: -1}}, needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
		{name: "a pending pod that fits nowhere frees nothing and takes nothing", policy: SingleNUMANode, zones: a100,
			held: []Held{{Need: Need{GPUs: 5}, Zone: -1}}, needs: pod4x32},
		{name: "a pending pod leaves room on the other side", policy: SingleNUMANode, zones: a100,
			held: []Held{{Need: Need{GPUs: 4, CPUs: 32}, Zone: -1}}, needs: pod4x32},
		{name: "a pinned pending pod", policy: SingleNUMANode, zones: take(a100, 1, 4, 0),
			held: []Held{{Need: Need{CPUs: 100}, Zone: 0}}, needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
		{name: "pcie-2numa: 2 GPUs and 60 CPUs", policy: SingleNUMANode, zones: pcie, needs: []Need{{GPUs: 2, CPUs: 60}}},
		{name: "pcie-2numa: slice needs a zone with a free slice GPU", policy: SingleNUMANode,
			zones: []Zone{{ID: 0, GPUs: 2, CPUs: 63, FreeCPUs: 63}, {ID: 1, GPUs: 2, CPUs: 64, FreeCPUs: 2, SliceRoom: true}},
			needs: []Need{{Slice: true, CPUs: 8}}, wantErr: "the kubelet puts 8 exclusive CPUs on NUMA node 0, the first with room for them, and no GPU there has room for the slice"},
		// A slice's units carry no NUMA node: the kubelet aligns only the
		// CPUs, on the first NUMA node with room for them; the slice must
		// be there, though NUMA node 1 has room for both.
		{name: "pcie-2numa: the slice must be where the kubelet puts the CPUs", policy: SingleNUMANode,
			zones: []Zone{{ID: 0, GPUs: 2, CPUs: 63, FreeCPUs: 63}, {ID: 1, GPUs: 2, CPUs: 64, FreeCPUs: 64, SliceRoom: true}},
			needs: []Need{{Slice: true, CPUs: 8}}, wantErr: "the kubelet puts 8 exclusive CPUs on NUMA node 0, the first with room for them, and no GPU there has room for the slice"},
		{name: "pcie-2numa: the CPUs' NUMA node full, the slice goes with them to the other", policy: SingleNUMANode,
			zones: []Zone{{ID: 0, GPUs: 2, CPUs: 63, FreeCPUs: 4}, {ID: 1, GPUs: 2, CPUs: 64, FreeCPUs: 64, SliceRoom: true}},
			needs: []Need{{Slice: true, CPUs: 8}}},
		{name: "pcie-2numa: a slice alone goes on any GPU with room", policy: SingleNUMANode,
			zones: []Zone{{ID: 0, GPUs: 2, CPUs: 63, FreeCPUs: 63}, {ID: 1, GPUs: 2, CPUs: 64, FreeCPUs: 64, SliceRoom: true}},
			needs: []Need{{Slice: true}}},
		{name: "pcie-2numa: no NUMA node has room for the CPUs", policy: SingleNUMANode,
			zones: []Zone{{ID: 0, GPUs: 2, CPUs: 63, FreeCPUs: 4, SliceRoom: true}, {ID: 1, GPUs: 2, CPUs: 64, FreeCPUs: 4, SliceRoom: true}},
			needs: []Need{{Slice: true, CPUs: 8}}, wantErr: "no NUMA node has a GPU with room for the slice and 8 free CPUs"},
		{name: "container scope: two containers on two sides", policy: SingleNUMANode, zones: take(take(a100, 0, 0, 60), 1, 0, 60),
			needs: []Need{{Name: "a", GPUs: 2, CPUs: 60}, {Name: "b", GPUs: 2, CPUs: 60}}},
		{name: "container scope: not together", policy: SingleNUMANode, zones: take(take(a100, 0, 0, 60), 1, 0, 60),
			needs: []Need{{Name: "a", CPUs: 60}, {Name: "b", CPUs: 60}, {Name: "c", CPUs: 60}}, wantErr: "no NUMA nodes hold the pod's 3 aligned containers at once"},
		{name: "a pinned pod over its zone's room keeps the zone full", policy: SingleNUMANode, zones: take(a100, 1, 4, 0),
			held: []Held{{Need: Need{CPUs: 200}, Zone: 0}}, needs: pod4x32, wantErr: "no NUMA node has 4 free GPUs and 32 free CPUs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.policy, tc.zones, tc.held, tc.needs)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Check() = %v, want a fit", err)
				}
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("Check() = %v, want %q", err, tc.wantErr)
			}
			var ne *Error
			if !errors.As(err, &ne) || ne.TooLarge != tc.tooBig {
				t.Fatalf("Check() = %#v, want TooLarge %v", err, tc.tooBig)
			}
		})
	}
}

func TestFitPlacesEachNeed(t *testing.T) {
	zones := []Zone{{ID: 0, FreeGPUs: 1, FreeCPUs: 10, SliceRoom: true}, {ID: 3, FreeGPUs: 4, FreeCPUs: 40, SliceRoom: true}}
	placed, ok := Fit(zones, []Held{{Need: Need{CPUs: 5}, Zone: 0}}, []Need{{GPUs: 4, CPUs: 8}, {Slice: true, CPUs: 5}, {Slice: true, CPUs: 1}})
	if !ok {
		t.Fatal("no fit")
	}
	// First fit by zone, unit after unit, after the held unit.
	if diff := cmp.Diff([]int{3, 0, 3}, placed); diff != "" {
		t.Errorf("placed (-want +got):\n%s", diff)
	}
	// Memory counts only where the zone tracks it.
	if _, ok := Fit([]Zone{{ID: 0, FreeCPUs: 4}}, nil, []Need{{CPUs: 4, MemMiB: 1 << 20}}); !ok {
		t.Error("untracked memory refused")
	}
	if _, ok := Fit([]Zone{{ID: 0, FreeCPUs: 4, MemMiB: 1024, FreeMemMiB: 512}}, nil, []Need{{CPUs: 4, MemMiB: 1024}}); ok {
		t.Error("tracked memory not checked")
	}
}

func TestFitMIGInstances(t *testing.T) {
	zones := []Zone{
		{ID: 0, FreeCPUs: 8, MIG: map[string]int{"1g.5gb": 7, "3g.20gb": 1}, FreeMIG: map[string]int{"1g.5gb": 2, "3g.20gb": 1}},
		{ID: 1, FreeCPUs: 40, MIG: map[string]int{"1g.5gb": 7}, FreeMIG: map[string]int{"1g.5gb": 3}},
	}
	tests := []struct {
		name  string
		held  []Held
		needs []Need
		want  []int // nil: no fit
	}{
		{name: "instances and CPUs on one zone", needs: []Need{{CPUs: 20, MIG: map[string]int{"1g.5gb": 3}}}, want: []int{1}},
		{name: "instances of each unit counted", needs: []Need{{MIG: map[string]int{"1g.5gb": 2}}, {MIG: map[string]int{"1g.5gb": 2}}}, want: []int{0, 1}},
		{name: "held instances taken first", held: []Held{{Need: Need{MIG: map[string]int{"1g.5gb": 2}}, Zone: 1}},
			needs: []Need{{CPUs: 20, MIG: map[string]int{"1g.5gb": 2}}}},
		{name: "a profile only one zone has", needs: []Need{{CPUs: 20, MIG: map[string]int{"3g.20gb": 1}}}},
		{name: "instances no zone has free", needs: []Need{{MIG: map[string]int{"1g.5gb": 4}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			placed, ok := Fit(zones, tc.held, tc.needs)
			if ok != (tc.want != nil) {
				t.Fatalf("Fit = %v, %v; want %v", placed, ok, tc.want)
			}
			if diff := cmp.Diff(tc.want, placed); diff != "" {
				t.Errorf("placed (-want +got):\n%s", diff)
			}
		})
	}
	if zones[1].FreeMIG["1g.5gb"] != 3 {
		t.Errorf("Fit changed its zones: %v", zones[1].FreeMIG)
	}
	// A unit of more instances than a zone has at all never fits there.
	err := Check(SingleNUMANode, zones, nil, []Need{{CPUs: 4, MIG: map[string]int{"1g.5gb": 8}}})
	if want := "no NUMA node has 8 1g.5gb MIG instances and 4 CPUs even when empty"; err == nil || err.Error() != want {
		t.Errorf("Check = %v, want %q", err, want)
	}
}

// container is a container asking cpu and memory (requests = limits) and
// extra resources.
func container(name, cpu, mem string, extra corev1.ResourceList) corev1.Container {
	l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	for k, v := range extra {
		l[k] = v
	}
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: l, Requests: l}}
}

func TestPodDemand(t *testing.T) {
	gpus := func(n int64) corev1.ResourceList {
		return corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}
	}
	slice := corev1.ResourceList{api.ResourceGPUMemory: resource.MustParse("4")}
	mig := corev1.ResourceList{api.MIGResource("1g.5gb"): resource.MustParse("2")}
	always := corev1.ContainerRestartPolicyAlways
	sidecar := container("side", "2", "1Gi", nil)
	sidecar.RestartPolicy = &always
	burstable := container("main", "4", "1Gi", gpus(2))
	burstable.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	tests := []struct {
		name string
		init []corev1.Container
		ctrs []corev1.Container
		qos  corev1.PodQOSClass
		want Demand
	}{
		{name: "guaranteed 4 GPUs 32 CPUs", ctrs: []corev1.Container{container("main", "32", "64Gi", gpus(4))},
			want: Demand{Pod: Need{GPUs: 4, CPUs: 32, MemMiB: 65536}, Containers: []Need{{Name: "main", GPUs: 4, CPUs: 32, MemMiB: 65536}}}},
		{name: "fractional CPUs are shared", ctrs: []corev1.Container{container("main", "1500m", "1Gi", gpus(1))},
			want: Demand{Pod: Need{GPUs: 1, MemMiB: 1024}, Containers: []Need{{Name: "main", GPUs: 1, MemMiB: 1024}}}},
		{name: "burstable: GPUs only", ctrs: []corev1.Container{burstable},
			want: Demand{Pod: Need{GPUs: 2}, Containers: []Need{{Name: "main", GPUs: 2}}}},
		{name: "the recorded QoS class wins", ctrs: []corev1.Container{container("main", "8", "1Gi", gpus(1))}, qos: corev1.PodQOSBurstable,
			want: Demand{Pod: Need{GPUs: 1}, Containers: []Need{{Name: "main", GPUs: 1}}}},
		{name: "slices merge, sidecar and init", init: []corev1.Container{container("init", "16", "1Gi", nil), sidecar},
			ctrs: []corev1.Container{container("a", "4", "1Gi", slice), container("b", "2", "1Gi", slice), container("c", "1", "1Gi", nil)},
			want: Demand{Pod: Need{Slice: true, CPUs: 16, MemMiB: 4096}, Containers: []Need{
				{Name: "side", CPUs: 2, MemMiB: 1024}, {Name: "a+b", Slice: true, CPUs: 6, MemMiB: 2048}, {Name: "c", CPUs: 1, MemMiB: 1024}}}},
		{name: "CPU-only shared pool", ctrs: []corev1.Container{container("main", "500m", "1Gi", nil)}, want: Demand{}},
		{name: "MIG instances with CPUs", ctrs: []corev1.Container{container("a", "8", "1Gi", mig), container("b", "2", "1Gi", mig)},
			want: Demand{Pod: Need{CPUs: 10, MemMiB: 2048, MIG: map[string]int{"1g.5gb": 4}}, Containers: []Need{
				{Name: "a", CPUs: 8, MemMiB: 1024, MIG: map[string]int{"1g.5gb": 2}}, {Name: "b", CPUs: 2, MemMiB: 1024, MIG: map[string]int{"1g.5gb": 2}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.ctrs}, Status: corev1.PodStatus{QOSClass: tc.qos}}
			p, err := gpureq.ParsePod(pod)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, PodDemand(pod, p)); diff != "" {
				t.Errorf("PodDemand (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNeedsByScope(t *testing.T) {
	d := Demand{Pod: Need{GPUs: 2, CPUs: 8}, Containers: []Need{{Name: "a", GPUs: 2}, {Name: "b", CPUs: 8}}}
	if diff := cmp.Diff([]Need{{GPUs: 2, CPUs: 8}}, d.Needs(ScopePod)); diff != "" {
		t.Errorf("pod scope (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(d.Containers, d.Needs(ScopeContainer)); diff != "" {
		t.Errorf("container scope (-want +got):\n%s", diff)
	}
	if (Demand{}).Needs(ScopePod) != nil {
		t.Error("an empty demand has needs")
	}
}
