package planner_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// queued creates a 1-GPU pod held by the queue gate.
func (f *gangFixture) queued(ns, name string, created time.Time) {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(1).Obj()
	p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-"+name)
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	p.CreationTimestamp = metav1.NewTime(created)
	if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// admitted counts a namespace's pods planned with their gate lifted.
func (f *gangFixture) admitted(ns string) (admitted, gated int) {
	f.t.Helper()
	pods, _ := f.list()
	for _, p := range pods {
		if p.Namespace != ns {
			continue
		}
		_, planned := p.Annotations[api.AnnotationGangPlan]
		switch {
		case planned && !api.HasQueueGate(p):
			admitted++
		case api.HasQueueGate(p):
			gated++
		}
	}
	return admitted, gated
}

// passesEvicting runs n planner passes, 2 s apart; between them the pods
// evicter evicted (of namespace ns, UIDs "uid-<name>") leave, as their
// kubelets would end them.
func (f *gangFixture) passesEvicting(evicter *testbuild.PreemptClient, ns string, n int) {
	f.t.Helper()
	seen := 0
	for range n {
		f.sync()
		for _, name := range evicter.Evicted[seen:] {
			if err := f.client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				f.t.Fatal(err)
			}
			f.cache.DeletePod(types.UID("uid-" + name))
		}
		seen = len(evicter.Evicted)
		f.now = f.now.Add(2 * time.Second)
	}
}

func withGPUCapacity(nodes []*corev1.Node) []*corev1.Node {
	for _, n := range nodes {
		n.Status.Capacity = corev1.ResourceList{api.ResourceGPU: resource.MustParse("8")}
	}
	return nodes
}

// Two teams with equal guarantees submit at once on an 8-GPU cluster: the
// one without usage history goes first and takes all that is left after
// the other's guarantee; the other gets its guarantee. Swapping the
// history swaps the outcome.
func TestQueuesFairShareByHistory(t *testing.T) {
	for _, tc := range []struct {
		historyOf      string
		wantA, wantB   int
		firstEventTeam string
	}{
		{historyOf: "team-a", wantA: 2, wantB: 6},
		{historyOf: "team-b", wantA: 6, wantB: 2},
	} {
		t.Run("history on "+tc.historyOf, func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
			f := newGangFixture(t, nodes...)
			hist := map[string]float64{tc.historyOf: 2 * 3600 * 8}
			book := &planner.QueueBook{
				Queues: testbuild.Objects{
					testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 2, hist["team-a"], f.now),
					testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 2, hist["team-b"], f.now),
				},
				Pods:     f.list,
				Nodes:    func() ([]*corev1.Node, error) { return nodes, nil },
				HalfLife: time.Hour, Now: func() time.Time { return f.now },
			}
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
			for i := range 8 {
				f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now)
				f.queued("ns-b", fmt.Sprintf("b-%d", i), f.now)
			}
			f.sync()
			f.sync()
			a, ga := f.admitted("ns-a")
			b, gb := f.admitted("ns-b")
			if a != tc.wantA || b != tc.wantB {
				t.Errorf("admitted team-a %d (gated %d), team-b %d (gated %d); want %d and %d\nevents: %s", a, ga, b, gb, tc.wantA, tc.wantB, strings.Join(f.events.Events, "\n"))
			}
			if !strings.Contains(strings.Join(f.events.Events, "\n"), api.EventQueueWaiting) {
				t.Errorf("no %s Event for the pods left waiting", api.EventQueueWaiting)
			}
		})
	}
}

// A queued pod outside any gang that its queue admits but no node has room
// for is told so as a pod (before: "GangWaiting: ... gang ns-a/a-0: no
// room for the whole group: 1 member needs 1 whole GPUs").
func TestQueuedPodWaitsForRoomAsAPod(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	f.running("busy", "n0", 8, f.now.Add(-time.Minute), nil)
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 8, 0, f.now)},
		Pods:   f.list,
		Nodes:  func() ([]*corev1.Node, error) { return nodes, nil },
		Now:    func() time.Time { return f.now },
	}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	f.queued("ns-a", "a-0", f.now)
	f.sync()
	const want = api.EventQueueWaiting + ": tessera: pod ns-a/a-0: no room: it needs 1 whole GPU and 1.0 GPUs in all"
	all := strings.Join(f.events.Events, "\n")
	if !strings.Contains(all, want) || strings.Contains(all, "GangWaiting") {
		t.Errorf("events:\n%s\nwant %q and no GangWaiting", all, want)
	}
}

// A queue's limit holds: what would pass it waits, with the reason.
func TestQueueLimitHolds(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	q := &api.Queue{Name: "team-a", Namespaces: []string{"ns-a"}, Resources: map[corev1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: 1, Limit: 3, Limited: true, Weight: 1},
	}}
	book := &planner.QueueBook{Queues: testbuild.Objects{q.Unstructured()}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	for i := range 5 {
		f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now.Add(time.Duration(i)*time.Second))
	}
	f.sync()
	f.sync()
	if a, g := f.admitted("ns-a"); a != 3 || g != 2 {
		t.Errorf("admitted %d, gated %d; want 3 and 2 (limit 3)", a, g)
	}
	if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, "limit 3") {
		t.Errorf("no Event naming the limit: %s", ev)
	}
}

// A Queue object the extender cannot read admits nothing, with the reason
// on the pods' Events; a queue beside it admits as before.
func TestMalformedQueueObjectAdmitsNothing(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	bad := testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 1, 0, f.now)
	bad.Object["spec"].(map[string]any)["resources"] = map[string]any{"cpu": map[string]any{"guaranteed": "4"}}
	book := &planner.QueueBook{Queues: testbuild.Objects{bad, testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 1, 0, f.now)},
		Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	f.queued("ns-a", "a-0", f.now)
	f.queued("ns-b", "b-0", f.now)
	f.sync()
	if a, g := f.admitted("ns-a"); a != 0 || g != 1 {
		t.Errorf("ns-a: admitted %d, gated %d; want 0 and 1", a, g)
	}
	if a, _ := f.admitted("ns-b"); a != 1 {
		t.Errorf("ns-b: admitted %d, want 1", a)
	}
	const want = `queue team-a admits nothing until it is fixed: Queue team-a: spec.resources["cpu"]: unknown resource`
	if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, want) {
		t.Errorf("events:\n%s\nwant %q", ev, want)
	}
}

