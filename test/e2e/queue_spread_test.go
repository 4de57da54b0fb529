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

// A slice over several GPUs (tessera.dev/gpu-count) in a namespace a Queue
// serves binds on as many GPUs, as in a namespace no Queue serves, and a
// whole-GPU pod of another namespace binds beside it. On make demo the
// queue planner's plan named one GPU for such a slice: its bind failed
// every time ("its plan put it on GPU ..., which no longer has room", 31
// FailedBinding Events in 5 minutes on an empty a100-1), and every other
// bind to its node waited for it until kube-scheduler's Client.Timeout.
func TestQueuedMultiGPUSliceBinds(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	ns := namespace(t, c, "e2e-queue-spread")
	other := namespace(t, c, "e2e-queue-spread-plain")
	waitReleased(t, c)
	const queue = "e2e-spread"
	q := &api.Queue{Name: queue, Namespaces: []string{ns}, Resources: map[v1.ResourceName]api.QueueResource{
		api.ResourceGPU:       {Guaranteed: 2, Weight: 1},
		api.ResourceGPUMemory: {Guaranteed: 64, Weight: 1},
		api.ResourceGPUCore:   {Guaranteed: 800, Weight: 1},
	}}
	res := dyn.Resource(api.QueueGVR)
	if _, err := res.Create(t.Context(), q.Unstructured(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("Queue %s: %v", queue, err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), queue, metav1.DeleteOptions{}) })
	waitQueuesSeen(t, c, nil, queue)

	for _, tc := range []struct {
		name, node      string
		count           int
		memUnits, cores int64
	}{
		{name: "spread", node: "a100-1", count: 8, memUnits: 8, cores: 8},
		{name: "spread2", node: "a100-2", count: 2, memUnits: 4, cores: 20},
	} {
		p := create(t, client, ns, podSpec{name: tc.name, memUnits: tc.memUnits, cores: tc.cores, node: tc.node,
			annotations: map[string]string{api.AnnotationGPUCount: fmt.Sprint(tc.count)}})
		if !api.HasQueueGate(p) {
			t.Errorf("%s: created without the queue gate: %v", tc.name, p.Spec.SchedulingGates)
		}
	}
	// A whole-GPU pod of a namespace no Queue serves, on spread2's node.
	create(t, client, other, podSpec{name: "whole", gpus: 1, node: "a100-2"})
	for _, tc := range []struct {
		name, node string
		gpus       int
		mib, cores int64
	}{{"spread", "a100-1", 8, 1024, 1}, {"spread2", "a100-2", 2, 2048, 10}} {
		p, _ := waitRunning(t, c, ns, tc.name, 90*time.Second)
		a, ok, err := api.GetAssignment(p.Annotations)
		if !ok || err != nil || len(a.Containers) != 1 || a.Containers[0].Shared == nil {
			t.Fatalf("%s: assignment %+v (%v, %v)", tc.name, a, ok, err)
		}
		s := a.Containers[0].Shared
		if p.Spec.NodeName != tc.node || len(s.GPUs()) != tc.gpus || s.MemoryMiB != tc.mib || s.Cores != tc.cores {
			t.Errorf("%s: on %s, slice %+v; want %d GPUs of %s with %d MiB and %d%% each", tc.name, p.Spec.NodeName, s, tc.gpus, tc.node, tc.mib, tc.cores)
		}
		if plan, ok, err := api.GetGangPlan(p.Annotations); ok && err == nil && len(plan.SliceGPUs()) != tc.gpus {
			t.Errorf("%s: its plan names GPUs %s, want %d", tc.name, plan.GPUsText(), tc.gpus)
		}
	}
	waitRunning(t, c, other, "whole", 60*time.Second)
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
