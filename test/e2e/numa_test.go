package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// TestNUMAFit runs its own two-node cluster whose kubelets align like a
// production GPU node: topology manager single-numa-node, static CPU
// manager (the kubelet's own managers, in-process). On node numa-a two
// exclusive-CPU pods leave fewer than 32 free CPUs on each NUMA node while
// the node as a whole still has 55 CPUs and 7 GPUs free. A Guaranteed pod
// asking 4 GPUs and 32 CPUs must run on numa-b, and a copy pinned to numa-a
// must be refused by the extender with the NUMA reason. Then the extender
// runs with --numa-fit=false: the same pod is bound to numa-a (which
// kube-scheduler's totals and the GPU binpacking prefer) and the kubelet
// fails it with TopologyAffinityError.
func TestNUMAFit(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	node := func(name string) nodesim.NodeSpec {
		return nodesim.NodeSpec{Name: name, Profile: "dgx-a100", TopologyPolicy: "single-numa-node", CPUManagerPolicy: "static"}
	}
	const ns = "numa"
	c := ownCluster(ctx, t, ns, []nodesim.NodeSpec{node("numa-a"), node("numa-b")})
	client := c.Client()

	// Both nodes report their NUMA nodes: 127 and 128 exclusive-capable
	// CPUs (CPU 0 reserved), under single-numa-node.
	for _, n := range []string{"numa-a", "numa-b"} {
		topo := waitNUMA(t, c, n, func(tp *api.NUMATopology) bool { return len(tp.Zones) == 2 })
		if topo.TopologyManagerPolicy != "single-numa-node" || topo.CPUManagerPolicy != "static" || topo.Source != api.NUMASourcePodResources ||
			topo.Zones[0].CPUs+topo.Zones[1].CPUs != 255 {
			t.Fatalf("node %s NUMA report = %+v", n, topo)
		}
	}

	// numa-a: 100 exclusive CPUs on each NUMA node, and one GPU in use.
	for _, name := range []string{"hog-0", "hog-1"} {
		mustCreate(t, c, guaranteed(ns, name, 0, "100", "numa-a"))
		waitRunning(t, c, ns, name, time.Minute)
	}
	small := podSpec{name: "small", gpus: 1, node: "numa-a"}
	create(t, client, ns, small)
	waitRunning(t, c, ns, "small", time.Minute)
	topo := waitNUMA(t, c, "numa-a", func(tp *api.NUMATopology) bool { return len(tp.Pods) == 2 })
	for _, z := range topo.Zones {
		if z.FreeCPUs >= 32 {
			t.Fatalf("numa-a NUMA node %d has %d free CPUs, want < 32: %+v", z.ID, z.FreeCPUs, topo)
		}
	}
	t.Logf("numa-a after the hogs: %+v", topo.Zones)

	// With the rule: the 4-GPU 32-CPU pod runs on numa-b, aligned.
	mustCreate(t, c, guaranteed(ns, "big", 4, "32", ""))
	p, rec := waitRunning(t, c, ns, "big", time.Minute)
	if p.Spec.NodeName != "numa-b" {
		t.Fatalf("big runs on %s, want numa-b", p.Spec.NodeName)
	}
	checkAligned(t, c, "numa-b", rec)
	// A copy pinned to numa-a is refused there, with the reason.
	pinned := guaranteed(ns, "big-pinned", 4, "32", "numa-a")
	mustCreate(t, c, pinned)
	msg := waitEventMessage(t, c, ns, "big-pinned", "FailedScheduling", "no NUMA node has")
	if !strings.Contains(msg, "tessera: no NUMA node has 4 free GPUs and 32 free CPUs") {
		t.Errorf("FailedScheduling = %q, want the NUMA reason", msg)
	}
	t.Logf("big-pinned: %s", msg)
	if got := getPod(t, client, ns, "big-pinned"); got.Spec.NodeName != "" {
		t.Fatalf("big-pinned bound to %s", got.Spec.NodeName)
	}

	// Without the rule: the same pod goes to numa-a and the kubelet fails
	// it.
	for _, name := range []string{"big", "big-pinned"} {
		if err := client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitGone(t, c, ns, "big", "big-pinned")
	if err := c.RestartExtenderWith(ctx, []string{"--numa-fit=false"}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, guaranteed(ns, "big", 4, "32", ""))
	var last *v1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		if p.Status.Phase == v1.PodRunning {
			return false, fmt.Errorf("big runs on %s", p.Spec.NodeName)
		}
		return p.Status.Phase == v1.PodFailed, nil
	})
	if err != nil {
		t.Fatalf("without --numa-fit: %v\n%s", err, describe(t, c, last))
	}
	if last.Spec.NodeName != "numa-a" || last.Status.Reason != "TopologyAffinityError" {
		t.Fatalf("without --numa-fit: pod on %q failed with %q, want numa-a and TopologyAffinityError\n%s", last.Spec.NodeName, last.Status.Reason, describe(t, c, last))
	}
	t.Logf("without --numa-fit: big bound to %s, failed: %s: %s", last.Spec.NodeName, last.Status.Reason, last.Status.Message)
}

