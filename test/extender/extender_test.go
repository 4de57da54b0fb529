// Package extender_test runs tessera-extender against the real
// kube-scheduler (built from k8s.io/kubernetes) configured exactly by
// deploy/extender/scheduler-config.yaml, with RBAC from
// deploy/extender/rbac.yaml, the extender as its own process, and Nodes
// carrying the inventory annotation and capacities a node agent publishes.
package extender_test

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
)

const (
	a100 = "NVIDIA A100-SXM4-40GB"
	h100 = "NVIDIA H100 80GB HBM3"
)

func sel(scenario string) map[string]string { return map[string]string{"scenario": scenario} }

func sharedOn(node string, gpu int, memMiB, cores int64) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main",
		Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpuUUID(node, gpu), Index: gpu}, MemoryMiB: memMiB, Cores: cores}})
	return a
}

func wholeOn(node string, gpus ...int) *api.Assignment {
	a := api.NewAssignment()
	var refs []api.GPURef
	for _, g := range gpus {
		refs = append(refs, api.GPURef{UUID: gpuUUID(node, g), Index: g})
	}
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main", GPUs: refs})
	return a
}

func sharedGPU(t testing.TB, p *v1.Pod) string {
	t.Helper()
	a, ok, err := api.GetAssignment(p.Annotations)
	if err != nil || !ok || a.Container("main") == nil || a.Container("main").Shared == nil {
		t.Fatalf("pod %s: no shared assignment (ok=%v err=%v)", p.Name, ok, err)
	}
	return a.Container("main").Shared.GPU.UUID
}

