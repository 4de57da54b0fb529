package extender

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

func mustDemand(t testing.TB, p *corev1.Pod) *Demand {
	t.Helper()
	d, err := ParseDemand(p)
	if err != nil {
		t.Fatalf("ParseDemand(%s): %v", p.Name, err)
	}
	return &d
}

func TestFilter(t *testing.T) {
	a100 := "NVIDIA A100-SXM4-40GB"
	tests := []struct {
		name   string
		node   *corev1.Node
		pods   []*corev1.Pod
		pod    *corev1.Pod
		want   Reason
		unres  bool
		noNode bool
	}{
		{name: "shared fits", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(), pod: testbuild.Pod("p").Shared(10, 50).Obj()},
		{name: "cpu-only fits a GPU-less node", node: testbuild.Node("n").Obj(), pod: testbuild.Pod("p").CPU("1").Obj()},
		{name: "unknown node", pod: testbuild.Pod("p").Shared(1, 0).Obj(), noNode: true, want: UnknownNode},
		{name: "no inventory", node: testbuild.Node("n").Obj(), pod: testbuild.Pod("p").Whole(1).Obj(), want: NoGPUs, unres: true},
		{name: "model not allowed", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(), pod: testbuild.Pod("p").Whole(1).Model("H100|V100").Obj(), want: ModelNotAllowed, unres: true},
		{name: "model allowed", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(), pod: testbuild.Pod("p").Whole(1).Model("H100|A100").Obj()},
		{name: "no shared isolation", node: testbuild.Node("n").GPUs(2, a100, 40960).NoIsolation().Obj(), pod: testbuild.Pod("p").Shared(1, 0).Obj(), want: NoSharedIsolation, unres: true},
		{name: "whole GPUs without isolation", node: testbuild.Node("n").GPUs(2, a100, 40960).NoIsolation().Obj(), pod: testbuild.Pod("p").Whole(2).Obj()},
		{name: "too few healthy GPUs", node: testbuild.Node("n").GPUs(2, a100, 40960).Unhealthy(0).Obj(), pod: testbuild.Pod("p").Whole(2).Obj(), want: TooFewGPUs, unres: true},
		{name: "slice larger than any GPU", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(), pod: testbuild.Pod("p").Shared(41, 0).Obj(), want: SliceTooLarge, unres: true},
		{name: "node total fits but no single GPU does", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(25, 10).Node("n").On(0, 25600, 10).Obj(),
				testbuild.Pod("b").Shared(25, 10).Node("n").On(1, 25600, 10).Obj(),
			},
			pod: testbuild.Pod("p").Shared(20, 10).Obj(), want: NoGPUForSlice},
		{name: "memory fits but cores do not", node: testbuild.Node("n").GPUs(1, a100, 40960).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Shared(1, 70).Node("n").On(0, 1024, 70).Obj()},
			pod:  testbuild.Pod("p").Shared(1, 40).Obj(), want: NoGPUForSlice},
		{name: "core-only memory default counts", node: testbuild.Node("n").GPUs(1, a100, 40960).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Shared(30, 10).Node("n").On(0, 30720, 10).Obj()},
			pod:  testbuild.Pod("p").Shared(0, 50).Obj(), want: NoGPUForSlice},
		{name: "whole GPUs busy", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Shared(1, 10).Node("n").On(0, 1024, 10).Obj()},
			pod:  testbuild.Pod("p").Whole(2).Obj(), want: InsufficientGPUs},
		{name: "pending whole GPU pod keeps the last free GPU from a slice", node: testbuild.Node("n").GPUs(2, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(40, 10).Node("n").On(0, 40960, 10).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Shared(1, 10).Obj(), want: NoGPUForSlice},
		{name: "while a whole-GPU pod waits for its GPUs, slices avoid free GPUs", node: testbuild.Node("n").GPUs(4, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(10, 10).Node("n").On(0, 10240, 10).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Shared(35, 10).Obj(), want: NoGPUForSlice},
		{name: "while a whole-GPU pod waits for its GPUs, slices go to used GPUs", node: testbuild.Node("n").GPUs(4, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(10, 10).Node("n").On(0, 10240, 10).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Shared(20, 10).Obj()},
		{name: "once the whole GPU is recorded, free GPUs take slices again", node: testbuild.Node("n").GPUs(4, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(10, 10).Node("n").On(0, 10240, 10).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Holding(3).Obj(),
			},
			pod: testbuild.Pod("p").Shared(35, 10).Obj()},
		{name: "whole-GPU pods count pending ones", node: testbuild.Node("n").GPUs(4, a100, 40960).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Shared(10, 10).Node("n").On(0, 10240, 10).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Whole(2).Obj()},
		{name: "a pending NVLink pod keeps other whole-GPU pods waiting", node: testbuild.Node("n").GPUs(4, a100, 40960).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("w").Whole(2).NVLink().Node("n").Obj()},
			pod:  testbuild.Pod("p").Whole(1).Obj(), want: PendingNVLinkPod},
		{name: "a new NVLink pod needs room for pending GPUs in its clique", node: testbuild.Node("n").GPUs(8, a100, 40960).Cliques([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Whole(2).Node("n").Holding(0, 1).Obj(),
				testbuild.Pod("b").Whole(1).Node("n").Holding(4).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Whole(3).NVLink().Obj(), want: NoFreeNVLinkClique},
		{name: "a new NVLink pod fits beside pending GPUs when its clique has room", node: testbuild.Node("n").GPUs(8, a100, 40960).Cliques([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}).Obj(),
			pods: []*corev1.Pod{
				testbuild.Pod("a").Whole(2).Node("n").Holding(0, 1).Obj(),
				testbuild.Pod("w").Whole(1).Node("n").Obj(),
			},
			pod: testbuild.Pod("p").Whole(3).NVLink().Obj()},
		{name: "nvlink clique too small", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).Obj(),
			pod: testbuild.Pod("p").Whole(3).NVLink().Obj(), want: NoNVLinkClique, unres: true},
		{name: "nvlink clique busy", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Whole(1).Node("n").Holding(0).Obj(), testbuild.Pod("b").Whole(1).Node("n").Holding(2).Obj()},
			pod:  testbuild.Pod("p").Whole(2).NVLink().Obj(), want: NoFreeNVLinkClique},
		{name: "without nvlink the same GPUs fit", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Whole(1).Node("n").Holding(0).Obj(), testbuild.Pod("b").Whole(1).Node("n").Holding(2).Obj()},
			pod:  testbuild.Pod("p").Whole(2).Obj()},
		{name: "nvlink clique free", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).Obj(),
			pods: []*corev1.Pod{testbuild.Pod("a").Whole(1).Node("n").Holding(0).Obj()},
			pod:  testbuild.Pod("p").Whole(2).NVLink().Obj()},
		{name: "insufficient cpu", node: testbuild.Node("n").GPUs(1, a100, 40960).CPU("1").Obj(), pod: testbuild.Pod("p").Whole(1).CPU("2").Obj(), want: InsufficientCPU},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st *NodeState
			if !tc.noNode {
				st = mustState(t, newTestCache(t, []*corev1.Node{tc.node}, tc.pods), "n")
			}
			v := Filter(st, mustDemand(t, tc.pod))
			if v.Reason != tc.want {
				t.Fatalf("Filter() = %q (%s), want %q", v.Reason, v.Message, tc.want)
			}
			if v.Reason.Unresolvable() != tc.unres {
				t.Errorf("Unresolvable() = %v, want %v", v.Reason.Unresolvable(), tc.unres)
			}
			if !v.Fits() && v.Message == "" {
				t.Error("rejection without a message")
			}
		})
	}
}