// checkAligned checks that the first container of rec got its GPUs and its
// CPUs on one NUMA node of node (a dgx-a100).
func checkAligned(t *testing.T, c *nodesim.Cluster, node string, rec *nodesim.PodRecord) {
	t.Helper()
	ctr := rec.Containers[0]
	inv := inventory(t, c, node)
	gpuZones := map[int]bool{}
	for _, id := range ctr.Allocated[string(api.ResourceGPU)] {
		for _, g := range inv.GPUs {
			if g.UUID == id {
				gpuZones[g.NUMANode] = true
			}
		}
	}
	m, err := nvmlmock.Load("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := cpuset.Parse(ctr.CPUs)
	if err != nil {
		t.Fatal(err)
	}
	cpuZones := map[int]bool{}
	for _, n := range m.NUMANodes {
		if zone, _ := cpuset.Parse(n.CPUs); zone.Intersection(cpus).Size() > 0 {
			cpuZones[n.ID] = true
		}
	}
	if len(gpuZones) != 1 || len(cpuZones) != 1 || fmt.Sprint(gpuZones) != fmt.Sprint(cpuZones) || cpus.Size() != 32 {
		t.Fatalf("container %s: GPUs %v on NUMA nodes %v, %d CPUs %s on NUMA nodes %v: want 32 CPUs and the GPUs on one NUMA node",
			ctr.Name, ctr.Allocated[string(api.ResourceGPU)], gpuZones, cpus.Size(), ctr.CPUs, cpuZones)
	}
	t.Logf("%s on %s: GPUs %v and CPUs %s all on NUMA node %v", rec.Name, node, ctr.Allocated[string(api.ResourceGPU)], ctr.CPUs, gpuZones)
}

// guaranteed is a Guaranteed pod asking gpus whole GPUs and cpu CPUs
// (requests = limits), on node when it is set.
func guaranteed(ns, name string, gpus int64, cpu, node string) *v1.Pod {
	rl := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse("1Gi")}
	if gpus > 0 {
		rl[api.ResourceGPU] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}}},
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{v1.LabelHostname: node}
	}
	return p
}

func mustCreate(t *testing.T, c *nodesim.Cluster, p *v1.Pod) {
	t.Helper()
	if _, err := c.Client().CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

// waitNUMA waits until node's NUMA report satisfies ok and returns it.
func waitNUMA(t *testing.T, c *nodesim.Cluster, node string, ok func(*api.NUMATopology) bool) *api.NUMATopology {
	t.Helper()
	var last *api.NUMATopology
	var lastErr error
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		tp, found, err := api.GetNUMATopology(n.Annotations)
		if err != nil || !found {
			lastErr = err
			return false, nil
		}
		last = tp
		return ok(tp), nil
	})
	if err != nil {
		t.Fatalf("node %s NUMA report: %v (last %+v, error %v)", node, err, last, lastErr)
	}
	return last
}

// waitEventMessage waits for an event of reason on pod whose message
// contains substr and returns the message.
func waitEventMessage(t *testing.T, c *nodesim.Cluster, ns, pod, reason, substr string) string {
	t.Helper()
	msg, err := pollEvent(t.Context(), c.Client(), ns, pod, reason, substr, time.Minute)
	if err != nil {
		t.Fatalf("pod %s/%s: no %s event containing %q: %v\n%s", ns, pod, reason, substr, err, describe(t, c, getPod(t, c.Client(), ns, pod)))
	}
	return msg
}

// waitGone waits until the pods are deleted.
func waitGone(t *testing.T, c *nodesim.Cluster, ns string, names ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, err := c.Client().CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pods %v not deleted: %v", names, err)
	}
}
