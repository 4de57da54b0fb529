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
	dyn, err := c.Dynamic()
	if err != nil {
		t.Fatal(err)
	}
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