// Two departments of one team each, 8 GPUs guaranteed to each, on two
// 8-GPU nodes: team-b borrowed the whole cluster while team-a was idle.
// team-a's pods take its guarantee back: exactly as many of team-b's pods
// are evicted as team-a needs (on the nodes team-a's pods may use), and
// team-b never goes below its own guarantee.
func TestQueueReclaimAcrossDepartments(t *testing.T) {
	for _, tc := range []struct {
		name     string
		asks     int
		selector string // team-a's pods' kubernetes.io/hostname, "" any
		oneDept  bool   // both teams under one department guaranteed 16
		want     int
	}{
		{name: "guarantee back", asks: 8, want: 8},
		{name: "asks beyond its guarantee: only the guarantee is reclaimed", asks: 12, want: 8},
		{name: "nodeSelector: victims only where the asker may run", asks: 4, selector: "n1", want: 4},
		// On make demo the sibling team borrowed the whole department's
		// guarantee (the cluster), and admission refused the asker as
		// borrowing ("the queues would use 36 of the cluster's 28")
		// before reclaim was tried.
		{name: "within one department: the guarantee back from the sibling", asks: 8, oneDept: true, want: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []*corev1.Node
			for i := range 2 {
				n := testbuild.Node(fmt.Sprintf("n%d", i)).GPUs(8, "H100", 81920).Obj()
				n.Labels = map[string]string{corev1.LabelHostname: n.Name}
				nodes = append(nodes, n)
			}
			nodes = withGPUCapacity(nodes)
			f := newGangFixture(t, nodes...)
			guar := func(name, parent string, ns []string) *unstructured.Unstructured {
				return testbuild.QueueObj(t, name, parent, ns, 8, 0, f.now)
			}
			queues := testbuild.Objects{guar("dept-1", "", nil), guar("team-a", "dept-1", []string{"ns-a"}), guar("dept-2", "", nil), guar("team-b", "dept-2", []string{"ns-b"})}
			if tc.oneDept {
				queues = testbuild.Objects{testbuild.QueueObj(t, "dept-1", "", nil, 16, 0, f.now), guar("team-a", "dept-1", []string{"ns-a"}), guar("team-b", "dept-1", []string{"ns-b"})}
			}
			book := &planner.QueueBook{
				Queues: queues,
				Pods:   f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, HalfLife: time.Hour, Now: func() time.Time { return f.now },
			}
			evicter := &testbuild.PreemptClient{}
			reclaim := &planner.QueueReclaimer{Ledger: extender.PlannerLedger{Cache: f.cache}, Evicter: evicter, Pods: f.list, Events: f.events, Now: func() time.Time { return f.now }}
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Queues: book, QueueReclaim: reclaim})
			onNode := map[string]string{}
			for i := range 16 {
				node := fmt.Sprintf("n%d", i/8)
				p := testbuild.Pod(fmt.Sprintf("b-%d", i)).Whole(1).Node(node).Holding(i % 8).Obj()
				p.Namespace, p.UID = "ns-b", types.UID(fmt.Sprintf("uid-b-%d", i))
				// n1's pods are the oldest: reclaim's order (newest first)
				// comes to them last.
				p.CreationTimestamp = metav1.NewTime(f.now.Add(-time.Hour - time.Duration(i/8)*time.Hour))
				onNode[p.Name] = node
				if _, err := f.client.CoreV1().Pods("ns-b").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tc.asks {
				f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now)
				if tc.selector != "" {
					p, _ := f.client.CoreV1().Pods("ns-a").Get(context.Background(), fmt.Sprintf("a-%d", i), metav1.GetOptions{})
					p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: tc.selector}
					if _, err := f.client.CoreV1().Pods("ns-a").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			pods, _ := f.list()
			for _, p := range pods {
				f.cache.SetPod(p)
			}
			f.passesEvicting(evicter, "ns-b", 6)
			if len(evicter.Evicted) != tc.want {
				t.Errorf("evicted %d of team-b's pods %v, want %d\nevents:\n%s", len(evicter.Evicted), evicter.Evicted, tc.want, strings.Join(f.events.Events, "\n"))
			}
			for _, name := range evicter.Evicted {
				if tc.selector != "" && onNode[name] != tc.selector {
					t.Errorf("evicted %s on %s, where team-a's pods may not run", name, onNode[name])
				}
			}
			if a, _ := f.admitted("ns-a"); a != tc.want {
				t.Errorf("team-a admitted %d, want %d\nevents:\n%s", a, tc.want, strings.Join(f.events.Events, "\n"))
			}
		})
	}
}

// Two teams guaranteed 2 GPUs each wait with an 8-GPU pod each on an
// 8-GPU cluster: both must borrow, and lending protects neither (neither
// could start within its guarantee), so one runs instead of both waiting
// for ever.
func TestQueuedWorkLargerThanGuaranteesRuns(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 2, 0, f.now), testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 2, 0, f.now)},
		Pods:   f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil },
	}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	for _, ns := range []string{"ns-a", "ns-b"} {
		p := testbuild.Pod("big").Whole(8).Obj()
		p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-big")
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
		if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.sync()
	a, _ := f.admitted("ns-a")
	b, _ := f.admitted("ns-b")
	if a+b != 1 {
		t.Errorf("admitted %d of team-a's and %d of team-b's 8-GPU pods, want one of the two\nevents:\n%s", a, b, strings.Join(f.events.Events, "\n"))
	}
}

// planWriter is a PreemptClient that records evictions and writes plans
// through the fixture's clientset, so the planner sees them.
type planWriter struct {
	*testbuild.PreemptClient
	gang *planner.KubeGang
}

func (w planWriter) SetPlan(ctx context.Context, pod *corev1.Pod, value string) error {
	return w.gang.SetPlan(ctx, pod, value)
}

// Priority tiers (as in the extender's preemption tests).
const (
	inference = 100000
	notebook  = 1000
)