func TestNormalizeScores(t *testing.T) {
	got := NormalizeScores([]float64{-5, 5, 0, 100}, []bool{true, true, true, false}, 10)
	if diff := cmp.Diff([]int64{0, 10, 5, 0}, got); diff != "" {
		t.Errorf("NormalizeScores (-want +got):\n%s", diff)
	}
	got = NormalizeScores([]float64{3, 3}, []bool{true, true}, 10)
	if diff := cmp.Diff([]int64{10, 10}, got); diff != "" {
		t.Errorf("NormalizeScores equal (-want +got):\n%s", diff)
	}
}

func testPolicy(t testing.TB, name string) allocator.Policy {
	t.Helper()
	p, err := NewPolicy(name, DefaultWorkload(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBinpackPrefersUsedGPUsAndNodes checks the default policy packs: a
// slice goes to the node and GPU already in use, leaving free nodes whole.
func TestBinpackPrefersUsedGPUsAndNodes(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("n1").GPUs(8, "A100", 40960).Obj(), testbuild.Node("n2").GPUs(8, "A100", 40960).Obj()}
	pods := []*corev1.Pod{testbuild.Pod("a").Shared(10, 50).Node("n2").On(3, 10240, 50).Obj()}
	c := newTestCache(t, nodes, pods)
	p := testPolicy(t, PolicyBinpack)
	d := mustDemand(t, testbuild.Pod("p").Shared(10, 25).Obj())
	s1, ok1 := Score(p, mustState(t, c, "n1"), d)
	s2, ok2 := Score(p, mustState(t, c, "n2"), d)
	if !ok1 || !ok2 {
		t.Fatalf("Score fits = %v %v, want true true", ok1, ok2)
	}
	if s2 <= s1 {
		t.Errorf("binpack scores used node %v <= empty node %v", s2, s1)
	}
	u, err := ChoosePlacement(p, mustState(t, c, "n2"), "uid-p", d)
	if err != nil {
		t.Fatal(err)
	}
	want := []SharedUse{{Container: "main", UUID: testbuild.GPUUUID("n2", 3), Index: 3, MemMiB: 10240, Cores: 25}}
	if diff := cmp.Diff(want, u.Shared); diff != "" {
		t.Errorf("ChoosePlacement (-want +got):\n%s", diff)
	}
	// spread does the opposite.
	sp := testPolicy(t, "spread")
	s1, _ = Score(sp, mustState(t, c, "n1"), d)
	s2, _ = Score(sp, mustState(t, c, "n2"), d)
	if s1 <= s2 {
		t.Errorf("spread scores empty node %v <= used node %v", s1, s2)
	}
}

func TestChoosePlacementRefusesWhatNoLongerFits(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{testbuild.Node("n").GPUs(1, "A100", 40960).Obj()},
		[]*corev1.Pod{testbuild.Pod("a").Shared(40, 10).Node("n").On(0, 40960, 10).Obj()})
	_, err := ChoosePlacement(testPolicy(t, PolicyBinpack), mustState(t, c, "n"), "uid-p", mustDemand(t, testbuild.Pod("p").Shared(1, 1).Obj()))
	if err == nil {
		t.Fatal("ChoosePlacement() on a full GPU succeeded")
	}
}

func TestPreempt(t *testing.T) {
	node := testbuild.Node("n").GPUs(2, "A100", 40960).Obj()
	pods := []*corev1.Pod{
		testbuild.Pod("g0a").Shared(20, 50).Node("n").On(0, 20480, 50).Priority(1).Obj(),
		testbuild.Pod("g0b").Shared(20, 50).Node("n").On(0, 20480, 50).Priority(2).Obj(),
		testbuild.Pod("g1").Shared(30, 30).Node("n").On(1, 30720, 30).Priority(3).Obj(),
		testbuild.Pod("cpu").CPU("1").Node("n").Obj(),
	}
	st := mustState(t, newTestCache(t, []*corev1.Node{node}, pods), "n")
	uids := func(names ...string) []types.UID {
		var out []types.UID
		for _, n := range names {
			out = append(out, types.UID("uid-"+n))
		}
		return out
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		victims []types.UID
		want    []types.UID
		ok      bool
	}{
		{name: "only the lowest-priority victim that frees one GPU is needed", pod: testbuild.Pod("p").Shared(20, 50).Obj(),
			victims: uids("g0a", "g0b", "g1", "cpu"), want: uids("g0a", "cpu"), ok: true},
		{name: "victims on different GPUs do not add up", pod: testbuild.Pod("p").Shared(30, 0).Obj(),
			victims: uids("g0a", "g1"), want: uids("g1"), ok: true},
		{name: "does not fit even with all victims gone", pod: testbuild.Pod("p").Shared(35, 0).Obj(),
			victims: uids("g0a"), ok: false},
		{name: "whole GPU needs its GPU emptied", pod: testbuild.Pod("p").Whole(1).Obj(),
			victims: uids("g0a", "g0b", "g1"), want: uids("g0a", "g0b"), ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Preempt(st, mustDemand(t, tc.pod), tc.victims, nil)
			if ok != tc.ok {
				t.Fatalf("Preempt() ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Preempt() victims (-want +got):\n%s", diff)
			}
		})
	}
}

