package extender

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// migSlot is one instance of a layout.
type migSlot struct {
	profile     string
	start, size int
}

// migNode is a node of 8 A100s of which GPUs 0-1 are in 7 × 1g.5gb and
// GPUs 2-3 in 3g.20gb + 2g.10gb + 1g.5gb (dgx-a100-mig's layout).
func migNode(name string) *corev1.Node {
	b := testbuild.Node(name).GPUs(8, "A100", 40960)
	migLayout(b, name)
	return b.Obj()
}

// migLayout puts GPUs 0-3 of b (node name) in migNode's layout.
func migLayout(b *testbuild.NodeBuilder, name string) {
	for i := 0; i < 4; i++ {
		g := &b.Inv.GPUs[i]
		g.MemoryUnits = 0
		g.MIG = &api.InventoryMIG{}
		layout := []migSlot{{"1g.5gb", 0, 1}, {"1g.5gb", 1, 1}, {"1g.5gb", 2, 1}, {"1g.5gb", 3, 1}, {"1g.5gb", 4, 1}, {"1g.5gb", 5, 1}, {"1g.5gb", 6, 1}}
		if i >= 2 {
			layout = []migSlot{{"3g.20gb", 0, 4}, {"2g.10gb", 4, 2}, {"1g.5gb", 6, 1}}
		}
		for k, l := range layout {
			g.MIG.Instances = append(g.MIG.Instances, api.InventoryMIGInstance{UUID: testbuild.MIGUUID(name, i, k), Profile: l.profile,
				MIGPlacement: api.MIGPlacement{Start: l.start, Size: l.size}, Healthy: true})
		}
	}
	for _, p := range []string{"1g.5gb", "2g.10gb", "3g.20gb"} {
		b.Inv.Resources = append(b.Inv.Resources, string(api.MIGResource(p)))
	}
}

// migPod asks n instances of profile.
func migPod(name, profile string, n int64) *testbuild.PodBuilder {
	b := testbuild.Pod(name)
	b.Pod.Spec.Containers[0].Resources.Limits[api.MIGResource(profile)] = *resource.NewQuantity(n, resource.DecimalSI)
	return b
}

func TestMIGFilter(t *testing.T) {
	tests := []struct {
		name string
		node *corev1.Node
		pods []*corev1.Pod
		pod  *corev1.Pod
		want Reason
		msg  string
	}{
		{name: "fits", node: migNode("n"), pod: migPod("p", "1g.5gb", 2).Obj()},
		{name: "a node without MIG", node: testbuild.Node("n").GPUs(8, "A100", 40960).Obj(), pod: migPod("p", "1g.5gb", 1).Obj(),
			want: NoMIG, msg: "tessera: node has no GPU in MIG mode"},
		{name: "a profile the node does not have", node: migNode("n"), pod: migPod("p", "7g.40gb", 1).Obj(),
			want: NoMIGProfile, msg: "tessera: node has fewer than 1 healthy tessera.dev/mig-7g.40gb instances"},
		{name: "recorded and pending instances are used", node: migNode("n"),
			pods: []*corev1.Pod{migPod("a", "3g.20gb", 1).Node("n").HoldingMIG("3g.20gb", [2]int{2, 0}).Obj(), migPod("b", "3g.20gb", 1).Node("n").Obj()},
			pod:  migPod("p", "3g.20gb", 1).Obj(), want: InsufficientMIG,
			msg: "tessera: fewer than 1 tessera.dev/mig-3g.20gb instances free (0 free; instances of pods the node agent has not recorded yet count as used)"},
		{name: "an ended pod's instance is free", node: migNode("n"),
			pods: []*corev1.Pod{migPod("a", "3g.20gb", 1).Node("n").HoldingMIG("3g.20gb", [2]int{2, 0}).Obj()},
			pod:  migPod("p", "3g.20gb", 1).Obj()},
		{name: "16 of 16 1g.5gb", node: migNode("n"), pod: migPod("p", "1g.5gb", 16).Obj()},
		{name: "17 of 16 1g.5gb", node: migNode("n"), pod: migPod("p", "1g.5gb", 17).Obj(), want: NoMIGProfile},
		{name: "GPUs in MIG mode are not offered whole", node: migNode("n"), pod: testbuild.Pod("p").Whole(5).Obj(), want: TooFewGPUs,
			msg: "tessera: node has fewer than 5 healthy GPUs (4 of its 8 GPUs are in MIG mode, offered as MIG instances only)"},
		{name: "a slice on more GPUs than the node offers", node: migNode("n"), pod: testbuild.Pod("p").Shared(5, 10).GPUCount("5").Obj(),
			want: GPUCountAboveNode, msg: "tessera: tessera.dev/gpu-count 5: node has fewer than 5 healthy GPUs for slices (4 of its 8 GPUs are in MIG mode, offered as MIG instances only)"},
		{name: "the other 4 are", node: migNode("n"), pod: testbuild.Pod("p").Whole(4).Obj()},
		{name: "nor sliced", node: migNode("n"), pods: []*corev1.Pod{testbuild.Pod("w").Whole(4).Node("n").Holding(4, 5, 6, 7).Obj()},
			pod: testbuild.Pod("p").Shared(4, 10).Obj(), want: NoGPUForSlice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCache(t, []*corev1.Node{tc.node}, tc.pods)
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
			if r := tc.want; r == NoMIG || r == NoMIGProfile {
				if !r.Unresolvable() {
					t.Errorf("%s is resolvable", r)
				}
			}
		})
	}
}

