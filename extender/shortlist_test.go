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

	for _, tc := range []struct {
		k    int
		want []string
		left float64
	}{
		{k: 0, want: []string{"empty", "quarter", "half", "threeq"}},
		{k: 4, want: []string{"empty", "quarter", "half", "threeq"}},
		{k: 3, want: []string{"quarter", "half", "threeq"}, left: 1},
		{k: 2, want: []string{"quarter", "threeq"}, left: 2},
		{k: 1, want: []string{"threeq"}, left: 3},
	} {
		t.Run(fmt.Sprintf("k=%d", tc.k), func(t *testing.T) {
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
// the shortlist, and that the shortlist holds exactly min(k, fitting)
// nodes: kube-scheduler, whose choice the extender's weight dominates,
// loses no node it would have chosen.
func TestShortlistKeepsTheBestNode(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	ctx := context.Background()
	for round := range 30 {
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
		if want := min(k, len(fitting)); len(*short.NodeNames) != want {
			t.Fatalf("round %d: shortlist of %d from %d fitting nodes has %d", round, k, len(fitting), len(*short.NodeNames))
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
			if hp.Score == best && slices.Contains(*short.NodeNames, hp.Host) {
				kept = true
			}
			if !slices.Contains(fitting, hp.Host) && slices.Contains(*short.NodeNames, hp.Host) {
				t.Errorf("round %d: shortlist holds %s, which does not fit", round, hp.Host)
			}
		}
		if !kept {
			t.Errorf("round %d: no node of the best score %d in the shortlist %v (prioritize %v)", round, best, *short.NodeNames, prio)
		}
	}
}

// TestShortlistTiesKeepTheOrderSent checks that among nodes of equal score
// the shortlist keeps the first ones kube-scheduler sent, and every node
// that scores better than them.
func TestShortlistTiesKeepTheOrderSent(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("used").GPUs(8, "A100", 40960).Obj()}
	for i := range 5 {
		nodes = append(nodes, testbuild.Node(fmt.Sprintf("e%d", i)).GPUs(8, "A100", 40960).Obj())
	}
	// The slice fills used's GPU 0 exactly: used scores best, the empty
	// nodes all the same.
	bound := []*corev1.Pod{testbuild.Pod("u").Shared(30, 75).Node("used").On(0, 30720, 75).Obj()}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	for _, tc := range []struct {
		sent []string
		k    int
		want []string
	}{
		{sent: []string{"e4", "e3", "e2", "e1", "e0"}, k: 2, want: []string{"e4", "e3"}},
		{sent: []string{"e0", "e1", "e2", "e3", "e4"}, k: 3, want: []string{"e0", "e1", "e2"}},
		{sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 2, want: []string{"e2", "used"}},
		{sent: []string{"e2", "e0", "e4", "used", "e1"}, k: 1, want: []string{"used"}},
	} {
		t.Run(fmt.Sprintf("%v/k=%d", tc.sent, tc.k), func(t *testing.T) {
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
