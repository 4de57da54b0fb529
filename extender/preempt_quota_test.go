package extender

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// aboveMaxScene is make demo's repro: 16 A100s on a100-1 and a100-2,
// namespace eqp under an ElasticQuota of min 8 = max 8, running 8 one-GPU
// pods of priority 100 (6 on a100-1, 2 on a100-2), an ungoverned
// namespace's priority-50 pod on a100-2, and eqp's pod urgent (priority
// 1000, 4 GPUs) that kube-scheduler found unschedulable; a Preemptor with
// quota.
type aboveMaxScene struct {
	f      *quotaFixture
	client *testbuild.PreemptClient
	p      *Preemptor
	urgent *corev1.Pod
}

// runningIn creates a pod of namespace ns on node holding GPUs gpus there,
// started minutesAgo.
func (f *quotaFixture) runningIn(ns, name, node string, prio int32, minutesAgo int, gpus ...int) *corev1.Pod {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(int64(len(gpus))).Priority(prio).Node(node).Holding(gpus...).Obj()
	p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-"+name)
	start := metav1.NewTime(f.now.Add(-time.Duration(minutesAgo) * time.Minute))
	p.CreationTimestamp, p.Status.StartTime, p.Status.Phase = start, &start, corev1.PodRunning
	return f.add(p)
}

// add creates p and shows it to the ledger and the quota index.
func (f *quotaFixture) add(p *corev1.Pod) *corev1.Pod {
	f.t.Helper()
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.feed()
	return p
}

// pendingIn creates a pending pod of namespace ns asking for n whole GPUs
// that kube-scheduler found unschedulable.
func (f *quotaFixture) pendingIn(ns, name string, prio int32, n int64) *corev1.Pod {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(n).Priority(prio).Obj()
	p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-"+name)
	p.CreationTimestamp = metav1.NewTime(f.now.Add(-time.Minute))
	p.Status.Phase = corev1.PodPending
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	return f.add(p)
}

func (f *quotaFixture) preemptor(client *testbuild.PreemptClient) *Preemptor {
	return &Preemptor{Cache: f.cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return f.list("") },
		Policy: testPolicy(f.t, PolicyBinpack), Events: f.events, Quota: f.enf, Now: func() time.Time { return f.now }}
}

func newAboveMaxScene(t *testing.T) *aboveMaxScene {
	a100 := func(name string) *corev1.Node { return testbuild.Node(name).GPUs(8, "A100", 81920).Obj() }
	f := newQuotaFixture(t, staticQuotas{"eqp": {Namespace: "eqp", Min: gpus(8), Max: gpus(8)}}, a100("a100-1"), a100("a100-2"))
	for i := range 6 {
		f.runningIn("eqp", fmt.Sprintf("lo-%d", i), "a100-1", 100, 30-i, i) // lo-5 the newest
	}
	f.runningIn("eqp", "lo-6", "a100-2", 100, 10, 0)
	f.runningIn("eqp", "lo-7", "a100-2", 100, 9, 1)
	f.runningIn("free", "batch", "a100-2", 50, 1, 2)
	sc := &aboveMaxScene{f: f, client: &testbuild.PreemptClient{}}
	sc.urgent = f.pendingIn("eqp", "urgent", 1000, 4)
	sc.p = f.preemptor(sc.client)
	return sc
}

