package planner_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// training is the tier between inference and notebook (queue_test.go).
const training = 10000

// newTierFixture is a gang fixture on nodes (labelled with their
// hostname) whose planner preempts lower tiers through a Preemptor; the
// returned client records the evictions and refuses those of the pods
// named in its PDB. With stale > 0, the planner's first stale
// reservations of a plan find the snapshot stale (staleLedger).
func newTierFixture(t *testing.T, nodes []*corev1.Node, stale ...int) (*gangFixture, *testbuild.PreemptClient) {
	t.Helper()
	return newTierFixtureWith(t, nodes, nil, stale...)
}

// newTierFixtureWith is newTierFixture whose preemptor writes through
// wrap(client) when wrap is not nil.
func newTierFixtureWith(t *testing.T, nodes []*corev1.Node, wrap func(*gangFixture, extender.PreemptClient) extender.PreemptClient, stale ...int) (*gangFixture, *testbuild.PreemptClient) {
	t.Helper()
	for _, n := range nodes {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["kubernetes.io/hostname"] = n.Name
	}
	f := newGangFixture(t, withGPUCapacity(nodes)...)
	evicter := &testbuild.PreemptClient{PDB: map[string]bool{}}
	var client extender.PreemptClient = planWriter{evicter, &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}}
	if wrap != nil {
		client = wrap(f, client)
	}
	var ledger planner.Ledger = extender.PlannerLedger{Cache: f.cache}
	if len(stale) > 0 {
		ledger = &staleLedger{Ledger: ledger, stale: stale[0]}
	}
	f.tierPlanner(client, ledger)
	return f, evicter
}

// tierPlanner makes the fixture's planner one that preempts through
// client, on ledger.
func (f *gangFixture) tierPlanner(client extender.PreemptClient, ledger planner.Ledger) {
	pre := &extender.Preemptor{Cache: f.cache, Client: client, Pods: f.list,
		Policy: testPolicy(f.t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: ledger, Client: f.gangClient, Pods: f.list,
		Policy: testPolicy(f.t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }, Preempt: pre})
}

// restartTier replaces the fixture's planner and cache by new ones (an
// extender restart): they know what the API server holds, nothing more.
func (f *gangFixture) restartTier(nodes []*corev1.Node, evicter *testbuild.PreemptClient) {
	f.t.Helper()
	f.cache = extender.NewCache()
	for _, n := range withGPUCapacity(nodes) {
		f.cache.SetNode(n)
	}
	pods, err := f.list()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, p := range pods {
		f.cache.SetPod(p)
	}
	f.tierPlanner(planWriter{evicter, &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(f.t)}}, extender.PlannerLedger{Cache: f.cache})
}

// runningTier creates a running pod of namespace "low" on node holding
// gpus, of priority prio, started age ago (in gang gang of minMember min
// when gang is not ""), and feeds it to the ledger.
func (f *gangFixture) runningTier(name, node string, prio int32, age time.Duration, gang string, min int, gpus ...int) *corev1.Pod {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(int64(len(gpus))).Priority(prio).Node(node).Holding(gpus...).Obj()
	p.Namespace, p.UID = "low", types.UID("uid-low-"+name)
	if gang != "" {
		p.Annotations[api.AnnotationGang] = gang
		p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(min)
	}
	started := metav1.NewTime(f.now.Add(-age))
	p.CreationTimestamp, p.Status.StartTime, p.Status.Phase = started, &started, corev1.PodRunning
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
	return p
}

