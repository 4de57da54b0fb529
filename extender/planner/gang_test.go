package planner_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/internal/nodepin"
)

// gangFixture runs a GangPlanner against a fake clientset, feeding the
// ledger from the clientset's pods as the informer would.
type gangFixture struct {
	t       *testing.T
	client  *fake.Clientset
	cache   *extender.Cache
	events  *testbuild.Recorder
	planner *planner.GangPlanner
	// gangClient is the planner's client.
	gangClient planner.GangClient
	now        time.Time
	mu         sync.Mutex
	evicted    []string
	// view, when set, is what the planner's pod lister returns instead of
	// the API server's pods: an informer cache that lags.
	view []*corev1.Pod
}

func newGangFixture(t *testing.T, nodes ...*corev1.Node) *gangFixture {
	t.Helper()
	f := &gangFixture{t: t, client: fake.NewClientset(), cache: extender.NewCache(), events: &testbuild.Recorder{}, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, n := range nodes {
		f.cache.SetNode(n)
	}
	f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ca := a.(k8stesting.CreateAction)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.evicted = append(f.evicted, ca.GetObject().(metav1.Object).GetName())
		return true, nil, nil
	})
	f.gangClient = &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{
		Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.plannerView,
		Policy: testPolicy(t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now },
	})
	return f
}

func (f *gangFixture) list() ([]*corev1.Pod, error) {
	l, err := f.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

func (f *gangFixture) plannerView() ([]*corev1.Pod, error) {
	if f.view != nil {
		return f.view, nil
	}
	return f.list()
}

// member creates a gated gang member asking for gpus whole GPUs.
func (f *gangFixture) member(gangName string, minMember, i, gpus int, created time.Time) *corev1.Pod {
	f.t.Helper()
	p := testbuild.Pod(fmt.Sprintf("%s-%d", gangName, i)).Whole(int64(gpus)).Obj()
	p.Annotations[api.AnnotationGang] = gangName
	p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(minMember)
	p.Annotations[api.AnnotationGangTimeout] = "60"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
	p.CreationTimestamp = metav1.NewTime(created)
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// sync runs one planner pass and feeds the ledger as the informer would.
func (f *gangFixture) sync() {
	f.t.Helper()
	if err := f.planner.Sync(context.Background()); err != nil {
		f.t.Fatalf("Sync: %v", err)
	}
	pods, _ := f.list()
	for _, p := range pods {
		f.cache.SetPod(p)
	}
}

type memberState struct {
	planned, gated bool
	node           string
}

func (f *gangFixture) state(prefix string) map[string]memberState {
	f.t.Helper()
	pods, _ := f.list()
	out := map[string]memberState{}
	for _, p := range pods {
		if !strings.HasPrefix(p.Name, prefix) {
			continue
		}
		plan, ok, err := api.GetGangPlan(p.Annotations)
		if err != nil {
			f.t.Fatalf("pod %s: %v", p.Name, err)
		}
		s := memberState{planned: ok, gated: api.HasGangGate(p)}
		if ok {
			s.node = plan.Node
		}
		if len(p.Spec.SchedulingGates) == 0 || p.Spec.SchedulingGates[0].Name != "other.example/gate" {
			f.t.Errorf("pod %s: the other gate was touched: %v", p.Name, p.Spec.SchedulingGates)
		}
		out[p.Name] = s
	}
	return out
}

// Members written with different minimum sizes: the largest counts, and
// the wait reason says they disagree (it said only "2 of 3 members exist").
func TestGangMembersDisagreeOnTheirSize(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(3)...)
	f.member("g", 2, 0, 1, f.now)
	f.member("g", 3, 1, 1, f.now)
	f.sync()
	want := "gang default/g: 2 of 3 members exist, waiting to be planned together (its members disagree on the minimum size: 2, 3; the largest counts)"
	if !strings.Contains(strings.Join(f.events.Events, "\n"), want) {
		t.Errorf("events %q: want %q", f.events.Events, want)
	}
}

func TestGangWaitsWholeUntilItFits(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(3)...)
	t0 := f.now
	for i := range 3 {
		f.member("g", 4, i, 8, t0)
	}
	f.sync()
	if !strings.Contains(strings.Join(f.events.Events, "\n"), "3 of 4 members exist") {
		t.Errorf("events %q: want the incomplete gang's reason", f.events.Events)
	}
	f.member("g", 4, 3, 8, t0)
	f.sync()
	for name, s := range f.state("g-") {
		if s.planned || !s.gated {
			t.Errorf("24 GPUs for 32: member %s planned=%v gated=%v; want the whole gang held", name, s.planned, s.gated)
		}
	}
	if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, "no room for the whole group") {
		t.Errorf("events %q: want the no-room reason", ev)
	}
	f.cache.SetNode(testbuild.Node("n3").GPUs(8, "H100", 81920).Obj())
	f.sync()
	nodes := map[string]bool{}
	for name, s := range f.state("g-") {
		if !s.planned || s.gated {
			t.Errorf("32 GPUs: member %s planned=%v gated=%v; want planned and released", name, s.planned, s.gated)
		}
		nodes[s.node] = true
	}
	if len(nodes) != 4 {
		t.Errorf("members planned on %v, want 4 distinct nodes", nodes)
	}
	for i := range 4 {
		if free := mustState(t, f.cache, fmt.Sprintf("n%d", i)).FreeGPUs(); free != 0 {
			t.Errorf("n%d has %d free GPUs after the plan, want 0", i, free)
		}
	}
	// A planner restarted with an empty memory keeps the plan (it lives on
	// the pods) and plans nothing twice.
	before := f.state("g-")
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack), Now: func() time.Time { return f.now }})
	f.sync()
	for name, s := range f.state("g-") {
		if s != before[name] {
			t.Errorf("after a restart member %s is %+v, was %+v", name, s, before[name])
		}
	}
}