func TestScenarios(t *testing.T) {
	e := startEnv(t)

	t.Run("shared pods pack onto one GPU", func(t *testing.T) {
		for _, n := range []string{"pack-a", "pack-b"} {
			e.createNode(t, nodeSpec{name: n, gpus: 2, model: a100, memMiB: 40960, labels: sel("pack")})
		}
		var gpu, node string
		for i := 0; i < 4; i++ {
			name := "pack-" + itoa(i)
			e.createPod(t, podSpec{name: name, memUnits: 10, cores: 25, selector: sel("pack")})
			p := e.waitBound(t, name, time.Minute)
			g := sharedGPU(t, p)
			if i == 0 {
				gpu, node = g, p.Spec.NodeName
				continue
			}
			if g != gpu || p.Spec.NodeName != node {
				t.Errorf("pod %s on %s/%s, want packed with pack-0 on %s/%s", name, p.Spec.NodeName, g, node, gpu)
			}
		}
	})

	t.Run("a slice larger than any GPU's free part stays pending though the node total fits", func(t *testing.T) {
		e.createNode(t, nodeSpec{name: "frag", gpus: 2, model: a100, memMiB: 40960, labels: sel("frag")})
		e.createPod(t, podSpec{name: "frag-0", memUnits: 30, cores: 10, node: "frag", assign: sharedOn("frag", 0, 30720, 10)})
		e.createPod(t, podSpec{name: "frag-1", memUnits: 30, cores: 10, node: "frag", assign: sharedOn("frag", 1, 30720, 10)})
		// 20 GiB are free on the node, 10 on each GPU.
		e.createPod(t, podSpec{name: "frag-big", memUnits: 16, selector: sel("frag")})
		e.waitPendingWith(t, "frag-big", "no single GPU has 16384 MiB and 0 cores free", time.Minute)
		// The reason is in the pod's events, not only in its condition.
		if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			ev := e.events(t, "frag-big")
			return strings.Contains(ev, "FailedScheduling") && strings.Contains(ev, "tessera: no single GPU has 16384 MiB and 0 cores free"), nil
		}); err != nil {
			t.Errorf("frag-big: reason not in events: %v\n%s", err, e.events(t, "frag-big"))
		}
		// A slice that fits one GPU's rest is placed.
		e.createPod(t, podSpec{name: "frag-small", memUnits: 8, selector: sel("frag")})
		e.waitBound(t, "frag-small", time.Minute)
	})

	t.Run("GPU model constraint", func(t *testing.T) {
		e.createNode(t, nodeSpec{name: "model-a100", gpus: 2, model: a100, memMiB: 40960, labels: sel("model")})
		e.createNode(t, nodeSpec{name: "model-h100", gpus: 2, model: h100, memMiB: 81920, labels: sel("model")})
		for i := 0; i < 2; i++ {
			name := "model-h-" + itoa(i)
			e.createPod(t, podSpec{name: name, gpus: 1, model: "H100|V100", selector: sel("model")})
			if p := e.waitBound(t, name, time.Minute); p.Spec.NodeName != "model-h100" {
				t.Errorf("pod %s asking for H100 bound to %s", name, p.Spec.NodeName)
			}
		}
		// The H100 node is full; the A100 node's GPUs are free but not allowed.
		e.createPod(t, podSpec{name: "model-h-2", gpus: 1, model: "H100", selector: sel("model")})
		// (kube-scheduler's own count check rejects the full H100 node.)
		e.waitPendingWith(t, "model-h-2", `GPU model "NVIDIA A100-SXM4-40GB" is not one of H100`, time.Minute)
		e.createPod(t, podSpec{name: "model-v100", gpus: 1, model: "V100", selector: sel("model")})
		e.waitPendingWith(t, "model-v100", "is not one of V100", time.Minute)
	})

	t.Run("NVLink requirement", func(t *testing.T) {
		e.createNode(t, nodeSpec{name: "nvl", gpus: 8, model: a100, memMiB: 40960, cliques: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, labels: sel("nvl")})
		e.createPod(t, podSpec{name: "nvl-held-0", gpus: 1, node: "nvl", assign: wholeOn("nvl", 0)})
		e.createPod(t, podSpec{name: "nvl-held-4", gpus: 1, node: "nvl", assign: wholeOn("nvl", 4)})
		// 6 GPUs are free, but no clique has 4.
		e.createPod(t, podSpec{name: "nvl-4", gpus: 4, nvlink: true, selector: sel("nvl")})
		e.waitPendingWith(t, "nvl-4", "no NVLink clique has 4 free GPUs", time.Minute)
		e.createPod(t, podSpec{name: "nvl-3", gpus: 3, nvlink: true, selector: sel("nvl")})
		e.waitBound(t, "nvl-3", time.Minute)
	})

	t.Run("binpack keeps whole nodes free for an 8-GPU pod", func(t *testing.T) {
		for i := 0; i < 4; i++ {
			e.createNode(t, nodeSpec{name: "bp-" + itoa(i), gpus: 8, model: a100, memMiB: 40960, labels: sel("bp")})
		}
		// 16 quarter-GPU slices and four 1-GPU pods: 8 GPUs' worth.
		var names []string
		for i := 0; i < 16; i++ {
			names = append(names, "bp-s"+itoa(i))
			e.createPod(t, podSpec{name: names[len(names)-1], memUnits: 10, cores: 25, selector: sel("bp")})
		}
		for i := 0; i < 4; i++ {
			names = append(names, "bp-w"+itoa(i))
			e.createPod(t, podSpec{name: names[len(names)-1], gpus: 1, selector: sel("bp")})
		}
		used := map[string]bool{}
		for _, n := range names {
			used[e.waitBound(t, n, 2*time.Minute).Spec.NodeName] = true
		}
		if len(used) > 2 {
			t.Errorf("20 small pods spread over %d nodes %v, want at most 2", len(used), used)
		}
		for i := 0; i < 2; i++ {
			name := "bp-8gpu-" + itoa(i)
			e.createPod(t, podSpec{name: name, gpus: 8, selector: sel("bp")})
			p := e.waitBound(t, name, 2*time.Minute)
			if used[p.Spec.NodeName] {
				t.Errorf("8-GPU pod bound to %s, which runs small pods", p.Spec.NodeName)
			}
			used[p.Spec.NodeName] = true
		}
	})

	t.Run("preemption only when it makes the pod fit on one GPU", func(t *testing.T) {
		for name, value := range map[string]int32{"low-1": 1, "low-2": 2, "low-3": 3, "high": 1000} {
			pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
			if _, err := e.client.SchedulingV1().PriorityClasses().Create(t.Context(), pc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// 10 GiB free: kube-scheduler's own dry run keeps the more important
		// pods and picks B (20 GiB on GPU 0) as the victim, which would
		// leave 30 GiB free on the node but 20 and 10 GiB on the GPUs. The
		// extender drops the node: no candidate, nobody preempted.
		e.createNode(t, nodeSpec{name: "pre1", gpus: 2, model: a100, memMiB: 40960, labels: sel("pre1")})
		e.createPod(t, podSpec{name: "pre1-a", memUnits: 20, priorityClass: "low-3", node: "pre1", assign: sharedOn("pre1", 0, 20480, 0)})
		e.createPod(t, podSpec{name: "pre1-b", memUnits: 20, priorityClass: "low-1", node: "pre1", assign: sharedOn("pre1", 0, 20480, 0)})
		e.createPod(t, podSpec{name: "pre1-c", memUnits: 30, priorityClass: "low-2", node: "pre1", assign: sharedOn("pre1", 1, 30720, 0)})
		e.createPod(t, podSpec{name: "pre1-hi", memUnits: 30, priorityClass: "high", selector: sel("pre1")})
		e.waitPendingWith(t, "pre1-hi", "preemption: no candidate node for preemption", time.Minute)
		// Give a (wrong) preemption time to show.
		time.Sleep(3 * time.Second)
		for _, n := range []string{"pre1-a", "pre1-b", "pre1-c"} {
			p, err := e.client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Errorf("pod %s preempted (err %v) although that cannot make pre1-hi fit one GPU", n, err)
			}
		}

		// Here the scheduler's victim C (35 GiB on GPU 1) frees a GPU: kept.
		e.createNode(t, nodeSpec{name: "pre2", gpus: 2, model: a100, memMiB: 40960, labels: sel("pre2")})
		e.createPod(t, podSpec{name: "pre2-a", memUnits: 20, priorityClass: "low-3", node: "pre2", assign: sharedOn("pre2", 0, 20480, 0)})
		e.createPod(t, podSpec{name: "pre2-b", memUnits: 20, priorityClass: "low-1", node: "pre2", assign: sharedOn("pre2", 0, 20480, 0)})
		e.createPod(t, podSpec{name: "pre2-c", memUnits: 35, priorityClass: "low-2", node: "pre2", assign: sharedOn("pre2", 1, 35840, 0)})
		e.createPod(t, podSpec{name: "pre2-hi", memUnits: 30, priorityClass: "high", selector: sel("pre2")})
		victim, err := e.cp.WaitForPod(t.Context(), ns, "pre2-c", "preempted", time.Minute, func(p *v1.Pod) (bool, error) { return p.DeletionTimestamp != nil, nil })
		if err != nil {
			t.Fatalf("%v\nevents of pre2-hi: %s", err, e.events(t, "pre2-hi"))
		}
		for _, n := range []string{"pre2-a", "pre2-b"} {
			if p, err := e.client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
				t.Errorf("pod %s preempted (err %v), only pre2-c had to go", n, err)
			}
		}
		// No kubelet: finish the victim's termination as it would.
		zero := int64(0)
		if err := e.client.CoreV1().Pods(ns).Delete(t.Context(), victim.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if g := sharedGPU(t, e.waitBound(t, "pre2-hi", time.Minute)); g != gpuUUID("pre2", 1) {
			t.Errorf("pre2-hi on GPU %s, want the freed GPU 1 (%s)", g, gpuUUID("pre2", 1))
		}
	})

	t.Run("no GPU over-committed", func(t *testing.T) {
		waitAgentIdle(t, e)
		checkNoOvercommit(t, e.client)
		if errs := e.agent.errors(); len(errs) > 0 {
			t.Errorf("node agent stand-in found over-committed nodes: %v", errs)
		}
	})
}