// A pod above its namespace's ElasticQuota max preempts the namespace's
// own lower-priority pods: the fewest that bring the namespace within its
// max and make it fit one node, here the 4 newest of a100-1 (where it then
// fits, though a100-2's GPUs fit it as they are), and nothing of another
// namespace. Its plan holds the room and counts against the quota, so the
// victims' replacements are refused. Before, kube-scheduler's dry run
// offered the preempt verb the 2 victims a100-1's room needs, which the
// verb rightly refused (eqp would still be above its max), and Tessera's
// preemptor left the pod to kube-scheduler since a100-2 fits its GPUs: it
// waited for ever (make demo: "0/2 nodes are available: 1 Insufficient
// tessera.dev/gpu, 1 tessera: quota: pod urgent asks for 4
// tessera.dev/gpu; namespace eqp uses 8, its ElasticQuota max is 8").
func TestPreemptorFreesItsOwnNamespacesQuota(t *testing.T) {
	sc := newAboveMaxScene(t)
	f, ctx := sc.f, context.Background()

	res := f.filter(sc.urgent)
	if len(*res.NodeNames) != 0 || len(res.FailedAndUnresolvableNodes) != 0 || !strings.Contains(res.FailedNodes["a100-1"], "namespace eqp uses 8, its ElasticQuota max is 8") {
		t.Fatalf("urgent's filter: passed %v, failed %v, unresolvable %v: want refused by quota on every node, resolvable", *res.NodeNames, res.FailedNodes, res.FailedAndUnresolvableNodes)
	}
	// kube-scheduler's dry run: a100-1 needs 2 victims for room; they
	// leave eqp above its max, so the verb offers no node.
	pre, err := f.srv.PreemptArgs(ctx, &extenderv1.ExtenderPreemptionArgs{Pod: sc.urgent, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"a100-1": {Pods: []*extenderv1.MetaPod{{UID: "uid-eqp-lo-5"}, {UID: "uid-eqp-lo-4"}}},
	}})
	if err != nil || len(pre.NodeNameToMetaVictims) != 0 {
		t.Fatalf("preempt verb with kube-scheduler's 2 victims: %v, %v; want no node", pre, err)
	}

	if err := sc.p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	evicted := append([]string(nil), sc.client.Evicted...)
	sort.Strings(evicted)
	if diff := cmp.Diff([]string{"lo-2", "lo-3", "lo-4", "lo-5"}, evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s", diff)
	}
	plan, ok, err := api.GetGangPlan(map[string]string{api.AnnotationGangPlan: sc.client.Plans["urgent"]})
	if !ok || err != nil || plan.Node != "a100-1" || len(plan.GPUs) != 4 {
		t.Fatalf("urgent's plan %+v (%v, %v): want 4 GPUs of a100-1", plan, ok, err)
	}
	for _, g := range plan.GPUs {
		if g.Index < 2 || g.Index > 5 {
			t.Errorf("planned GPU %d: not one of the victims' (2-5)", g.Index)
		}
	}
	if ev := strings.Join(f.eventsWith(api.EventPreempting), "\n"); !strings.Contains(ev, "its namespace's ElasticQuota refuses it (eqp would use 12 tessera.dev/gpu, above its max 8)") {
		t.Errorf("Preempting events do not say quota needs the victims: %s", ev)
	}
	if ev := strings.Join(f.eventsWith(api.EventPreempted), "\n"); !strings.Contains(ev, "brings namespace eqp within its quota") {
		t.Errorf("Preempted events do not say why: %s", ev)
	}

	// The informer shows the plan and the victims gone; the Deployment
	// makes a replacement at once.
	fresh, err := f.client.CoreV1().Pods("eqp").Get(ctx, "urgent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fresh.Annotations[api.AnnotationGangPlan] = sc.client.Plans["urgent"]
	if _, err := f.client.CoreV1().Pods("eqp").Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range evicted {
		if err := f.client.CoreV1().Pods("eqp").Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.feed()
	repl := f.pendingIn("eqp", "lo-8", 100, 1)
	if res := f.filter(repl); len(*res.NodeNames) != 0 || !strings.Contains(res.FailedAndUnresolvableNodes["a100-2"], "namespace eqp uses 8, its ElasticQuota max is 8") {
		t.Errorf("the replacement's filter: passed %v, unresolvable %v: want refused (urgent's plan counts), unresolvable", *res.NodeNames, res.FailedAndUnresolvableNodes)
	}
	if res := f.filter(fresh); res.NodeNames == nil || !cmp.Equal(*res.NodeNames, []string{"a100-1"}) {
		t.Errorf("urgent with its plan passed %v, want a100-1", res.NodeNames)
	}
	if err := sc.p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(sc.client.Evicted) != 4 {
		t.Errorf("evicted %v: the next pass must evict nothing more", sc.client.Evicted)
	}
}

// When no node runs enough of the namespace's own lower-priority pods, the
// ones quota needs besides the node's go elsewhere: max 7, 3 one-GPU pods
// of priority 100 on each node and one of 2000, a 4-GPU pod of 1000: the 3
// of one node and the newest of the other (either node would do as well:
// the first by name). A pod its namespace's lower-priority pods could not
// bring within its max, all gone, preempts nothing.
func TestPreemptorFreesQuotaAcrossNodes(t *testing.T) {
	a100 := func(name string) *corev1.Node { return testbuild.Node(name).GPUs(8, "A100", 81920).Obj() }
	f := newQuotaFixture(t, staticQuotas{"eqp": {Namespace: "eqp", Min: gpus(7), Max: gpus(7)}}, a100("a100-1"), a100("a100-2"))
	for i := range 3 {
		f.runningIn("eqp", fmt.Sprintf("a-%d", i), "a100-1", 100, 30-i, i)
		f.runningIn("eqp", fmt.Sprintf("b-%d", i), "a100-2", 100, 20-i, i)
	}
	f.runningIn("eqp", "hi", "a100-2", 2000, 20, 3)
	client := &testbuild.PreemptClient{}
	p := f.preemptor(client)
	f.pendingIn("eqp", "huge", 1000, 8) // 8 gone would admit it; only 6 are lower
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 0 {
		t.Fatalf("evicted %v for a pod its namespace's lower-priority pods cannot admit", client.Evicted)
	}
	if err := f.client.CoreV1().Pods("eqp").Delete(context.Background(), "huge", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pendingIn("eqp", "urgent", 1000, 4)
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	evicted := append([]string(nil), client.Evicted...)
	sort.Strings(evicted)
	if diff := cmp.Diff([]string{"a-0", "a-1", "a-2", "b-2"}, evicted); diff != "" {
		t.Errorf("evicted (-want +got):\n%s", diff)
	}
	plan, ok, err := api.GetGangPlan(map[string]string{api.AnnotationGangPlan: client.Plans["urgent"]})
	if !ok || err != nil || plan.Node != "a100-1" {
		t.Errorf("urgent's plan %+v (%v, %v): want a100-1", plan, ok, err)
	}
}