// tierMember creates gated member i of gang name (minMember min) asking
// for gpus GPUs at priority prio; edit changes it before it is created.
func (f *gangFixture) tierMember(name string, min, i, gpus int, prio int32, edit func(*corev1.Pod)) {
	f.t.Helper()
	p := testbuild.Pod(fmt.Sprintf("%s-%d", name, i)).Whole(int64(gpus)).Priority(prio).Obj()
	p.Annotations[api.AnnotationGang] = name
	p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(min)
	p.Annotations[api.AnnotationGangTimeout] = "60"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
	p.CreationTimestamp = metav1.NewTime(f.now)
	if edit != nil {
		edit(p)
	}
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// notebooksOn fills every GPU of node with a 1-GPU notebook
// (<node>-nb-<gpu>), the one on GPU i started age(i) ago.
func (f *gangFixture) notebooksOn(node string, gpus int, age func(i int) time.Duration) []string {
	var out []string
	for i := range gpus {
		name := fmt.Sprintf("%s-nb-%d", node, i)
		f.runningTier(name, node, notebook, age(i), "", 0, i)
		out = append(out, name)
	}
	return out
}

// planned are the nodes the members of prefix are planned on, sorted; it
// fails the test when one is not planned with its gate lifted.
func (f *gangFixture) plannedWhole(prefix string) []string {
	f.t.Helper()
	var nodes []string
	for name, s := range f.state(prefix) {
		if !s.planned || s.gated {
			f.t.Errorf("member %s: planned %v, gated %v; want planned with its gate lifted\nevents:\n%s", name, s.planned, s.gated, strings.Join(f.events.Events, "\n"))
		}
		nodes = append(nodes, s.node)
	}
	sort.Strings(nodes)
	return nodes
}

// plannedOnceVictimsLeave checks that the members of prefix are planned
// and keep their gates while the pods evicted for them (named in evicted)
// are still there, so that kube-scheduler does not try them on GPUs still
// taken; then the victims leave, and the next pass lifts the gates. It
// returns plannedWhole's nodes.
func (f *gangFixture) plannedOnceVictimsLeave(prefix string, evicted []string) []string {
	f.t.Helper()
	for name, s := range f.state(prefix) {
		if !s.planned || !s.gated {
			f.t.Errorf("member %s while its victims are there: planned %v, gated %v; want planned and gated", name, s.planned, s.gated)
		}
	}
	gone := map[string]bool{}
	for _, name := range evicted {
		gone[name] = true
	}
	pods, _ := f.list()
	for _, p := range pods {
		if gone[p.Name] {
			f.gone(p)
		}
	}
	f.sync()
	return f.plannedWhole(prefix)
}

func sortedCopy(s []string) []string {
	out := append([]string{}, s...)
	sort.Strings(out)
	return out
}

// An inference gang of 2 x 8 GPUs on three nodes full of notebooks (and a
// fourth running a newer training pod): the notebooks of exactly two nodes
// are evicted, nothing else, and the gang is planned there at once.
func TestGangPreemptsLowerTier(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pdb       string
		wantNodes []string
	}{
		// n2's notebooks are the newest, then n1's; the starts interleave.
		{name: "the newest notebooks go", wantNodes: []string{"n1", "n2"}},
		{name: "a budget passes n2 over", pdb: "n2-nb-3", wantNodes: []string{"n0", "n1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, evicter := newTierFixture(t, testbuild.EightGPUNodes(4))
			onNode := map[string][]string{}
			for k, n := range []string{"n0", "n1", "n2"} {
				onNode[n] = f.notebooksOn(n, 8, func(i int) time.Duration { return time.Hour - time.Duration(3*i+k)*time.Minute })
			}
			f.runningTier("train", "n3", training, time.Minute, "", 0, 0, 1, 2, 3, 4, 5, 6, 7)
			if tc.pdb != "" {
				evicter.PDB[tc.pdb] = true
			}
			for i := range 2 {
				f.tierMember("inf", 2, i, 8, inference, nil)
			}
			f.sync()
			var want []string
			for _, n := range tc.wantNodes {
				want = append(want, onNode[n]...)
			}
			if diff := cmp.Diff(sortedCopy(want), sortedCopy(evicter.Evicted)); diff != "" {
				t.Fatalf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
			}
			if diff := cmp.Diff(tc.wantNodes, f.plannedOnceVictimsLeave("inf-", evicter.Evicted)); diff != "" {
				t.Errorf("planned nodes (-want +got):\n%s", diff)
			}
			f.sync()
			if len(evicter.Evicted) != len(want) {
				t.Errorf("the next pass evicted more: %v", evicter.Evicted)
			}
		})
	}
}

