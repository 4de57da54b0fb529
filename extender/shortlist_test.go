package extender

import (
	"cmp"
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestFilterShortlist checks that with a shortlist filter passes only the
// k fitting nodes the policy scores best, in both request modes, keeps
// the reasons of the nodes that do not fit, and counts what it left out.
func TestFilterShortlist(t *testing.T) {
	nodes := []*corev1.Node{
		testbuild.Node("empty").GPUs(8, "A100", 40960).Obj(),
		testbuild.Node("quarter").GPUs(8, "A100", 40960).Obj(),
		testbuild.Node("half").GPUs(8, "A100", 40960).Obj(),
		testbuild.Node("threeq").GPUs(8, "A100", 40960).Obj(),
		testbuild.Node("full").GPUs(1, "A100", 40960).Obj(),
		testbuild.Node("cpu").Obj(),
	}
	bound := []*corev1.Pod{
		testbuild.Pod("q").Shared(10, 25).Node("quarter").On(0, 10240, 25).Obj(),
		testbuild.Pod("h").Shared(20, 50).Node("half").On(0, 20480, 50).Obj(),
		testbuild.Pod("t").Shared(30, 75).Node("threeq").On(0, 30720, 75).Obj(),
		testbuild.Pod("f").Whole(1).Node("full").Holding(0).Obj(),
	}
	names := []string{"empty", "quarter", "half", "threeq", "full", "cpu"}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	ctx := context.Background()

	// The policy's order (binpack, checked here so that the cases below
	// rest on it): the slice fills threeq's used GPU exactly; on quarter's
	// it leaves half the GPU free, on half's a quarter (binpack's
	// fragmentation cost ranks that lower); an empty node is last.
	c := newTestCache(t, nodes, bound)
	d, err := ParseDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	q, p := NewQuery(&d), testPolicy(t, PolicyBinpack)
	var raw []float64
	for _, n := range []string{"threeq", "quarter", "half", "empty"} {
		s, ok := q.Score(p, mustState(t, c, n))
		if !ok {
			t.Fatalf("%s: the pod does not fit", n)
		}
		raw = append(raw, s)
	}
	if !slices.IsSortedFunc(raw, func(a, b float64) int { return cmp.Compare(b, a) }) || raw[0] == raw[1] || raw[1] == raw[2] || raw[2] == raw[3] {
		t.Fatalf("scores of threeq, quarter, half, empty = %v, want strictly decreasing", raw)
	}

	// A pod with a soft preference of its own keeps the k best; one
	// without keeps only the best (threeq), which kube-scheduler then
	// takes without scoring.
	soft := withSoftPreference(pod)
	for _, tc := range []struct {
		soft bool
		k    int
		want []string
		left float64
	}{
		{soft: true, k: 0, want: []string{"empty", "quarter", "half", "threeq"}},
		{soft: true, k: 4, want: []string{"empty", "quarter", "half", "threeq"}},
		{soft: true, k: 3, want: []string{"quarter", "half", "threeq"}, left: 1},
		{soft: true, k: 2, want: []string{"quarter", "threeq"}, left: 2},
		{soft: true, k: 1, want: []string{"threeq"}, left: 3},
		{k: 0, want: []string{"empty", "quarter", "half", "threeq"}},
		{k: 4, want: []string{"threeq"}, left: 3},
		{k: 1, want: []string{"threeq"}, left: 3},
	} {
		pod := pod
		if tc.soft {
			pod = soft
		}
		t.Run(fmt.Sprintf("soft=%v/k=%d", tc.soft, tc.k), func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			s := NewServer(newTestCache(t, nodes, bound), testPolicy(t, PolicyBinpack), newFakePods(), nil, m)
			s.SetShortlist(tc.k)
			res := s.FilterArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
			if res.Error != "" {
				t.Fatal(res.Error)
			}
			if diff := gocmp.Diff(tc.want, *res.NodeNames); diff != "" {
				t.Errorf("NodeNames (-want +got):\n%s", diff)
			}
			failed := []string{}
			for n := range res.FailedNodes {
				failed = append(failed, n)
			}
			for n := range res.FailedAndUnresolvableNodes {
				failed = append(failed, n)
			}
			slices.Sort(failed)
			if diff := gocmp.Diff([]string{"cpu", "full"}, failed); diff != "" {
				t.Errorf("failed nodes (-want +got):\n%s", diff)
			}
			var left dto.Metric
			if err := m.leftOut.Write(&left); err != nil {
				t.Fatal(err)
			}
			if got := left.GetCounter().GetValue(); got != tc.left {
				t.Errorf("left out = %v, want %v", got, tc.left)
			}

			// Full Nodes mode keeps the same nodes.
			list := &corev1.NodeList{}
			for _, n := range nodes {
				list.Items = append(list.Items, *n)
			}
			res = s.FilterArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, Nodes: list})
			var got []string
			for _, n := range res.Nodes.Items {
				got = append(got, n.Name)
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Nodes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestShortlistKeepsTheBestNode checks, on random clusters and pods, that
// the node prioritize scores highest among all fitting nodes is always in
// the shortlist: kube-scheduler, whose choice the extender's weight
// dominates, loses no node it would have chosen. A pod with a soft
// preference gets exactly min(k, fitting) nodes; one without gets only
// nodes of prioritize's best score, at most k.
func TestShortlistKeepsTheBestNode(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	ctx := context.Background()
	for round := range 60 {
		var nodes []*corev1.Node
		var bound []*corev1.Pod
		names := make([]string, 40)
		for i := range names {
			names[i] = fmt.Sprintf("n%02d", i)
			gpus := 1 + rng.Intn(8)
			nodes = append(nodes, testbuild.Node(names[i]).GPUs(gpus, "A100", 40960).Obj())
			for g := range gpus {
				switch rng.Intn(4) {
				case 0:
					bound = append(bound, testbuild.Pod(fmt.Sprintf("w-%d-%d", i, g)).Whole(1).Node(names[i]).Holding(g).Obj())
				case 1:
					mem, cores := int64(1+rng.Intn(39)), int64(1+rng.Intn(99))
					bound = append(bound, testbuild.Pod(fmt.Sprintf("s-%d-%d", i, g)).Shared(mem, cores).Node(names[i]).On(g, mem*1024, cores).Obj())
				}
			}
		}
		var pod *corev1.Pod
		if rng.Intn(2) == 0 {
			pod = testbuild.Pod("p").Shared(int64(1+rng.Intn(39)), int64(1+rng.Intn(99))).Obj()
		} else {
			pod = testbuild.Pod("p").Whole(int64(1 + rng.Intn(4))).Obj()
		}
		soft := round%2 == 1
		if soft {
			pod = withSoftPreference(pod)
		}
		k := 1 + rng.Intn(5)
		s := NewServer(newTestCache(t, nodes, bound), testPolicy(t, PolicyBinpack), newFakePods(), nil, nil)
		prio, err := s.PrioritizeArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, false)
		if err != nil {
			t.Fatal(err)
		}
		full := s.FilterArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		s.SetShortlist(k)
		short := s.FilterArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		fitting := *full.NodeNames
		got := len(*short.NodeNames)
		if want := min(k, len(fitting)); soft && got != want || !soft && (got > want || len(fitting) > 0 && got == 0) {
			t.Fatalf("round %d (soft preference %v): shortlist of %d from %d fitting nodes has %d", round, soft, k, len(fitting), got)
		}
		if len(fitting) == 0 {
			continue
		}
		best := int64(-1)
		for _, hp := range prio {
			if slices.Contains(fitting, hp.Host) {
				best = max(best, hp.Score)
			}
		}
		kept := false
		for _, hp := range prio {
			in := slices.Contains(*short.NodeNames, hp.Host)
			if hp.Score == best && in {
				kept = true
			}
			if !slices.Contains(fitting, hp.Host) && in {
				t.Errorf("round %d: shortlist holds %s, which does not fit", round, hp.Host)
			}
			if !soft && in && hp.Score != best {
				t.Errorf("round %d: shortlist holds %s of score %d, below the best %d", round, hp.Host, hp.Score, best)
			}
		}
		if !kept {
			t.Errorf("round %d: no node of the best score %d in the shortlist %v (prioritize %v)", round, best, *short.NodeNames, prio)
		}
	}
}

// TestShortlistTies checks how the shortlist breaks ties: for a pod
// without soft preferences it keeps one node, of the best the first by
// name whatever the order sent (so that a burst of pods, filtered before
// their binds reach the extender, fills one node before the next); for a
// pod with soft preferences, among nodes of equal score the first ones
// kube-scheduler sent, and every node that scores better than them.
func TestShortlistTies(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("used").GPUs(8, "A100", 40960).Obj()}
	for i := range 5 {
		nodes = append(nodes, testbuild.Node(fmt.Sprintf("e%d", i)).GPUs(8, "A100", 40960).Obj())
	}
	// The slice fills used's GPU 0 exactly: used scores best, the empty
	// nodes all the same.
	bound := []*corev1.Pod{testbuild.Pod("u").Shared(30, 75).Node("used").On(0, 30720, 75).Obj()}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	soft := withSoftPreference(pod)
	for _, tc := range []struct {
		soft bool
		sent []string
		k    int
		want []string
	}{
		{sent: []string{"e4", "e3", "e2", "e1", "e0"}, k: 2, want: []string{"e0"}},
		{sent: []string{"e0", "e1", "e2", "e3", "e4"}, k: 3, want: []string{"e0"}},
		{sent: []string{"e3", "e1", "e4", "e2"}, k: 100, want: []string{"e1"}},
		{sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 2, want: []string{"used"}},
		{sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 1, want: []string{"used"}},
		{soft: true, sent: []string{"e4", "e3", "e2", "e1", "e0"}, k: 2, want: []string{"e4", "e3"}},
		{soft: true, sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 2, want: []string{"e2", "used"}},
		{soft: true, sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 1, want: []string{"used"}},
	} {
		pod := pod
		if tc.soft {
			pod = soft
		}
		t.Run(fmt.Sprintf("%v/k=%d/soft=%v", tc.sent, tc.k, tc.soft), func(t *testing.T) {
			s := NewServer(newTestCache(t, nodes, bound), testPolicy(t, PolicyBinpack), newFakePods(), nil, nil)
			s.SetShortlist(tc.k)
			names := slices.Clone(tc.sent)
			res := s.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
			if res.Error != "" {
				t.Fatal(res.Error)
			}
			if diff := gocmp.Diff(tc.want, *res.NodeNames); diff != "" {
				t.Errorf("NodeNames (-want +got):\n%s", diff)
			}
		})
	}
}

// withSoftPreference returns a copy of pod that prefers nodes labelled
// zone=a (preferred node affinity).
func withSoftPreference(pod *corev1.Pod) *corev1.Pod {
	pod = pod.DeepCopy()
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}},
		}}},
	}}
	return pod
}

