package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

func elasticQuota(t *testing.T, c *nodesim.Cluster, ns string, resource v1.ResourceName, min, max int64) {
	t.Helper()
	dyn := dynamicClient(t, c)
	eq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": "quota", "namespace": ns},
		"spec": map[string]any{
			"min": map[string]any{string(resource): fmt.Sprint(min)},
			"max": map[string]any{string(resource): fmt.Sprint(max)},
		},
	}}
	if _, err := dyn.Resource(nodesim.ElasticQuotaGVR).Namespace(ns).Create(t.Context(), eq, metav1.CreateOptions{}); err != nil {
		t.Fatalf("ElasticQuota in %s (is deploy/crds installed?): %v", ns, err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(nodesim.ElasticQuotaGVR).Namespace(ns).Delete(context.Background(), "quota", metav1.DeleteOptions{})
	})
}

// countPhases counts a namespace's pods: Running, and unbound (waiting).
func countPhases(t *testing.T, c *nodesim.Cluster, ns string) (running, waiting, failed int) {
	t.Helper()
	l, err := c.Client().CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		switch {
		case p.DeletionTimestamp != nil:
		case p.Status.Phase == v1.PodRunning:
			running++
		case p.Status.Phase == v1.PodFailed:
			failed++
		case p.Spec.NodeName == "":
			waiting++
		}
	}
	return
}

// waitingPods describes a namespace's unbound pods, for a failure message:
// each pod's gates, plan, pinned node, PodScheduled condition and last
// Events, so that a pod left waiting can be told from the logs.
func waitingPods(t *testing.T, c *nodesim.Cluster, ns string) string {
	t.Helper()
	ctx := context.Background()
	l, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("listing pods: %v", err)
	}
	var out []string
	for _, p := range l.Items {
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s (uid %s): gates %v, plan %q", p.Name, p.UID, p.Spec.SchedulingGates, p.Annotations[api.AnnotationGangPlan])
		if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				fmt.Fprintf(&b, ", pinned %v", term.MatchFields)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled {
				fmt.Fprintf(&b, ", PodScheduled %s %s: %s", cond.Status, cond.Reason, cond.Message)
			}
		}
		evs, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
		if err == nil {
			items := evs.Items
			for _, e := range items[max(0, len(items)-4):] {
				fmt.Fprintf(&b, "; event %s: %s", e.Reason, e.Message)
			}
		}
		out = append(out, b.String())
	}
	if len(out) == 0 {
		return "no pod waits"
	}
	return strings.Join(out, "\n")
}

// Quota: a namespace never goes above its max; a namespace borrows idle
// GPUs beyond its min; a namespace asking for room within its min gets it
// back by eviction of the borrower's pods beyond the borrower's own min.
func TestQuotaMaxBorrowReclaim(t *testing.T) {
	c := getCluster(t)
	client := c.Client()

	// Max: 12 units of GPU memory; the second 8-unit pod waits for quota.
	nsMax := namespace(t, c, "e2e-quota-max")
	elasticQuota(t, c, nsMax, api.ResourceGPUMemory, 4, 12)
	time.Sleep(time.Second) // the extender's informer sees the quota
	create(t, client, nsMax, podSpec{name: "nb-0", memUnits: 8, cores: 10})
	waitRunning(t, c, nsMax, "nb-0", 60*time.Second)
	create(t, client, nsMax, podSpec{name: "nb-1", memUnits: 8, cores: 10})
	var msg string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := getPod(t, client, nsMax, "nb-1")
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("bound to %s above the quota's max", p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
				msg = cond.Message
			}
		}
		return strings.Contains(strings.ToLower(msg), "quota"), nil
	})
	if err != nil {
		t.Errorf("nb-1 (8 more units over a max of 12) should wait for quota: %v (PodScheduled: %q)", err, msg)
	}

	// Borrow: team-a (min 4, max 28 GPUs) runs 10 one-GPU pods on an idle
	// cluster.
	nsA := namespace(t, c, "e2e-quota-a")
	nsB := namespace(t, c, "e2e-quota-b")
	elasticQuota(t, c, nsA, api.ResourceGPU, 4, 28)
	elasticQuota(t, c, nsB, api.ResourceGPU, 20, 28)
	time.Sleep(time.Second)
	for i := range 10 {
		create(t, client, nsA, podSpec{name: fmt.Sprintf("a-%d", i), gpus: 1})
	}
	for i := range 10 {
		waitRunning(t, c, nsA, fmt.Sprintf("a-%d", i), 60*time.Second)
	}
	// Reclaim: team-b asks for 20 (its min) while 18 GPUs are free: pods
	// of team-a beyond its min are evicted until team-b fits.
	for i := range 20 {
		create(t, client, nsB, podSpec{name: fmt.Sprintf("b-%d", i), gpus: 1})
	}
	var ra, rb, wa, wb, fa, fb int
	err = wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		ra, wa, fa = countPhases(t, c, nsA)
		rb, wb, fb = countPhases(t, c, nsB)
		return rb == 20, nil
	})
	t.Logf("team-a: %d Running, %d waiting, %d Failed; team-b: %d Running, %d waiting, %d Failed", ra, wa, fa, rb, wb, fb)
	if err != nil {
		t.Errorf("team-b did not get its min of 20 GPUs back: %v", err)
	}
	if ra < 4 {
		t.Errorf("team-a runs %d pods, below its min of 4", ra)
	}
	if ra > 8 {
		t.Errorf("team-a still runs %d pods: only 8 GPUs are left beside team-b's 20", ra)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// ElasticQuota reclaim for a gang that must share a node, from a
// Deployment whose controller replaces each evicted pod at once (the
// replacements are not gated: they are no gang members): the gang's plan
// holds the freed node before the victims are evicted, so exactly one
// node's 8 pods are reclaimed. Before, the replacements were bound into
// the freed room and reclaimed again (make demo: 11 evictions for 8 GPUs).
func TestQuotaReclaimForAGangOfDeploymentVictims(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	waitReleased(t, c)
	nsA := namespace(t, c, "e2e-quota-dep-a")
	nsB := namespace(t, c, "e2e-quota-dep-b")
	elasticQuota(t, c, nsA, api.ResourceGPU, 4, 16)
	elasticQuota(t, c, nsB, api.ResourceGPU, 8, 16)
	time.Sleep(time.Second) // the extender's informer sees the quotas
	a100Deployment(t, client, nsA, "borrowers", 16, "", podSpec{gpus: 1})
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		running, _, _ := countPhases(t, c, nsA)
		return running == 16, nil
	}); err != nil {
		running, waiting, _ := countPhases(t, c, nsA)
		t.Fatalf("the Deployment's 16 pods do not all run on a100-1 and a100-2: %v (%d Running, %d waiting)", err, running, waiting)
	}

	nodeGangOnA100s(t, c, nsB, "b", "")
	// Give further rounds of reclaim, had there been any, time to show.
	time.Sleep(5 * time.Second)
	if reclaimed := eventedPods(t, client, nsA, api.EventReclaimed); len(reclaimed) != 8 {
		t.Errorf("reclaimed %d pods of the Deployment, want the 8 of one node: %v", len(reclaimed), reclaimed)
	}
	running, waiting, _ := countPhases(t, c, nsA)
	if running != 8 || waiting != 8 {
		t.Errorf("after the reclaim the Deployment has %d pods Running and %d waiting; want 8 and 8 (its replacements wait)", running, waiting)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
