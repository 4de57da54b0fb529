package extender

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// machineNode is a node with the GPUs of a mock machine (their NUMA nodes
// as the profile has them) and a NUMA report under policy: CPU 0 reserved,
// held maps pod keys (namespace/name) to CPUs they hold per NUMA node.
func machineNode(t *testing.T, name, profile, policy string, held map[string]map[int]int) *corev1.Node {
	return machineNodeWith(t, name, profile, policy, held, nil)
}

// machineNodeWith is machineNode with edit applied to its inventory once
// the GPUs have their NUMA nodes (nil: none).
func machineNodeWith(t *testing.T, name, profile, policy string, held map[string]map[int]int, edit func(*testbuild.NodeBuilder)) *corev1.Node {
	t.Helper()
	m, err := nvmlmock.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	b := testbuild.Node(name).GPUs(len(m.GPUs), "A100", 40960)
	for i, g := range m.GPUs {
		b.Inv.GPUs[i].NUMANode = g.NUMANode
	}
	if edit != nil {
		edit(b)
	}
	total := 0
	topo := &api.NUMATopology{APIVersion: api.Version, Kind: api.KindNUMATopology, TopologyManagerPolicy: policy,
		TopologyManagerScope: api.TopologyScopeContainer, CPUManagerPolicy: api.CPUManagerPolicyStatic, Source: api.NUMASourcePodResources}
	used := map[int]int{}
	for key, zones := range held {
		ns, pod, _ := strings.Cut(key, "/")
		u := api.NUMAPodUse{Namespace: ns, Name: pod}
		for id := 0; id < len(m.NUMANodes); id++ {
			if n := zones[id]; n > 0 {
				u.Zones = append(u.Zones, api.NUMAZoneUse{ID: id, CPUs: n})
				used[id] += n
			}
		}
		topo.Pods = append(topo.Pods, u)
	}
	for _, n := range m.NUMANodes {
		cpus, err := cpuset.Parse(n.CPUs)
		if err != nil {
			t.Fatal(err)
		}
		c := cpus.Size()
		if n.ID == 0 {
			c-- // CPU 0 reserved
		}
		total += cpus.Size()
		topo.Zones = append(topo.Zones, api.NUMAZone{ID: n.ID, CPUs: c, FreeCPUs: c - used[n.ID]})
	}
	node := b.CPU(resource.NewQuantity(int64(total-1), resource.DecimalSI).String()).Obj()
	v, err := api.EncodeNUMATopology(topo)
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations[api.AnnotationNUMATopology] = v
	return node
}

// guaranteedPod asks gpus whole GPUs and cpus CPUs, requests = limits.
func guaranteedPod(name string, gpus int64, cpus string) *testbuild.PodBuilder {
	b := testbuild.Pod(name).Whole(gpus)
	c := &b.Pod.Spec.Containers[0]
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		rl[corev1.ResourceCPU] = resource.MustParse(cpus)
		rl[corev1.ResourceMemory] = resource.MustParse("1Gi")
	}
	return b
}