// TestGangAvoidsNodesKubeSchedulerRefuses: a gang is planned only on
// nodes kube-scheduler would bind its members to: not on a cordoned node,
// nor on one with a NoSchedule taint they do not tolerate (package
// eligible), and there once the node takes pods again.
func TestGangAvoidsNodesKubeSchedulerRefuses(t *testing.T) {
	nodes := testbuild.EightGPUNodes(4)
	nodes[0].Spec.Unschedulable = true
	nodes[1].Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	f := newGangFixture(t, nodes...)
	for i := range 2 {
		f.member("g", 2, i, 8, f.now)
	}
	f.sync()
	if got := f.plannedOn("g-"); !slices.Equal(got, []string{"n2", "n3"}) {
		t.Errorf("members planned on %v, want n2 and n3 (n0 cordoned, n1 tainted); events %q", got, f.events.Events)
	}
	// Only the cordoned and the tainted node are free: a second gang
	// waits.
	for i := range 2 {
		f.member("h", 2, i, 8, f.now)
	}
	f.sync()
	for name, s := range f.state("h-") {
		if s.planned {
			t.Errorf("member %s planned on %s: only the cordoned and the tainted node are free", name, s.node)
		}
	}
	// Its waiting reason says which nodes refuse it and why.
	const why = "2 of 4 GPU nodes refuse every member: n0 (node is cordoned (unschedulable)), n1 (untolerated taint {dedicated: infer})"
	if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, why) {
		t.Errorf("events %q: want %q", ev, why)
	}
	// Uncordoned and untainted: it is planned there.
	nodes[0].Spec.Unschedulable = false
	nodes[1].Spec.Taints = nil
	f.cache.SetNode(nodes[0])
	f.cache.SetNode(nodes[1])
	f.sync()
	for name, s := range f.state("h-") {
		if !s.planned || (s.node != "n0" && s.node != "n1") {
			t.Errorf("member %s: planned %v on %q, want n0 or n1 once they take pods again", name, s.planned, s.node)
		}
	}
}