// A queued inference pod that fits nowhere preempts a lower-tier notebook
// like any pod would: the planner asks the preemptor, which evicts and
// holds the room with a plan; the next pass lifts the gate.
func TestQueuedPodPreemptsLowerTier(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(1, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	nb := testbuild.Pod("nb").Whole(1).Priority(notebook).Node("n0").Holding(0).Obj()
	nb.Namespace, nb.UID = "notebooks", "uid-nb"
	start := metav1.NewTime(f.now.Add(-time.Hour))
	nb.CreationTimestamp, nb.Status.StartTime = start, &start
	if _, err := f.client.CoreV1().Pods("notebooks").Create(context.Background(), nb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(nb)
	book := &planner.QueueBook{Queues: testbuild.Objects{testbuild.QueueObj(t, "serving", "", []string{"ns-a"}, 1, 0, f.now)}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	evicter := &testbuild.PreemptClient{}
	pre := &extender.Preemptor{Cache: f.cache, Client: planWriter{evicter, &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}}, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Queues: book, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book, Preempt: pre})
	f.queued("ns-a", "inf", f.now)
	p, _ := f.client.CoreV1().Pods("ns-a").Get(context.Background(), "inf", metav1.GetOptions{})
	prio := int32(inference)
	p.Spec.Priority = &prio
	if _, err := f.client.CoreV1().Pods("ns-a").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	if diff := cmp.Diff([]string{"nb"}, evicter.Evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
	}
	f.sync()
	if a, g := f.admitted("ns-a"); a != 1 || g != 0 {
		t.Errorf("inf: admitted %d, gated %d; want planned on the preempted room with its gate lifted", a, g)
	}
}

// newReclaimFixture is a gang fixture on nodes whose planner serves the
// queues team-a (namespace ns-a, 4 GPUs guaranteed) and team-b (ns-b,
// bGuaranteed) and reclaims for them with the returned reclaimer and
// evicter; metrics may be nil.
func newReclaimFixture(t *testing.T, nodes []*corev1.Node, bGuaranteed int64, metrics *extender.Metrics) (*gangFixture, *planner.QueueReclaimer, *testbuild.PreemptClient) {
	t.Helper()
	return newReclaimFixtureOf(t, nodes, func(now time.Time) testbuild.Objects {
		return testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 4, 0, now), testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, bGuaranteed, 0, now)}
	}, metrics)
}

// newReclaimFixtureOf is newReclaimFixture with the Queues queues makes
// (given the fixture's clock).
func newReclaimFixtureOf(t *testing.T, nodes []*corev1.Node, queues func(now time.Time) testbuild.Objects, metrics *extender.Metrics) (*gangFixture, *planner.QueueReclaimer, *testbuild.PreemptClient) {
	t.Helper()
	f := newGangFixture(t, nodes...)
	book := &planner.QueueBook{Queues: queues(f.now), Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	evicter := &testbuild.PreemptClient{}
	reclaim := &planner.QueueReclaimer{Ledger: extender.PlannerLedger{Cache: f.cache}, Evicter: evicter, Pods: f.list, Events: f.events, Metrics: metrics, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book, QueueReclaim: reclaim})
	return f, reclaim, evicter
}

// runningB creates team-b's running 1-GPU pod name on GPU gpu of node,
// started age ago, and feeds it to the ledger.
func (f *gangFixture) runningB(name, node string, gpu int, age time.Duration) {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(1).Node(node).Holding(gpu).Obj()
	p.Namespace, p.UID = "ns-b", types.UID("uid-"+name)
	started := metav1.NewTime(f.now.Add(-age))
	p.CreationTimestamp, p.Status.StartTime = started, &started
	if _, err := f.client.CoreV1().Pods("ns-b").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
}

// queuedNVLinkAsker creates team-a's gated 4-GPU pod a-0 that needs one
// NVLink clique.
func (f *gangFixture) queuedNVLinkAsker() *corev1.Pod {
	f.t.Helper()
	asker := testbuild.Pod("a-0").Whole(4).NVLink().Obj()
	asker.Namespace, asker.UID = "ns-a", "uid-ns-a-a-0"
	asker.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	asker.CreationTimestamp = metav1.NewTime(f.now)
	if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), asker, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	return asker
}

// Topology-aware reclaim: a 4-GPU pod that needs one NVLink clique (a
// node of two 4-GPU cliques, each with two of team-b's 1-GPU pods)
// reclaims the two pods of one clique, not one of each (which would free
// 4 GPUs that cannot serve it).
func TestQueueReclaimFreesOneClique(t *testing.T) {
	n := testbuild.Node("n0").GPUs(8, "H100", 81920).Cliques([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}).Obj()
	nodes := withGPUCapacity([]*corev1.Node{n})
	f, _, evicter := newReclaimFixture(t, nodes, 0, nil)
	// Newest first alternates between the cliques: 0, 4, 1, 5 (and the
	// other GPUs, 2, 3, 6, 7, are busy too, with older pods).
	for i, gpu := range []int{0, 4, 1, 5, 2, 3, 6, 7} {
		f.runningB(fmt.Sprintf("b-%d", gpu), "n0", gpu, time.Duration(i+1)*time.Minute)
	}
	f.queuedNVLinkAsker()
	f.sync()
	got := append([]string(nil), evicter.Evicted...)
	sort.Strings(got)
	if len(got) != 4 || !(sameClique(got, []int{0, 1, 2, 3}) || sameClique(got, []int{4, 5, 6, 7})) {
		t.Errorf("evicted %v, want the four pods of one clique\nevents:\n%s", got, strings.Join(f.events.Events, "\n"))
	}
	// Planned, its gate kept until the victims are gone.
	if a, gated := f.admitted("ns-a"); a != 0 || gated != 1 {
		t.Errorf("the 4-GPU pod while its victims are there: %d admitted, %d gated; want it planned and gated", a, gated)
	}
	f.passesEvicting(evicter, "ns-b", 2)
	if a, _ := f.admitted("ns-a"); a != 1 {
		t.Errorf("the 4-GPU pod is not planned on the freed clique")
	}
}

func sameClique(names []string, clique []int) bool {
	in := map[string]bool{}
	for _, g := range clique {
		in[fmt.Sprintf("b-%d", g)] = true
	}
	for _, n := range names {
		if !in[n] {
			return false
		}
	}
	return true
}