// Topology-aware preemption: the victims free the domain the gang needs.
// Without its constraint the cheapest (newest) victims are spread; with it
// they all fall within one domain, and nothing outside it is evicted.
func TestGangPreemptsWithinItsDomain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		// members of gpus each; edit sets the constraint.
		members, gpus int
		edit          func(*corev1.Pod)
		want          []string
	}{
		{
			// GPU i's notebook is newer than GPU i+4's, which is newer
			// than GPU i+1's: the four newest are two per clique.
			name:    "one NVLink clique",
			nodes:   []*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Cliques([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}).Obj()},
			members: 1, gpus: 4,
			edit: func(p *corev1.Pod) { p.Annotations[api.AnnotationNVLink] = api.NVLinkRequired },
			want: []string{"n0-nb-0", "n0-nb-1", "n0-nb-2", "n0-nb-3"},
		},
		{
			name:    "one node (gang-topology kubernetes.io/hostname:required)",
			nodes:   testbuild.EightGPUNodes(2),
			members: 2, gpus: 4,
			edit: func(p *corev1.Pod) { p.Annotations[api.AnnotationGangTopology] = "kubernetes.io/hostname:required" },
			want: []string{"n0-nb-0", "n0-nb-1", "n0-nb-2", "n0-nb-3", "n0-nb-4", "n0-nb-5", "n0-nb-6", "n0-nb-7"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, evicter := newTierFixture(t, tc.nodes)
			for k, n := range tc.nodes {
				if len(tc.nodes) == 1 {
					// newest first: GPU 0, 4, 1, 5, 2, 6, 3, 7.
					f.notebooksOn(n.Name, 8, func(i int) time.Duration { return time.Hour - time.Duration(10-2*(i%4)-i/4)*time.Minute })
					continue
				}
				f.notebooksOn(n.Name, 8, func(i int) time.Duration { return time.Hour - time.Duration(2*i+1-k)*time.Minute })
			}
			for i := range tc.members {
				f.tierMember("inf", tc.members, i, tc.gpus, inference, tc.edit)
			}
			f.sync()
			if diff := cmp.Diff(tc.want, sortedCopy(evicter.Evicted)); diff != "" {
				t.Fatalf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
			}
			f.plannedOnceVictimsLeave("inf-", evicter.Evicted)
		})
	}
}

// elasticGangAndSolo runs notebooks: an elastic gang el of four 2-GPU
// members, minimum 2, on n0 (el-2, the newest, started 20 minutes ago),
// and an 8-GPU pod started 5 minutes ago on n1.
func (f *gangFixture) elasticGangAndSolo() {
	f.runningTier("el-0", "n0", notebook, 40*time.Minute, "el", 2, 0, 1)
	f.runningTier("el-1", "n0", notebook, 40*time.Minute, "el", 2, 2, 3)
	f.runningTier("el-2", "n0", notebook, 20*time.Minute, "el", 2, 4, 5)
	f.runningTier("el-3", "n0", notebook, 30*time.Minute, "el", 2, 6, 7)
	f.runningTier("solo", "n1", notebook, 5*time.Minute, "", 0, 0, 1, 2, 3, 4, 5, 6, 7)
}

// A lower-tier elastic gang gives back its newest extra member before any
// whole workload goes, even a newer one.
func TestGangPreemptsElasticExtrasFirst(t *testing.T) {
	f, evicter := newTierFixture(t, testbuild.EightGPUNodes(2))
	f.elasticGangAndSolo()
	f.tierMember("inf", 1, 0, 2, inference, nil)
	f.sync()
	if diff := cmp.Diff([]string{"el-2"}, evicter.Evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
	}
	if diff := cmp.Diff([]string{"n0"}, f.plannedOnceVictimsLeave("inf-", evicter.Evicted)); diff != "" {
		t.Errorf("planned nodes (-want +got):\n%s", diff)
	}
}

