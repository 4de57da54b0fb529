package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
)

// A team's high-tier pod displaces the team's own lower tiers when its
// Queue is at its limit: the queue (limit 4) runs four notebook-tier 1-GPU
// pods on l40s-1; an inference-tier 2-GPU pod of the same namespace, on
// that node, is refused by the queue ("above its limit 4") and then
// admitted by evicting exactly two of the notebooks. Before, it waited for
// ever behind them (the same pods in a namespace no Queue serves
// preempted).
func TestQueuedHighTierPreemptsItsOwnQueue(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	priorityClasses(t, client)
	const node = "l40s-1"
	ns := namespace(t, c, "e2e-own-tiers")
	waitReleased(t, c)
	q := &api.Queue{Name: "e2e-own-tiers", Namespaces: []string{ns}, Resources: map[v1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: 2, Limit: 4, Limited: true, Weight: 1},
	}}
	res := dyn.Resource(api.QueueGVR)
	if _, err := res.Create(t.Context(), q.Unstructured(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), q.Name, metav1.DeleteOptions{}) })
	waitQueuesSeen(t, c, nil, q.Name)
	var notebooks []string
	for i := range 4 {
		s := podSpec{name: fmt.Sprintf("nb-%d", i), gpus: 1, node: node}
		createTier(t, client, ns, tierNotebook, s)
		notebooks = append(notebooks, s.name)
	}
	for _, n := range notebooks {
		waitRunning(t, c, ns, n, 90*time.Second)
	}
	start := time.Now()
	createTier(t, client, ns, tierInference, podSpec{name: "urgent", gpus: 2, node: node})
	p, _ := waitRunning(t, c, ns, "urgent", 60*time.Second)
	t.Logf("the queue's inference pod Running on %s %s after creation", p.Spec.NodeName, time.Since(start).Round(time.Millisecond))
	if g := gone(t, client, ns, notebooks); len(g) != 2 {
		t.Errorf("evicted %v, want exactly two of the queue's notebooks", g)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// The same with an ElasticQuota (min = max 4): four notebook-tier 1-GPU
// pods fill the namespace's max, two on l40s-1 (of its 4 GPUs) and two on
// v100-1; an inference-tier 2-GPU pod of the namespace for l40s-1 has room
// there but not in its quota, and evicts exactly two of the notebooks
// (Tessera's preemptor: kube-scheduler's dry run offers no victims where
// the room is, which the preempt verb must refuse for the quota). It waited
// for ever before ("namespace uses 4, its ElasticQuota max is 4 ...
// preemption: no candidate node for preemption").
func TestHighTierPreemptsItsOwnNamespaceAtItsQuotaMax(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	priorityClasses(t, client)
	ns := namespace(t, c, "e2e-own-quota")
	waitReleased(t, c)
	elasticQuota(t, c, ns, api.ResourceGPU, 4, 4)
	time.Sleep(time.Second) // the extender's informer sees the quota
	var notebooks []string
	for i, node := range []string{"l40s-1", "l40s-1", "v100-1", "v100-1"} {
		s := podSpec{name: fmt.Sprintf("nb-%d", i), gpus: 1, node: node}
		createTier(t, client, ns, tierNotebook, s)
		notebooks = append(notebooks, s.name)
	}
	for _, n := range notebooks {
		waitRunning(t, c, ns, n, 90*time.Second)
	}
	start := time.Now()
	createTier(t, client, ns, tierInference, podSpec{name: "urgent", gpus: 2, node: "l40s-1"})
	p, _ := waitRunning(t, c, ns, "urgent", 60*time.Second)
	t.Logf("the namespace's inference pod Running on %s %s after creation", p.Spec.NodeName, time.Since(start).Round(time.Millisecond))
	if g := gone(t, client, ns, notebooks); len(g) != 2 {
		t.Errorf("evicted %v, want exactly two of the namespace's notebooks", g)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