// TestGangGPUModelByWord: a gang whose members ask for "A100" is planned
// on GPUs NVML names "NVIDIA A100-SXM4-40GB", as the filter places a
// single pod with that annotation (api.ModelAllowed; the planner matched
// names exactly before, and such a gang waited for ever), and not on H100s.
func TestGangGPUModelByWord(t *testing.T) {
	f := newGangFixture(t,
		testbuild.Node("h0").GPUs(8, "NVIDIA H100 80GB HBM3", 81920).Obj(),
		testbuild.Node("a0").GPUs(8, "NVIDIA A100-SXM4-40GB", 40960).Obj(),
		testbuild.Node("a1").GPUs(8, "NVIDIA A100-SXM4-40GB", 40960).Obj())
	for i := range 2 {
		m := f.member("g", 2, i, 8, f.now)
		f.edit(m.Name, func(p *corev1.Pod) { p.Annotations[api.AnnotationGPUModel] = "A100" })
	}
	f.sync()
	if got := f.plannedOn("g-"); !slices.Equal(got, []string{"a0", "a1"}) {
		t.Errorf("members planned on %v, want a0 and a1; events %q", got, f.events.Events)
	}
}

func TestTwoGangsThatFitOnlyAloneDoNotDeadlock(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
	t0 := f.now
	// Interleaved creation: both gangs complete in the same pass.
	for i := range 4 {
		f.member("b", 4, i, 8, t0.Add(time.Second))
		f.member("a", 4, i, 8, t0)
	}
	for range 3 {
		f.sync()
	}
	a, b := f.state("a-"), f.state("b-")
	for name, s := range a {
		if !s.planned || s.gated {
			t.Errorf("older gang a: member %s planned=%v gated=%v", name, s.planned, s.gated)
		}
	}
	for name, s := range b {
		if s.planned || !s.gated {
			t.Errorf("gang b must wait whole: member %s planned=%v gated=%v", name, s.planned, s.gated)
		}
	}
}