// namespaces is a fixed QueueGate.
// The planner admits such a pod like a gated one.
func TestPlannerAdmitsUngatedQueuedPod(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	book := &planner.QueueBook{Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 1, 0, f.now)}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	p := testbuild.Pod("ungated").Whole(1).Obj()
	p.Namespace, p.UID = "ns-a", "uid-ungated"
	if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	if a, _ := f.admitted("ns-a"); a != 1 {
		t.Errorf("the ungated pod of a queued namespace is not planned\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
}

// The reclaim of TestQueueReclaimFreesOneClique, with metrics: its
// evictions count as useful once the asker holds a GPU they freed, as
// useless when it holds only others, or none within the hold.
func TestQueueReclaimEvictionResults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holding []int // the asker's GPUs once bound; nil: never bound
		after   time.Duration
		useful  float64
		useless float64
	}{
		{name: "the asker runs on the freed clique", holding: []int{0, 1, 2, 3}, useful: 4},
		{name: "the asker runs on other GPUs", holding: []int{4, 5, 6, 7}, useless: 4},
		{name: "the asker does not run within the hold", after: 3 * time.Minute, useless: 4},
		{name: "within the hold nothing is counted yet", after: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testbuild.Node("n0").GPUs(8, "H100", 81920).Cliques([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}).Obj()
			nodes := withGPUCapacity([]*corev1.Node{n})
			reg := prometheus.NewRegistry()
			metrics := extender.NewMetrics(reg)
			f, reclaim, evicter := newReclaimFixture(t, nodes, 0, metrics)
			// Clique 0's pods are the newest: they go.
			for i, gpu := range []int{0, 1, 2, 3, 4, 5, 6, 7} {
				f.runningB(fmt.Sprintf("b-%d", gpu), "n0", gpu, time.Duration(i+1)*time.Minute)
			}
			asker := f.queuedNVLinkAsker()
			f.sync()
			got := append([]string(nil), evicter.Evicted...)
			sort.Strings(got)
			if diff := cmp.Diff([]string{"b-0", "b-1", "b-2", "b-3"}, got); diff != "" {
				t.Fatalf("evicted (-want +got):\n%s", diff)
			}
			if left := reclaim.Settle(f.now); left != 4 {
				t.Errorf("%d evictions followed before the asker runs, want 4 (one per workload)", left)
			}
			for i := range 4 {
				f.cache.DeletePod(types.UID(fmt.Sprintf("uid-b-%d", i)))
			}
			if tc.holding != nil {
				bound := testbuild.Pod("a-0").Whole(4).NVLink().Node("n0").Holding(tc.holding...).Obj()
				bound.Namespace, bound.UID = "ns-a", asker.UID
				f.cache.SetPod(bound)
			}
			reclaim.Settle(f.now.Add(tc.after))
			if got := testbuild.Counter(t, reg, "reclaim_evictions", "useful"); got != tc.useful {
				t.Errorf("useful evictions %v, want %v", got, tc.useful)
			}
			if got := testbuild.Counter(t, reg, "reclaim_evictions", "useless"); got != tc.useless {
				t.Errorf("useless evictions %v, want %v", got, tc.useless)
			}
		})
	}
}

// Topology-aware reclaim for a gang whose gang-topology level is required
// (a rack, a node, or a multi-node NVLink clique): team-b, guaranteed 4,
// runs a 1-GPU pod on each GPU of four 2-GPU nodes in two racks, the
// newest alternating between the racks (and between nodes; the newest two
// share a clique); team-a's gang of 4 × 1 GPU (2 × 1 GPU for a node)
// reclaims the pods of ONE domain and is planned there. Newest first without the
// topology would spend team-b's 4 GPUs of surplus across both domains.
func TestQueueReclaimFreesOneTopologyDomain(t *testing.T) {
	const gpuCliqueLabel = "nvidia.com/gpu.clique"
	cliqueOfNode := map[string]string{"n0": "cq-1", "n2": "cq-1", "n1": "cq-2", "n3": "cq-2"}
	for _, tc := range []struct {
		level   string
		members int
		domain  func(node string) string
	}{
		{level: "rack", members: 4, domain: func(n string) string { return map[string]string{"n0": "r1", "n1": "r1", "n2": "r2", "n3": "r2"}[n] }},
		{level: corev1.LabelHostname, members: 2, domain: func(n string) string { return n }},
		// Multi-node NVLink domains as NVIDIA's GPU feature discovery
		// labels them, across the racks: the newest two pods share one.
		{level: gpuCliqueLabel, members: 4, domain: func(n string) string { return cliqueOfNode[n] }},
	} {
		t.Run(tc.level, func(t *testing.T) {
			var nodes []*corev1.Node
			for _, name := range []string{"n0", "n1", "n2", "n3"} {
				n := testbuild.Node(name).GPUs(2, "H100", 81920).Obj()
				n.Labels = map[string]string{"rack": map[string]string{"n0": "r1", "n1": "r1", "n2": "r2", "n3": "r2"}[name], corev1.LabelHostname: name, gpuCliqueLabel: cliqueOfNode[name]}
				nodes = append(nodes, n)
			}
			nodes = withGPUCapacity(nodes)
			f, _, evicter := newReclaimFixture(t, nodes, 4, nil)
			nodeOf := map[string]string{}
			// Newest first: n0, n2, n1, n3, then the older ones.
			for i, at := range []struct {
				node string
				gpu  int
			}{{"n0", 0}, {"n2", 0}, {"n1", 0}, {"n3", 0}, {"n0", 1}, {"n1", 1}, {"n2", 1}, {"n3", 1}} {
				name := fmt.Sprintf("b-%s-%d", at.node, at.gpu)
				f.runningB(name, at.node, at.gpu, time.Duration(i+1)*time.Minute)
				nodeOf[name] = at.node
			}
			for i := range tc.members {
				p := testbuild.Pod(fmt.Sprintf("g-%d", i)).Whole(1).Obj()
				p.Namespace, p.UID = "ns-a", types.UID(fmt.Sprintf("uid-g-%d", i))
				p.Annotations[api.AnnotationGang] = "g"
				p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(tc.members)
				p.Annotations[api.AnnotationGangTopology] = tc.level + ":required"
				p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
				p.CreationTimestamp = metav1.NewTime(f.now)
				if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.sync()
			domains := map[string]bool{}
			for _, name := range evicter.Evicted {
				domains[tc.domain(nodeOf[name])] = true
			}
			if len(evicter.Evicted) != tc.members || len(domains) != 1 {
				t.Fatalf("evicted %v, want the %d pods of one %s\nevents:\n%s", evicter.Evicted, tc.members, tc.level, strings.Join(f.events.Events, "\n"))
			}
			pods, _ := f.list()
			for _, p := range pods {
				if p.Namespace != "ns-a" {
					continue
				}
				plan, ok, err := api.GetGangPlan(p.Annotations)
				if !ok || err != nil {
					t.Errorf("%s not planned (%v)", p.Name, err)
					continue
				}
				if !domains[tc.domain(plan.Node)] {
					t.Errorf("%s planned on %s, not in the freed %s %v", p.Name, plan.Node, tc.level, domains)
				}
			}
		})
	}
}

// Room that starts being freed while a planning pass runs (a pod there
// begins leaving after the pass read the pods) goes by the next pass's
// order, not to the workload the pass had reached: in the pass that sees
// the pod leaving only through queue reclaim's fresh view, nothing is
// admitted; in the next, the oldest queued pod is.
func TestRoomFreedDuringAPassGoesByOrder(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 8, 0, f.now)},
		Pods:   f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, HalfLife: time.Hour, Now: func() time.Time { return f.now },
	}
	reclaim := &planner.QueueReclaimer{Ledger: extender.PlannerLedger{Cache: f.cache}, Evicter: &testbuild.PreemptClient{}, Pods: f.list, Events: f.events, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.plannerView, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book, QueueReclaim: reclaim})
	full := testbuild.Pod("full").Whole(8).Node("n0").Holding(0, 1, 2, 3, 4, 5, 6, 7).Obj()
	full.Namespace, full.UID = "other", "uid-full"
	if _, err := f.client.CoreV1().Pods("other").Create(context.Background(), full, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(full)
	f.queued("ns-a", "a-0", f.now.Add(-time.Minute))
	f.queued("ns-a", "a-1", f.now)
	f.sync() // the cluster is full: both wait
	if a, _ := f.admitted("ns-a"); a != 0 {
		t.Fatalf("admitted %d on a full cluster", a)
	}
	// The pass reads the pods before full begins leaving; reclaim reads
	// them after.
	before, _ := f.list()
	f.view = before
	full, _ = f.client.CoreV1().Pods("other").Get(context.Background(), "full", metav1.GetOptions{})
	full.DeletionTimestamp = &metav1.Time{Time: f.now}
	if _, err := f.client.CoreV1().Pods("other").Update(context.Background(), full, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(full)
	f.sync()
	if a, _ := f.admitted("ns-a"); a != 0 {
		t.Errorf("admitted %d in the pass during which the room began to be freed, want 0 (the next pass decides)", a)
	}
	f.view = nil
	f.sync()
	// Both are planned on the room full frees, and keep their gates
	// while it is still leaving.
	pods, _ := f.list()
	planned := 0
	for _, p := range pods {
		if _, ok := p.Annotations[api.AnnotationGangPlan]; ok && p.Namespace == "ns-a" {
			planned++
		}
	}
	if a, gated := f.admitted("ns-a"); a != 0 || gated != 2 || planned != 2 {
		t.Errorf("in the next pass, while full is leaving: %d planned, %d admitted, %d gated; want both planned and gated\nevents:\n%s", planned, a, gated, strings.Join(f.events.Events, "\n"))
	}
	f.gone(full)
	f.sync()
	if a, _ := f.admitted("ns-a"); a != 2 {
		t.Errorf("admitted %d once full is gone, want both\nevents:\n%s", a, strings.Join(f.events.Events, "\n"))
	}
}

// An elastic gang's members held back by its cap (gang-max-member) are not
// waiting demand: the queue's snapshot counts as pending only those the cap
// lets start, in name order, besides every other waiting pod.
func TestQueueSnapshotLeavesOutMembersBeyondTheCap(t *testing.T) {
	q := &api.Queue{Name: "team-a", Namespaces: []string{"ns-a"}, Resources: map[corev1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: 8, Weight: 1},
	}}
	member := func(name, maxMember string, bound bool) *corev1.Pod {
		p := testbuild.Pod(name).Whole(2).Obj()
		p.Namespace, p.UID = "ns-a", types.UID("uid-"+name)
		p.Annotations = map[string]string{api.AnnotationGang: "g", api.AnnotationGangMinMember: "1"}
		if maxMember != "" {
			p.Annotations[api.AnnotationGangMaxMember] = maxMember
		}
		if bound {
			p.Spec.NodeName = "n0"
		}
		return p
	}
	lone := testbuild.Pod("lone").Whole(1).Obj()
	lone.Namespace = "ns-a"
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	for _, tc := range []struct {
		name        string
		maxMember   string
		bound       int
		wantPending int64 // GPUs
	}{
		{"cap 3, one running: two of four waiting count", "3", 1, 1 + 2*2},
		{"cap reached: none count", "2", 2, 1},
		{"no cap: all count", "", 1, 1 + 4*2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := []*corev1.Pod{lone}
			for i := range 5 {
				pods = append(pods, member(fmt.Sprintf("m-%d", i), tc.maxMember, i < tc.bound))
			}
			book := &planner.QueueBook{Queues: testbuild.Objects{q.Unstructured()},
				Pods:  func() ([]*corev1.Pod, error) { return pods, nil },
				Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
			snap, err := book.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if got := snap.State.Pending["team-a"][api.ResourceGPU]; got != tc.wantPending {
				t.Errorf("pending GPUs %d, want %d", got, tc.wantPending)
			}
			if got, want := snap.State.Used["team-a"][api.ResourceGPU], int64(2*tc.bound); got != want {
				t.Errorf("used GPUs %d, want %d", got, want)
			}
		})
	}
}

