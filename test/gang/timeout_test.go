package gang_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

// TestGangPlanExpiresAndReleasesItsReservation: PodGroup t (minMember 2,
// scheduleTimeoutSeconds 5) on two 8-GPU nodes. Both members are planned
// and lose the gang gate, but member t-1 is also held by a gate of
// someone else, so it never binds: the gang misses a member. While the
// plan holds, t-1's planned node is reserved: a plain 8-GPU pod pinned to
// that node stays pending though kube-scheduler sees the node free. After
// the timeout the planner releases the plan: a GangTimeout event on every
// member, every member evicted (t-1 goes at once; t-0, bound, terminates
// and the test finishes that as the kubelet would) and the plain pod binds
// to the node that was reserved.
//
// The test deletes t-0 before it expects the plain pod to bind because
// kube-scheduler only retries a pod the extender rejected on a cluster
// event: the eviction of unbound members and the deletionTimestamp of
// bound ones are none (AssignedPodUpdated moves only pods with
// cross-topology terms), so without a kubelet finishing a bound member the
// retry would come from the 5-minute unschedulable flush.
func TestGangPlanExpiresAndReleasesItsReservation(t *testing.T) {
	// Long enough that "other" below is created and found pending (by
	// kube-scheduler and the extender, on a loaded CI machine) while the
	// plan still holds.
	const timeout = 10 * time.Second
	e := start(t)
	e.InstallSchedulerPluginsCRDs(t)
	w := e.WatchPods(t)
	for _, n := range []string{"n0", "n1"} {
		e.CreateNode(t, h100Node(n, nil))
	}
	e.CreatePodGroup(t, ns, "t", 2, int(timeout/time.Second))
	member := func(name string) extenderenv.PodSpec {
		return extenderenv.PodSpec{Name: name, GPUs: 8, Labels: map[string]string{api.LabelPodGroup: "t"}, Gated: true}
	}
	e.CreatePod(t, member("t-0"))
	held := member("t-1").Pod()
	held.Spec.SchedulingGates = append(held.Spec.SchedulingGates, v1.PodSchedulingGate{Name: "example.com/hold"})
	if _, err := e.Client.CoreV1().Pods(ns).Create(t.Context(), held, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	bound0 := e.WaitBound(t, ns, "t-0", 30*time.Second)
	plannedAt := time.Now()
	p1 := e.GetPod(t, ns, "t-1")
	plan1, ok, err := api.GetGangPlan(p1.Annotations)
	if !ok || err != nil {
		t.Fatalf("t-1 has no plan (ok %v, err %v); events:\n%s", ok, err, e.Events(t, ns, "t-1"))
	}
	if api.HasGangGate(p1) || len(p1.Spec.SchedulingGates) != 1 || p1.Spec.NodeName != "" {
		t.Fatalf("t-1: gates %v, node %q; want only example.com/hold left, unbound", p1.Spec.SchedulingGates, p1.Spec.NodeName)
	}
	if plan1.Node == bound0.Spec.NodeName {
		t.Fatalf("both members planned on %s", plan1.Node)
	}
	t.Logf("t-0 bound to %s, t-1 planned on %s (plan expires %s), held by example.com/hold", bound0.Spec.NodeName, plan1.Node, plan1.Expires.Format(time.RFC3339))

	// The reservation holds t-1's node.
	e.CreatePod(t, extenderenv.PodSpec{Name: "other", GPUs: 8, Selector: map[string]string{v1.LabelHostname: plan1.Node}})
	e.WaitPendingWith(t, ns, "other", "tessera", 10*time.Second)
	t.Logf("while the plan holds: %s", strings.TrimSpace(e.Events(t, ns, "other")))

	ev := e.WaitEvent(t, ns, "t-0", "GangTimeout", fmt.Sprintf("plan expired after %s with 1 of 2 planned members unbound (t-1)", timeout), 3*timeout)
	timedOutAt := time.Now()
	t.Logf("%s after t-0 bound: %s", timedOutAt.Sub(plannedAt).Round(100*time.Millisecond), strings.TrimSpace(ev))
	// The plan expires scheduleTimeoutSeconds after planning (truncated to
	// the second), and is not released before.
	if d := plan1.Expires.Sub(plannedAt); d > timeout {
		t.Errorf("plan expires %s after t-0 bound, want within the %s timeout", d, timeout)
	}
	if timedOutAt.Before(plan1.Expires) {
		t.Errorf("GangTimeout seen at %s, before the plan expired at %s", timedOutAt.Format(time.StampMilli), plan1.Expires.Format(time.StampMilli))
	}
	e.WaitEvent(t, ns, "t-1", "GangTimeout", "evicting all 2 members", 5*time.Second)
	for _, b := range w.BindsOf(ns, "other") {
		if b.At.Before(timedOutAt.Add(-time.Second)) {
			t.Errorf("other bound at %s, before the plan expired (%s)", b.At.Format(time.StampMilli), timedOutAt.Format(time.StampMilli))
		}
	}

	// t-1, never bound, is gone; t-0 is terminating (no kubelet finishes it).
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().Pods(ns).Get(ctx, "t-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("t-1 not evicted: %v", err)
	}
	if p := e.GetPod(t, ns, "t-0"); p.DeletionTimestamp == nil {
		t.Errorf("t-0 not evicted")
	}
	if b := w.BindsOf(ns, "other"); len(b) != 0 {
		t.Errorf("other bound before t-0 was gone: %+v", b)
	}
	e.DeletePod(t, ns, "t-0") // the kubelet finishes the eviction
	// The capacity is free: the plain pod binds to the node t-1 had.
	other := e.WaitBound(t, ns, "other", 30*time.Second)
	t.Logf("other bound to %s %s after the timeout", other.Spec.NodeName, time.Since(timedOutAt).Round(100*time.Millisecond))
	if other.Spec.NodeName != plan1.Node {
		t.Errorf("other bound to %s, want %s (t-1's released node)", other.Spec.NodeName, plan1.Node)
	}
	// No member of gang t was bound but t-0, once.
	for _, b := range w.BindsOf(ns, "t-") {
		if b.Name != "t-0" {
			t.Errorf("gang member %s bound to %s", b.Name, b.Node)
		}
	}
}