// MIG pods binpack: the node with fewer free instances of the profile
// scores higher, and a bound pod's instances count until recorded.
func TestMIGScoreAndBind(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{migNode("a"), migNode("b")},
		[]*corev1.Pod{migPod("x", "1g.5gb", 3).Node("b").HoldingMIG("1g.5gb", [2]int{0, 0}, [2]int{0, 1}, [2]int{0, 2}).Obj()})
	d, _ := ParseDemand(migPod("p", "1g.5gb", 1).Obj())
	q := NewQuery(&d)
	sa, oka := q.Score(bestFit(t), mustState(t, c, "a"))
	sb, okb := q.Score(bestFit(t), mustState(t, c, "b"))
	if !oka || !okb || sb <= sa {
		t.Fatalf("scores a=%v(%v) b=%v(%v): want b above a", sa, oka, sb, okb)
	}
	// Reserve 13 more on b: it is then full for 1g.5gb.
	big, _ := ParseDemand(migPod("q", "1g.5gb", 13).Obj())
	u, err := ChoosePlacement(bestFit(t), mustState(t, c, "b"), "q", &big)
	if err != nil {
		t.Fatal(err)
	}
	if u.MIGPending["1g.5gb"] != 13 {
		t.Fatalf("placement = %+v, want 13 1g.5gb pending", u)
	}
	if _, err := c.Reserve("q", "b", func(*NodeState) (*PodUse, error) { u.Node = "b"; return u, nil }); err != nil {
		t.Fatal(err)
	}
	if v := Filter(mustState(t, c, "b"), &d); v.Reason != InsufficientMIG || !strings.Contains(v.Message, "0 free") {
		t.Errorf("after the reservation: %+v, want insufficient-free-mig", v)
	}
}

// A gang of MIG pods is planned by the instances free on each node.
func TestMIGGangPlan(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{migNode("a"), testbuild.Node("b").GPUs(8, "A100", 40960).Obj()}, nil)
	var demands []Demand
	grp := gang.Group{Namespace: "default", Name: "g"}
	for i := 0; i < 2; i++ {
		d, err := ParseDemand(migPod(fmt.Sprintf("m%d", i), "3g.20gb", 1).Obj())
		if err != nil {
			t.Fatal(err)
		}
		demands = append(demands, d)
		grp.Members = append(grp.Members, gang.Member{Name: fmt.Sprintf("m%d", i), Request: d.Request(1024, 40960)})
	}
	plan := func() (*gang.Plan, error) {
		var nodes []gang.Node
		for _, n := range []string{"a", "b"} {
			st := mustState(t, c, n)
			nodes = append(nodes, gang.Node{Node: st.View(allocator.Whole), Admit: allOf(st.numaAdmit(demands), st.migAdmit(demands))})
		}
		grp.MinMember = len(grp.Members)
		return gang.PlanGroup(grp, nodes, bestFit(t))
	}
	p, err := plan()
	if err != nil {
		t.Fatal(err)
	}
	for _, pl := range p.Placements {
		if pl.Node != "a" {
			t.Errorf("member %s planned on %s, the node without MIG", pl.Member, pl.Node)
		}
	}
	// A third 3g.20gb finds none (node a has two).
	demands = append(demands, demands[0])
	grp.Members = append(grp.Members, gang.Member{Name: "m2", Request: demands[0].Request(1024, 40960)})
	if _, err := plan(); err == nil {
		t.Error("three 3g.20gb members planned on a node with two")
	}
}

// The CPU-only prioritize entry gives MIG pods the flat score it gives
// every GPU pod (the main entry scores them).
func TestMIGPodsAreGPUPodsForTheCPUEntry(t *testing.T) {
	d, _ := ParseDemand(migPod("p", "1g.5gb", 1).Obj())
	if !d.UsesGPUs() {
		t.Fatal("a MIG demand does not use GPUs")
	}
	f := newFixture(t, []*corev1.Node{migNode("a"), testbuild.Node("b").GPUs(8, "A100", 40960).Obj()}, nil)
	names := []string{"a", "b"}
	var got extenderv1.HostPriorityList
	f.post(t, verbs.PathPrioritizeCPU, &extenderv1.ExtenderArgs{Pod: migPod("p", "1g.5gb", 1).Obj(), NodeNames: &names}, &got)
	for _, h := range got {
		if h.Score != 0 {
			t.Errorf("CPU entry scored %s %d, want the flat 0", h.Host, h.Score)
		}
	}
}