// A queue borrowing through an elastic gang (4 members of 4 GPUs, minMember
// 2, started one minute apart) gives back its extra members, newest first,
// when another queue asks within its guarantee: the gang is not taken whole
// (that would take the queue below its own guarantee, and reclaim used to
// refuse then, "other queues borrow too little").
func TestQueueReclaimTakesElasticExtras(t *testing.T) {
	var nodes []*corev1.Node
	for i := range 2 {
		nodes = append(nodes, testbuild.Node(fmt.Sprintf("n%d", i)).GPUs(8, "H100", 81920).Obj())
	}
	nodes = withGPUCapacity(nodes)
	f, _, evicter := newReclaimFixture(t, nodes, 8, nil)
	for i := range 4 {
		p := testbuild.Pod(fmt.Sprintf("el-%d", i)).Whole(4).Node(fmt.Sprintf("n%d", i/2)).Holding(4*(i%2), 4*(i%2)+1, 4*(i%2)+2, 4*(i%2)+3).Obj()
		p.Namespace, p.UID = "ns-a", types.UID(fmt.Sprintf("uid-el-%d", i))
		p.Annotations = map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "2"}
		start := metav1.NewTime(f.now.Add(-time.Hour + time.Duration(i)*time.Minute))
		p.CreationTimestamp, p.Status.StartTime = start, &start
		if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		p := testbuild.Pod(fmt.Sprintf("b-%d", i)).Whole(4).Obj()
		p.Namespace, p.UID = "ns-b", types.UID(fmt.Sprintf("uid-b-%d", i))
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
		p.CreationTimestamp = metav1.NewTime(f.now)
		if _, err := f.client.CoreV1().Pods("ns-b").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods, _ := f.list()
	for _, p := range pods {
		f.cache.SetPod(p)
	}
	f.passesEvicting(evicter, "ns-a", 6)
	got := append([]string(nil), evicter.Evicted...)
	sort.Strings(got)
	if diff := cmp.Diff([]string{"el-2", "el-3"}, got); diff != "" {
		t.Errorf("evicted (-want +got): the two newest extra members only\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
	}
	if a, _ := f.admitted("ns-b"); a != 2 {
		t.Errorf("team-b admitted %d, want 2\nevents:\n%s", a, strings.Join(f.events.Events, "\n"))
	}
}

// A queue 4 GPUs short of its guarantee takes back an elastic gang's extra
// member of 4 GPUs from a queue that borrows 2 through it (which is then 2
// short, less than the asker was), under a department with 2 GPUs idle;
// the same two pods as whole workloads are not taken.
func TestQueueReclaimTakesAnExtraMemberStraddlingItsGuarantee(t *testing.T) {
	for _, tc := range []struct {
		name    string
		elastic bool
		want    []string
	}{
		{name: "extra member", elastic: true, want: []string{"el-1"}},
		{name: "whole workloads", elastic: false, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj(), testbuild.Node("n1").GPUs(8, "H100", 81920).Obj()})
			f, _, evicter := newReclaimFixtureOf(t, nodes, func(now time.Time) testbuild.Objects {
				return testbuild.Objects{testbuild.QueueObj(t, "dept", "", nil, 16, 0, now),
					testbuild.QueueObj(t, "team-a", "dept", []string{"ns-a"}, 6, 0, now), testbuild.QueueObj(t, "team-b", "dept", []string{"ns-b"}, 10, 0, now)}
			}, nil)
			for i := range 2 {
				p := testbuild.Pod(fmt.Sprintf("el-%d", i)).Whole(4).Node("n0").Holding(4*i, 4*i+1, 4*i+2, 4*i+3).Obj()
				p.Namespace, p.UID = "ns-a", types.UID(fmt.Sprintf("uid-el-%d", i))
				if tc.elastic {
					p.Annotations = map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "1"}
				}
				start := metav1.NewTime(f.now.Add(-time.Hour + time.Duration(i)*time.Minute))
				p.CreationTimestamp, p.Status.StartTime = start, &start
				if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 6 {
				f.runningB(fmt.Sprintf("b-%d", i), "n1", i, time.Hour)
			}
			asker := testbuild.Pod("b-four").Whole(4).Obj()
			asker.Namespace, asker.UID = "ns-b", "uid-b-four"
			asker.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
			asker.CreationTimestamp = metav1.NewTime(f.now)
			if _, err := f.client.CoreV1().Pods("ns-b").Create(context.Background(), asker, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			pods, _ := f.list()
			for _, p := range pods {
				f.cache.SetPod(p)
			}
			f.passesEvicting(evicter, "ns-a", 4)
			if diff := cmp.Diff(tc.want, evicter.Evicted); diff != "" {
				t.Errorf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
			}
			if told := strings.Join(f.events.Events, "\n"); tc.elastic && !strings.Contains(told, api.ExtraMemberEvicted) {
				t.Errorf("no Reclaimed Event tells the extra member why it goes:\n%s", told)
			}
			wantAdmitted := 0 // b-four waits
			if tc.elastic {
				wantAdmitted = 1
			}
			if a, _ := f.admitted("ns-b"); a != wantAdmitted {
				t.Errorf("team-b admitted %d, want %d\nevents:\n%s", a, wantAdmitted, strings.Join(f.events.Events, "\n"))
			}
		})
	}
}