// The withheld-GPU race of issue 17: the ledger frees a GPU when its pod
// ends, but the node agent offers it to the other kind only once the
// kubelet's allocations show it free (the inventory's withheld lists).
// Filter still passes (the scheduler would not retry the pod when the node
// releases the GPU); Offers says whether a pod counted on the node can be
// bound now, and ChoosePlacement puts a slice on a GPU offered for slices
// when there is one.
func TestOffersWaitsForWithheldGPUs(t *testing.T) {
	a100 := "NVIDIA A100-SXM4-40GB"
	whole := func(n int64) *corev1.Pod { return testbuild.Pod("x").Whole(n).Node("n").Obj() }
	slice := func(gpu int) *corev1.Pod { return testbuild.Pod("x").Shared(4, 0).Node("n").On(gpu, 4096, 0).Obj() }
	for _, tc := range []struct {
		name string
		node *testbuild.NodeBuilder
		pods []*corev1.Pod
		want bool
	}{
		{name: "a slice's GPU still withheld from whole use after the slice ended", node: testbuild.Node("n").GPUs(8, a100, 40960).WithheldFromWhole(3), pods: []*corev1.Pod{whole(8)}},
		{name: "released", node: testbuild.Node("n").GPUs(8, a100, 40960), pods: []*corev1.Pod{whole(8)}, want: true},
		{name: "7 whole GPUs beside the withheld one", node: testbuild.Node("n").GPUs(8, a100, 40960).WithheldFromWhole(3), pods: []*corev1.Pod{whole(7)}, want: true},
		{name: "other pending whole GPUs need offered GPUs too", node: testbuild.Node("n").GPUs(8, a100, 40960).WithheldFromWhole(3),
			pods: []*corev1.Pod{whole(6), testbuild.Pod("y").Whole(1).Node("n").Obj()}, want: true},
		{name: "other pending whole GPUs leave too few", node: testbuild.Node("n").GPUs(8, a100, 40960).WithheldFromWhole(3),
			pods: []*corev1.Pod{whole(6), testbuild.Pod("y").Whole(2).Node("n").Obj()}},
		{name: "an NVLink pod needs a clique offered whole", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).WithheldFromWhole(0),
			pods: []*corev1.Pod{testbuild.Pod("x").Whole(2).NVLink().Node("n").Obj()}, want: true},
		{name: "an NVLink pod with no clique offered whole", node: testbuild.Node("n").GPUs(4, a100, 40960).Cliques([]int{0, 1}, []int{2, 3}).WithheldFromWhole(0, 2),
			pods: []*corev1.Pod{testbuild.Pod("x").Whole(2).NVLink().Node("n").Obj()}},
		{name: "a GPU withheld from whole use takes slices", node: testbuild.Node("n").GPUs(1, a100, 40960).WithheldFromWhole(0), pods: []*corev1.Pod{slice(0)}, want: true},
		{name: "a whole GPU's units still withheld after its pod ended", node: testbuild.Node("n").GPUs(2, a100, 40960).WithheldFromShared(1), pods: []*corev1.Pod{slice(1)}},
		{name: "units of another GPU withheld", node: testbuild.Node("n").GPUs(2, a100, 40960).WithheldFromShared(1), pods: []*corev1.Pod{slice(0)}, want: true},
		{name: "a slice waits while the node's NRI plugin is away", node: testbuild.Node("n").GPUs(2, a100, 40960).NoIsolation(), pods: []*corev1.Pod{slice(0)}},
		{name: "whole GPUs need no NRI plugin", node: testbuild.Node("n").GPUs(2, a100, 40960).NoIsolation(), pods: []*corev1.Pod{whole(2)}, want: true},
		{name: "a GPU withheld from shared use is offered whole", node: testbuild.Node("n").GPUs(8, a100, 40960).WithheldFromShared(0, 1, 2, 3, 4, 5, 6, 7), pods: []*corev1.Pod{whole(8)}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := mustState(t, newTestCache(t, []*corev1.Node{tc.node.Obj()}, tc.pods), "n")
			got, why := st.Offers(st.Pods["uid-x"])
			if got != tc.want || (got != (why == "")) {
				t.Errorf("Offers() = %v, %q; want %v", got, why, tc.want)
			}
		})
	}

	// Filter counts what the ledger counts; the slice goes where it need
	// not wait.
	st := mustState(t, newTestCache(t, []*corev1.Node{testbuild.Node("n").GPUs(2, a100, 40960).WithheldFromShared(0).WithheldFromWhole(1).Obj()}, nil), "n")
	for _, p := range []*corev1.Pod{testbuild.Pod("w").Whole(2).Obj(), testbuild.Pod("s").Shared(4, 0).Obj()} {
		if v := Filter(st, mustDemand(t, p)); !v.Fits() {
			t.Errorf("Filter(%s) = %s", p.Name, v.Message)
		}
	}
	for range 4 {
		u, err := ChoosePlacement(testPolicy(t, PolicyBinpack), st, "uid-s", mustDemand(t, testbuild.Pod("s").Shared(4, 0).Obj()))
		if err != nil || len(u.Shared) != 1 || u.Shared[0].Index != 1 {
			t.Fatalf("ChoosePlacement() = %+v, %v; want the slice on GPU 1, offered for slices", u, err)
		}
	}
	only := mustState(t, newTestCache(t, []*corev1.Node{testbuild.Node("n").GPUs(1, a100, 40960).WithheldFromShared(0).Obj()}, nil), "n")
	if u, err := ChoosePlacement(testPolicy(t, PolicyBinpack), only, "uid-s", mustDemand(t, testbuild.Pod("s").Shared(4, 0).Obj())); err != nil || u.Shared[0].Index != 0 {
		t.Errorf("ChoosePlacement() on a node whose only GPU is withheld = %+v, %v; want GPU 0 (the bind waits)", u, err)
	}
}

