package extender

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
)

type staticQuotas map[string]quota.Quota

func (s staticQuotas) Quotas() map[string]quota.Quota { return s }

func gpus(n int64) quota.Resources { return quota.Resources{api.ResourceGPU: n} }

// minMax16x32 is the scenario: namespaces a and b, min 16, max 32.
func minMax16x32() staticQuotas {
	return staticQuotas{
		"a": {Namespace: "a", Min: gpus(16), Max: gpus(32)},
		"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
	}
}

// quotaFixture runs the extender's quota enforcement (filter, gang
// planner, reclaim, preempt) against a fake clientset whose evictions
// delete the pod, unless pdb names it (429, as a PodDisruptionBudget
// would answer).
type quotaFixture struct {
	t       *testing.T
	client  *fake.Clientset
	cache   *Cache
	events  *testbuild.Recorder
	nodes   []*corev1.Node
	enf     *equota.Enforcer
	planner *planner.GangPlanner
	srv     *Server
	reg     *prometheus.Registry
	now     time.Time

	mu      sync.Mutex
	evicted []string // ns/name, real evictions
	deleted []string // ns/name, deleted past their budgets
	dryRuns int
	pdb     map[string]bool
	// indexed are the pods fed to the quota index.
	indexed map[types.UID]bool
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

func newQuotaFixture(t *testing.T, quotas equota.Source, nodes ...*corev1.Node) *quotaFixture {
	t.Helper()
	f := &quotaFixture{t: t, client: fake.NewClientset(), cache: NewCache(), events: &testbuild.Recorder{}, pdb: map[string]bool{}, indexed: map[types.UID]bool{},
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), reg: prometheus.NewRegistry()}
	for _, n := range nodes {
		n = n.DeepCopy()
		n.Status.Allocatable[api.ResourceGPU] = *resource.NewQuantity(int64(len(mustInventory(t, n).GPUs)), resource.DecimalSI)
		f.nodes = append(f.nodes, n)
		f.cache.SetNode(n)
	}
	f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.pdb[ev.Name] {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		if ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0 {
			f.dryRuns++
			return true, nil, nil
		}
		f.evicted = append(f.evicted, ev.Namespace+"/"+ev.Name)
		return true, nil, f.client.Tracker().Delete(podsGVR, ev.Namespace, ev.Name)
	})
	f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		d := a.(k8stesting.DeleteAction)
		f.deleted = append(f.deleted, d.GetNamespace()+"/"+d.GetName())
		return false, nil, nil
	})
	ledger := &equota.Ledger{
		Quotas: quotas,
		Index:  &equota.Index{},
		Pods:   func(ns string) ([]*corev1.Pod, error) { return f.list(ns) },
		Nodes:  func() ([]*corev1.Node, error) { return f.nodes, nil },
		Reserved: func(uid types.UID) bool {
			_, ok := f.cache.PodUse(uid)
			return ok
		},
		Now: func() time.Time { return f.now },
	}
	metrics := NewMetrics(f.reg)
	qn := QuotaNodes{Cache: f.cache}
	f.enf = &equota.Enforcer{Ledger: ledger, Nodes: qn, Evicter: &KubeEvicter{Client: f.client}, Events: f.events, Metrics: metrics,
		Now: func() time.Time { return f.now },
		Pod: func(ns, name string) (*corev1.Pod, error) {
			return f.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		}}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{
		Ledger: PlannerLedger{Cache: f.cache}, Client: &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}, Pods: func() ([]*corev1.Pod, error) { return f.list("") },
		Policy: testPolicy(t, PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }, Quota: &Quota{Enforcer: f.enf, Nodes: qn},
	})
	f.srv = NewServer(f.cache, testPolicy(t, PolicyBinpack), newFakePods(), f.events, metrics)
	f.srv.SetQuota(&Quota{Enforcer: f.enf, Nodes: qn})
	return f
}

func mustInventory(t *testing.T, n *corev1.Node) *api.GPUInventory {
	t.Helper()
	inv, ok, err := api.GetGPUInventory(n.Annotations)
	if !ok || err != nil {
		t.Fatalf("node %s: inventory %v %v", n.Name, ok, err)
	}
	return inv
}

func (f *quotaFixture) list(ns string) ([]*corev1.Pod, error) {
	l, err := f.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

// feed makes the ledger match the clientset, as the informer would.
func (f *quotaFixture) feed() {
	f.t.Helper()
	pods, _ := f.list("")
	live := map[types.UID]bool{}
	for _, p := range pods {
		live[p.UID] = true
		f.cache.SetPod(p)
		f.enf.Ledger.Index.Set(p)
		f.indexed[p.UID] = true
	}
	for _, st := range f.cache.Snapshot() {
		for uid := range st.Pods {
			if !live[uid] {
				f.cache.DeletePod(uid)
			}
		}
	}
	for uid := range f.indexed {
		if !live[uid] {
			f.enf.Ledger.Index.Delete(uid)
			delete(f.indexed, uid)
		}
	}
}

// sync runs one planner pass and feeds the ledger.
func (f *quotaFixture) sync() {
	f.t.Helper()
	if err := f.planner.Sync(context.Background()); err != nil {
		f.t.Fatalf("Sync: %v", err)
	}
	f.feed()
}

type podOpt func(*corev1.Pod)

func inGang(name string, minMember int) podOpt {
	return func(p *corev1.Pod) {
		p.Annotations[api.AnnotationGang] = name
		p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(minMember)
	}
}

func gated(p *corev1.Pod) {
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
}

func on(node string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = node } }

func prio(n int32) podOpt { return func(p *corev1.Pod) { p.Spec.Priority = &n } }

// pod creates a pod of namespace ns asking for n whole GPUs.
func (f *quotaFixture) pod(ns, name string, n int64, created time.Time, opts ...podOpt) *corev1.Pod {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(n).Obj()
	p.Namespace = ns
	p.UID = types.UID("uid-" + ns + "-" + name + "-" + created.Format("150405"))
	p.CreationTimestamp = metav1.NewTime(created)
	for _, o := range opts {
		o(p)
	}
	if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
	f.enf.Ledger.Index.Set(p)
	f.indexed[p.UID] = true
	return p
}

func (f *quotaFixture) evictions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.evicted...)
}

func (f *quotaFixture) eventsWith(reason string) []string {
	f.events.Mu.Lock()
	defer f.events.Mu.Unlock()
	var out []string
	for _, e := range f.events.Events {
		if strings.HasPrefix(e, reason+": ") {
			out = append(out, e)
		}
	}
	return out
}

func (f *quotaFixture) filter(pod *corev1.Pod) *extenderv1.ExtenderFilterResult {
	names := make([]string, 0, len(f.nodes))
	for _, n := range f.nodes {
		names = append(names, n.Name)
	}
	return f.srv.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
}