// A queued pod the planner has just planned, shown by a lagging cache as
// still gated and unplanned, is not planned a second time: a second plan
// moved its hold in the ledger to another node while the pod stayed pinned
// to the first (the gate was gone, so nothing re-pinned it), and the first
// node's GPU went to other pods: the pod could bind nowhere until its plan
// expired (seen in an e2e run: 27 of a Job's 28 pods Running, one waiting
// on a node eight others filled).
func TestQueuedPodPlannedOnceOnALaggingCache(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj(), testbuild.Node("n1").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	f.running("busy", "n0", 7, f.now.Add(-time.Minute), nil)
	book := &planner.QueueBook{Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 16, 0, f.now)}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.plannerView, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	f.queued("ns-a", "a-0", f.now)
	before, _ := f.list()
	if err := f.planner.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	planOf := func() (*api.GangPlan, *corev1.Pod) {
		t.Helper()
		p, err := f.client.CoreV1().Pods("ns-a").Get(context.Background(), "a-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		plan, _, _ := api.GetGangPlan(p.Annotations)
		return plan, p
	}
	first, p := planOf()
	if first == nil || api.HasQueueGate(p) {
		t.Fatalf("a-0 after the first pass: plan %v, gates %v; want planned and its gate lifted", first, p.Spec.SchedulingGates)
	}
	// The informer has not delivered the plan or the gate's removal yet:
	// the planner's pod list and the ledger's pods are as before.
	f.view = before
	if err := f.planner.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.view = nil
	plan, p := planOf()
	held, _ := extender.PlannerLedger{Cache: f.cache}.Holds(p.UID)
	if plan == nil || plan.Node != first.Node || held.Node != first.Node {
		t.Errorf("a-0 planned on %s, pinned there; after a pass on a lagging cache its plan says %v and the ledger holds it on %q", first.Node, plan, held.Node)
	}
	// Once the cache shows the plan, the pod stays as planned.
	f.sync()
	if plan, _ := planOf(); plan == nil || plan.Node != first.Node {
		t.Errorf("a-0 planned on %s; after the cache caught up its plan says %v", first.Node, plan)
	}
}

// A queue's refusal that differs from the last one told only in its
// numbers (the queues' use, which moves with every pod that starts or
// ends) is told again after a while, not on every pass: on make demo a
// gang waiting for its queue got twenty QueueWaiting Events in one second
// ("the queues would use 37 of the cluster's 28", then 41, 44, 36, ...).
// A reason of another kind is told at once, and so is every change of
// another reason ("7 of 8 members exist" after "6 of 8").
func TestQueueRefusalsDifferingInNumbersAreToldOnceAWhile(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.queued("ns-a", "a-0", f.now)
	pods, _ := f.list()
	count := func() int {
		n := 0
		for _, e := range f.events.Events {
			if strings.HasPrefix(e, api.EventQueueWaiting+": ") {
				n++
			}
		}
		return n
	}
	key := api.PodKey("ns-a", "a-0")
	refusal := func(use int) string {
		return fmt.Sprintf("queue qa would borrow tessera.dev/gpu, but the queues would use %d of the cluster's 28", use)
	}
	for i := range 20 {
		f.planner.WaitQueue(key, pods, refusal(29+i))
		f.now = f.now.Add(100 * time.Millisecond)
	}
	if got := count(); got != 1 {
		t.Errorf("%d Events for 20 passes within 2 s whose refusals differ in a number, want 1:\n%s", got, strings.Join(f.events.Events, "\n"))
	}
	f.now = f.now.Add(planner.RetellAfter)
	f.planner.WaitQueue(key, pods, refusal(50))
	if got := count(); got != 2 {
		t.Errorf("%d Events, want 2 once %s passed", got, planner.RetellAfter)
	}
	f.planner.Wait(key, pods, "pod ns-a/a-0: no room: it needs 1 whole GPU and 1.0 GPUs in all; tried the whole cluster")
	if got := count(); got != 3 {
		t.Errorf("%d Events, want 3: a reason of another kind is told at once", got)
	}
	f.planner.Wait(key, pods, "pod ns-a/a-0: no room: it needs 1 whole GPU and 2.0 GPUs in all; tried the whole cluster")
	if got := count(); got != 4 {
		t.Errorf("%d Events, want 4: a reason other than a queue's refusal is told whenever it changes", got)
	}
}