// TestSoftPreferences lists what makes kube-scheduler weigh a pod's own
// preferences, and what does not.
func TestSoftPreferences(t *testing.T) {
	term := []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "zone"}}}
	for _, tc := range []struct {
		name string
		edit func(*corev1.PodSpec)
		want bool
	}{
		{name: "none", edit: func(*corev1.PodSpec) {}},
		{name: "preferred node affinity", edit: func(s *corev1.PodSpec) { s.Affinity = withSoftPreference(&corev1.Pod{}).Spec.Affinity }, want: true},
		{name: "required node affinity only", edit: func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}}}
		}},
		{name: "preferred pod affinity", edit: func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: term}}
		}, want: true},
		{name: "preferred pod anti-affinity", edit: func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: term}}
		}, want: true},
		{name: "spread, ScheduleAnyway", edit: func(s *corev1.PodSpec) {
			s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.ScheduleAnyway}}
		}, want: true},
		{name: "spread, DoNotSchedule", edit: func(s *corev1.PodSpec) {
			s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.DoNotSchedule}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testbuild.Pod("p").Whole(1).Obj()
			tc.edit(&pod.Spec)
			if got := softPreferences(pod); got != tc.want {
				t.Errorf("softPreferences = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestShortlistLeavesPreferNoScheduleToTheScheduler checks that when a
// best node has a PreferNoSchedule taint the pod does not tolerate, the
// shortlist keeps the k best, so that kube-scheduler's TaintToleration can
// prefer an untainted node next to it; a tolerated taint changes nothing.
func TestShortlistLeavesPreferNoScheduleToTheScheduler(t *testing.T) {
	taint := corev1.Taint{Key: "maintenance", Value: "soon", Effect: corev1.TaintEffectPreferNoSchedule}
	used := testbuild.Node("used").GPUs(8, "A100", 40960).Obj()
	used.Spec.Taints = []corev1.Taint{taint, {Key: "other", Effect: corev1.TaintEffectNoSchedule}}
	nodes := []*corev1.Node{used, testbuild.Node("e0").GPUs(8, "A100", 40960).Obj(), testbuild.Node("e1").GPUs(8, "A100", 40960).Obj()}
	bound := []*corev1.Pod{testbuild.Pod("u").Shared(30, 75).Node("used").On(0, 30720, 75).Obj()}
	tolerating := testbuild.Pod("p").Shared(10, 25).Obj()
	tolerating.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{name: "not tolerated", pod: testbuild.Pod("p").Shared(10, 25).Obj(), want: []string{"used", "e0"}},
		{name: "tolerated", pod: tolerating, want: []string{"used"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(newTestCache(t, nodes, bound), testPolicy(t, PolicyBinpack), newFakePods(), nil, nil)
			s.SetShortlist(2)
			names := []string{"used", "e0", "e1"}
			res := s.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &names})
			if res.Error != "" {
				t.Fatal(res.Error)
			}
			if diff := gocmp.Diff(tc.want, *res.NodeNames); diff != "" {
				t.Errorf("NodeNames (-want +got):\n%s", diff)
			}
		})
	}
}