func TestQuotaFilterAdmission(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type want struct {
		Passed       []string
		Failed       map[string]string
		Unresolvable map[string]string
	}
	all := func(msg string) map[string]string {
		return map[string]string{"n0": msg, "n1": msg, "n2": msg, "n3": msg}
	}
	cases := []struct {
		name   string
		quotas staticQuotas
		// a uses 16 GPUs on n0 and n1 (priority 5); b uses 8 on n2.
		ns      string
		gpus    int64
		prio    int32
		want    want
		metric  Reason
		noEvent bool
	}{{
		name: "namespace without quota", quotas: minMax16x32(), ns: "c", gpus: 8,
		want: want{Passed: []string{"n3"}, Failed: map[string]string{}, Unresolvable: map[string]string{}}, noEvent: true,
	}, {
		name: "within min", quotas: minMax16x32(), ns: "b", gpus: 8,
		want: want{Passed: []string{"n3"}, Failed: map[string]string{}, Unresolvable: map[string]string{}}, noEvent: true,
	}, {
		name: "borrowing within what can be lent", quotas: minMax16x32(), ns: "a", gpus: 8,
		want: want{Passed: []string{"n3"}, Failed: map[string]string{}, Unresolvable: map[string]string{}}, noEvent: true,
	}, {
		name: "above max, nothing of lower priority to preempt",
		quotas: staticQuotas{
			"a": {Namespace: "a", Min: gpus(8), Max: gpus(16)},
			"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
		},
		ns: "a", gpus: 8, prio: 5,
		want:   want{Failed: map[string]string{}, Unresolvable: all("tessera: quota: pod p asks for 8 tessera.dev/gpu; namespace a uses 16, its ElasticQuota max is 16")},
		metric: Reason(equota.AboveMax),
	}, {
		name: "above max, lower-priority work of its own namespace could go",
		quotas: staticQuotas{
			"a": {Namespace: "a", Min: gpus(8), Max: gpus(16)},
			"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
		},
		ns: "a", gpus: 8, prio: 10,
		want:   want{Unresolvable: map[string]string{}, Failed: all("tessera: quota: pod p asks for 8 tessera.dev/gpu; namespace a uses 16, its ElasticQuota max is 16")},
		metric: Reason(equota.AboveMax),
	}, {
		name: "borrowing beyond what can be lent",
		quotas: staticQuotas{
			"a": {Namespace: "a", Min: gpus(8), Max: gpus(64)},
			"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
		},
		ns: "b", gpus: 16, prio: 0,
		want:   want{Failed: map[string]string{}, Unresolvable: all("tessera: quota: pod p asks for 16 tessera.dev/gpu; namespace b would borrow above its min 16, but governed namespaces use 24 of 32 that can be lent")},
		metric: Reason(equota.NotLendable),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newQuotaFixture(t, tc.quotas, testbuild.EightGPUNodes(4)...)
			f.pod("a", "a0", 8, t0, on("n0"), prio(5))
			f.pod("a", "a1", 8, t0, on("n1"), prio(5))
			f.pod("b", "b0", 8, t0, on("n2"))
			p := testbuild.Pod("p").Whole(tc.gpus).Priority(tc.prio).Obj()
			p.Namespace = tc.ns
			res := f.filter(p)
			if res.Error != "" {
				t.Fatalf("filter error: %s", res.Error)
			}
			got := want{Passed: *res.NodeNames, Failed: res.FailedNodes, Unresolvable: res.FailedAndUnresolvableNodes}
			if tc.want.Passed != nil {
				// Only the node whose GPUs are free passes; the others
				// fail for GPUs, not quota.
				got.Failed, got.Unresolvable = map[string]string{}, map[string]string{}
				for n, m := range res.FailedNodes {
					if strings.Contains(m, "quota") {
						got.Failed[n] = m
					}
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") })); diff != "" {
				t.Errorf("filter (-want +got):\n%s", diff)
			}
			evs := f.eventsWith(api.EventQuotaExceeded)
			if tc.noEvent != (len(evs) == 0) {
				t.Errorf("QuotaExceeded events %q, want some: %v", evs, !tc.noEvent)
			}
			if tc.metric != "" {
				if v := testbuild.Counter(t, f.reg, "rejections", string(tc.metric)); v != 4 {
					t.Errorf("rejections{%s} = %v, want 4", tc.metric, v)
				}
			}
		})
	}
}

// TestGangQuotaAdmittedWhole: a gang is admitted for the sum of its
// members, so a gang whose members would each fit under max alone waits
// whole with the quota reason.
func TestGangQuotaAdmittedWhole(t *testing.T) {
	f := newQuotaFixture(t, staticQuotas{"a": {Namespace: "a", Min: gpus(8), Max: gpus(16)}}, testbuild.EightGPUNodes(4)...)
	t0 := f.now
	for i := range 3 {
		f.pod("a", fmt.Sprintf("g-%d", i), 8, t0, inGang("g", 3), gated)
	}
	f.sync()
	pods, _ := f.list("a")
	for _, p := range pods {
		if _, planned := p.Annotations[api.AnnotationGangPlan]; planned || !api.HasGangGate(p) {
			t.Errorf("member %s planned=%v gated=%v: want it held", p.Name, planned, api.HasGangGate(p))
		}
	}
	msg := "tessera: quota: gang g (3 members) asks for 24 tessera.dev/gpu; namespace a uses 0, its ElasticQuota max is 16"
	want := "QuotaExceeded: " + msg
	if diff := cmp.Diff([]string{want, want, want}, f.eventsWith(api.EventQuotaExceeded)); diff != "" {
		t.Errorf("QuotaExceeded events (-want +got):\n%s", diff)
	}
	// The same words, once prefixed (they read "tessera: tessera: quota:").
	want = "GangWaiting: " + msg
	if diff := cmp.Diff([]string{want, want, want}, f.eventsWith("GangWaiting")); diff != "" {
		t.Errorf("GangWaiting events (-want +got):\n%s", diff)
	}
	f.sync()
	if n := len(f.eventsWith(api.EventQuotaExceeded)); n != 3 {
		t.Errorf("a second pass with the same reason emitted events again: %d", n)
	}
}