func TestNUMAFilterOnMockMachines(t *testing.T) {
	hogs := map[string]map[int]int{"default/hog-0": {0: 100}, "default/hog-1": {1: 100}}
	hogPods := func(node string) []*corev1.Pod {
		return []*corev1.Pod{guaranteedPod("hog-0", 0, "100").Node(node).Obj(), guaranteedPod("hog-1", 0, "100").Node(node).Obj()}
	}
	smallHogs := []*corev1.Pod{guaranteedPod("hog-0", 0, "10").Node("n").Obj(), guaranteedPod("hog-1", 0, "10").Node("n").Obj()}
	big := guaranteedPod("big", 4, "32").Obj()
	tests := []struct {
		name   string
		node   *corev1.Node
		pods   []*corev1.Pod
		pod    *corev1.Pod
		ignore bool
		want   Reason
		msg    string
	}{
		{name: "empty dgx-a100", node: machineNode(t, "n", "dgx-a100", "single-numa-node", nil), pod: big},
		{name: "CPUs taken on both NUMA nodes", node: machineNode(t, "n", "dgx-a100", "single-numa-node", hogs), pods: hogPods("n"), pod: big,
			want: NoNUMAFit, msg: "tessera: no NUMA node has 4 free GPUs and 32 free CPUs (topology manager policy single-numa-node)"},
		{name: "restricted refuses as well", node: machineNode(t, "n", "dgx-a100", "restricted", hogs), pods: hogPods("n"), pod: big, want: NoNUMAFit},
		{name: "best-effort admits", node: machineNode(t, "n", "dgx-a100", "best-effort", hogs), pods: hogPods("n"), pod: big},
		{name: "none admits", node: machineNode(t, "n", "dgx-a100", "none", hogs), pods: hogPods("n"), pod: big},
		{name: "--numa-fit=false admits", node: machineNode(t, "n", "dgx-a100", "single-numa-node", hogs), pods: hogPods("n"), pod: big, ignore: true},
		{name: "ended hogs free their CPUs", node: machineNode(t, "n", "dgx-a100", "single-numa-node", hogs), pod: big},
		{name: "a hog the node has not reported yet holds its CPUs", node: machineNode(t, "n", "dgx-a100", "single-numa-node", map[string]map[int]int{"default/hog-0": {0: 100}}),
			pods: hogPods("n"), pod: big, want: NoNUMAFit},
		{name: "GPUs of the free side taken", node: machineNode(t, "n", "dgx-a100", "single-numa-node", map[string]map[int]int{"default/hog-0": {0: 100}}),
			pods: []*corev1.Pod{hogPods("n")[0], testbuild.Pod("w").Whole(1).Node("n").Holding(4).Obj()}, pod: big, want: NoNUMAFit},
		{name: "8 GPUs never fit one NUMA node", node: machineNode(t, "n", "dgx-a100", "single-numa-node", nil), pod: testbuild.Pod("p").Whole(8).Obj(),
			want: NUMANodeTooSmall, msg: "tessera: no NUMA node has 8 GPUs even when empty (topology manager policy single-numa-node)"},
		{name: "a burstable pod aligns GPUs only", node: machineNode(t, "n", "dgx-a100", "single-numa-node", hogs), pods: hogPods("n"), pod: testbuild.Pod("p").Whole(4).CPU("32").Obj()},
		{name: "pcie-2numa: 2 GPUs and 60 CPUs", node: machineNode(t, "n", "pcie-2numa", "single-numa-node", map[string]map[int]int{"default/hog-0": {1: 10}}),
			pods: smallHogs[:1], pod: guaranteedPod("p", 2, "60").Obj()},
		{name: "pcie-2numa: 2 GPUs and 60 CPUs, neither side", node: machineNode(t, "n", "pcie-2numa", "single-numa-node", map[string]map[int]int{"default/hog-0": {0: 10}, "default/hog-1": {1: 10}}),
			pods: smallHogs, pod: guaranteedPod("p", 2, "60").Obj(), want: NoNUMAFit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCache()
			if tc.ignore {
				c.IgnoreNUMA()
			}
			c.SetNode(tc.node)
			for _, p := range tc.pods {
				c.SetPod(p)
			}
			d, err := ParseDemand(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			v := Filter(mustState(t, c, "n"), &d)
			if v.Reason != tc.want {
				t.Fatalf("Filter = %+v, want %q", v, tc.want)
			}
			if tc.msg != "" && v.Message != tc.msg {
				t.Errorf("message = %q, want %q", v.Message, tc.msg)
			}
		})
	}
}