// waitAgentIdle waits until every bound whole-GPU pod has its GPUs
// recorded.
func waitAgentIdle(t testing.TB, e *env) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 300*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := e.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName != "" && wholeGPUs(p) > 0 {
				if _, ok := p.Annotations[api.AnnotationAssignment]; !ok {
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("whole-GPU pods still unrecorded: %v (agent errors: %v)", err, e.agent.errors())
	}
}

// randomShape draws a pod shape: shared slices (memory and/or cores) and
// 1, 2, 4 or 8 whole GPUs, some with a model constraint or NVLink.
func randomShape(rng *rand.Rand, name string) podSpec {
	s := podSpec{name: name}
	switch x := rng.Float64(); {
	case x < 0.5:
		s.memUnits = int64(rng.Intn(21))
		s.cores = int64(rng.Intn(7)) * 10
		if s.memUnits == 0 && s.cores == 0 {
			s.cores = 20
		}
	case x < 0.8:
		s.gpus = 1
	case x < 0.9:
		s.gpus = 2
	case x < 0.96:
		s.gpus = 4
	default:
		s.gpus = 8
	}
	if s.gpus >= 2 && rng.Intn(3) == 0 {
		s.nvlink = true
	}
	if rng.Intn(10) == 0 {
		s.model = []string{"A100", "H100"}[rng.Intn(2)]
	}
	return s
}