// TestReclaimEvictsWholeBorrowedGang is the scenario in the
// planner: a's two gangs fill the 32 GPUs (16 of them borrowed from b);
// b's gang within its min gets the room of a's newest gang, evicted whole;
// afterwards nothing flaps: b is planned, a's gang, recreated by its
// controller, waits with the quota reason, and nothing more is evicted.
func TestReclaimEvictsWholeBorrowedGang(t *testing.T) {
	f := newQuotaFixture(t, minMax16x32(), testbuild.EightGPUNodes(4)...)
	t0 := f.now
	f.pod("a", "a1-0", 8, t0, inGang("a1", 2), on("n0"))
	f.pod("a", "a1-1", 8, t0, inGang("a1", 2), on("n1"))
	f.pod("a", "a2-0", 8, t0.Add(time.Minute), inGang("a2", 2), on("n2"))
	f.pod("a", "a2-1", 8, t0.Add(time.Minute), inGang("a2", 2), on("n3"))
	f.pod("b", "b-0", 8, t0.Add(2*time.Minute), inGang("b", 2), gated)
	f.pod("b", "b-1", 8, t0.Add(2*time.Minute), inGang("b", 2), gated)

	f.sync()
	if diff := cmp.Diff([]string{"a/a2-0", "a/a2-1"}, f.evictions()); diff != "" {
		t.Fatalf("evictions (-want +got):\n%s", diff)
	}
	if f.dryRuns != 2 {
		t.Errorf("%d dry-run evictions, want 2 (every member checked first)", f.dryRuns)
	}
	rec := f.eventsWith(api.EventReclaimed)
	if len(rec) != 2 || !strings.Contains(rec[0], "reclaim quota for namespace b") || !strings.Contains(rec[0], "gang a2 (priority 0") {
		t.Errorf("Reclaimed events %q", rec)
	}
	if ev := f.eventsWith(api.EventQuotaReclaiming); len(ev) != 2 || !strings.Contains(ev[0], "evicting gang a2 of namespace a (2 pods)") {
		t.Errorf("QuotaReclaiming events on b's members: %q", ev)
	}
	if v := testbuild.Counter(t, f.reg, "quota_reclaim_evictions", "a"); v != 2 {
		t.Errorf("quota_reclaim_evictions_total{a} = %v, want 2", v)
	}

	// a2's controller recreates its pods at once (gated by the webhook).
	f.now = f.now.Add(time.Second)
	f.pod("a", "a2-0", 8, f.now, inGang("a2", 2), gated)
	f.pod("a", "a2-1", 8, f.now, inGang("a2", 2), gated)
	for range 5 {
		f.sync()
		f.now = f.now.Add(time.Second)
	}
	if diff := cmp.Diff([]string{"a/a2-0", "a/a2-1"}, f.evictions()); diff != "" {
		t.Errorf("evictions after the reclaim (-want +got):\n%s", diff)
	}
	pods, _ := f.list("")
	got := map[string]string{}
	for _, p := range pods {
		plan, ok, _ := api.GetGangPlan(p.Annotations)
		switch {
		case p.Spec.NodeName != "":
			got[p.Namespace+"/"+p.Name] = "bound " + p.Spec.NodeName
		case ok:
			got[p.Namespace+"/"+p.Name] = "planned " + plan.Node
		default:
			got[p.Namespace+"/"+p.Name] = "waiting"
		}
	}
	want := map[string]string{"a/a1-0": "bound n0", "a/a1-1": "bound n1", "a/a2-0": "waiting", "a/a2-1": "waiting", "b/b-0": "planned n2", "b/b-1": "planned n3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
	ex := f.eventsWith(api.EventQuotaExceeded)
	if len(ex) == 0 || !strings.Contains(ex[0], "namespace a would borrow above its min 16, but governed namespaces use 32 of 32 that can be lent") {
		t.Errorf("recreated a2: QuotaExceeded events %q", ex)
	}
}

// reclaimScene: a uses 32 (gang a1 of 16, oldest, and pods ax and ay of 8,
// ay newest); b's plain pod of 8 is pending within its min.
func reclaimScene(t *testing.T) (*quotaFixture, *corev1.Pod) {
	f := newQuotaFixture(t, minMax16x32(), testbuild.EightGPUNodes(4)...)
	t0 := f.now
	f.pod("a", "a1-0", 8, t0, inGang("a1", 2), on("n0"))
	f.pod("a", "a1-1", 8, t0, inGang("a1", 2), on("n1"))
	f.pod("a", "ax", 8, t0.Add(time.Minute), on("n2"))
	f.pod("a", "ay", 8, t0.Add(2*time.Minute), on("n3"))
	b := f.pod("b", "b-0", 8, t0.Add(3*time.Minute))
	return f, b
}

// reclaimAyFor filters b-0 of reclaimScene on its full cluster (it passes
// no node, which queues a reclaim), runs that reclaim and checks that it
// evicted ay alone.
func (f *quotaFixture) reclaimAyFor(b *corev1.Pod) {
	f.t.Helper()
	if res := f.filter(b); len(*res.NodeNames) != 0 {
		f.t.Fatalf("b-0 passed %v on a full cluster", *res.NodeNames)
	}
	if err := f.reclaimQueued(); err != nil {
		f.t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/ay"}, f.evictions()); diff != "" {
		f.t.Fatalf("evictions (-want +got):\n%s", diff)
	}
}

// reclaimQueued runs the reclaim a filter without room queued.
func (f *quotaFixture) reclaimQueued() error {
	f.t.Helper()
	queued, err := f.enf.ReclaimQueued(context.Background())
	if !queued {
		f.t.Fatal("filter queued no reclaim")
	}
	f.feed()
	return err
}

func TestReclaimForPlainPodAndHold(t *testing.T) {
	f, b := reclaimScene(t)
	f.reclaimAyFor(b)
	// ay's controller recreates it at once: it must not borrow the room
	// reclaimed for b (that would make reclaim run again: a flap).
	f.now = f.now.Add(time.Second)
	ay := f.pod("a", "ay", 8, f.now)
	res := f.filter(ay)
	if len(*res.NodeNames) != 0 || !strings.Contains(res.FailedAndUnresolvableNodes["n0"], "that can be lent") {
		t.Fatalf("recreated ay: passed %v, unresolvable %v; want it refused by quota", *res.NodeNames, res.FailedAndUnresolvableNodes)
	}
	res = f.filter(b)
	if diff := cmp.Diff([]string{"n3"}, *res.NodeNames); diff != "" {
		t.Errorf("b-0 after the reclaim (-want +got):\n%s", diff)
	}
	// b-0 binds: the hold is taken by b's own use; ay stays refused.
	b.Spec.NodeName = "n3"
	if _, err := f.client.CoreV1().Pods("b").Update(context.Background(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.feed()
	res = f.filter(ay)
	if len(*res.NodeNames) != 0 {
		t.Errorf("recreated ay passed %v after b bound", *res.NodeNames)
	}
	if diff := cmp.Diff([]string{"a/ay"}, f.evictions()); diff != "" {
		t.Errorf("evictions at the end (-want +got):\n%s", diff)
	}
}

func TestReclaimSkipsWorkloadProtectedByPDB(t *testing.T) {
	cases := []struct {
		name          string
		pdb           []string
		past          bool
		wantEvictions []string
		wantPast      []string
		wantErr       string
		wantBlocked   int
	}{
		{name: "newest protected: the next one goes", pdb: []string{"ay"}, wantEvictions: []string{"a/ax"}, wantBlocked: 2},
		// a1 (16, oldest) may go too: a keeps its min of 16.
		{name: "all protected: nothing goes", pdb: []string{"ax", "ay", "a1-1"}, wantErr: "other namespaces borrow too little to free tessera.dev/gpu=8 without falling under their own min; passed over as their PodDisruptionBudgets refuse eviction", wantBlocked: 4},
		// With PastBudgets (the product's default): a budget is a
		// preference; the newest borrower goes past it.
		{name: "all protected, past budgets: the newest goes", pdb: []string{"ax", "ay", "a1-1"}, past: true, wantPast: []string{"a/ay"}, wantBlocked: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, b := reclaimScene(t)
			if tc.past {
				f.enf.PastBudgets = &KubeEvicter{Client: f.client}
			}
			for _, n := range tc.pdb {
				f.pdb[n] = true
			}
			f.filter(b)
			err := f.reclaimQueued()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("reclaim error %v, want %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantEvictions, f.evictions()); diff != "" {
				t.Errorf("evictions (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPast, f.deleted); diff != "" {
				t.Errorf("deleted past budgets (-want +got):\n%s", diff)
			}
			// One event on each refused pod (not the other members of
			// its gang) and one on the asker naming them all.
			if got := f.eventsWith(api.EventReclaimBlocked); len(got) != tc.wantBlocked || !strings.Contains(got[0], "cannot be evicted") {
				t.Errorf("ReclaimBlocked events %q, want %d", got, tc.wantBlocked)
			}
		})
	}
}

func TestReclaimNeverTakesANamespaceUnderItsMin(t *testing.T) {
	// a runs one gang of 32, half inside its min: it is spared, and b
	// waits.
	f := newQuotaFixture(t, minMax16x32(), testbuild.EightGPUNodes(4)...)
	for i := range 4 {
		f.pod("a", fmt.Sprintf("a-%d", i), 8, f.now, inGang("big", 4), on(fmt.Sprintf("n%d", i)))
	}
	b := f.pod("b", "b-0", 8, f.now.Add(time.Minute))
	f.filter(b)
	err := f.reclaimQueued()
	if err == nil || !strings.Contains(err.Error(), "without falling under their own min") {
		t.Errorf("reclaim error %v", err)
	}
	if got := f.evictions(); len(got) != 0 {
		t.Errorf("evicted %v", got)
	}
}

// A tenant with min 2 borrowing 14 GPUs through one 16-GPU gang gives it
// back, whole, to a namespace within its min (min 12, using 0): the gang
// straddles a's min, borrows more (14) than a is then short (2), and b is
// shorter (12). The Event says why, not that a keeps its min (make demo:
// it said so while a fell to 0).
func TestReclaimTakesAMostlyBorrowedGang(t *testing.T) {
	q := staticQuotas{
		"a": {Namespace: "a", Min: gpus(2), Max: gpus(32)},
		"b": {Namespace: "b", Min: gpus(12), Max: gpus(32)},
	}
	f := newQuotaFixture(t, q, testbuild.EightGPUNodes(2)...)
	for i := range 2 {
		f.pod("a", fmt.Sprintf("a-%d", i), 8, f.now, inGang("big", 2), on(fmt.Sprintf("n%d", i)))
	}
	b := f.pod("b", "b-0", 8, f.now.Add(time.Minute))
	f.filter(b)
	if err := f.reclaimQueued(); err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	if diff := cmp.Diff([]string{"a/a-0", "a/a-1"}, f.evictions()); diff != "" {
		t.Errorf("evictions (-want +got):\n%s", diff)
	}
	rec := f.eventsWith(api.EventReclaimed)
	if len(rec) != 2 || !strings.Contains(rec[0], "borrows more than a is then short of its min") || strings.Contains(rec[0], "keeps a at its min") {
		t.Errorf("Reclaimed events %q", rec)
	}
}

// TestPreemptVerbWithQuota: through the verb, a node whose only GPU
// victims are a partial gang is dropped; a node with a whole
// lower-priority single pod of a borrowing namespace keeps it.
func TestPreemptVerbWithQuota(t *testing.T) {
	f := newQuotaFixture(t, minMax16x32(), testbuild.EightGPUNodes(3)...)
	t0 := f.now
	f.pod("a", "other", 8, t0, on("n2")) // a uses 24: 8 above its min
	g0 := f.pod("a", "g-0", 8, t0, inGang("g", 2), on("n0"))
	f.pod("a", "g-1", 4, t0, inGang("g", 2), on("n1"))
	solo := f.pod("a", "solo", 4, t0, on("n1"))
	pre := testbuild.Pod("x").Whole(4).Priority(100).Obj()
	pre.Namespace = "b"
	args := &extenderv1.ExtenderPreemptionArgs{Pod: pre, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"n0": {Pods: []*extenderv1.MetaPod{{UID: string(g0.UID)}}},
		"n1": {Pods: []*extenderv1.MetaPod{{UID: string(solo.UID)}}},
	}}
	res, err := f.srv.PreemptArgs(context.Background(), args)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*extenderv1.MetaVictims{"n1": {Pods: []*extenderv1.MetaPod{{UID: string(solo.UID)}}}}
	if diff := cmp.Diff(want, res.NodeNameToMetaVictims); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// TestPreemptVerbTakesExtraMembersFirst: kube-scheduler spares the pods
// that started first, so on a node where an elastic gang's extra member
// runs beside whole pods of the same priority that started after it, its
// victims are the whole pods (seen on make demo: a 4-GPU pod of a higher
// tier evicted four 1-GPU pods while an extra member of 4 GPUs ran). The
// verb offers the node's extra members too and takes them first; the
// gang's minimum is never offered, nor an extra member of a priority the
// preemptor does not outrank.
func TestPreemptVerbTakesExtraMembersFirst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		gangPrio int32
		want     func(g1 *corev1.Pod, n0, n1 []*corev1.Pod) map[string][]*corev1.Pod
	}{{
		name:     "the extra member goes instead of four whole pods",
		gangPrio: 10,
		want: func(g1 *corev1.Pod, _, _ []*corev1.Pod) map[string][]*corev1.Pod {
			return map[string][]*corev1.Pod{"n1": {g1}}
		},
	}, {
		name:     "an extra member the preemptor does not outrank stays",
		gangPrio: 200,
		want: func(_ *corev1.Pod, n0, n1 []*corev1.Pod) map[string][]*corev1.Pod {
			return map[string][]*corev1.Pod{"n0": n0, "n1": n1}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newQuotaFixture(t, staticQuotas{}, testbuild.EightGPUNodes(2)...)
			t0 := f.now
			f.pod("tr", "g-0", 4, t0, inGang("g", 1), on("n0"), prio(tc.gangPrio))
			g1 := f.pod("tr", "g-1", 4, t0.Add(time.Minute), inGang("g", 1), on("n1"), prio(tc.gangPrio))
			var n0, n1 []*corev1.Pod
			for i := 0; i < 4; i++ {
				n0 = append(n0, f.pod("nb", fmt.Sprintf("x-%d", i), 1, t0.Add(2*time.Minute), on("n0"), prio(10)))
				n1 = append(n1, f.pod("nb", fmt.Sprintf("w-%d", i), 1, t0.Add(2*time.Minute), on("n1"), prio(10)))
			}
			pre := testbuild.Pod("infer").Whole(4).Priority(100).Obj()
			pre.Namespace = "nb"
			meta := func(pods []*corev1.Pod) *extenderv1.MetaVictims {
				mv := &extenderv1.MetaVictims{Pods: []*extenderv1.MetaPod{}}
				for _, p := range pods {
					mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: string(p.UID)})
				}
				return mv
			}
			// kube-scheduler's victims: the whole pods that started last.
			res, err := f.srv.PreemptArgs(context.Background(), &extenderv1.ExtenderPreemptionArgs{Pod: pre, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
				"n0": meta(n0), "n1": meta(n1),
			}})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]*extenderv1.MetaVictims{}
			for node, pods := range tc.want(g1, n0, n1) {
				want[node] = meta(pods)
			}
			sortVictims := cmpopts.SortSlices(func(a, b *extenderv1.MetaPod) bool { return a.UID < b.UID })
			if diff := cmp.Diff(want, res.NodeNameToMetaVictims, sortVictims); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQuotaCollector(t *testing.T) {
	f, _ := reclaimScene(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(&QuotaCollector{State: func() (*quota.State, error) {
		v, err := f.enf.Ledger.View("", nil)
		if err != nil {
			return nil, err
		}
		return v.State, nil
	}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var ns string
			for _, l := range m.Label {
				if l.GetName() == "namespace" {
					ns = l.GetValue()
				}
			}
			got[strings.TrimPrefix(mf.GetName(), "tessera_extender_quota_")+"/"+ns] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"used/a": 32, "min/a": 16, "max/a": 32, "borrowed/a": 16, "lent/a": 0,
		"used/b": 0, "min/b": 16, "max/b": 32, "borrowed/b": 0, "lent/b": 16,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gauges (-want +got):\n%s", diff)
	}
}

// TestQuotaLedgerHold: reclaimed room counts for the asking namespace in
// other namespaces' views until its own use reaches what it used then plus
// what was held (or its min), or the hold expires.
func TestQuotaLedgerHold(t *testing.T) {
	f := newQuotaFixture(t, staticQuotas{
		"a": {Namespace: "a", Min: gpus(16), Max: gpus(32)},
		"b": {Namespace: "b", Min: gpus(24), Max: gpus(32)},
	}, testbuild.EightGPUNodes(4)...)
	f.pod("b", "b0", 8, f.now, on("n0"))
	usedB := func(asking string) int64 {
		t.Helper()
		v, err := f.enf.Ledger.View(asking, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v.State.Used["b"][api.ResourceGPU]
	}
	f.enf.Ledger.Hold("b", "x", gpus(8), gpus(8), time.Minute)
	f.enf.Ledger.Hold("b", "y", gpus(8), gpus(8), time.Minute)
	f.enf.Ledger.Hold("b", "y", gpus(8), gpus(8), time.Minute) // y again: replaced
	steps := []struct {
		what          string
		act           func()
		wantA, wantB0 int64 // b's use as a and as b itself see it
	}{
		{"two holds over b's 8", func() {}, 24, 8},
		{"x's pod binds: y still held", func() { f.pod("b", "x", 8, f.now, on("n1")) }, 24, 16},
		{"y's pod binds: b at its min, no hold", func() { f.pod("b", "y", 8, f.now, on("n2")) }, 24, 24},
		{"b's pods go: nothing held any more", func() {
			for _, n := range []string{"x", "y"} {
				if err := f.client.CoreV1().Pods("b").Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}, 8, 8},
	}
	for _, s := range steps {
		s.act()
		if got, gotB := usedB("a"), usedB("b"); got != s.wantA || gotB != s.wantB0 {
			t.Errorf("%s: b's use seen by a %d, by b %d; want %d, %d", s.what, got, gotB, s.wantA, s.wantB0)
		}
	}
	f.enf.Ledger.Hold("b", "z", gpus(8), gpus(8), time.Minute)
	f.now = f.now.Add(2 * time.Minute)
	if got := usedB("a"); got != 8 {
		t.Errorf("expired hold: b's use seen by a %d, want 8", got)
	}
}

// TestReclaimForUnschedulablePod: on a full cluster kube-scheduler's own
// resource check rejects every node before the extender's filter is
// asked; the periodic pass finds the pod by its Unschedulable condition.
func TestReclaimForUnschedulablePod(t *testing.T) {
	f, b := reclaimScene(t)
	other := f.pod("b", "elsewhere", 8, f.now, func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "none"} })
	if got := f.enf.Unschedulable(); len(got) != 0 {
		t.Errorf("unschedulable before kube-scheduler tried: %v", got)
	}
	for _, p := range []*corev1.Pod{b, other} {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		if _, err := f.client.CoreV1().Pods("b").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got := f.enf.Unschedulable()
	want := []types.NamespacedName{{Namespace: "b", Name: "elsewhere"}, {Namespace: "b", Name: "b-0"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("unschedulable (-want +got):\n%s", diff)
	}
	// No node matches the first pod's selector: evicting would not help it.
	if err := f.enf.ReclaimForPod(context.Background(), got[0]); err == nil {
		t.Error("reclaim for a pod no node selects: no error")
	}
	if err := f.enf.ReclaimForPod(context.Background(), got[1]); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/ay"}, f.evictions()); diff != "" {
		t.Errorf("evictions (-want +got):\n%s", diff)
	}
}

// TestReclaimTakesExtraMembersFirst: quota reclaim takes an elastic
// gang's extra member (the newest) before any whole workload of its
// priority, though the whole pods beside it are newer (seen on make demo:
// eight whole pods of a borrowing namespace were reclaimed while its
// gang's two extras ran on).
func TestReclaimTakesExtraMembersFirst(t *testing.T) {
	f := newQuotaFixture(t, minMax16x32(), testbuild.EightGPUNodes(4)...)
	t0 := f.now
	f.pod("a", "g-0", 4, t0, inGang("g", 2), on("n0"))
	f.pod("a", "g-1", 4, t0, inGang("g", 2), on("n0"))
	f.pod("a", "g-2", 4, t0.Add(time.Minute), inGang("g", 2), on("n1"))
	f.pod("a", "g-3", 4, t0.Add(90*time.Second), inGang("g", 2), on("n1"))
	f.pod("a", "w-0", 8, t0.Add(2*time.Minute), on("n2"))
	f.pod("a", "w-1", 8, t0.Add(2*time.Minute), on("n3"))
	b := f.pod("b", "b-0", 4, t0.Add(3*time.Minute))
	if err := f.enf.ReclaimForPod(context.Background(), types.NamespacedName{Namespace: b.Namespace, Name: b.Name}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/g-3"}, f.evictions()); diff != "" {
		t.Errorf("evictions (-want +got):\n%s", diff)
	}
	if ev := f.eventsWith(api.EventQuotaReclaiming); len(ev) != 1 || !strings.Contains(ev[0], "gang g member g-3 of namespace a (1 pods)") {
		t.Errorf("QuotaReclaiming events: %q", ev)
	}
}

// TestPreemptVerbFreesQuota: a pod above its namespace's max that a
// lower-priority pod of its own namespace would make room for: the GPUs
// fit without preempting anything, but the victim is kept, since quota
// needs it gone; a node whose victims would not free enough quota is
// dropped.
func TestPreemptVerbFreesQuota(t *testing.T) {
	f := newQuotaFixture(t, staticQuotas{"a": {Namespace: "a", Min: gpus(8), Max: gpus(16)}}, testbuild.EightGPUNodes(3)...)
	low := f.pod("a", "low", 4, f.now, on("n0"), prio(1))
	f.pod("a", "high", 8, f.now, on("n1"), prio(100))
	small := f.pod("a", "small", 1, f.now, on("n2"), prio(1))
	f.pod("a", "mid", 2, f.now, on("n2"), prio(100)) // a uses 15 of its max 16
	pre := testbuild.Pod("x").Whole(4).Priority(10).Obj()
	pre.Namespace = "a"
	if v := f.enf.AdmitPod(context.Background(), pre); v.Allowed || v.Unresolvable {
		t.Fatalf("the preemptor: %+v, want refused and resolvable", v)
	}
	res, err := f.srv.PreemptArgs(context.Background(), &extenderv1.ExtenderPreemptionArgs{Pod: pre, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"n0": {Pods: []*extenderv1.MetaPod{{UID: string(low.UID)}}},
		"n2": {Pods: []*extenderv1.MetaPod{{UID: string(small.UID)}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*extenderv1.MetaVictims{"n0": {Pods: []*extenderv1.MetaPod{{UID: string(low.UID)}}}}
	if diff := cmp.Diff(want, res.NodeNameToMetaVictims); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// TestReclaimOnlyForNodesThePodMayUse: room on a cordoned node, or on no
// node the pod's required affinity allows, is no reason for reclaim to
// hold back, nor a place it frees room on (package eligible).
func TestReclaimOnlyForNodesThePodMayUse(t *testing.T) {
	f, b := reclaimScene(t)
	affine := f.pod("b", "affine", 8, f.now, func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"ghost"}}}}}}}}
	})
	for _, p := range []*corev1.Pod{b, affine} {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		if _, err := f.client.CoreV1().Pods("b").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.enf.ReclaimForPod(context.Background(), types.NamespacedName{Namespace: "b", Name: "affine"}); err == nil {
		t.Error("reclaim for a pod whose affinity allows no node: no error")
	}
	if got := f.evictions(); len(got) != 0 {
		t.Fatalf("evictions for a pod that may use no node: %v", got)
	}
	// b-0 may use every node: reclaim evicts for it.
	if err := f.enf.ReclaimForPod(context.Background(), types.NamespacedName{Namespace: "b", Name: b.Name}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/ay"}, f.evictions()); diff != "" {
		t.Errorf("evictions (-want +got):\n%s", diff)
	}
}

// A pending pod of a namespace without a quota: reclaim is not due (nothing
// is guaranteed to it), which callers take quietly (the planner leaves it
// out of the pod's waiting reason), and nothing is evicted.
func TestReclaimNotDueWithoutQuota(t *testing.T) {
	f, _ := reclaimScene(t)
	p := f.pod("free", "asker", 8, f.now)
	err := f.enf.ReclaimForPod(context.Background(), types.NamespacedName{Namespace: "free", Name: p.Name})
	if !errors.Is(err, equota.ErrNothingGuaranteed) || !strings.Contains(err.Error(), "free: the namespace has no quota") {
		t.Errorf("reclaim for a namespace without quota: %v, want ErrNothingGuaranteed naming it", err)
	}
	if got := f.evictions(); len(got) != 0 {
		t.Errorf("evicted %v", got)
	}
}

// TestPreemptVerbOncePerPod: kube-scheduler evicts the victims the verb
// offered asynchronously and may ask again for the same pod before the
// informers show them leaving; the verb then offers nothing more: not on
// the nominated node's remembered victims, nor once the informer shows
// them leaving; after the memory it answers again.
func TestPreemptVerbOncePerPod(t *testing.T) {
	f := newQuotaFixture(t, staticQuotas{}, testbuild.EightGPUNodes(2)...)
	t0 := f.now
	v0 := f.pod("a", "v0", 8, t0, on("n0"))
	v1 := f.pod("a", "v1", 8, t0, on("n1"))
	pre := testbuild.Pod("x").Whole(4).Priority(100).Obj()
	pre.Namespace, pre.UID = "b", "uid-x"
	now := t0
	f.srv.now = func() time.Time { return now }
	ask := func(v ...*corev1.Pod) map[string]*extenderv1.MetaVictims {
		t.Helper()
		args := &extenderv1.ExtenderPreemptionArgs{Pod: pre, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}
		for _, p := range v {
			args.NodeNameToMetaVictims[p.Spec.NodeName] = &extenderv1.MetaVictims{Pods: []*extenderv1.MetaPod{{UID: string(p.UID)}}}
		}
		res, err := f.srv.PreemptArgs(context.Background(), args)
		if err != nil {
			t.Fatal(err)
		}
		return res.NodeNameToMetaVictims
	}
	if got := ask(v0); len(got) != 1 {
		t.Fatalf("first ask: %v, want n0's victim", got)
	}
	// kube-scheduler nominated n0 and asks again (v0 not seen leaving).
	pre.Status.NominatedNodeName = "n0"
	if got := ask(v1); len(got) != 0 {
		t.Errorf("second ask while n0's victim leaves: %v, want nothing", got)
	}
	// The informer shows v0 leaving, the memory is over: still nothing.
	now = t0.Add(answerMemory + time.Second)
	leaving := v0.DeepCopy()
	leaving.DeletionTimestamp = &metav1.Time{Time: now}
	f.cache.SetPod(leaving)
	if got := ask(v1); len(got) != 0 {
		t.Errorf("ask while v0 is seen leaving: %v, want nothing", got)
	}
	// v0 stays (its deletion undone in this test's ledger): after the
	// memory the verb answers again.
	f.cache.SetPod(v0)
	if got := ask(v1); len(got) != 1 {
		t.Errorf("ask after the memory: %v, want n1's victim", got)
	}
}

// TestRoomBeingFreed: what tessera-scheduler's PostFilter asks before
// DefaultPreemption, the rule of the preempt verb's empty answers.
func TestRoomBeingFreed(t *testing.T) {
	f := newQuotaFixture(t, staticQuotas{}, testbuild.EightGPUNodes(2)...)
	v0 := f.pod("a", "v0", 8, f.now, on("n0"))
	f.pod("a", "v1", 8, f.now, on("n1"))
	pre := testbuild.Pod("x").Whole(4).Priority(100).Obj()
	pre.Namespace, pre.UID = "b", "uid-x"
	if f.srv.RoomBeingFreed(pre, []string{"n0", "n1"}) {
		t.Error("nothing leaves: want false")
	}
	leaving := v0.DeepCopy()
	leaving.DeletionTimestamp = &metav1.Time{Time: f.now}
	f.cache.SetPod(leaving)
	if !f.srv.RoomBeingFreed(pre, []string{"n0"}) {
		t.Error("v0 leaves n0, where the pod fits once it is gone: want true")
	}
	if f.srv.RoomBeingFreed(pre, []string{"n1"}) {
		t.Error("nothing leaves n1: want false")
	}
	planned := pre.DeepCopy()
	planned.Annotations = map[string]string{api.AnnotationGangPlan: "{}"}
	if !f.srv.RoomBeingFreed(planned, []string{"n1"}) {
		t.Error("a pod with a plan: want true")
	}
}

// replacingQuotaEvicter evicts as the fixture's client does, and then
// plays what a cluster does at once when a Deployment's pod is evicted:
// its controller makes a replacement (not gated: it is no gang member),
// and kube-scheduler binds it to the first node the extender's filter
// passes, before the planner's pass has ended.
type replacingQuotaEvicter struct {
	equota.Evicter
	f     *quotaFixture
	gpus  int64    // each replacement's whole GPUs
	bound []string // name@node
}

func (r *replacingQuotaEvicter) Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error {
	if err := r.Evicter.Evict(ctx, pod, dryRun); err != nil || dryRun {
		return err
	}
	f := r.f
	f.feed()
	f.now = f.now.Add(time.Millisecond)
	repl := f.pod(pod.Namespace, pod.Name+"-r", r.gpus, f.now)
	res := f.filter(repl)
	if res.NodeNames == nil || len(*res.NodeNames) == 0 {
		return nil
	}
	repl.Spec.NodeName = (*res.NodeNames)[0]
	repl.Status.Phase = corev1.PodRunning
	if _, err := f.client.CoreV1().Pods(repl.Namespace).Update(ctx, repl, metav1.UpdateOptions{}); err != nil {
		return err
	}
	f.feed()
	r.bound = append(r.bound, repl.Name+"@"+repl.Spec.NodeName)
	return nil
}

// ElasticQuota reclaim for a gang holds the freed room before it evicts
// (as tier preemption does): the victims' replacements, made and bound at
// once by their Deployment, find no room there, and the victims are
// evicted once. On make demo's cluster, where the reclaim evicted first,
// 3 replacements were bound into the node freed for a gang of 2 x 4 GPUs
// that must share a node, and reclaimed again: 11 evictions for 8 GPUs.
func TestQuotaReclaimHoldsTheRoomBeforeEvicting(t *testing.T) {
	nodes := testbuild.EightGPUNodes(3)
	for _, n := range nodes {
		n.Labels = map[string]string{"kubernetes.io/hostname": n.Name}
	}
	f := newQuotaFixture(t, staticQuotas{
		"a": {Namespace: "a", Min: gpus(8), Max: gpus(24)},
		"b": {Namespace: "b", Min: gpus(16), Max: gpus(24)},
	}, nodes...)
	rep := &replacingQuotaEvicter{Evicter: f.enf.Evicter, f: f, gpus: 1}
	f.enf.Evicter = rep
	// a's Deployment fills the cluster one GPU at a time, node after node,
	// so that its newest pods are on every node.
	for i := range 24 {
		node := fmt.Sprintf("n%d", i%3)
		f.pod("a", fmt.Sprintf("a-%02d", i), 1, f.now.Add(time.Duration(i)*time.Second), on(node))
	}
	f.now = f.now.Add(time.Minute)
	for i := range 2 {
		f.pod("b", fmt.Sprintf("b-%d", i), 4, f.now, inGang("b", 2), gated, func(p *corev1.Pod) {
			p.Annotations[api.AnnotationGangTopology] = "kubernetes.io/hostname:required"
		})
	}
	f.sync()
	f.sync()
	if got := f.evictions(); len(got) != 8 {
		t.Errorf("evicted %d pods, want the 8 of one node: %v\nreplacements bound: %v\nevents:\n%s",
			len(got), got, rep.bound, strings.Join(f.events.Events, "\n"))
	}
	if len(rep.bound) != 0 {
		t.Errorf("replacements bound into the room reclaimed for the gang: %v", rep.bound)
	}
	pods, _ := f.list("b")
	var planned []string
	for _, p := range pods {
		if plan, ok, _ := api.GetGangPlan(p.Annotations); ok {
			planned = append(planned, plan.Node)
		}
	}
	if len(planned) != 2 || planned[0] != planned[1] {
		t.Errorf("b's members planned on %v, want both on one node", planned)
	}
	if ev := f.eventsWith(api.EventQuotaReclaiming); len(ev) != 2 {
		t.Errorf("QuotaReclaiming events %q, want one on each member", ev)
	}
}

// Reclaim for a plain pod holds the room in quota before it evicts: the
// victim's replacement, made at once by its controller while the
// evictions are still under way, would borrow the room reclaimed and is
// refused by quota, so it is not bound there (and reclaimed again).
func TestQuotaReclaimForAPodHoldsBeforeEvicting(t *testing.T) {
	f, b := reclaimScene(t)
	rep := &replacingQuotaEvicter{Evicter: f.enf.Evicter, f: f, gpus: 8}
	f.enf.Evicter = rep
	f.reclaimAyFor(b)
	if len(rep.bound) != 0 {
		t.Errorf("replacement bound into the room reclaimed for b-0: %v", rep.bound)
	}
	if res := f.filter(b); res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Errorf("b-0 after the reclaim: passed %v, unresolvable %v", res.NodeNames, res.FailedAndUnresolvableNodes)
	}
}

