package quota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/quota"
)

func applied(ns, object string, min, max core.Resources, invalid string) quota.Applied {
	return quota.Applied{Object: object, Quota: core.Quota{Namespace: ns, Min: min, Max: max, Invalid: invalid}}
}

// TestRequeues: which namespaces' waiting pods an ElasticQuota change
// requeues, and with what value: only changes that may admit more.
func TestRequeues(t *testing.T) {
	y4 := applied("team-y", "team-y/q@1", gpus(0), gpus(4), "")
	x := applied("team-x", "team-x/q@5", gpus(2), gpus(8), "")
	for _, tc := range []struct {
		name          string
		before, after quota.Snapshot
		want          map[string]string
	}{
		{"max raised (F5)", quota.Snapshot{"team-y": y4, "team-x": x},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(0), gpus(8), ""), "team-x": x},
			map[string]string{"team-y": "team-y/q@2"}},
		{"max lowered", quota.Snapshot{"team-y": y4},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(0), gpus(2), "")}, map[string]string{}},
		{"a capped resource no longer capped", quota.Snapshot{"team-y": y4},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(0), core.Resources{api.ResourceGPUMemory: 80}, "")},
			map[string]string{"team-y": "team-y/q@2"}},
		{"a resource capped anew", quota.Snapshot{"team-y": y4},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(0), core.Resources{api.ResourceGPU: 4, api.ResourceGPUMemory: 80}, "")},
			map[string]string{}},
		{"min raised: the namespace, and the others may borrow more", quota.Snapshot{"team-y": y4, "team-x": x},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(2), gpus(4), ""), "team-x": x},
			map[string]string{"team-y": "team-y/q@2", "team-x": "team-y/q@2"}},
		{"deleted: the namespace, and the others", quota.Snapshot{"team-y": y4, "team-x": x},
			quota.Snapshot{"team-x": x},
			map[string]string{"team-y": "team-y/q@1 deleted", "team-x": "team-y/q@1 deleted"}},
		{"invalid fixed", quota.Snapshot{"team-y": applied("team-y", "team-y/q@1", core.Resources{}, core.Resources{}, "min above max")},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(0), gpus(4), "")},
			map[string]string{"team-y": "team-y/q@2"}},
		{"a malformed quota that applied deleted, another applies now", quota.Snapshot{"team-y": applied("team-y", "team-y/a@1", core.Resources{}, core.Resources{}, "bad")},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@7", gpus(0), gpus(4), "")},
			map[string]string{"team-y": "team-y/q@7"}},
		{"made invalid", quota.Snapshot{"team-y": y4},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", core.Resources{}, core.Resources{}, "bad")}, map[string]string{}},
		{"created where there was none", quota.Snapshot{"team-x": x},
			quota.Snapshot{"team-x": x, "team-y": y4}, map[string]string{}},
		{"written again the same (a label, a status)", quota.Snapshot{"team-y": y4},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@9", gpus(0), gpus(4), "")}, map[string]string{}},
		{"nothing", quota.Snapshot{"team-y": y4}, quota.Snapshot{"team-y": y4}, map[string]string{}},
		{"two changes at once", quota.Snapshot{"team-y": y4, "team-x": x, "team-z": applied("team-z", "team-z/q@3", gpus(0), gpus(1), "")},
			quota.Snapshot{"team-y": applied("team-y", "team-y/q@2", gpus(1), gpus(4), ""), "team-x": applied("team-x", "team-x/q@6", gpus(2), gpus(9), ""),
				"team-z": applied("team-z", "team-z/q@3", gpus(0), gpus(1), "")},
			map[string]string{"team-y": "team-y/q@2", "team-x": "team-x/q@6, team-y/q@2", "team-z": "team-y/q@2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, quota.Requeues(tc.before, tc.after)); diff != "" {
				t.Errorf("requeues (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSnapNotices: of several ElasticQuotas in a namespace all but the
// first by name are ignored, and a malformed one that applies is invalid:
// each gets a notice saying why (F9: before, only a log line).
func TestSnapNotices(t *testing.T) {
	objs := []*unstructured.Unstructured{
		withRV(elasticQuota("team-x", "q4", map[string]any{"tessera.dev/gpu": "1"}, nil), "14"),
		withRV(elasticQuota("team-x", "q1", map[string]any{"tessera.dev/gpu": "1"}, map[string]any{"tessera.dev/gpu": "4"}), "11"),
		withRV(elasticQuota("team-x", "q9", map[string]any{"tessera.dev/gpu": "lots"}, nil), "19"),
		withRV(elasticQuota("team-b", "bad", map[string]any{"tessera.dev/gpu": "8"}, map[string]any{"tessera.dev/gpu": "4"}), "21"),
	}
	snap, notices := quota.Snap(objs)
	if objs[0].GetName() != "q4" {
		t.Error("Snap sorted its argument")
	}
	if got := snap["team-x"].Object; got != "team-x/q1@11" {
		t.Errorf("team-x governed by %q, want team-x/q1@11", got)
	}
	if got := snap["team-b"]; got.Object != "team-b/bad@21" || got.Quota.Invalid == "" {
		t.Errorf("team-b governed by %+v, want the invalid team-b/bad@21", got)
	}
	got := map[string]string{}
	for _, n := range notices {
		got[n.Object.GetNamespace()+"/"+n.Object.GetName()] = n.Reason + ": " + n.Message
	}
	want := map[string][]string{
		"team-x/q4":  {api.EventQuotaIgnored, "namespace team-x already has an ElasticQuota, q1, which applies"},
		"team-x/q9":  {api.EventQuotaIgnored, "q1, which applies", "it is malformed too", "lots"},
		"team-b/bad": {api.EventQuotaInvalid, "spec.min.tessera.dev/gpu (8) is above spec.max", "namespace team-b admits nothing new under it until it is fixed"},
	}
	if len(got) != len(want) {
		t.Errorf("notices %v, want on %d objects", got, len(want))
	}
	for key, parts := range want {
		for _, p := range parts {
			if !strings.Contains(got[key], p) {
				t.Errorf("notice on %s: %q, want it to say %q", key, got[key], p)
			}
		}
	}
}

func withRV(u *unstructured.Unstructured, rv string) *unstructured.Unstructured {
	u.SetResourceVersion(rv)
	u.SetUID(types.UID("uid-" + u.GetNamespace() + "-" + u.GetName()))
	return u
}

type objects struct {
	mu   sync.Mutex
	objs []*unstructured.Unstructured
}

func (o *objects) Objects() []*unstructured.Unstructured {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*unstructured.Unstructured(nil), o.objs...)
}

func (o *objects) set(objs ...*unstructured.Unstructured) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.objs = objs
}

type recordedEvents struct {
	mu   sync.Mutex
	list []string
}

func (r *recordedEvents) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := obj.(*unstructured.Unstructured)
	r.list = append(r.list, fmt.Sprintf("%s %s/%s %s %s: %s", u.GetKind(), u.GetNamespace(), u.GetName(), typ, reason, fmt.Sprintf(format, args...)))
}

func (r *recordedEvents) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.list
	r.list = nil
	return out
}

// refused is a pending pod of ns asking for n GPUs that kube-scheduler
// marked Unschedulable (the extender's quota refusal).
func refused(ns, name string, n int64) *corev1.Pod {
	p := gpuPod(name, n, "")
	p.Namespace = ns
	p.UID = types.UID("uid-" + ns + "-" + name)
	p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/4 nodes are available: tessera: quota: ... its ElasticQuota max is 4"}}}
	return p
}

func quotaObj(ns, name, rv string, min, max string) *unstructured.Unstructured {
	return withRV(elasticQuota(ns, name, map[string]any{"tessera.dev/gpu": min}, map[string]any{"tessera.dev/gpu": max}), rv)
}

// TestRequeuerWritesOncePerChange: a quota raise writes the requeue
// annotation, through the API, on the namespace's pods kube-scheduler
// found unschedulable and on no other pod; a resync or the same change
// seen again writes nothing; a pod refused just before the change and
// marked unschedulable after it is still written while the change
// settles; a deletion requeues the namespace and the other governed ones.
// The first sync requeues, once, the pods quota refused in every
// namespace (what changed before it is unknown). Warning Events tell on the ignored quota once per change of it.
func TestRequeuerWritesOncePerChange(t *testing.T) {
	ctx := context.Background()
	r5 := refused("team-y", "r5", 1)
	notTried := refused("team-y", "not-tried", 1)
	notTried.Status = corev1.PodStatus{Phase: corev1.PodPending}
	bound := gpuPod("bound", 1, "n1")
	bound.Namespace = "team-y"
	cpuOnly := refused("team-y", "cpu-only", 0)
	cpuOnly.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
	gated := refused("team-y", "gated", 1)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
	x1 := refused("team-x", "x1", 1)
	other := refused("ungoverned", "o1", 1)
	client := fake.NewClientset(r5, notTried, bound, cpuOnly, gated, x1, other)
	var writes []string
	var failWrite error
	now := time.Unix(1000, 0)
	store := &objects{}
	store.set(quotaObj("team-y", "team-y", "1", "0", "4"), quotaObj("team-y", "z-extra", "2", "0", "16"),
		quotaObj("team-x", "q", "3", "2", "8"))
	events := &recordedEvents{}
	r := &quota.Requeuer{
		Store: store,
		Pods:  lister(client),
		Patch: func(ctx context.Context, ns, name string, patch []byte) error {
			if failWrite != nil {
				return failWrite
			}
			writes = append(writes, ns+"/"+name)
			_, err := client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
		Events: events, Rate: 1000, Settle: 10 * time.Second,
		Now: func() time.Time { return now },
	}
	annotation := func(ns, name string) string {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := api.QuotaRequeue(p.Annotations)
		return v
	}
	sync := func(what string, wantWrites ...string) {
		t.Helper()
		writes = nil
		r.Sync(ctx)
		if diff := cmp.Diff(wantWrites, writes); diff != "" {
			t.Errorf("%s: pods written (-want +got):\n%s", what, diff)
		}
	}

	// The first sync does not know what changed before it (the extender
	// restarted): the pods quota refused, in every namespace, once.
	sync("baseline", "ungoverned/o1", "team-y/r5", "team-x/x1")
	if got := annotation("ungoverned", "o1"); !strings.HasPrefix(got, "extender start ") {
		t.Errorf("o1's %s = %q after the first sync, want the start's", api.AnnotationQuotaRequeue, got)
	}
	if got := events.take(); len(got) != 1 || !strings.Contains(got[0], "ElasticQuota team-y/z-extra Warning QuotaIgnored: ignored: namespace team-y already has an ElasticQuota, team-y, which applies") {
		t.Errorf("events at the baseline: %q, want one QuotaIgnored on team-y/z-extra", got)
	}
	sync("a resync")
	if got := events.take(); len(got) != 0 {
		t.Errorf("events told again at a resync: %q", got)
	}

	// F5: team-y's max raised from 4 to 8.
	store.set(quotaObj("team-y", "team-y", "5", "0", "8"), quotaObj("team-y", "z-extra", "2", "0", "16"),
		quotaObj("team-x", "q", "3", "2", "8"))
	sync("the max raised", "team-y/r5")
	if got := annotation("team-y", "r5"); got != "team-y/team-y@5" {
		t.Errorf("r5's %s = %q, want team-y/team-y@5", api.AnnotationQuotaRequeue, got)
	}
	for _, name := range []string{"not-tried", "bound", "cpu-only", "gated"} {
		if got := annotation("team-y", name); got != "" {
			t.Errorf("%s written (%q): it does not wait in kube-scheduler's unschedulable pool", name, got)
		}
	}
	if got := events.take(); len(got) != 0 {
		t.Errorf("events: %q, want none (z-extra unchanged)", got)
	}
	sync("the same change seen again")

	// A pod the old quota refused, marked Unschedulable only now.
	notTried.Status = r5.Status
	if _, err := client.CoreV1().Pods("team-y").UpdateStatus(ctx, notTried, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(5 * time.Second)
	if !r.Pending() {
		t.Fatal("nothing pending while the change settles")
	}
	sync("a pod marked unschedulable while the change settles", "team-y/not-tried")
	now = now.Add(6 * time.Second)
	sync("the change settled")
	if r.Pending() {
		t.Error("still pending after the change settled")
	}

	// The ignored quota changed: told again, once.
	store.set(quotaObj("team-y", "team-y", "5", "0", "8"), quotaObj("team-y", "z-extra", "6", "0", "12"),
		quotaObj("team-x", "q", "3", "2", "8"))
	sync("the ignored quota changed")
	if got := events.take(); len(got) != 1 || !strings.Contains(got[0], "team-y/z-extra Warning QuotaIgnored") {
		t.Errorf("events: %q, want one QuotaIgnored on team-y/z-extra", got)
	}

	// A write that fails is tried again at the next sync.
	store.set(quotaObj("team-y", "z-extra", "6", "0", "12"), quotaObj("team-x", "q", "3", "2", "8"))
	failWrite = errors.New("apiserver unavailable")
	sync("team-y's quota deleted, the API failing")
	failWrite = nil
	now = now.Add(time.Minute)
	// team-y's own quota deleted: z-extra applies now (max 12), a raise;
	// the namespace is still governed, so the others are not requeued.
	sync("the API back", "team-y/not-tried", "team-y/r5")
	if got := annotation("team-y", "r5"); got != "team-y/z-extra@6" {
		t.Errorf("r5's %s = %q, want team-y/z-extra@6", api.AnnotationQuotaRequeue, got)
	}
	if got := events.take(); len(got) != 0 {
		t.Errorf("events: %q, want none (z-extra applies now)", got)
	}
	sync("settled")

	// Every quota of team-y deleted: its pods and team-x's (which may
	// borrow more now) are requeued.
	store.set(quotaObj("team-x", "q", "3", "2", "8"))
	sync("team-y ungoverned", "team-x/x1", "team-y/not-tried", "team-y/r5")
	if got := annotation("team-x", "x1"); got != "team-y/z-extra@6 deleted" {
		t.Errorf("x1's %s = %q, want team-y/z-extra@6 deleted", api.AnnotationQuotaRequeue, got)
	}
	if got := annotation("ungoverned", "o1"); !strings.HasPrefix(got, "extender start ") {
		t.Errorf("a pod of a namespace without a quota requeued for a change: %q", got)
	}
}

// At its first sync (the extender starting) the Requeuer requeues, once,
// only the pods quota refused: a pod unschedulable for want of GPUs is
// left to kube-scheduler's own events.
func TestRequeuerAtStartOnlyQuotaRefusals(t *testing.T) {
	ctx := context.Background()
	byQuota := refused("team-y", "by-quota", 1)
	noRoom := refused("team-y", "no-room", 1)
	noRoom.Status.Conditions[0].Message = "0/4 nodes are available: 4 Insufficient tessera.dev/gpu."
	client := fake.NewClientset(byQuota, noRoom)
	var writes []string
	store := &objects{}
	store.set(quotaObj("team-y", "team-y", "1", "0", "8"))
	now := time.Unix(1000, 0)
	r := &quota.Requeuer{
		Store: store,
		Pods:  lister(client),
		Patch: func(ctx context.Context, ns, name string, patch []byte) error {
			writes = append(writes, ns+"/"+name)
			_, err := client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		},
		Rate: 1000, Now: func() time.Time { return now },
	}
	r.Sync(ctx)
	if diff := cmp.Diff([]string{"team-y/by-quota"}, writes); diff != "" {
		t.Errorf("first sync: pods written (-want +got):\n%s", diff)
	}
	writes = nil
	now = now.Add(time.Second)
	r.Sync(ctx)
	if len(writes) != 0 || r.Pending() {
		t.Errorf("second sync wrote %v (pending %v), want nothing: the start's requeue is one pass", writes, r.Pending())
	}
}

// lister lists a namespace's pods from client, as the informer's lister
// the Requeuer is given does.
func lister(client *fake.Clientset) func(ns string) ([]*corev1.Pod, error) {
	return func(ns string) ([]*corev1.Pod, error) {
		l, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []*corev1.Pod
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		return out, nil
	}
}