// runRandom creates n pods of random shapes (kill, when set, is called
// once half of them are bound), waits until scheduling settles and checks
// the invariant from the pods' assignments.
func runRandom(t *testing.T, e *env, seed int64, n int, kill func()) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	for i := 0; i < 40; i++ {
		spec := nodeSpec{name: fmt.Sprintf("r-%02d", i), gpus: 8, model: a100, memMiB: 40960}
		if i%2 == 1 {
			spec.model, spec.memMiB = h100, 81920
		}
		if i%4 == 2 {
			spec.cliques = [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
		}
		e.createNode(t, spec)
	}
	for i := 0; i < n; i++ {
		e.createPod(t, randomShape(rng, fmt.Sprintf("r-%03d", i)))
	}
	ctx := t.Context()
	count := func() (bound, pending int) {
		pods, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			if pods.Items[i].Spec.NodeName != "" {
				bound++
			} else {
				pending++
			}
		}
		return bound, pending
	}
	if kill != nil {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
			b, _ := count()
			return b >= n/2, nil
		})
		if err != nil {
			t.Fatalf("half of the pods never bound: %v", err)
		}
		kill()
	}
	// Settled: the bound count has not changed for 20s.
	last, since := -1, time.Now()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(context.Context) (bool, error) {
		b, _ := count()
		if b != last {
			last, since = b, time.Now()
		}
		return time.Since(since) > 20*time.Second, nil
	})
	if err != nil {
		t.Fatalf("scheduling never settled: %v", err)
	}
	bound, pending := count()
	t.Logf("%d pods bound, %d pending", bound, pending)
	// The cluster has 320 GPUs; the random demand is above that, so both
	// outcomes must occur for the run to mean anything.
	if bound < n/2 || pending == 0 {
		t.Errorf("%d bound, %d pending: the run did not fill the cluster", bound, pending)
	}
	waitAgentIdle(t, e)
	checkNoOvercommit(t, e.client)
	if errs := e.agent.errors(); len(errs) > 0 {
		t.Errorf("node agent stand-in found over-committed nodes: %v", errs)
	}
	if t.Failed() {
		e.agent.mu.Lock()
		t.Logf("node agent stand-in:\n%s", strings.Join(e.agent.log, "\n"))
		e.agent.mu.Unlock()
	}
}

func TestRandomRun(t *testing.T) {
	e := startEnv(t)
	runRandom(t, e, 4, 300, nil)
}

func TestRandomRunExtenderRestart(t *testing.T) {
	e := startEnv(t)
	runRandom(t, e, 5, 300, func() {
		t.Log("killing the extender (SIGKILL)")
		e.ext.kill()
		time.Sleep(3 * time.Second)
		t.Log("restarting the extender")
		e.ext.start(t.Context())
	})
}