// The gang gate on a GPU pod that declares no gang, in a namespace a
// Queue serves, is not lifted alone: the queue admits the pod first, in
// its order and within its limit, and then lifts both gates. Not even for
// a pod another scheduler places (the extender's filter, which holds a
// queued namespace's pods, never sees it) or one that has only the gang
// gate (the webhook, which adds the queue's, was down): lifting the gang's
// gate must not let a pod skip its queue.
func TestGangGateWithoutAGangKeepsItsQueue(t *testing.T) {
	for _, tc := range []struct {
		name      string
		gates     []string
		scheduler string
	}{
		{"both gates", []string{api.SchedulingGateGang, api.SchedulingGateQueue}, ""},
		{"the gang gate only", []string{api.SchedulingGateGang}, ""},
		{"the gang gate only, another scheduler", []string{api.SchedulingGateGang}, "other-scheduler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
			f := newGangFixture(t, nodes...)
			q := &api.Queue{Name: "team-a", Namespaces: []string{"ns-a"}, Resources: map[corev1.ResourceName]api.QueueResource{
				api.ResourceGPU: {Guaranteed: 1, Limit: 1, Limited: true, Weight: 1},
			}}
			book := &planner.QueueBook{Queues: testbuild.Objects{q.Unstructured()}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
			f.queued("ns-a", "first", f.now) // takes the queue's limit
			p := testbuild.Pod("loose").Whole(1).Obj()
			p.Namespace, p.UID, p.Spec.SchedulerName = "ns-a", "uid-loose", tc.scheduler
			p.CreationTimestamp = metav1.NewTime(f.now.Add(time.Second))
			for _, g := range tc.gates {
				p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
			}
			if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.sync()
			f.sync()
			loose, err := f.client.CoreV1().Pods("ns-a").Get(context.Background(), "loose", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_, planned := loose.Annotations[api.AnnotationGangPlan]
			if !api.HasGangGate(loose) || planned {
				t.Fatalf("over its queue's limit: gates %v, planned %v; want the gang gate kept", loose.Spec.SchedulingGates, planned)
			}
			if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, "limit 1") || strings.Contains(ev, api.EventGangGateLifted) {
				t.Errorf("events:\n%s\nwant the queue's limit told, no %s", ev, api.EventGangGateLifted)
			}
			// Room in the queue: admitted, both gates lifted.
			if err := f.client.CoreV1().Pods("ns-a").Delete(context.Background(), "first", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			f.cache.DeletePod("uid-ns-a-first")
			f.sync()
			if a, g := f.admitted("ns-a"); a != 1 || g != 0 {
				t.Errorf("admitted %d, queue-gated %d; want 1 and 0", a, g)
			}
			if loose, _ = f.client.CoreV1().Pods("ns-a").Get(context.Background(), "loose", metav1.GetOptions{}); len(loose.Spec.SchedulingGates) != 0 {
				t.Errorf("admitted by its queue, gates %v left", loose.Spec.SchedulingGates)
			}
		})
	}
}

// A pod the queue gate holds in a namespace no Queue serves (its Queue
// was deleted while it waited) is handed to kube-scheduler: its gates are
// lifted without a plan, with a QueueGateLifted Event, and no reservation
// is made for it; a pod of a namespace a Queue serves keeps its gate.
func TestQueueGateLiftedWhenNoQueueServes(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	f.running("busy", "n0", 8, f.now.Add(-time.Hour), nil) // no room: a queued pod would wait
	queues := testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 8, 0, f.now)}
	book := &planner.QueueBook{Queues: queues, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	f.queued("ns-a", "served", f.now.Add(-time.Hour))
	f.queued("ns-gone", "orphan", f.now.Add(-time.Hour))
	f.sync()
	get := func(ns, name string) *corev1.Pod {
		p, err := f.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	orphan := get("ns-gone", "orphan")
	if _, planned := orphan.Annotations[api.AnnotationGangPlan]; len(orphan.Spec.SchedulingGates) != 0 || planned {
		t.Errorf("orphan: gates %v, planned %v; want its gates lifted, no plan", orphan.Spec.SchedulingGates, planned)
	}
	if !api.HasQueueGate(get("ns-a", "served")) {
		t.Error("a pod its Queue serves lost its gate")
	}
	ev := strings.Join(f.events.Events, "\n")
	if !strings.Contains(ev, api.EventQueueGateLifted+": tessera: no Queue serves namespace ns-gone") {
		t.Errorf("events:\n%s\nwant %s on orphan", ev, api.EventQueueGateLifted)
	}
	if strings.Contains(ev, "admitted by queue  ") || strings.Contains(ev, "QueueWaiting: tessera: pod ns-gone/orphan") {
		t.Errorf("orphan handled as queued:\n%s", ev)
	}
}

// The usage history a Queue's status records accrues each instant once:
// writes every 10 s at 900 ms past the second, each read back as the next
// one's base, add 8 GPUs x 10 s each (the status keeps whole seconds; the
// fraction past them was counted again by the next write).
func TestQueueUsageAccruesOnce(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	for i := range 8 {
		p := testbuild.Pod(fmt.Sprintf("r-%d", i)).Whole(1).Node("n0").Holding(i).Obj()
		p.Namespace, p.UID = "ns-a", types.UID(fmt.Sprintf("uid-r-%d", i))
		p.Status.Phase = corev1.PodRunning
		if _, err := f.client.CoreV1().Pods("ns-a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := f.now.Truncate(time.Second)
	obj := testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 8, 1, t0)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{api.QueueGVR: "QueueList"}, obj)
	now := t0
	book := &planner.QueueBook{Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, Dynamic: dyn,
		HalfLife: 24 * time.Hour, Now: func() time.Time { return now }}
	want := 1.0
	for i := 1; i <= 3; i++ {
		book.Queues = testbuild.Objects{obj}
		now = t0.Add(time.Duration(i)*10*time.Second + 900*time.Millisecond)
		if err := book.WriteStatus(context.Background()); err != nil {
			t.Fatal(err)
		}
		var err error
		if obj, err = dyn.Resource(api.QueueGVR).Get(context.Background(), "team-a", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		want = queue.Accrue(queue.Usage{api.ResourceGPU: want}, quota.Resources{api.ResourceGPU: 8}, 10*time.Second, 24*time.Hour)[api.ResourceGPU]
	}
	st, err := api.QueueStatusFromUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Usage[api.ResourceGPU]; math.Abs(got-want) > 1e-6 {
		t.Errorf("usage after three writes 10 s apart: %.3f GPU-seconds, want %.3f (8 GPUs x 30 s, decayed)", got, want)
	}
}

// The fair share a Queue's status shows counts its recent borrowing with
// a history weight (time-based fair share): team-a used 4 of the node's 8
// GPUs lately, team-b nothing, both wait for 8; by weight alone each gets
// 4, tilted team-a gets 8/3 (3, the odd unit on the larger remainder).
func TestQueueStatusFairShareCountsHistory(t *testing.T) {
	for _, tc := range []struct {
		weight       float64
		wantA, wantB int64
	}{{weight: 0, wantA: 4, wantB: 4}, {weight: 1, wantA: 3, wantB: 5}} {
		t.Run(fmt.Sprintf("history weight %g", tc.weight), func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj()})
			f := newGangFixture(t, nodes...)
			for _, ns := range []string{"ns-a", "ns-b"} {
				for i := range 8 {
					p := testbuild.Pod(fmt.Sprintf("w-%d", i)).Whole(1).Obj()
					p.Namespace, p.UID = ns, types.UID(fmt.Sprintf("uid-%s-%d", ns, i))
					if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			now := f.now.Truncate(time.Second)
			const halfLife = 24 * time.Hour
			a := testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 0, 4*halfLife.Seconds()/math.Ln2, now)
			b := testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 0, 0, now)
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{api.QueueGVR: "QueueList"}, a, b)
			book := &planner.QueueBook{Queues: testbuild.Objects{a, b}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, Dynamic: dyn,
				HalfLife: halfLife, HistoryWeight: tc.weight, Now: func() time.Time { return now }}
			if err := book.WriteStatus(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, name := range []string{"team-a", "team-b"} {
				obj, err := dyn.Resource(api.QueueGVR).Get(context.Background(), name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				st, err := api.QueueStatusFromUnstructured(obj)
				if err != nil {
					t.Fatal(err)
				}
				got[name] = st.FairShare[api.ResourceGPU]
			}
			if want := map[string]int64{"team-a": tc.wantA, "team-b": tc.wantB}; !cmp.Equal(want, got) {
				t.Errorf("status fair shares %v, want %v", got, want)
			}
		})
	}
}