// A victim that never goes (stuck terminating): the member planned on its
// room keeps its gate while it runs, at most two minutes; then the gate is
// lifted and kube-scheduler tries the pod as it would without the wait.
func TestGangGateLiftedWhenAVictimNeverGoes(t *testing.T) {
	f, evicter := newTierFixture(t, testbuild.EightGPUNodes(2))
	f.elasticGangAndSolo()
	f.tierMember("inf", 1, 0, 2, inference, func(p *corev1.Pod) { p.Annotations[api.AnnotationGangTimeout] = "600" })
	f.sync()
	if diff := cmp.Diff([]string{"el-2"}, evicter.Evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s", diff)
	}
	for _, after := range []time.Duration{0, 90 * time.Second} {
		f.now = f.now.Add(after)
		f.sync()
		if s := f.state("inf-")["inf-0"]; !s.planned || !s.gated {
			t.Fatalf("%s after the eviction, el-2 still running: planned %v, gated %v; want planned and gated", after, s.planned, s.gated)
		}
	}
	f.now = f.now.Add(31 * time.Second)
	f.sync()
	if diff := cmp.Diff([]string{"n0"}, f.plannedWhole("inf-")); diff != "" {
		t.Errorf("planned nodes (-want +got):\n%s", diff)
	}
	if len(evicter.Evicted) != 1 {
		t.Errorf("evicted more while waiting: %v", evicter.Evicted)
	}
}

// The wait for the victims is kept on the plan: an extender restarted
// while el-2 still runs keeps inf-0's gate (before, its memory of the wait
// was lost and the first pass lifted the gate), and lifts it once el-2 is
// gone.
func TestGangGateKeptThroughARestart(t *testing.T) {
	nodes := testbuild.EightGPUNodes(2)
	f, evicter := newTierFixture(t, nodes)
	f.elasticGangAndSolo()
	f.tierMember("inf", 1, 0, 2, inference, nil)
	f.sync()
	if diff := cmp.Diff([]string{"el-2"}, evicter.Evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s", diff)
	}
	f.restartTier(nodes, evicter)
	f.sync()
	if s := f.state("inf-")["inf-0"]; !s.planned || !s.gated {
		t.Fatalf("after the restart, el-2 still running: planned %v, gated %v; want planned and gated", s.planned, s.gated)
	}
	if diff := cmp.Diff([]string{"n0"}, f.plannedOnceVictimsLeave("inf-", evicter.Evicted)); diff != "" {
		t.Errorf("planned nodes (-want +got):\n%s", diff)
	}
	if len(evicter.Evicted) != 1 {
		t.Errorf("evicted more after the restart: %v", evicter.Evicted)
	}
}

// No preemption: a member with preemptionPolicy Never, or a started
// elastic gang growing beyond its minimum. The gang (or the member) waits.
func TestGangDoesNotPreempt(t *testing.T) {
	never := corev1.PreemptNever
	t.Run("preemptionPolicy Never", func(t *testing.T) {
		f, evicter := newTierFixture(t, testbuild.EightGPUNodes(2))
		for _, n := range []string{"n0", "n1"} {
			f.notebooksOn(n, 8, func(i int) time.Duration { return time.Hour })
		}
		f.tierMember("inf", 2, 0, 8, inference, nil)
		f.tierMember("inf", 2, 1, 8, inference, func(p *corev1.Pod) { p.Spec.PreemptionPolicy = &never })
		f.sync()
		if len(evicter.Evicted) > 0 {
			t.Errorf("evicted %v for a gang with a member that may not preempt", evicter.Evicted)
		}
		for name, s := range f.state("inf-") {
			if s.planned || !s.gated {
				t.Errorf("member %s: planned %v, gated %v; want it waiting", name, s.planned, s.gated)
			}
		}
	})
	t.Run("an elastic gang beyond its minimum", func(t *testing.T) {
		f, evicter := newTierFixture(t, testbuild.EightGPUNodes(2))
		f.notebooksOn("n1", 8, func(i int) time.Duration { return time.Hour })
		// minMember 1: inf-0 starts on the empty n0; inf-1 would need a
		// notebook node.
		f.tierMember("inf", 1, 0, 8, inference, nil)
		f.tierMember("inf", 1, 1, 8, inference, nil)
		f.sync()
		f.sync()
		if len(evicter.Evicted) > 0 {
			t.Errorf("evicted %v for a member beyond the gang's minimum", evicter.Evicted)
		}
		st := f.state("inf-")
		if !st["inf-0"].planned || st["inf-1"].planned {
			t.Errorf("inf-0 planned %v, inf-1 planned %v; want inf-0 only", st["inf-0"].planned, st["inf-1"].planned)
		}
	})
}