// MIG instances align with exclusive CPUs as GPUs do: the kubelet's
// topology manager hints an instance on its GPU's NUMA node (found on make
// demo: a Guaranteed 1g.5gb pod with 40 CPUs was bound to a node whose MIG
// GPUs' NUMA node had 17 CPUs free, and failed with TopologyAffinityError).
func TestNUMAFilterOfMIGPods(t *testing.T) {
	guaranteedMIG := func(name, profile, cpus string) *testbuild.PodBuilder {
		b := migPod(name, profile, 1)
		c := &b.Pod.Spec.Containers[0]
		for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			rl[corev1.ResourceCPU] = resource.MustParse(cpus)
			rl[corev1.ResourceMemory] = resource.MustParse("1Gi")
		}
		return b
	}
	// dgx-a100-mig: GPUs 0-3 in MIG mode, all on NUMA node 0; with
	// gpu3OnNUMA1, GPU 3 (3g.20gb + 2g.10gb + 1g.5gb) is on NUMA node 1.
	layout := func(b *testbuild.NodeBuilder) { migLayout(b, "n") }
	gpu3OnNUMA1 := func(b *testbuild.NodeBuilder) { migLayout(b, "n"); b.Inv.GPUs[3].NUMANode = 1 }
	hog := func(zone int) (map[string]map[int]int, []*corev1.Pod) {
		return map[string]map[int]int{"default/hog": {zone: 100}}, []*corev1.Pod{guaranteedPod("hog", 0, "100").Node("n").Obj()}
	}
	hog0, hog0Pods := hog(0)
	hog1, hog1Pods := hog(1)
	tests := []struct {
		name string
		node *corev1.Node
		pods []*corev1.Pod
		pod  *corev1.Pod
		want Reason
		msg  string
	}{
		{name: "CPUs of the instances' NUMA node taken", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, layout),
			pods: hog0Pods, pod: guaranteedMIG("p", "1g.5gb", "40").Obj(), want: NoNUMAFit,
			msg: "tessera: no NUMA node has 1 free 1g.5gb MIG instance and 40 free CPUs (topology manager policy single-numa-node)"},
		{name: "CPUs of the other NUMA node taken", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog1, layout),
			pods: hog1Pods, pod: guaranteedMIG("p", "1g.5gb", "40").Obj()},
		{name: "a burstable pod aligns its instance only", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, layout),
			pods: hog0Pods, pod: migPod("p", "1g.5gb", 1).CPU("40").Obj()},
		{name: "best-effort admits", node: machineNodeWith(t, "n", "dgx-a100-mig", "best-effort", hog0, layout),
			pods: hog0Pods, pod: guaranteedMIG("p", "1g.5gb", "40").Obj()},
		{name: "an instance on the NUMA node with CPUs", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, gpu3OnNUMA1),
			pods: hog0Pods, pod: guaranteedMIG("p", "3g.20gb", "40").Obj()},
		{name: "that instance held by a pod", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, gpu3OnNUMA1),
			pods: append([]*corev1.Pod{migPod("a", "3g.20gb", 1).Node("n").HoldingMIG("3g.20gb", [2]int{3, 0}).Obj()}, hog0Pods...),
			pod:  guaranteedMIG("p", "3g.20gb", "40").Obj(), want: NoNUMAFit},
		{name: "the held instance is on the other NUMA node", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, gpu3OnNUMA1),
			pods: append([]*corev1.Pod{migPod("a", "3g.20gb", 1).Node("n").HoldingMIG("3g.20gb", [2]int{2, 0}).Obj()}, hog0Pods...),
			pod:  guaranteedMIG("p", "3g.20gb", "40").Obj()},
		{name: "an instance not recorded yet is held where the kubelet puts it first", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, gpu3OnNUMA1),
			pods: append([]*corev1.Pod{migPod("a", "3g.20gb", 1).Node("n").Obj()}, hog0Pods...),
			pod:  guaranteedMIG("p", "3g.20gb", "40").Obj()},
		{name: "an instance not recorded yet goes with its CPUs", node: machineNodeWith(t, "n", "dgx-a100-mig", "single-numa-node", hog0, gpu3OnNUMA1),
			pods: append([]*corev1.Pod{guaranteedMIG("a", "3g.20gb", "40").Node("n").Obj()}, hog0Pods...),
			pod:  guaranteedMIG("p", "3g.20gb", "40").Obj(), want: NoNUMAFit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCache()
			c.SetNode(tc.node)
			for _, p := range tc.pods {
				c.SetPod(p)
			}
			d, err := ParseDemand(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			v := Filter(mustState(t, c, "n"), &d)
			if v.Reason != tc.want {
				t.Fatalf("Filter = %+v, want %q", v, tc.want)
			}
			if tc.msg != "" && v.Message != tc.msg {
				t.Errorf("message = %q, want %q", v.Message, tc.msg)
			}
		})
	}
}

func TestNUMAMalformedReport(t *testing.T) {
	node := machineNode(t, "n", "dgx-a100", "single-numa-node", nil)
	node.Annotations[api.AnnotationNUMATopology] = `{"apiVersion":"tessera.dev/v1alpha1","kind":"NUMATopology","topologyManagerPolicy":"strict"}`
	c := newTestCache(t, []*corev1.Node{node}, nil)
	d, _ := ParseDemand(testbuild.Pod("p").Whole(1).Obj())
	v := Filter(mustState(t, c, "n"), &d)
	if v.Reason != BadNUMATopology || !v.Reason.Unresolvable() || !strings.Contains(v.Message, api.AnnotationNUMATopology) {
		t.Fatalf("Filter = %+v, want %s naming the annotation", v, BadNUMATopology)
	}
}

