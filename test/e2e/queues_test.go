package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// createQueue creates a Queue (deleted at the end of the test) with a
// guarantee of whole GPUs and, when usage > 0, a usage history of that
// many GPU-seconds written now, as the extender would have.
func createQueue(t *testing.T, dyn dynamic.Interface, name, parent string, namespaces []string, guaranteed int64, usage float64) {
	t.Helper()
	q := &api.Queue{Name: name, Parent: parent, Namespaces: namespaces, Resources: map[v1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: guaranteed, Weight: 1},
	}}
	res := dyn.Resource(api.QueueGVR)
	u, err := res.Create(t.Context(), q.Unstructured(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Queue %s (is deploy/crds installed?): %v", name, err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if usage > 0 {
		st := api.QueueStatus{Usage: map[v1.ResourceName]float64{api.ResourceGPU: usage}, UsageUpdated: time.Now().UTC()}
		u.Object["status"] = st.Object()
		if _, err := res.UpdateStatus(t.Context(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("Queue %s status: %v", name, err)
		}
	}
}

// waitQueuesSeen waits up to 30 s until the extender's /status/queues lists
// every named Queue, valid and, when ok is not nil, satisfying ok: the
// extender reads Queues through an informer, and a pod created before it
// saw its namespace's Queue is not held by the queue gate.
func waitQueuesSeen(t *testing.T, c *nodesim.Cluster, ok func(extender.QueueView) bool, names ...string) {
	t.Helper()
	last, err := waitStatus(t, c, extender.StatusQueuesPath, func(views []extender.QueueView) bool {
		for _, name := range names {
			i := slices.IndexFunc(views, func(v extender.QueueView) bool { return v.Name == name })
			if i < 0 || views[i].Invalid != "" || (ok != nil && !ok(views[i])) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the extender does not show the Queues %v: %v\nlast %s: %s", names, err, extender.StatusQueuesPath, last)
	}
}

// clusterGPUs lists the cluster's nodes and counts their whole GPUs.
func clusterGPUs(t *testing.T, client kubernetes.Interface) ([]v1.Node, int64) {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var gpus int64
	for _, n := range nodes.Items {
		q := n.Status.Capacity[api.ResourceGPU]
		gpus += q.Value()
	}
	return nodes.Items, gpus
}

// Fair share by usage history: two teams with equal guarantees (2 GPUs)
// each submit as many one-GPU pods as the cluster has GPUs while the
// cluster is full; team-a has used 6 GPUs on average lately (its history
// in its Queue's status), team-b nothing. When the room is freed, team-b's
// pods go first, until its share (use plus recent history over its
// guarantee) reaches team-a's; from then on the two alternate. So team-b
// ends with about 6 GPUs more than team-a, team-a with at least its
// guarantee, and what waits, waits behind the queue gate with the reason.
// Their fair shares, while both wait, are tilted by the same history:
// team-a's is below team-b's.
func TestQueuesFairShareByHistory(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	nsA := namespace(t, c, "e2e-queue-a")
	nsB := namespace(t, c, "e2e-queue-b")
	nsFull := namespace(t, c, "e2e-queue-full")
	waitReleased(t, c)
	// The cluster is full: one pod per node holds all its GPUs.
	nodes, gpus := clusterGPUs(t, client)
	for _, n := range nodes {
		q := n.Status.Capacity[api.ResourceGPU]
		create(t, client, nsFull, podSpec{name: "full-" + n.Name, gpus: q.Value(), node: n.Name})
	}
	for _, n := range nodes {
		waitRunning(t, c, nsFull, "full-"+n.Name, 90*time.Second)
	}
	// 6 GPUs on average lately: 6·h/ln 2 GPU-seconds at the extender's
	// half-life (24h by default).
	createQueue(t, dyn, "e2e-team-a", "", []string{nsA}, 2, 6*86400/math.Ln2)
	createQueue(t, dyn, "e2e-team-b", "", []string{nsB}, 2, 0)
	waitQueuesSeen(t, c, func(v extender.QueueView) bool { return v.Share > 0 }, "e2e-team-a")
	waitQueuesSeen(t, c, nil, "e2e-team-b")
	for i := range gpus {
		create(t, client, nsA, podSpec{name: fmt.Sprintf("a-%d", i), gpus: 1})
		create(t, client, nsB, podSpec{name: fmt.Sprintf("b-%d", i), gpus: 1})
	}
	for _, p := range []*v1.Pod{getPod(t, client, nsA, "a-0"), getPod(t, client, nsB, "b-0")} {
		if !api.HasQueueGate(p) {
			t.Errorf("pod %s of a queued namespace is not held by the queue gate: %v", p.Name, p.Spec.SchedulingGates)
		}
	}
	// Time-based fair share (--queue-history-weight, 1 by default): what
	// is lent beyond the guarantees is tilted by recent borrowing, so
	// while both wait team-a's fair share (it borrowed 4 lately) is below
	// team-b's; by weight alone they were equal.
	var fa, fb int64
	last, err := waitStatus(t, c, extender.StatusQueuesPath, func(views []extender.QueueView) bool {
		for _, v := range views {
			switch v.Name {
			case "e2e-team-a":
				fa = v.FairShare[api.ResourceGPU]
			case "e2e-team-b":
				fb = v.FairShare[api.ResourceGPU]
			}
		}
		return fa >= 2 && fb > fa && fa+fb == gpus
	})
	t.Logf("fair shares while both wait: team-a %d, team-b %d of %d GPUs", fa, fb, gpus)
	if err != nil {
		t.Errorf("team-a's fair share %d is not below team-b's %d (their history does not tilt what is lent): %v\nlast %s", fa, fb, err, last)
	}
	if err := client.CoreV1().Pods(nsFull).DeleteCollection(t.Context(), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	var ra, rb, wa, wb int
	err = wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		ra, wa, _ = countPhases(t, c, nsA)
		rb, wb, _ = countPhases(t, c, nsB)
		return int64(ra+rb) == gpus, nil
	})
	t.Logf("cluster %d GPUs; team-a (history of 6 GPUs): %d Running, %d waiting; team-b (none): %d Running, %d waiting", gpus, ra, wa, rb, wb)
	if err != nil {
		t.Fatalf("the teams do not fill the cluster: %v\nwaiting in %s:\n%s\nwaiting in %s:\n%s", err, nsA, waitingPods(t, c, nsA), nsB, waitingPods(t, c, nsB))
	}
	if ra < 2 {
		t.Errorf("team-a runs %d, below its guarantee 2", ra)
	}
	if d := rb - ra; d < 4 || d > 8 {
		t.Errorf("team-b runs %d more than team-a, want about 6 (team-a's recent history)", d)
	}
	// Every pod of either team still waiting waits behind the queue gate,
	// and each team's pods started in its queue's order: creation time,
	// then name (the pods were created within a second or two, so a-27
	// may run before a-3), no waiting pod before a running one.
	for _, ns := range []string{nsA, nsB} {
		l, err := client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := func(a, b *v1.Pod) bool {
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return a.Name < b.Name
		}
		var lastRunning, firstWaiting *v1.Pod
		for i := range l.Items {
			p := &l.Items[i]
			switch {
			case p.DeletionTimestamp != nil:
			case p.Spec.NodeName == "":
				if !api.HasQueueGate(p) {
					t.Errorf("waiting pod %s/%s is not held by the queue gate: %v", ns, p.Name, p.Spec.SchedulingGates)
				}
				if firstWaiting == nil || before(p, firstWaiting) {
					firstWaiting = p
				}
			default:
				if lastRunning == nil || before(lastRunning, p) {
					lastRunning = p
				}
			}
		}
		if lastRunning != nil && firstWaiting != nil && before(firstWaiting, lastRunning) {
			t.Errorf("queue order broken in %s: %s (created %s) waits while %s (created %s) runs", ns,
				firstWaiting.Name, firstWaiting.CreationTimestamp.UTC().Format(time.RFC3339), lastRunning.Name, lastRunning.CreationTimestamp.UTC().Format(time.RFC3339))
		}
	}
	// The extender writes the queues' status: used, and the history kept.
	err = wait.PollUntilContextTimeout(t.Context(), time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(api.QueueGVR).Get(ctx, "e2e-team-a", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st, err := api.QueueStatusFromUnstructured(u)
		return err == nil && st.Used[api.ResourceGPU] == int64(ra) && st.Usage[api.ResourceGPU] > 5*86400/math.Ln2, nil
	})
	if err != nil {
		u, _ := dyn.Resource(api.QueueGVR).Get(t.Context(), "e2e-team-a", metav1.GetOptions{})
		var status any
		if u != nil {
			status, _, _ = unstructured.NestedFieldNoCopy(u.Object, "status")
		}
		t.Errorf("Queue e2e-team-a status does not show used %d and its history: %v (status %v)", ra, err, status)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// A gang created without the scheduling gate (kube-system, which the
// webhook leaves out, stands for a cluster without the webhook or one
// that failed open) never has a member bound alone: members wait until
// all three exist, then run together.
func TestUngatedGangNeverBoundAlone(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	const ns = "kube-system"
	names := []string{"ungated-0", "ungated-1", "ungated-2"}
	t.Cleanup(func() {
		for _, n := range names {
			_ = client.CoreV1().Pods(ns).Delete(context.Background(), n, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	})
	// kube-controller-manager makes kube-system's default ServiceAccount;
	// a cluster of this suite without it has none.
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	member := func(i int) podSpec {
		return podSpec{name: names[i], gpus: 1, annotations: map[string]string{api.AnnotationGang: "ungated", api.AnnotationGangMinMember: "3"}}
	}
	for i := range 2 {
		if p := create(t, client, ns, member(i)); len(p.Spec.SchedulingGates) != 0 {
			t.Fatalf("pod %s was gated (%v): the test needs an ungated gang", p.Name, p.Spec.SchedulingGates)
		}
	}
	// Two of three members exist: give kube-scheduler every chance.
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		for i := range 2 {
			if p := getPod(t, client, ns, names[i]); p.Spec.NodeName != "" {
				t.Fatalf("member %s bound to %s while its gang has 2 of 3 members", p.Name, p.Spec.NodeName)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	create(t, client, ns, member(2))
	for _, n := range names {
		waitRunning(t, c, ns, n, 90*time.Second)
	}
}

// A two-level hierarchy (dept-1/team-a, dept-2/team-b, 8 GPUs guaranteed
// to each) lends across departments and reclaims to guarantees: team-b
// fills the whole cluster and has more pods waiting; team-a then asks for
// its guarantee on one node (a nodeSelector). Exactly 8 of team-b's pods
// are evicted, all on that node, each freed GPU goes to team-a (none to
// team-b's waiting pods), and team-b keeps at least its guarantee.
func TestQueueHierarchyLendsAndReclaims(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	nsA := namespace(t, c, "e2e-hier-a")
	nsB := namespace(t, c, "e2e-hier-b")
	waitReleased(t, c)
	const node = "a100-1"
	_, gpus := clusterGPUs(t, client)
	createQueue(t, dyn, "e2e-dept-1", "", nil, 8, 0)
	createQueue(t, dyn, "e2e-hier-team-a", "e2e-dept-1", []string{nsA}, 8, 0)
	createQueue(t, dyn, "e2e-dept-2", "", nil, 8, 0)
	createQueue(t, dyn, "e2e-hier-team-b", "e2e-dept-2", []string{nsB}, 8, 0)
	waitQueuesSeen(t, c, nil, "e2e-dept-1", "e2e-hier-team-a", "e2e-dept-2", "e2e-hier-team-b")
	for i := range gpus + 4 {
		create(t, client, nsB, podSpec{name: fmt.Sprintf("b-%d", i), gpus: 1})
	}
	var rb, wb int
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		rb, wb, _ = countPhases(t, c, nsB)
		return int64(rb) == gpus, nil
	})
	if err != nil {
		t.Fatalf("team-b borrows the cluster: %d Running of %d, %d waiting: %v\nwaiting:\n%s", rb, gpus, wb, err, waitingPods(t, c, nsB))
	}
	onNode := map[string]bool{}
	pods, _ := client.CoreV1().Pods(nsB).List(t.Context(), metav1.ListOptions{})
	for _, p := range pods.Items {
		onNode[p.Name] = p.Spec.NodeName == node
	}
	start := time.Now()
	for i := range 8 {
		create(t, client, nsA, podSpec{name: fmt.Sprintf("a-%d", i), gpus: 1, node: node})
	}
	for i := range 8 {
		waitRunning(t, c, nsA, fmt.Sprintf("a-%d", i), 2*time.Minute)
	}
	t.Logf("team-a's guarantee of 8 GPUs on %s Running %s after its pods were created", node, time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // a useless eviction would show by now
	after, _ := client.CoreV1().Pods(nsB).List(t.Context(), metav1.ListOptions{})
	left := map[string]bool{}
	running := 0
	for _, p := range after.Items {
		left[p.Name] = true
		if p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
			running++
		}
	}
	var evicted []string
	for name := range onNode {
		if !left[name] {
			evicted = append(evicted, name)
			if !onNode[name] {
				t.Errorf("evicted %s, which did not run on %s: its GPU cannot serve team-a", name, node)
			}
		}
	}
	if len(evicted) != 8 {
		t.Errorf("evicted %d of team-b's pods (%v), want exactly 8", len(evicted), evicted)
	}
	if int64(running) != gpus-8 {
		t.Errorf("team-b runs %d pods, want %d: a freed GPU went to team-b's waiting pods, or more were evicted", running, gpus-8)
	}
	occ, all := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, all)
}

// A team within its guarantee takes it back from its sibling team, which
// borrows the rest of their department's guarantee (here the whole
// cluster) with a Job: admission counts the sibling's borrowing as
// reclaimable, exactly one node's 8 Job pods are evicted for the team's
// gang of 2 x 4 GPUs that must share a node, and the evicted pods end
// terminal. On make demo the team waited for ever: admission refused it
// ("the queues would use 36 of the cluster's 28"); then, admitted, it
// still waited, as the evicted Job pods stayed Running and Terminating
// (the simulated kubelet did not move a deleted pod to a terminal phase,
// and a Job's pods carry a finalizer).
func TestQueueTeamTakesItsGuaranteeBackWithinItsDepartment(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	nsA := namespace(t, c, "e2e-dept-team-a")
	nsB := namespace(t, c, "e2e-dept-team-b")
	waitReleased(t, c)
	_, gpus := clusterGPUs(t, client)
	createQueue(t, dyn, "e2e-dept", "", nil, gpus, 0)
	createQueue(t, dyn, "e2e-dept-team-a", "e2e-dept", []string{nsA}, 8, 0)
	createQueue(t, dyn, "e2e-dept-team-b", "e2e-dept", []string{nsB}, gpus-8, 0)
	waitQueuesSeen(t, c, nil, "e2e-dept", "e2e-dept-team-a", "e2e-dept-team-b")
	t.Cleanup(func() {
		bg := metav1.DeletePropagationBackground
		_ = client.BatchV1().Jobs(nsB).Delete(context.Background(), "train", metav1.DeleteOptions{PropagationPolicy: &bg})
	})
	n := int32(gpus)
	tmpl := podSpec{gpus: 1}.pod(nsB)
	tmpl.Spec.RestartPolicy = v1.RestartPolicyNever
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: nsB},
		Spec: batchv1.JobSpec{Parallelism: &n, Completions: &n, BackoffLimit: new(int32(1000)),
			Template: v1.PodTemplateSpec{Spec: tmpl.Spec}}}
	if _, err := client.BatchV1().Jobs(nsB).Create(t.Context(), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var rb, wb int
	if err := wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		rb, wb, _ = countPhases(t, c, nsB)
		return int64(rb) == gpus, nil
	}); err != nil {
		t.Fatalf("team-b's Job borrows the cluster: %d Running of %d, %d waiting: %v\nwaiting:\n%s", rb, gpus, wb, err, waitingPods(t, c, nsB))
	}
	nodeGangOnA100s(t, c, nsA, "a", "")
	time.Sleep(3 * time.Second) // a further round of reclaim would show by now
	if reclaimed := eventedPods(t, client, nsB, api.EventReclaimed); len(reclaimed) != 8 {
		t.Errorf("reclaimed %d of team-b's Job pods, want the 8 of one node: %v", len(reclaimed), reclaimed)
	}
	// The evicted pods are terminal (the kubelet's phase). They may stay
	// Terminating a while longer: kube-controller-manager v1.34.2's Job
	// controller keeps their finalizer until its pod-failure backoff
	// elapses (kubernetes/kubernetes#139428, fixed in later patch
	// releases); neither kube-scheduler nor Tessera counts a Failed pod.
	var stuck []string
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods(nsB).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		stuck = nil
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil && p.Status.Phase != v1.PodFailed && p.Status.Phase != v1.PodSucceeded {
				stuck = append(stuck, fmt.Sprintf("%s (%s on %s)", p.Name, p.Status.Phase, p.Spec.NodeName))
			}
		}
		return len(stuck) == 0, nil
	}); err != nil {
		t.Errorf("evicted Job pods not terminal: %v: %v", err, stuck)
	}
	occ, all := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, all)
}