// The reservation of the gang's plan finds the snapshot stale (the
// informer shows victims leaving while the pass goes on): the pass plans
// again and asks the preemption again, which evicts nothing more, since
// the evictions it made count as gone until the informer shows them. The
// e2e run that found it evicted a third node's notebooks too.
func TestGangPreemptionNotRepeatedOnAStaleSnapshot(t *testing.T) {
	f, evicter := newTierFixture(t, testbuild.EightGPUNodes(3), 1)
	for k, n := range []string{"n0", "n1", "n2"} {
		f.notebooksOn(n, 8, func(i int) time.Duration { return time.Hour - time.Duration(3*i+k)*time.Minute })
	}
	for i := range 2 {
		f.tierMember("inf", 2, i, 8, inference, nil)
	}
	f.sync()
	var want []string
	for _, n := range []string{"n1", "n2"} {
		for i := range 8 {
			want = append(want, fmt.Sprintf("%s-nb-%d", n, i))
		}
	}
	if diff := cmp.Diff(want, sortedCopy(evicter.Evicted)); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
	}
	if diff := cmp.Diff([]string{"n1", "n2"}, f.plannedOnceVictimsLeave("inf-", evicter.Evicted)); diff != "" {
		t.Errorf("planned nodes (-want +got):\n%s", diff)
	}
}

// replacingEvicter evicts as its PreemptClient does, and then plays what a
// cluster does at once when a Deployment's pod is evicted: the pod goes,
// its controller makes a replacement, and kube-scheduler binds it (through
// the extender's filter: the ledger's Check) to the first node where it
// fits, before the planner's pass has ended.
type replacingEvicter struct {
	extender.PreemptClient
	f            *gangFixture
	replacements []string // name@node
}

func (r *replacingEvicter) Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error {
	if err := r.PreemptClient.Evict(ctx, pod, dryRun); err != nil || dryRun {
		return err
	}
	f := r.f
	if err := f.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	f.cache.DeletePod(pod.UID)
	repl := testbuild.Pod(pod.Name + "-r").Whole(1).Priority(notebook).Obj()
	repl.Namespace, repl.UID = pod.Namespace, types.UID("uid-repl-"+pod.Name)
	d, err := extender.ParseDemand(repl)
	if err != nil {
		return err
	}
	for _, name := range []string{"n0", "n1", "n2", "n3"} {
		st, ok := f.cache.Node(name)
		if !ok || extender.Check(st, &d) != extender.Fits {
			continue
		}
		repl.Spec.NodeName = name
		repl.Status.Phase = corev1.PodRunning
		if _, err := f.client.CoreV1().Pods(repl.Namespace).Create(ctx, repl, metav1.CreateOptions{}); err != nil {
			return err
		}
		f.cache.SetPod(repl)
		r.replacements = append(r.replacements, repl.Name+"@"+name)
		break
	}
	return nil
}