func TestGangPlanExpiresAndEvictsAll(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	for i := range 2 {
		f.member("g", 2, i, 8, f.now)
	}
	f.sync()
	// One member binds, the other never does.
	p, err := f.client.CoreV1().Pods("default").Get(context.Background(), "g-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.NodeName = f.state("g-")["g-0"].node
	if _, err := f.client.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.now = f.now.Add(59 * time.Second)
	f.sync()
	if len(f.evicted) != 0 {
		t.Fatalf("evicted %v before the timeout", f.evicted)
	}
	f.now = f.now.Add(2 * time.Second)
	f.sync()
	if got := strings.Join(f.evicted, ","); got != "g-0,g-1" {
		t.Errorf("evicted %q, want every member g-0,g-1", got)
	}
	ev := strings.Join(f.events.Events, "\n")
	if !strings.Contains(ev, "GangTimeout") || !strings.Contains(ev, "1 of 2 planned members unbound (g-1)") {
		t.Errorf("events %q: want a GangTimeout naming g-1", ev)
	}
}

func TestInterruptedPlanIsReleased(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	for i := range 2 {
		f.member("g", 2, i, 8, f.now)
	}
	// A crash after writing one member's plan only.
	p, _ := f.client.CoreV1().Pods("default").Get(context.Background(), "g-0", metav1.GetOptions{})
	if err := api.SetGangPlan(p.Annotations, api.GangPlan{Gang: "g", Node: "n0", Expires: f.now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync() // releases the partial plan; no gate is removed
	for name, s := range f.state("g-") {
		if !s.gated {
			t.Errorf("member %s released from an incomplete plan", name)
		}
	}
	f.sync()
	for name, s := range f.state("g-") {
		if !s.planned || s.gated {
			t.Errorf("after replanning member %s planned=%v gated=%v", name, s.planned, s.gated)
		}
	}
}

// A plan the cache shows half-written, because the cache lags the
// planner's own writes of a moment ago, is not released: the API server's
// copies decide. (Released, the members kube-scheduler bound meanwhile were
// left without a plan and the last member waited for ever: seen in
// TestUngatedGangNeverBoundAlone.)
func TestPlanSeenHalfWrittenInALaggingCacheIsKept(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	var before []*corev1.Pod
	for i := range 3 {
		before = append(before, f.member("g", 3, i, 1, f.now).DeepCopy())
	}
	f.sync()
	pods, _ := f.list()
	var lagging []*corev1.Pod
	for _, p := range pods {
		if p.Name == "g-2" {
			for _, b := range before {
				if b.Name == "g-2" {
					b.UID = p.UID
					p = b // its plan not seen yet
				}
			}
		}
		lagging = append(lagging, p)
	}
	f.view = lagging
	f.sync()
	f.view = nil
	for name, s := range f.state("g-") {
		if !s.planned {
			t.Errorf("member %s lost its plan on a lagging view of it", name)
		}
	}
}

// A gang the planner has just planned, shown by a lagging cache with every
// member still gated and unplanned, is not planned a second time (its
// members' holds would move while the members bound, or were pinned, on
// the first plan's nodes).
func TestGangPlannedOnceOnALaggingCache(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	f.running("busy", "n0", 6, f.now.Add(-time.Minute), nil)
	for i := range 2 {
		f.member("g", 2, i, 1, f.now)
	}
	before, _ := f.list()
	if err := f.planner.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := f.state("g-")
	f.view = before
	if err := f.planner.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.view = nil
	if diff := cmp.Diff(first, f.state("g-"), cmp.AllowUnexported(memberState{})); diff != "" {
		t.Errorf("the gang's plan changed on a pass over a lagging cache (-first +after):\n%s", diff)
	}
	for name, s := range first {
		if s.node != "n0" {
			t.Errorf("member %s first planned on %q, want n0 (binpack, room for two)", name, s.node)
		}
	}
}

// A gang whose own preferred topology level no node carries is planned
// without it and told so; levels that match say nothing.
func TestGangTopologyLevelNoNodeCarries(t *testing.T) {
	for _, tc := range []struct {
		levels string
		warn   bool
	}{
		{levels: "topology.example/rakc,kubernetes.io/hostname", warn: true},
		{levels: "kubernetes.io/hostname", warn: false},
	} {
		t.Run(tc.levels, func(t *testing.T) {
			nodes := testbuild.EightGPUNodes(2)
			for _, n := range nodes {
				n.Labels = map[string]string{corev1.LabelHostname: n.Name}
			}
			f := newGangFixture(t, nodes...)
			for i := range 2 {
				m := f.member("g", 2, i, 1, f.now)
				m.Annotations[api.AnnotationGangTopology] = tc.levels
				if _, err := f.client.CoreV1().Pods(m.Namespace).Update(context.Background(), m, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.sync()
			for name, s := range f.state("g-") {
				if !s.planned {
					t.Errorf("member %s not planned", name)
				}
			}
			all := strings.Join(f.events.Events, "\n")
			const want = api.EventGangTopologyUnmatched + ": tessera: gang default/g: no node it may use has the label topology.example/rakc of its " + api.AnnotationGangTopology + " levels"
			if got := strings.Contains(all, want); got != tc.warn {
				t.Errorf("warned %v, want %v; events:\n%s", got, tc.warn, all)
			}
		})
	}
}

// The API server's copies decide only through their seals: plans a
// tenant wrote on its members do not keep an incomplete plan alive.
func TestForgedPlansDoNotKeepAnIncompletePlan(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	var before []*corev1.Pod
	for i := range 3 {
		before = append(before, f.member("g", 3, i, 1, f.now).DeepCopy())
	}
	f.sync() // three sealed plans
	ctx := context.Background()
	for _, name := range []string{"g-1", "g-2"} {
		p, err := f.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The tenant moves the plan to another node: the seal no longer fits.
		if err := api.SetGangPlan(p.Annotations, api.GangPlan{Gang: "g", Node: "elsewhere", Expires: f.now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The cache shows g-0's plan only.
	pods, _ := f.list()
	var view []*corev1.Pod
	for _, p := range pods {
		if p.Name != "g-0" {
			for _, b := range before {
				if b.Name == p.Name {
					p = b
				}
			}
		}
		view = append(view, p)
	}
	f.view = view
	f.sync()
	f.view = nil
	if f.state("g-")["g-0"].planned {
		t.Error("g-0's plan was kept: forged plans counted as the planner's")
	}
}

func TestMalformedGangDeclarationWaitsWithReason(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	p := testbuild.Pod("bad").Whole(1).Obj()
	p.Annotations[api.AnnotationGang] = "g"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
	if _, err := f.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	f.sync()
	if len(f.events.Events) != 1 || !strings.Contains(f.events.Events[0], api.AnnotationGangMinMember) {
		t.Errorf("events %q: want one event naming the missing minMember", f.events.Events)
	}
}

func TestRemoveGateFromStaleCopy(t *testing.T) {
	f := newGangFixture(t)
	stale := f.member("g", 1, 0, 1, f.now) // gates: other, gang
	fresh, err := f.client.CoreV1().Pods("default").Get(context.Background(), stale.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fresh.Spec.SchedulingGates = fresh.Spec.SchedulingGates[1:] // the other gate went: ours moved to 0
	if _, err := f.client.CoreV1().Pods("default").Update(context.Background(), fresh, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := (&planner.KubeGang{Client: f.client}).RemoveGate(context.Background(), stale); err != nil {
		t.Fatalf("RemoveGate from a stale copy: %v", err)
	}
	got, _ := f.client.CoreV1().Pods("default").Get(context.Background(), stale.Name, metav1.GetOptions{})
	if len(got.Spec.SchedulingGates) != 0 {
		t.Errorf("gates left: %v", got.Spec.SchedulingGates)
	}
}

// A plan that cannot be written for every member lifts no gate, leaves no
// plan on the members it was written for and releases the ledger's hold;
// the next pass plans the gang again. (The plans are written several at
// once, so any member's write may be the one that fails.)
func TestPlanWriteFailureLiftsNoGate(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
	failing := true
	f.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		if !failing || pa.GetName() != "g-2" || pa.GetPatchType() != types.MergePatchType || !strings.Contains(string(pa.GetPatch()), `"`+api.AnnotationGangPlan+`":"`) {
			return false, nil, nil
		}
		return true, nil, apierrors.NewServiceUnavailable("the test refuses g-2's plan")
	})
	for i := range 4 {
		f.member("g", 4, i, 8, f.now)
	}
	if err := f.planner.Sync(context.Background()); err == nil || !strings.Contains(err.Error(), "writing the plan of g-2") {
		t.Errorf("Sync = %v, want the failed write named", err)
	}
	for name, s := range f.state("g-") {
		if s.planned || !s.gated {
			t.Errorf("after the failed write member %s planned=%v gated=%v; want no plan, gated", name, s.planned, s.gated)
		}
	}
	for i := range 4 {
		if free := mustState(t, f.cache, fmt.Sprintf("n%d", i)).FreeGPUs(); free != 8 {
			t.Errorf("n%d has %d free GPUs after the failed plan, want 8 (released)", i, free)
		}
	}
	failing = false
	f.sync()
	for name, s := range f.state("g-") {
		if !s.planned || s.gated {
			t.Errorf("planned again: member %s planned=%v gated=%v", name, s.planned, s.gated)
		}
	}
}

// A planner stopping in the middle of a plan's writes (its context ended)
// lifts no gate of a member whose plan it did not write: the writes it did
// not make count as failed.
func TestPlanWritesStoppedByTheContextLiftNoGate(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	for i := range 2 {
		f.member("g", 2, i, 8, f.now)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.planner.Sync(ctx); err == nil {
		t.Error("Sync with an ended context reported no error")
	}
	for name, s := range f.state("g-") {
		if !s.gated {
			t.Errorf("member %s was released by a planner that stopped", name)
		}
	}
	for i := range 2 {
		if free := mustState(t, f.cache, fmt.Sprintf("n%d", i)).FreeGPUs(); free != 8 {
			t.Errorf("n%d has %d free GPUs, want 8 (the hold released)", i, free)
		}
	}
}

// The patch that lifts a planned member's gates also pins it to its
// plan's node (internal/nodepin), so kube-scheduler evaluates that node
// alone for it; an API server that refuses the pin as invalid still gets
// the gates lifted.
func TestLiftedMembersArePinnedToTheirPlannedNodes(t *testing.T) {
	for _, refusePin := range []bool{false, true} {
		t.Run(fmt.Sprintf("refusePin=%v", refusePin), func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
			refused := 0
			if refusePin {
				f.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if !strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), "affinity") {
						return false, nil, nil
					}
					refused++
					return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, a.(k8stesting.PatchAction).GetName(), field.ErrorList{field.Invalid(field.NewPath("spec", "affinity"), nil, "refused by the test")})
				})
			}
			for i := range 2 {
				f.member("g", 2, i, 8, f.now)
			}
			f.sync()
			pods, _ := f.list()
			nodes := map[string]bool{}
			for _, p := range pods {
				plan, ok, err := api.GetGangPlan(p.Annotations)
				if !ok || err != nil {
					t.Fatalf("pod %s: plan %v, %v", p.Name, ok, err)
				}
				nodes[plan.Node] = true
				if api.HasGangGate(p) {
					t.Errorf("pod %s is still gated", p.Name)
				}
				if got := nodepin.Pinned(p, plan.Node); got == refusePin {
					t.Errorf("pod %s pinned to %s: %v (affinity %+v)", p.Name, plan.Node, got, p.Spec.Affinity)
				}
			}
			if len(nodes) != 2 {
				t.Errorf("planned on %v, want 2 nodes", nodes)
			}
			if refusePin && refused != 4 {
				t.Errorf("%d pins refused, want two per member (its copy, then read afresh)", refused)
			}
		})
	}
}

func testPolicy(t testing.TB, name string) allocator.Policy {
	t.Helper()
	p, err := extender.NewPolicy(name, extender.DefaultWorkload(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustState(t testing.TB, c *extender.Cache, name string) *extender.NodeState {
	t.Helper()
	st, ok := c.Node(name)
	if !ok {
		t.Fatalf("node %s not in cache", name)
	}
	return st
}

// Binds of a pass's earlier workloads land while the pass goes on, so a
// workload's reservation may find its nodes changed more than once. It
// plans again each time (up to a bound) rather than give its turn to the
// workloads after it: the older gang is planned in the same pass though
// its first three reservations find the snapshot stale.
func TestStaleSnapshotKeepsTheOrder(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	stale := &staleLedger{Ledger: extender.PlannerLedger{Cache: f.cache}, stale: 3}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: stale, Client: f.gangClient, Pods: f.list,
		Policy: testPolicy(t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }})
	f.member("old", 1, 0, 4, f.now.Add(-time.Minute))
	f.member("new", 1, 0, 4, f.now)
	f.sync()
	st := f.state("")
	if !st["old-0"].planned || !st["new-0"].planned {
		t.Errorf("after one pass with 3 stale reservations: %v; want both planned, the older first", st)
	}
	if stale.staled != 3 {
		t.Errorf("%d stale reservations, want 3", stale.staled)
	}
}

// looseEvents are the fixture's Events that say a gang gate was lifted.
func (f *gangFixture) looseEvents() []string {
	f.events.Mu.Lock()
	defer f.events.Mu.Unlock()
	var out []string
	for _, e := range f.events.Events {
		if strings.Contains(e, api.EventGangGateLifted) {
			out = append(out, e)
		}
	}
	return out
}

// withoutGang removes the annotations that declare pod's gang (as
// `kubectl annotate pod p tessera.dev/gang- tessera.dev/gang-min-member-`
// does), and those of keep... are left.
func withoutGang(keep ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, k := range []string{api.AnnotationGang, api.AnnotationGangMinMember, api.AnnotationGangTimeout} {
			if !slices.Contains(keep, k) {
				delete(p.Annotations, k)
			}
		}
	}
}

// The gang gate on a pod that declares no gang held it for ever, with no
// Event: the planner lifts it (other gates stay) with a Normal Event
// saying why, once, and the pod is scheduled as a plain pod. A pod whose
// declaration is malformed is no such pod: it stays held, told why.
func TestGangGateWithoutAGangIsLifted(t *testing.T) {
	for _, tc := range []struct {
		name string
		// annotations of pod p at creation; edit, when set, changes it
		// after a first pass.
		annotations map[string]string
		edit        func(*corev1.Pod)
		lifted      bool
		event       string // an Event p gets
	}{
		{name: "gate its user added", lifted: true, event: "no gang declared"},
		{name: "gang's annotations removed while it waited", annotations: map[string]string{api.AnnotationGang: "og", api.AnnotationGangMinMember: "2"},
			edit: withoutGang(), lifted: true, event: "no gang declared"},
		{name: "gang's annotations removed, its timeout left", annotations: map[string]string{api.AnnotationGang: "og", api.AnnotationGangMinMember: "2", api.AnnotationGangTimeout: "60"},
			edit: withoutGang(api.AnnotationGangTimeout), event: "annotation tessera.dev/gang-timeout-seconds needs a gang"},
		{name: "only the gang's name removed", annotations: map[string]string{api.AnnotationGang: "og", api.AnnotationGangMinMember: "2"},
			edit: withoutGang(api.AnnotationGangMinMember), event: "annotation tessera.dev/gang-min-member needs a gang"},
		{name: "size with a space", annotations: map[string]string{api.AnnotationGang: "og", api.AnnotationGangMinMember: " 1"}, event: `tessera.dev/gang-min-member=" 1" is not a number of members`},
		{name: "size with a leading zero", annotations: map[string]string{api.AnnotationGang: "og", api.AnnotationGangMinMember: "01"}, event: "no leading zero"},
		{name: "invalid gang name", annotations: map[string]string{api.AnnotationGang: "Not_A Valid/Name", api.AnnotationGangMinMember: "1"}, event: "is not a valid name"},
		{name: "size without a gang", annotations: map[string]string{api.AnnotationGangMinMember: "1"}, event: "annotation tessera.dev/gang-min-member needs a gang"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
			p := testbuild.Pod("p").Whole(1).Obj()
			maps.Copy(p.Annotations, tc.annotations)
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
			if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				f.sync()
				if s := f.state("p")["p"]; s.planned || !s.gated {
					t.Fatalf("a member of a gang of 2 alone: %+v, want it held", s)
				}
				f.edit("p", tc.edit)
			}
			f.sync()
			f.sync()
			s := f.state("p")["p"] // also checks the other gate stays
			if s.planned || s.gated == tc.lifted {
				t.Errorf("after two passes: %+v, want the gang gate lifted %v and no plan", s, tc.lifted)
			}
			if tc.lifted && !slices.ContainsFunc(f.looseEvents(), func(e string) bool { return strings.Contains(e, tc.event) }) ||
				!tc.lifted && !f.hasEvent(tc.event) {
				t.Errorf("no %s Event containing %q: %q", map[bool]string{true: api.EventGangGateLifted, false: "GangWaiting"}[tc.lifted], tc.event, f.events.Events)
			}
			if n := len(f.looseEvents()); n != map[bool]int{true: 1}[tc.lifted] {
				t.Errorf("%d %s Events, want one when lifted, else none: %q", n, api.EventGangGateLifted, f.events.Events)
			}
		})
	}
}

// A member that leaves its gang (its annotations removed while it waits)
// is lifted as a plain pod; the others are not disturbed: the gang's plan
// holds, and the members still waiting wait as before.
func TestLeavingAGangDisturbsNotTheOthers(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	for i := range 3 { // two fit: og-2 waits for room, an elastic gang's extra
		f.member("og", 2, i, 8, f.now)
	}
	f.member("wait", 3, 0, 1, f.now) // a gang of 3 with one member
	f.sync()
	before := f.state("")
	if s := before["og-2"]; s.planned || !s.gated || !before["og-0"].planned || !before["og-1"].planned {
		t.Fatalf("before: %+v, want og-0 and og-1 planned, og-2 waiting", before)
	}
	f.edit("og-2", withoutGang())
	f.edit("og-0", func(p *corev1.Pod) { p.Spec.NodeName = before["og-0"].node })
	f.sync()
	f.sync()
	after := f.state("")
	if s := after["og-2"]; s.planned || s.gated {
		t.Errorf("og-2, out of the gang: %+v, want its gang gate lifted, no plan", s)
	}
	for _, name := range []string{"og-0", "og-1", "wait-0"} {
		if after[name] != before[name] {
			t.Errorf("%s: %+v, was %+v", name, after[name], before[name])
		}
	}
	if ev := f.looseEvents(); len(ev) != 1 {
		t.Errorf("%s Events %q, want one, og-2's", api.EventGangGateLifted, ev)
	}
}

// A member planned with its gang whose gate is still on (its removal
// failed) and that then leaves the gang loses its plan (the gang's room
// is released) before its gate is lifted: it never binds on room planned
// for a gang it is not in.
func TestPlannedPodLeavingItsGangLosesItsPlanFirst(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	failing := true
	f.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pa := a.(k8stesting.PatchAction); failing && pa.GetName() == "og-1" && pa.GetPatchType() == types.JSONPatchType {
			return true, nil, apierrors.NewServiceUnavailable("the test refuses og-1's gate removal")
		}
		return false, nil, nil
	})
	f.member("og", 2, 0, 8, f.now)
	f.member("og", 2, 1, 8, f.now)
	_ = f.planner.Sync(context.Background()) // og-1's gate stays: an error
	if s := f.state("og-")["og-1"]; !s.planned || !s.gated {
		t.Fatalf("og-1: %+v, want it planned and still gated", s)
	}
	failing = false
	f.edit("og-1", withoutGang())
	f.sync()
	if s := f.state("og-")["og-1"]; s.planned || !s.gated {
		t.Errorf("og-1 after leaving the gang: %+v, want its plan removed, its gate not lifted yet", s)
	}
	if free := mustState(t, f.cache, "n0").FreeGPUs() + mustState(t, f.cache, "n1").FreeGPUs(); free != 16 {
		t.Errorf("%d GPUs free, want 16: og-1's plan released, og-0's too (its gang of 2 has 1 member)", free)
	}
	f.sync()
	if s := f.state("og-")["og-1"]; s.planned || s.gated {
		t.Errorf("og-1, a plain pod: %+v, want its gate lifted", s)
	}
	if len(f.looseEvents()) != 1 {
		t.Errorf("Events %q, want one %s", f.events.Events, api.EventGangGateLifted)
	}
}

// A pod with a malformed gang declaration that got past admission without
// the gate is held all the same (the filter passes it no node), and the
// planner tells it why; one another scheduler places is none of Tessera's.
func TestUngatedMalformedDeclarationToldWhy(t *testing.T) {
	for _, scheduler := range []string{"", "other-scheduler"} {
		f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
		p := testbuild.Pod("p").Whole(1).Obj()
		p.Annotations[api.AnnotationGangMinMember] = "2"
		p.Spec.SchedulerName = scheduler
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.sync()
		f.sync()
		got, _ := f.client.CoreV1().Pods(p.Namespace).Get(context.Background(), "p", metav1.GetOptions{})
		if _, planned := got.Annotations[api.AnnotationGangPlan]; planned {
			t.Errorf("scheduler %q: planned", scheduler)
		}
		if told := f.hasEvent("annotation tessera.dev/gang-min-member needs a gang"); told != (scheduler == "") || len(f.events.Events) > 1 {
			t.Errorf("scheduler %q: events %q, want one GangWaiting only when the extender serves it", scheduler, f.events.Events)
		}
	}
}
