package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// TestMIGPods runs its own cluster: a dgx-a100-mig node (GPUs 0-1 in 7 ×
// 1g.5gb, 2-3 in 3g.20gb + 2g.10gb + 1g.5gb, 4-7 whole) and a dgx-a100
// without MIG. Pods of two profiles run on the MIG node with exactly their
// instance injected (its MIG UUID visible, no GPU's UUID, no other
// instance), the node agent records the instances in their assignments,
// a pod asking more 3g.20gb instances than are free waits, and a whole-GPU
// pod still gets whole GPUs, never one in MIG mode.
func TestMIGPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const ns = "mig"
	c := ownCluster(ctx, t, ns, []nodesim.NodeSpec{{Name: "mig-1", Profile: "dgx-a100-mig"}, {Name: "plain-1", Profile: "dgx-a100"}})

	inv := inventory(t, c, "mig-1")
	instances := map[string]string{} // MIG UUID -> profile
	gpuOf := map[string]string{}     // MIG UUID -> GPU UUID
	for _, g := range inv.GPUs {
		if g.MIG == nil {
			continue
		}
		for _, in := range g.MIG.Instances {
			instances[in.UUID], gpuOf[in.UUID] = in.Profile, g.UUID
		}
	}
	if len(instances) != 20 {
		t.Fatalf("mig-1 lists %d MIG instances, want 20 (2 × 7 + 2 × 3)", len(instances))
	}

	migPod := func(name, profile string, n int64) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []v1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.MIGResource(profile): *resource.NewQuantity(n, resource.DecimalSI)}}}}},
		}
	}
	for _, p := range []struct{ name, profile string }{{"small", "1g.5gb"}, {"medium", "3g.20gb"}} {
		mustCreate(t, c, migPod(p.name, p.profile, 1))
		pod, rec := waitRunning(t, c, ns, p.name, time.Minute)
		if pod.Spec.NodeName != "mig-1" {
			t.Fatalf("%s runs on %s, want mig-1", p.name, pod.Spec.NodeName)
		}
		ctr := rec.Containers[0]
		got := ctr.Allocated[string(api.MIGResource(p.profile))]
		if len(got) != 1 || instances[got[0]] != p.profile {
			t.Fatalf("%s: allocated %v, want one %s instance of mig-1", p.name, ctr.Allocated, p.profile)
		}
		uuid := got[0]
		// Exactly its instance is visible: no other instance, no GPU.
		if v := ctr.Env[api.EnvNVIDIAVisibleDevices]; v != uuid {
			t.Errorf("%s: %s=%q, want exactly %s", p.name, api.EnvNVIDIAVisibleDevices, v, uuid)
		}
		for _, d := range ctr.CDIDevices {
			if !strings.HasSuffix(d, "="+uuid) {
				t.Errorf("%s: CDI device %q is not its instance %s", p.name, d, uuid)
			}
		}
		// The node agent records the instance in the pod's assignment.
		recorded := waitAssignmentWith(t, c, ns, p.name, func(a *api.Assignment) bool {
			ca := a.Container("main")
			return ca != nil && len(ca.MIG) == 1
		})
		if m := recorded.Container("main").MIG[0]; m.UUID != uuid || m.Profile != p.profile || m.GPU.UUID != gpuOf[uuid] {
			t.Errorf("%s: assignment records %+v, want %s (%s) on GPU %s", p.name, m, uuid, p.profile, gpuOf[uuid])
		}
		t.Logf("%s (%s) runs on %s with %s only (GPU %s); CDI %v", p.name, p.profile, rec.Node, uuid, gpuOf[uuid], ctr.CDIDevices)
	}

	// Two 3g.20gb exist, one is taken: a pod asking 3 waits. kube-scheduler's
	// own count of the extended resource refuses both nodes before the
	// extender is asked (the extender's reasons for the same demand are
	// unit-tested: extender TestMIGFilter).
	mustCreate(t, c, migPod("too-many", "3g.20gb", 3))
	msg := waitEventMessage(t, c, ns, "too-many", "FailedScheduling", "3g.20gb")
	if !strings.Contains(msg, "Insufficient tessera.dev/mig-3g.20gb") {
		t.Errorf("FailedScheduling = %q, want both nodes short of tessera.dev/mig-3g.20gb", msg)
	}
	if p := getPod(t, c.Client(), ns, "too-many"); p.Spec.NodeName != "" {
		t.Fatalf("too-many bound to %s", p.Spec.NodeName)
	}
	t.Logf("too-many: %s", msg)

	// A whole-GPU pod of 4 GPUs on mig-1 gets GPUs 4-7, never one in MIG
	// mode.
	whole := guaranteed(ns, "whole", 4, "1", "mig-1")
	mustCreate(t, c, whole)
	_, rec := waitRunning(t, c, ns, "whole", time.Minute)
	migGPUs := map[string]bool{}
	for _, g := range gpuOf {
		migGPUs[g] = true
	}
	for _, g := range rec.Containers[0].Allocated[string(api.ResourceGPU)] {
		if migGPUs[g] {
			t.Errorf("whole-GPU pod got GPU %s, which is in MIG mode", g)
		}
	}
}