// A gang's tier preemption holds the freed room before it evicts: the
// victims' replacements, made and bound at once by their Deployment and
// kube-scheduler, find no room there, and the victims are evicted once.
// When the victims went first (seen on make demo's cluster: a gang of
// 2 x 4 GPUs evicted 41 one-GPU pods of a Deployment in nine rounds), the
// replacements took the freed GPUs, the plan found its node changed, and
// each replan preempted again.
func TestGangPreemptionHoldsTheRoomBeforeEvicting(t *testing.T) {
	var rep *replacingEvicter
	f, evicter := newTierFixtureWith(t, testbuild.EightGPUNodes(2), func(f *gangFixture, c extender.PreemptClient) extender.PreemptClient {
		rep = &replacingEvicter{PreemptClient: c, f: f}
		return rep
	})
	for k, n := range []string{"n0", "n1"} {
		f.notebooksOn(n, 8, func(i int) time.Duration { return time.Hour - time.Duration(2*i+1-k)*time.Minute })
	}
	for i := range 2 {
		f.tierMember("inf", 2, i, 4, inference, func(p *corev1.Pod) {
			p.Annotations[api.AnnotationGangTopology] = "kubernetes.io/hostname:required"
		})
	}
	f.sync()
	f.sync()
	if len(evicter.Evicted) != 8 {
		t.Errorf("evicted %d pods, want the 8 notebooks of one node: %v\nreplacements bound: %v\nevents:\n%s",
			len(evicter.Evicted), sortedCopy(evicter.Evicted), rep.replacements, strings.Join(f.events.Events, "\n"))
	}
	if len(rep.replacements) != 0 {
		t.Errorf("replacements bound into the room freed for the gang: %v", rep.replacements)
	}
	nodes := f.plannedWhole("inf-")
	if len(nodes) != 2 || nodes[0] != nodes[1] {
		t.Errorf("members planned on %v, want both on one node", nodes)
	}
}

// A whole-GPU gang that preempts slices holds the GPUs its victims leave
// by name: while one slice of a GPU is still leaving, a new slice fits
// none of them (with a hold by count it fitted beside the one left).
func TestGangPreemptingSlicesHoldsTheirGPUs(t *testing.T) {
	f, evicter := newTierFixture(t, testbuild.EightGPUNodes(1))
	var running []*corev1.Pod
	for i := range 16 {
		p := testbuild.Pod(fmt.Sprintf("s-%02d", i)).Shared(20, 50).Priority(notebook).Node("n0").On(i/2, 20480, 50).Obj()
		p.Namespace, p.UID = "low", types.UID(fmt.Sprintf("uid-low-s-%02d", i))
		started := metav1.NewTime(f.now.Add(-time.Hour + time.Duration(i)*time.Minute))
		p.CreationTimestamp, p.Status.StartTime, p.Status.Phase = started, &started, corev1.PodRunning
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.SetPod(p)
		running = append(running, p)
	}
	f.tierMember("inf", 1, 0, 2, inference, nil)
	f.sync()
	if len(evicter.Evicted) != 4 {
		t.Fatalf("evicted %v, want the four slices of two GPUs\nevents:\n%s", evicter.Evicted, strings.Join(f.events.Events, "\n"))
	}
	pods, _ := f.list()
	var member *corev1.Pod
	for _, p := range pods {
		if p.Name == "inf-0" {
			member = p
		}
	}
	plan, ok, err := api.GetGangPlan(member.Annotations)
	if !ok || err != nil || len(plan.GPUs) != 2 {
		t.Fatalf("plan %+v (%v, %v): want two GPUs named", plan, ok, err)
	}
	f.cache.SetPod(member)
	repl, err := extender.ParseDemand(testbuild.Pod("repl").Shared(20, 50).Obj())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range running {
		if !slices.Contains(evicter.Evicted, v.Name) {
			continue
		}
		f.cache.DeletePod(v.UID)
		if r := extender.Check(mustState(t, f.cache, "n0"), &repl); r == extender.Fits {
			t.Fatalf("after %s left, a new slice fits a GPU held for the gang", v.Name)
		}
	}
}