// A slice with exclusive CPUs goes to a GPU on the NUMA node that has the
// CPUs.
func TestNUMASlicePlacement(t *testing.T) {
	node := machineNode(t, "n", "pcie-2numa", "single-numa-node", map[string]map[int]int{"default/hog-0": {0: 60}})
	c := newTestCache(t, []*corev1.Node{node}, []*corev1.Pod{guaranteedPod("hog-0", 0, "60").Node("n").Obj()})
	st := mustState(t, c, "n")
	p := testbuild.Pod("p").Shared(8, 30).Obj()
	for _, rl := range []corev1.ResourceList{p.Spec.Containers[0].Resources.Limits, p.Spec.Containers[0].Resources.Requests} {
		rl[corev1.ResourceCPU] = resource.MustParse("8")
		rl[corev1.ResourceMemory] = resource.MustParse("1Gi")
	}
	d, err := ParseDemand(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ { // the policy's choice is not random
		u, err := ChoosePlacement(bestFit(t), st, types.UID("p"), &d)
		if err != nil {
			t.Fatal(err)
		}
		if g := st.Info.GPUs[st.Info.position(u.Shared[0].UUID)]; g.NUMANode != 1 {
			t.Fatalf("slice on GPU %d of NUMA node %d, want NUMA node 1 (NUMA node 0 has 3 free CPUs)", g.Index, g.NUMANode)
		}
	}
}

// Under best-effort the kubelet admits a pod it cannot align: nodes that
// can align it score above those that cannot.
func TestNUMAPreferAligned(t *testing.T) {
	scores := []int64{10, 4, 0, 7}
	PreferAligned(scores, []bool{true, true, false, true}, []bool{false, true, false, true})
	if want := []int64{0, 4, 0, 7}; !equalInts(scores, want) {
		t.Errorf("scores = %v, want %v", scores, want)
	}
	scores = []int64{10, 0}
	PreferAligned(scores, []bool{true, true}, []bool{true, true})
	if want := []int64{10, 0}; !equalInts(scores, want) {
		t.Errorf("all aligned: scores = %v, want %v unchanged", scores, want)
	}
	// On the ledger: a best-effort node whose NUMA nodes lack CPUs cannot
	// align; an empty one can.
	hogs := map[string]map[int]int{"default/hog-0": {0: 100}, "default/hog-1": {1: 100}}
	c := newTestCache(t, []*corev1.Node{machineNode(t, "busy", "dgx-a100", "best-effort", hogs), machineNode(t, "free", "dgx-a100", "best-effort", nil)},
		[]*corev1.Pod{guaranteedPod("hog-0", 0, "100").Node("busy").Obj(), guaranteedPod("hog-1", 0, "100").Node("busy").Obj()})
	d, _ := ParseDemand(guaranteedPod("big", 4, "32").Obj())
	if mustState(t, c, "busy").numaAligned(&d) || !mustState(t, c, "free").numaAligned(&d) {
		t.Error("numaAligned: want busy false, free true")
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Gangs are planned with the same rule: two members of 4 GPUs and 60 CPUs
// each fit one dgx-a100 (one per NUMA node), but only one fits a node whose
// NUMA node 1 has 28 CPUs free, though its 155 free CPUs and 8 GPUs hold
// two by the totals.
func TestNUMAGangPlan(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{
		machineNode(t, "a", "dgx-a100", "single-numa-node", map[string]map[int]int{"default/hog-1": {1: 100}}),
		machineNode(t, "b", "dgx-a100", "single-numa-node", nil),
	}, []*corev1.Pod{guaranteedPod("hog-1", 0, "100").Node("a").Obj()})
	members := []*corev1.Pod{guaranteedPod("m0", 4, "60").Obj(), guaranteedPod("m1", 4, "60").Obj(), guaranteedPod("m2", 4, "60").Obj()}
	demands := make([]Demand, len(members))
	grp := gang.Group{Namespace: "default", Name: "g", MinMember: len(members)}
	for i, m := range members {
		d, err := ParseDemand(m)
		if err != nil {
			t.Fatal(err)
		}
		demands[i] = d
		grp.Members = append(grp.Members, gang.Member{Name: m.Name, Request: d.Request(1024, 40960)})
	}
	var nodes []gang.Node
	for _, n := range []string{"a", "b"} {
		st := mustState(t, c, n)
		nodes = append(nodes, gang.Node{Node: st.View(allocator.Whole), Admit: st.numaAdmit(demands)})
	}
	plan, err := gang.PlanGroup(grp, nodes, bestFit(t))
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, p := range plan.Placements {
		per[p.Node]++
	}
	if per["a"] != 1 || per["b"] != 2 {
		t.Errorf("placements per node = %v, want a:1 b:2", per)
	}
	// A fourth member fits nowhere.
	grp.Members = append(grp.Members, grp.Members[0])
	grp.Members[3].Name = "m3"
	grp.MinMember = 4
	demands = append(demands, demands[0])
	for i, n := range []string{"a", "b"} {
		nodes[i].Admit = mustState(t, c, n).numaAdmit(demands)
	}
	if _, err := gang.PlanGroup(grp, nodes, bestFit(t)); err == nil {
		t.Error("four members of 4 GPUs and 60 CPUs planned on two dgx-a100 with one NUMA node taken")
	}
}

func bestFit(t *testing.T) allocator.Policy {
	t.Helper()
	p, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
