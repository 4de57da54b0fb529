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
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

const (
	a100 = extenderenv.A100
	h100 = extenderenv.H100
	ns   = extenderenv.DefaultNamespace
)

func itoa(i int) string { return strconv.Itoa(i) }

func sel(scenario string) map[string]string { return map[string]string{"scenario": scenario} }

func sharedGPU(t testing.TB, p *v1.Pod) string {
	t.Helper()
	a, ok, err := api.GetAssignment(p.Annotations)
	if err != nil || !ok || a.Container("main") == nil || a.Container("main").Shared == nil {
		t.Fatalf("pod %s: no shared assignment (ok=%v err=%v)", p.Name, ok, err)
	}
	return a.Container("main").Shared.GPU.UUID
}

func TestScenarios(t *testing.T) {
	e := extenderenv.Start(t, extenderenv.Options{Agent: true})

	t.Run("shared pods pack onto one GPU", func(t *testing.T) {
		for _, n := range []string{"pack-a", "pack-b"} {
			e.CreateNode(t, extenderenv.NodeSpec{Name: n, GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("pack")})
		}
		var gpu, node string
		for i := 0; i < 4; i++ {
			name := "pack-" + itoa(i)
			e.CreatePod(t, extenderenv.PodSpec{Name: name, MemUnits: 10, Cores: 25, Selector: sel("pack")})
			p := e.WaitBound(t, ns, name, time.Minute)
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
		e.CreateNode(t, extenderenv.NodeSpec{Name: "frag", GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("frag")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "frag-0", MemUnits: 30, Cores: 10, Node: "frag", Assign: extenderenv.SharedAssignment("frag", 0, 30720, 10)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "frag-1", MemUnits: 30, Cores: 10, Node: "frag", Assign: extenderenv.SharedAssignment("frag", 1, 30720, 10)})
		// 20 GiB are free on the node, 10 on each GPU.
		e.CreatePod(t, extenderenv.PodSpec{Name: "frag-big", MemUnits: 16, Selector: sel("frag")})
		e.WaitPendingWith(t, ns, "frag-big", "no single GPU has 16384 MiB and 0 cores free", time.Minute)
		// The reason is in the pod's events, not only in its condition.
		if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			ev := e.Events(t, ns, "frag-big")
			return strings.Contains(ev, "FailedScheduling") && strings.Contains(ev, "tessera: no single GPU has 16384 MiB and 0 cores free"), nil
		}); err != nil {
			t.Errorf("frag-big: reason not in events: %v\n%s", err, e.Events(t, ns, "frag-big"))
		}
		// A slice that fits one GPU's rest is placed.
		e.CreatePod(t, extenderenv.PodSpec{Name: "frag-small", MemUnits: 8, Selector: sel("frag")})
		e.WaitBound(t, ns, "frag-small", time.Minute)
	})

	t.Run("GPU model constraint", func(t *testing.T) {
		e.CreateNode(t, extenderenv.NodeSpec{Name: "model-a100", GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("model")})
		e.CreateNode(t, extenderenv.NodeSpec{Name: "model-h100", GPUs: 2, Model: h100, MemMiB: 81920, Labels: sel("model")})
		for i := 0; i < 2; i++ {
			name := "model-h-" + itoa(i)
			e.CreatePod(t, extenderenv.PodSpec{Name: name, GPUs: 1, Model: "H100|V100", Selector: sel("model")})
			if p := e.WaitBound(t, ns, name, time.Minute); p.Spec.NodeName != "model-h100" {
				t.Errorf("pod %s asking for H100 bound to %s", name, p.Spec.NodeName)
			}
		}
		// The H100 node is full; the A100 node's GPUs are free but not allowed.
		e.CreatePod(t, extenderenv.PodSpec{Name: "model-h-2", GPUs: 1, Model: "H100", Selector: sel("model")})
		// (kube-scheduler's own count check rejects the full H100 node.)
		e.WaitPendingWith(t, ns, "model-h-2", `GPU model "NVIDIA A100-SXM4-40GB" is not one of H100`, time.Minute)
		e.CreatePod(t, extenderenv.PodSpec{Name: "model-v100", GPUs: 1, Model: "V100", Selector: sel("model")})
		e.WaitPendingWith(t, ns, "model-v100", "is not one of V100", time.Minute)
	})

	t.Run("NVLink requirement", func(t *testing.T) {
		e.CreateNode(t, extenderenv.NodeSpec{Name: "nvl", GPUs: 8, Model: a100, MemMiB: 40960, Cliques: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, Labels: sel("nvl")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nvl-held-0", GPUs: 1, Node: "nvl", Assign: extenderenv.WholeAssignment("nvl", 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nvl-held-4", GPUs: 1, Node: "nvl", Assign: extenderenv.WholeAssignment("nvl", 4)})
		// 6 GPUs are free, but no clique has 4.
		e.CreatePod(t, extenderenv.PodSpec{Name: "nvl-4", GPUs: 4, NVLink: true, Selector: sel("nvl")})
		e.WaitPendingWith(t, ns, "nvl-4", "no NVLink clique has 4 free GPUs", time.Minute)
		e.CreatePod(t, extenderenv.PodSpec{Name: "nvl-3", GPUs: 3, NVLink: true, Selector: sel("nvl")})
		e.WaitBound(t, ns, "nvl-3", time.Minute)
	})

	t.Run("binpack keeps whole nodes free for an 8-GPU pod", func(t *testing.T) {
		for i := 0; i < 4; i++ {
			e.CreateNode(t, extenderenv.NodeSpec{Name: "bp-" + itoa(i), GPUs: 8, Model: a100, MemMiB: 40960, Labels: sel("bp")})
		}
		// 16 quarter-GPU slices and four 1-GPU pods: 8 GPUs' worth.
		var names []string
		for i := 0; i < 16; i++ {
			names = append(names, "bp-s"+itoa(i))
			e.CreatePod(t, extenderenv.PodSpec{Name: names[len(names)-1], MemUnits: 10, Cores: 25, Selector: sel("bp")})
		}
		for i := 0; i < 4; i++ {
			names = append(names, "bp-w"+itoa(i))
			e.CreatePod(t, extenderenv.PodSpec{Name: names[len(names)-1], GPUs: 1, Selector: sel("bp")})
		}
		used := map[string]bool{}
		for _, n := range names {
			used[e.WaitBound(t, ns, n, 2*time.Minute).Spec.NodeName] = true
		}
		if len(used) > 2 {
			t.Errorf("20 small pods spread over %d nodes %v, want at most 2", len(used), used)
		}
		for i := 0; i < 2; i++ {
			name := "bp-8gpu-" + itoa(i)
			e.CreatePod(t, extenderenv.PodSpec{Name: name, GPUs: 8, Selector: sel("bp")})
			p := e.WaitBound(t, ns, name, 2*time.Minute)
			if used[p.Spec.NodeName] {
				t.Errorf("8-GPU pod bound to %s, which runs small pods", p.Spec.NodeName)
			}
			used[p.Spec.NodeName] = true
		}
	})

	t.Run("preemption only when it makes the pod fit on one GPU", func(t *testing.T) {
		for name, value := range map[string]int32{"low-1": 1, "low-2": 2, "low-3": 3, "high": 1000} {
			pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
			if _, err := e.Client.SchedulingV1().PriorityClasses().Create(t.Context(), pc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// 10 GiB free: kube-scheduler's own dry run keeps the more important
		// pods and picks B (20 GiB on GPU 0) as the victim, which would
		// leave 30 GiB free on the node but 20 and 10 GiB on the GPUs. The
		// extender drops the node from kube-scheduler's candidates; Tessera's
		// own preemption evicts C instead (GPU 1 then has 40 GiB): the
		// lowest priority whose removal makes the pod fit one GPU. B, which
		// cannot make room, and A stay.
		e.CreateNode(t, extenderenv.NodeSpec{Name: "pre1", GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("pre1")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre1-a", MemUnits: 20, PriorityClass: "low-3", Node: "pre1", Assign: extenderenv.SharedAssignment("pre1", 0, 20480, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre1-b", MemUnits: 20, PriorityClass: "low-1", Node: "pre1", Assign: extenderenv.SharedAssignment("pre1", 0, 20480, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre1-c", MemUnits: 30, PriorityClass: "low-2", Node: "pre1", Assign: extenderenv.SharedAssignment("pre1", 1, 30720, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre1-hi", MemUnits: 30, PriorityClass: "high", Selector: sel("pre1")})
		c1, err := e.CP.WaitForPod(t.Context(), ns, "pre1-c", "preempted", time.Minute, func(p *v1.Pod) (bool, error) { return p.DeletionTimestamp != nil, nil })
		if err != nil {
			t.Fatalf("%v\nevents of pre1-hi: %s", err, e.Events(t, ns, "pre1-hi"))
		}
		for _, n := range []string{"pre1-a", "pre1-b"} {
			p, err := e.Client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Errorf("pod %s preempted (err %v): only pre1-c makes pre1-hi fit one GPU", n, err)
			}
		}
		zero := int64(0)
		if err := e.Client.CoreV1().Pods(ns).Delete(t.Context(), c1.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if g := sharedGPU(t, e.WaitBound(t, ns, "pre1-hi", time.Minute)); g != extenderenv.GPUUUID("pre1", 1) {
			t.Errorf("pre1-hi on GPU %s, want the freed GPU 1 (%s)", g, extenderenv.GPUUUID("pre1", 1))
		}

		// Here the scheduler's victim C (35 GiB on GPU 1) frees a GPU: kept.
		e.CreateNode(t, extenderenv.NodeSpec{Name: "pre2", GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("pre2")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre2-a", MemUnits: 20, PriorityClass: "low-3", Node: "pre2", Assign: extenderenv.SharedAssignment("pre2", 0, 20480, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre2-b", MemUnits: 20, PriorityClass: "low-1", Node: "pre2", Assign: extenderenv.SharedAssignment("pre2", 0, 20480, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre2-c", MemUnits: 35, PriorityClass: "low-2", Node: "pre2", Assign: extenderenv.SharedAssignment("pre2", 1, 35840, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "pre2-hi", MemUnits: 30, PriorityClass: "high", Selector: sel("pre2")})
		victim, err := e.CP.WaitForPod(t.Context(), ns, "pre2-c", "preempted", time.Minute, func(p *v1.Pod) (bool, error) { return p.DeletionTimestamp != nil, nil })
		if err != nil {
			t.Fatalf("%v\nevents of pre2-hi: %s", err, e.Events(t, ns, "pre2-hi"))
		}
		for _, n := range []string{"pre2-a", "pre2-b"} {
			if p, err := e.Client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
				t.Errorf("pod %s preempted (err %v), only pre2-c had to go", n, err)
			}
		}
		// No kubelet: finish the victim's termination as it would.
		if err := e.Client.CoreV1().Pods(ns).Delete(t.Context(), victim.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if g := sharedGPU(t, e.WaitBound(t, ns, "pre2-hi", time.Minute)); g != extenderenv.GPUUUID("pre2", 1) {
			t.Errorf("pre2-hi on GPU %s, want the freed GPU 1 (%s)", g, extenderenv.GPUUUID("pre2", 1))
		}
	})

	t.Run("no GPU over-committed", func(t *testing.T) {
		e.WaitAgentIdle(t)
		extenderenv.CheckNoOvercommit(t, e.Client)
		if errs := e.Agent.Errors(); len(errs) > 0 {
			t.Errorf("node agent stand-in found over-committed nodes: %v", errs)
		}
	})
}

// randomShape draws a pod shape: shared slices (memory and/or cores) and
// 1, 2, 4 or 8 whole GPUs, some with a model constraint or NVLink.
func randomShape(rng *rand.Rand, name string) extenderenv.PodSpec {
	s := extenderenv.PodSpec{Name: name}
	switch x := rng.Float64(); {
	case x < 0.5:
		s.MemUnits = int64(rng.Intn(21))
		s.Cores = int64(rng.Intn(7)) * 10
		if s.MemUnits == 0 && s.Cores == 0 {
			s.Cores = 20
		}
	case x < 0.8:
		s.GPUs = 1
	case x < 0.9:
		s.GPUs = 2
	case x < 0.96:
		s.GPUs = 4
	default:
		s.GPUs = 8
	}
	if s.GPUs >= 2 && rng.Intn(3) == 0 {
		s.NVLink = true
	}
	if rng.Intn(10) == 0 {
		s.Model = []string{"A100", "H100"}[rng.Intn(2)]
	}
	return s
}

// runRandom creates n pods of random shapes (kill, when set, is called
// once half of them are bound), waits until scheduling settles and checks
// the invariant from the pods' assignments.
func runRandom(t *testing.T, e *extenderenv.Env, seed int64, n int, kill func()) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	for i := 0; i < 40; i++ {
		spec := extenderenv.NodeSpec{Name: fmt.Sprintf("r-%02d", i), GPUs: 8, Model: a100, MemMiB: 40960}
		if i%2 == 1 {
			spec.Model, spec.MemMiB = h100, 81920
		}
		if i%4 == 2 {
			spec.Cliques = [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
		}
		e.CreateNode(t, spec)
	}
	for i := 0; i < n; i++ {
		e.CreatePod(t, randomShape(rng, fmt.Sprintf("r-%03d", i)))
	}
	ctx := t.Context()
	count := func() (bound, pending int) {
		pods, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
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
	e.WaitAgentIdle(t)
	extenderenv.CheckNoOvercommit(t, e.Client)
	if errs := e.Agent.Errors(); len(errs) > 0 {
		t.Errorf("node agent stand-in found over-committed nodes: %v", errs)
	}
	if t.Failed() {
		t.Logf("node agent stand-in:\n%s", strings.Join(e.Agent.Log(), "\n"))
	}
}

func TestRandomRun(t *testing.T) {
	e := extenderenv.Start(t, extenderenv.Options{Agent: true})
	runRandom(t, e, 4, 300, nil)
}

func TestRandomRunExtenderRestart(t *testing.T) {
	e := extenderenv.Start(t, extenderenv.Options{Agent: true})
	runRandom(t, e, 5, 300, func() {
		t.Log("killing the extender (SIGKILL)")
		e.Ext.Kill()
		time.Sleep(3 * time.Second)
		t.Log("restarting the extender")
		e.Ext.Start(t.Context())
	})
}

// TestRandomRunShortlist runs the random workload with filter passing only
// the 3 fitting nodes the policy scores best (--filter-shortlist=3, far
// below the 40 nodes): kube-scheduler then scores and binds among those
// alone, and the same invariants must hold.
func TestRandomRunShortlist(t *testing.T) {
	e := extenderenv.Start(t, extenderenv.Options{Agent: true, ExtenderArgs: []string{"--filter-shortlist=3"}})
	runRandom(t, e, 6, 300, nil)
	// The shortlist was in force: filter left fitting nodes out.
	resp, err := http.Get("http://" + e.Ext.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("extender /metrics: %v", err)
	}
	var leftOut float64
	if f := families["tessera_extender_filter_left_out_total"]; f != nil && len(f.GetMetric()) == 1 {
		leftOut = f.GetMetric()[0].GetCounter().GetValue()
	}
	if leftOut == 0 {
		t.Errorf("tessera_extender_filter_left_out_total = 0: filter never shortlisted")
	}
	t.Logf("filter left out %v fitting nodes", leftOut)
}