// TestPodUseHoldsGPUs: the one rule of "uses a GPU" that tier preemption
// (Preempt) and quota's victims (victimOf) share; MIG instances count.
func TestPodUseHoldsGPUs(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    PodUse
		want bool
	}{
		{"CPU and memory only", PodUse{CPUMilli: 4000, MemMiB: 1024}, false},
		{"a recorded whole GPU", PodUse{Whole: []string{"GPU-0"}}, true},
		{"whole GPUs not recorded yet", PodUse{WholePending: 2}, true},
		{"whole GPUs named by a plan", PodUse{PlannedWhole: []string{"GPU-1"}}, true},
		{"a placed slice", PodUse{Shared: []SharedUse{{}}}, true},
		{"a planned slice", PodUse{PlannedShares: []ContainerShare{{}}}, true},
		{"a recorded MIG instance", PodUse{MIG: []string{"MIG-0"}}, true},
		{"a MIG instance not recorded yet", PodUse{MIGPending: map[string]int{"1g.5gb": 1}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.u.HoldsGPUs(); got != tc.want {
				t.Errorf("HoldsGPUs() = %v, want %v", got, tc.want)
			}
			st := &NodeState{Pods: map[types.UID]*PodUse{"u": &tc.u}}
			if got := victimOf(st, "u").GPUs; got != tc.want {
				t.Errorf("victimOf(...).GPUs = %v, want %v", got, tc.want)
			}
		})
	}
}

// A node whose GPUs pods planned there hold (a gang's plan or
// reservation) says so, naming them, when a pod does not fit it.
func TestExplainNamesPlannedHolds(t *testing.T) {
	node := testbuild.Node("n1").GPUs(8, "A100", 40960).Obj()
	planned := testbuild.Pod("ring-0").Whole(8).Obj()
	if err := api.SetGangPlan(planned.Annotations, api.GangPlan{Gang: "ring", Node: "n1", Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	planned.Annotations[api.AnnotationGang] = "ring"
	c := newTestCache(t, []*corev1.Node{node}, []*corev1.Pod{planned})
	d, err := ParseDemand(testbuild.Pod("asker").Whole(1).Obj())
	if err != nil {
		t.Fatal(err)
	}
	st := mustState(t, c, "n1")
	r := Check(st, &d)
	want := "tessera: fewer than 1 whole GPUs free; 8 held for pods planned here (a gang's plan or reservation, or room freed for a pod): default/ring-0"
	if got := Explain(r, st, &d); got != want {
		t.Errorf("Explain = %q\nwant      %q", got, want)
	}
}