// TestShortlistRanksNUMAAlignmentFirst checks that the shortlist ranks as
// prioritize does (PreferAligned): a node where the pod's NUMA alignment
// is possible comes before a node that scores better but cannot align it.
func TestShortlistRanksNUMAAlignmentFirst(t *testing.T) {
	// busy's NUMA nodes have no CPUs left for the pod's 32: it cannot be
	// aligned there; free can. busy is also the fuller node, which the
	// binpack policy scores better (checked below).
	hogs := map[string]map[int]int{"default/hog-0": {0: 100}, "default/hog-1": {1: 100}}
	c := newTestCache(t, []*corev1.Node{machineNode(t, "busy", "dgx-a100", "best-effort", hogs), machineNode(t, "free", "dgx-a100", "best-effort", nil)},
		[]*corev1.Pod{guaranteedPod("hog-0", 0, "100").Node("busy").Obj(), guaranteedPod("hog-1", 0, "100").Node("busy").Obj()})
	pod := guaranteedPod("big", 4, "32").Obj()
	d, err := ParseDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	q, p := NewQuery(&d), testPolicy(t, PolicyBinpack)
	busy, ok1 := q.Score(p, mustState(t, c, "busy"))
	free, ok2 := q.Score(p, mustState(t, c, "free"))
	if !ok1 || !ok2 || busy <= free {
		t.Fatalf("scores busy %v (fits %v), free %v (fits %v): the case needs busy to fit and score better", busy, ok1, free, ok2)
	}
	for _, soft := range []bool{false, true} {
		pod := pod
		if soft {
			pod = withSoftPreference(pod)
		}
		s := NewServer(c, p, newFakePods(), nil, nil)
		s.SetShortlist(1)
		names := []string{"busy", "free"}
		res := s.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		if res.Error != "" {
			t.Fatal(res.Error)
		}
		if diff := gocmp.Diff([]string{"free"}, *res.NodeNames); diff != "" {
			t.Errorf("soft preference %v: NodeNames (-want +got):\n%s", soft, diff)
		}
	}
}