// A plain pod gets room by reclaim once per hold: when what was freed for
// it is taken before it binds (on make demo a victim's replacement took
// the whole GPU freed for a slice, before the node advertised its slice
// capacity again), reclaim does not evict again at every resync (it did,
// a borrower every 2 s), only once the hold has ended.
func TestReclaimForAPodOncePerHold(t *testing.T) {
	f, b := reclaimScene(t)
	b.Status.Phase = corev1.PodPending
	b.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	if _, err := f.client.CoreV1().Pods("b").UpdateStatus(context.Background(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "b", Name: b.Name}
	if err := f.enf.ReclaimForPod(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	f.feed()
	// The room goes to another pod of a (bound directly, as a pod of
	// another scheduler would be): b-0 fits nowhere again.
	f.pod("a", "thief", 8, f.now, on("n3"))
	f.feed()
	for range 3 {
		f.now = f.now.Add(2 * time.Second)
		if err := f.enf.ReclaimForPod(context.Background(), key); err != nil {
			t.Fatal(err)
		}
		f.feed()
	}
	if diff := cmp.Diff([]string{"a/ay"}, f.evictions()); diff != "" {
		t.Fatalf("evictions within the hold (-want +got):\n%s", diff)
	}
	f.now = f.now.Add(2 * time.Minute)
	if err := f.enf.ReclaimForPod(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if got := f.evictions(); len(got) != 2 {
		t.Errorf("evictions once the hold ended: %v, want a second one", got)
	}
}

// Reclaim across GPU shapes holds what the victims free in their own
// resources too: a namespace within its min of GPU memory reclaims a
// borrower's whole GPU for a slice, and the borrower's replacement (a
// whole GPU) is refused by quota while the hold lasts. The request alone
// (memory and cores) held nothing a whole-GPU borrower needs: on make
// demo each replacement took the GPU freed for the slice, and reclaim ran
// again.
func TestQuotaReclaimAcrossShapesHoldsTheFreedGPUs(t *testing.T) {
	nodes := testbuild.EightGPUNodes(1)
	f := newQuotaFixture(t, staticQuotas{
		"a": {Namespace: "a", Min: gpus(2), Max: gpus(8)},
		"b": {Namespace: "b", Min: quota.Resources{api.ResourceGPUMemory: 200, api.ResourceGPUCore: 400}, Max: quota.Resources{api.ResourceGPUMemory: 800, api.ResourceGPUCore: 1000}},
	}, nodes...)
	for i := range 8 {
		p := testbuild.Pod(fmt.Sprintf("a-%d", i)).Whole(1).Node("n0").Holding(i).Obj()
		p.Namespace, p.UID = "a", types.UID(fmt.Sprintf("uid-a-%d", i))
		p.CreationTimestamp = metav1.NewTime(f.now.Add(time.Duration(i) * time.Second))
		if _, err := f.client.CoreV1().Pods("a").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slice := testbuild.Pod("slice").Shared(20, 30).Obj()
	slice.Namespace, slice.UID = "b", "uid-b-slice"
	slice.CreationTimestamp = metav1.NewTime(f.now.Add(time.Minute))
	slice.Status.Phase = corev1.PodPending
	slice.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	if _, err := f.client.CoreV1().Pods("b").Create(context.Background(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.feed()
	if err := f.enf.ReclaimForPod(context.Background(), types.NamespacedName{Namespace: "b", Name: "slice"}); err != nil {
		t.Fatal(err)
	}
	f.feed()
	if diff := cmp.Diff([]string{"a/a-7"}, f.evictions()); diff != "" {
		t.Fatalf("evictions (-want +got):\n%s\nevents:\n%s", diff, strings.Join(f.events.Events, "\n"))
	}
	repl := f.pod("a", "a-7-r", 1, f.now.Add(time.Second))
	if res := f.filter(repl); len(*res.NodeNames) != 0 {
		t.Errorf("the victim's replacement passed %v: it takes the GPU freed for the slice", *res.NodeNames)
	}
	if res := f.filter(slice); len(*res.NodeNames) != 1 {
		t.Errorf("the slice passed %v, unresolvable %v: want the node of the freed GPU", *res.NodeNames, res.FailedAndUnresolvableNodes)
	}
}

// Reclaim for a plain pod holds the freed GPUs for it, not only quota:
// with QuotaRoom the pod's plan names the node (and GPUs) before the
// victim goes, so another pod its namespace's min admits (b-1 here; the
// quota hold covers b-0's request, not which pod takes the GPUs) does not
// take the room; before, it passed the freed node and b-0 waited for
// another hold to end.
func TestQuotaReclaimForAPodHoldsItsGPUs(t *testing.T) {
	f, b := reclaimScene(t)
	f.enf.Nodes = QuotaRoom{QuotaNodes: QuotaNodes{Cache: f.cache}, Policy: testPolicy(t, PolicyBinpack), Plans: &planner.KubeGang{Client: f.client, Sealer: testbuild.Sealer(t)}}
	f.reclaimAyFor(b)
	fresh, err := f.client.CoreV1().Pods("b").Get(context.Background(), b.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plan, ok, err := api.GetGangPlan(fresh.Annotations)
	if !ok || err != nil || plan.Node != "n3" || len(plan.GPUs) != 8 {
		t.Fatalf("b-0's plan %+v (%v, %v): want n3 and its 8 GPUs", plan, ok, err)
	}
	if ev := strings.Join(f.eventsWith(api.EventQuotaReclaiming), "\n"); !strings.Contains(ev, "the room is held for it on GPUs 0, 1, 2, 3, 4, 5, 6, 7 of node n3") {
		t.Errorf("QuotaReclaiming events do not say where the room is held: %s", ev)
	}
	b1 := f.pod("b", "b-1", 8, f.now.Add(time.Second))
	if res := f.filter(b1); len(*res.NodeNames) != 0 {
		t.Errorf("b-1 passed %v: it takes the room reclaimed for b-0", *res.NodeNames)
	}
	if res := f.filter(fresh); res.NodeNames == nil || len(*res.NodeNames) != 1 || (*res.NodeNames)[0] != "n3" {
		t.Errorf("b-0 with its plan passed %v, want n3", res.NodeNames)
	}
}

// kube-scheduler binds asynchronously: the filter of a namespace's next
// pod may run before the bind of the one before reserved anything, so a
// burst passes every filter. The bind asks quota again, each bind seeing
// those before it: of three pods of 2 GPUs under a max of 4, two bind
// and the third is refused with the quota's message (make demo: 7 pods of
// 2 GPUs ran under a max of 12).
func TestQuotaCheckedAgainAtBind(t *testing.T) {
	for _, tc := range []struct {
		name string
		// seen: the extender's informer shows the pods (else
		// kube-scheduler's, ahead of it, placed them first: neither the
		// quota index nor the listers know them at bind)
		seen bool
		// reserve: tessera-scheduler's Reserve places them (then bind)
		reserve bool
	}{
		{"bind, pods seen", true, false},
		{"bind, pods not seen yet", false, false},
		{"Reserve, pods seen", true, true},
		{"Reserve, pods not seen yet", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newQuotaFixture(t, staticQuotas{"a": {Namespace: "a", Min: gpus(2), Max: gpus(4)}},
				testbuild.Node("n1").GPUs(8, "A100", 40960).Obj())
			var pods []*corev1.Pod
			for i := range 3 {
				if tc.seen {
					pods = append(pods, f.pod("a", fmt.Sprintf("p%d", i), 2, f.now))
					continue
				}
				p := testbuild.Pod(fmt.Sprintf("p%d", i)).Whole(2).Obj()
				p.Namespace, p.UID = "a", types.UID(fmt.Sprintf("uid-a-p%d", i))
				pods = append(pods, p)
			}
			for _, p := range pods {
				if res := f.filter(p); len(*res.NodeNames) != 1 {
					t.Fatalf("filter of %s: %+v, want n1 (nothing bound yet)", p.Name, res)
				}
			}
			f.srv.pods = newFakePods(pods...)
			var errs []error
			for _, p := range pods {
				if tc.reserve {
					errs = append(errs, f.srv.Reserve(p, "n1"))
					continue
				}
				errs = append(errs, f.srv.Bind(context.Background(), &extenderv1.ExtenderBindingArgs{PodName: p.Name, PodNamespace: p.Namespace, PodUID: p.UID, Node: "n1"}))
			}
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("p0, p1: %v, %v; want both placed (4 GPUs, the max)", errs[0], errs[1])
			}
			if !errors.Is(errs[2], ErrQuotaAtBind) || !strings.Contains(errs[2].Error(), "max") {
				t.Errorf("p2: %v; want it refused by quota, naming the max", errs[2])
			}
			if _, reserved := f.cache.Reservation(pods[2].UID); reserved {
				t.Error("the refused pod holds a reservation")
			}
			if got := f.eventsWith(api.EventQuotaExceeded); len(got) != 1 || !strings.Contains(got[0], "p2") {
				t.Errorf("QuotaExceeded Events %v, want one on p2", got)
			}
			// The full view (reclaim, explanations) counts the binds in
			// flight too.
			v, err := f.enf.Ledger.View("a", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := v.State.Used["a"][api.ResourceGPU]; got != 4 {
				t.Errorf("the full view counts %d GPUs used by a, want 4 (the two placed)", got)
			}
		})
	}
}