// A team's high-tier pod displaces the team's own lower tiers once its
// queue is full (two teams guaranteed 8 each fill 16 GPUs with 1-GPU pods
// of priority 100): 4 of ty's newest pods are evicted for ty's 4-GPU pod
// of priority 1000, none of tx's, and it is admitted. Before, Admit
// refused it ("the queues would use 20 of the cluster's 16") and it waited
// for ever, while the same pods of a namespace no Queue serves preempted.
func TestQueuedHighTierPreemptsItsOwnQueue(t *testing.T) {
	nodes := withGPUCapacity(testbuild.EightGPUNodes(2))
	f := newGangFixture(t, nodes...)
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "tx", "", []string{"ns-x"}, 8, 0, f.now), testbuild.QueueObj(t, "ty", "", []string{"ns-y"}, 8, 0, f.now)},
		Pods:   f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, HalfLife: time.Hour, Now: func() time.Time { return f.now },
	}
	evicter := &testbuild.PreemptClient{}
	reclaim := &planner.QueueReclaimer{Ledger: extender.PlannerLedger{Cache: f.cache}, Evicter: evicter, Pods: f.list, Events: f.events, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.plannerView, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book, QueueReclaim: reclaim})
	low, high := int32(100), int32(1000)
	for n, ns := range []string{"ns-x", "ns-y"} {
		for i := range 8 {
			p := testbuild.Pod(fmt.Sprintf("lo-%d", i)).Whole(1).Node(fmt.Sprintf("n%d", n)).Holding(i).Obj()
			p.Namespace, p.UID = ns, types.UID(fmt.Sprintf("uid-lo-%d", i))
			if ns == "ns-x" {
				p.UID = types.UID(fmt.Sprintf("uid-x-lo-%d", i))
			}
			p.Spec.Priority = &low
			p.CreationTimestamp = metav1.NewTime(f.now.Add(-time.Hour + time.Duration(i)*time.Minute))
			if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	urgent := testbuild.Pod("urgent").Whole(4).Obj()
	urgent.Namespace, urgent.UID = "ns-y", "uid-urgent"
	urgent.Spec.Priority = &high
	urgent.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	if _, err := f.client.CoreV1().Pods("ns-y").Create(context.Background(), urgent, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, _ := f.list()
	for _, p := range pods {
		f.cache.SetPod(p)
	}
	// Two passes on a planner view that lags (the asker still unplanned,
	// the victims not leaving): the second evicts nothing more (on the
	// e2e cluster a pass 250 ms later evicted two more notebooks).
	f.view = pods
	f.sync()
	f.now = f.now.Add(250 * time.Millisecond)
	f.sync()
	f.view = nil
	f.passesEvicting(evicter, "ns-y", 4)
	events := strings.Join(f.events.Events, "\n")
	if diff := cmp.Diff([]string{"lo-7", "lo-6", "lo-5", "lo-4"}, evicter.Evicted); diff != "" {
		t.Errorf("evicted (-want +got):\n%s\nevents:\n%s", diff, events)
	}
	got, _ := f.client.CoreV1().Pods("ns-y").Get(context.Background(), "urgent", metav1.GetOptions{})
	if api.HasQueueGate(got) || got.Annotations[api.AnnotationGangPlan] == "" {
		t.Errorf("urgent not admitted and planned: gates %v, plan %q\nevents:\n%s", got.Spec.SchedulingGates, got.Annotations[api.AnnotationGangPlan], events)
	}
	if !strings.Contains(events, "preempting lower tiers of its own queue ty") {
		t.Errorf("no Event saying it preempts its own queue's lower tiers:\n%s", events)
	}
}