// waitAssignmentWith waits until the pod's assignment annotation satisfies ok
// and returns it.
func waitAssignmentWith(t *testing.T, c *nodesim.Cluster, ns, name string, ok func(*api.Assignment) bool) *api.Assignment {
	t.Helper()
	var last *api.Assignment
	var lastErr error
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		a, found, err := api.GetAssignment(p.Annotations)
		if err != nil || !found {
			lastErr = err
			return false, nil
		}
		last = a
		return ok(a), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s assignment: %v (last %+v, error %v)", ns, name, err, last, lastErr)
	}
	return last
}

// MIG instances count against quotas like every GPU resource: an
// ElasticQuota's max on a MIG profile holds (before 2026-11-29 the quota
// reader kept only tessera.dev/gpu, gpu-memory, gpu-core and
// nvidia.com/gpu and counted no MIG capacity: a MIG pod in a governed
// namespace was refused, "0 of 0 that can be lent", and a max on a
// profile capped nothing), and a Queue's limit on a profile holds: its
// first MIG pod runs, the second waits, and the Queue's status, which
// counts the instance, still reads back.
func TestMIGQuotaAndQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const capped, queued = "mig-capped", "mig-queued"
	c := ownCluster(ctx, t, capped, []nodesim.NodeSpec{{Name: "mig-1", Profile: "dgx-a100-mig"}})
	for _, ns := range []string{queued} {
		if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	small := api.MIGResource("1g.5gb")
	elasticQuota(t, c, capped, small, 0, 2)
	dyn := dynamicClient(t, c)
	q := &api.Queue{Name: "mig-team", Namespaces: []string{queued}, Resources: map[v1.ResourceName]api.QueueResource{
		small: {Limit: 1, Limited: true, Weight: 1},
	}}
	if _, err := dyn.Resource(api.QueueGVR).Create(ctx, q.Unstructured(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("Queue with a MIG limit: %v", err)
	}
	time.Sleep(time.Second) // the extender's informers see the quota and the queue
	migPod := func(ns, name string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []v1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{small: *resource.NewQuantity(1, resource.DecimalSI)}}}}},
		}
	}
	for _, name := range []string{"a", "b"} {
		mustCreate(t, c, migPod(capped, name))
		waitRunning(t, c, capped, name, time.Minute)
	}
	mustCreate(t, c, migPod(capped, "c"))
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := getPod(t, c.Client(), capped, "c")
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("bound to %s above the quota's max of 2 %s", p.Spec.NodeName, small)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
				msg = cond.Message
			}
		}
		return strings.Contains(strings.ToLower(msg), "quota") && strings.Contains(msg, string(small)), nil
	})
	if err != nil {
		t.Errorf("a third %s instance under a max of 2 should wait for quota: %v (PodScheduled: %q)", small, err, msg)
	}

	mustCreate(t, c, migPod(queued, "q"))
	if pod, _ := waitRunning(t, c, queued, "q", time.Minute); pod.Spec.NodeName != "mig-1" {
		t.Errorf("the queued MIG pod runs on %s, want mig-1", pod.Spec.NodeName)
	}
	mustCreate(t, c, migPod(queued, "q2"))
	waitEventMessage(t, c, queued, "q2", api.EventQueueWaiting, string(small))
	if p := getPod(t, c.Client(), queued, "q2"); p.Spec.NodeName != "" {
		t.Errorf("q2 bound to %s above its queue's limit of 1 %s", p.Spec.NodeName, small)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(api.QueueGVR).Get(ctx, q.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st, err := api.QueueStatusFromUnstructured(u)
		last = err
		return err == nil && st.Used[small] == 1, nil
	})
	if err != nil {
		t.Errorf("Queue %s status does not read back with 1 %s used: %v (%v)", q.Name, small, err, last)
	}
}
