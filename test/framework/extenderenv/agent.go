package extenderenv

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
)

// FakeAgent stands in for the node agents' device plugins: it records in
// each bound whole-GPU pod's assignment which GPUs it got, as the real
// agent does from the kubelet's allocation. Like the device plugin it
// avoids GPUs that any pod's assignment names, keeps NVLink pods in one
// clique, and prefers the highest free indices. It writes as the admin,
// not as tessera-node: it lists every node and pod, which the agent's RBAC
// does not allow (extenderenv installs no admission policy that would
// refuse the admin).
type FakeAgent struct {
	Client kubernetes.Interface
	// Sealer seals the assignments it writes, as the node agent does.
	Sealer *api.Sealer
	mu     sync.Mutex
	// errs are the pods it could not find GPUs for at its last look. A
	// stale shared claim (a pod whose Binding never happened, e.g. when the
	// extender was killed between the assignment patch and the Binding)
	// can cause that until the pod is rescheduled; an error that persists
	// until the end is an over-commitment.
	errs     map[string]string
	recorded int
	log      []string
}

// Errors are the pods the agent could not find GPUs for at its last
// look, sorted.
func (a *FakeAgent) Errors() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, e := range a.errs {
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}

// Run makes a Pass every 300ms until ctx is done.
func (a *FakeAgent) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		a.Pass(ctx)
	}
}

// Pass records the GPUs of every bound whole-GPU pod without an
// assignment.
func (a *FakeAgent) Pass(ctx context.Context) {
	nodes, err := a.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	invs := map[string]*api.GPUInventory{}
	for i := range nodes.Items {
		if inv, ok, err := api.GetGPUInventory(nodes.Items[i].Annotations); ok && err == nil {
			invs[nodes.Items[i].Name] = inv
		}
	}
	pods, err := a.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	used := map[string]bool{} // GPU UUIDs named by any assignment
	for i := range pods.Items {
		if as, ok, err := api.GetAssignment(pods.Items[i].Annotations); ok && err == nil {
			for _, c := range as.Containers {
				for _, g := range c.GPUs {
					used[g.UUID] = true
				}
				if c.Shared != nil {
					used[c.Shared.GPU.UUID] = true
				}
			}
		}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		inv := invs[p.Spec.NodeName]
		want := WholeGPUs(p)
		if inv == nil || want == 0 {
			continue
		}
		if _, ok := p.Annotations[api.AnnotationAssignment]; ok {
			continue
		}
		free := func(idx int) bool { return !used[inv.GPUs[idx].UUID] }
		var pick []int
		groups := [][]int{}
		if p.Annotations[api.AnnotationNVLink] == api.NVLinkRequired {
			groups = inv.NVLinkCliques
		} else {
			all := []int{}
			for k := range inv.GPUs {
				all = append(all, k)
			}
			groups = append(groups, all)
		}
		for _, g := range groups {
			var cand []int
			for k := len(g) - 1; k >= 0; k-- {
				if free(g[k]) {
					cand = append(cand, g[k])
				}
			}
			if len(cand) >= want {
				pick = cand[:want]
				break
			}
		}
		if pick == nil {
			a.mu.Lock()
			if a.errs == nil {
				a.errs = map[string]string{}
			}
			a.errs[p.Name] = fmt.Sprintf("no %d free GPUs for pod %s on node %s", want, p.Name, p.Spec.NodeName)
			a.mu.Unlock()
			continue
		}
		sort.Ints(pick)
		as := api.NewAssignment()
		var refs []api.GPURef
		for _, k := range pick {
			refs = append(refs, api.GPURef{UUID: inv.GPUs[k].UUID, Index: inv.GPUs[k].Index})
			used[inv.GPUs[k].UUID] = true
		}
		as.Containers = append(as.Containers, api.ContainerAssignment{Name: p.Spec.Containers[0].Name, GPUs: refs})
		annotations, err := a.Sealer.AssignmentAnnotations(p.UID, as)
		if err != nil {
			continue
		}
		// Conditional on the pod read: an assignment written since (a
		// test pre-binding a pod writes its own right after the create)
		// is not overwritten; the next pass reads it.
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations, "resourceVersion": p.ResourceVersion}})
		if _, err := a.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			a.mu.Lock()
			a.recorded++
			a.log = append(a.log, fmt.Sprintf("%s %s on %s: GPUs %v", time.Now().Format("15:04:05.000"), p.Name, p.Spec.NodeName, pick))
			delete(a.errs, p.Name)
			a.mu.Unlock()
		}
	}
}

// Recorded is how many whole-GPU pods the agent recorded GPUs for.
func (a *FakeAgent) Recorded() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.recorded
}

// Log is one line per recorded pod: time, pod, node, GPU indices.
func (a *FakeAgent) Log() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.log...)
}

// WaitAgentIdle waits until every bound whole-GPU pod has its GPUs
// recorded in its assignment (by FakeAgent); it reports an error on t
// otherwise.
func (e *Env) WaitAgentIdle(t testing.TB) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 300*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := e.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName != "" && WholeGPUs(p) > 0 {
				if _, ok := p.Annotations[api.AnnotationAssignment]; !ok {
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		var errs []string
		if e.Agent != nil {
			errs = e.Agent.Errors()
		}
		t.Errorf("whole-GPU pods still unrecorded: %v (agent errors: %v)", err, errs)
	}
}

// CheckNoOvercommit checks, from the Nodes' inventories and the pods'
// assignments only (not the extender's cache), that no GPU is
// over-committed on any dimension, that every bound pod got what it asked
// for on its own node, and that model and NVLink constraints hold.
func CheckNoOvercommit(t testing.TB, client kubernetes.Interface) (bound int) {
	t.Helper()
	ctx := t.Context()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type gpuUse struct {
		node            string
		model           string
		memMiB, mem     int64
		cores           int64
		whole, sharedBy int
		clique          int
		pods            []string
	}
	gpus := map[string]*gpuUse{}
	for i := range nodes.Items {
		inv, ok, err := api.GetGPUInventory(nodes.Items[i].Annotations)
		if err != nil || !ok {
			continue
		}
		of := map[int]int{}
		for k, c := range inv.NVLinkCliques {
			for _, idx := range c {
				of[idx] = k + 1
			}
		}
		for _, g := range inv.GPUs {
			gpus[g.UUID] = &gpuUse{node: nodes.Items[i].Name, model: g.Model, memMiB: int64(g.MemoryUnits) * int64(inv.MemoryUnitMiB), clique: of[g.Index]}
		}
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		bound++
		as, _, err := api.GetAssignment(p.Annotations)
		if err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		mem, cores, whole := LimitOf(p, api.ResourceGPUMemory), LimitOf(p, api.ResourceGPUCore), WholeGPUs(p)
		models := []string{}
		if m := p.Annotations[api.AnnotationGPUModel]; m != "" {
			models = strings.Split(m, "|")
		}
		checkModel := func(g *gpuUse) {
			if len(models) == 0 {
				return
			}
			for _, m := range models {
				if api.ModelMatches(g.model, m) {
					return
				}
			}
			t.Errorf("pod %s asks for model %v, runs on %q", p.Name, models, g.model)
		}
		switch {
		case mem > 0 || cores > 0:
			if as == nil {
				t.Errorf("shared pod %s bound to %s without an assignment", p.Name, p.Spec.NodeName)
				continue
			}
			c := as.Container("main")
			if c == nil || c.Shared == nil {
				t.Errorf("shared pod %s: assignment %+v has no shared slice", p.Name, as)
				continue
			}
			g := gpus[c.Shared.GPU.UUID]
			if g == nil || g.node != p.Spec.NodeName {
				t.Errorf("shared pod %s on %s: GPU %s is not one of its node's", p.Name, p.Spec.NodeName, c.Shared.GPU.UUID)
				continue
			}
			wantMiB := mem * 1024
			if mem == 0 {
				wantMiB = (cores*g.memMiB + 99) / 100
			}
			if c.Shared.MemoryMiB != wantMiB || c.Shared.Cores != cores {
				t.Errorf("shared pod %s: assignment %d MiB %d cores, asked %d MiB %d cores", p.Name, c.Shared.MemoryMiB, c.Shared.Cores, wantMiB, cores)
			}
			g.mem += c.Shared.MemoryMiB
			g.cores += c.Shared.Cores
			g.sharedBy++
			g.pods = append(g.pods, p.Name)
			checkModel(g)
		case whole > 0:
			if as == nil {
				t.Errorf("whole-GPU pod %s on %s: the node agent never recorded its GPUs", p.Name, p.Spec.NodeName)
				continue
			}
			c := as.Container("main")
			if c == nil || len(c.GPUs) != whole {
				t.Errorf("whole-GPU pod %s: %d GPUs recorded, asked %d", p.Name, len(c.GPUs), whole)
				continue
			}
			cliques := map[int]bool{}
			for _, ref := range c.GPUs {
				g := gpus[ref.UUID]
				if g == nil || g.node != p.Spec.NodeName {
					t.Errorf("whole-GPU pod %s: GPU %s is not one of node %s's", p.Name, ref.UUID, p.Spec.NodeName)
					continue
				}
				g.whole++
				g.pods = append(g.pods, p.Name+"(whole)")
				cliques[g.clique] = true
				checkModel(g)
			}
			if p.Annotations[api.AnnotationNVLink] == api.NVLinkRequired && (len(cliques) != 1 || cliques[0]) {
				t.Errorf("pod %s requires NVLink, its GPUs span cliques %v", p.Name, cliques)
			}
		}
	}
	for uuid, g := range gpus {
		switch {
		case g.whole > 1:
			t.Errorf("GPU %s of %s is held whole by %d pods: %v", uuid, g.node, g.whole, g.pods)
		case g.whole == 1 && g.sharedBy > 0:
			t.Errorf("GPU %s of %s is held whole and shared by %d pods: %v", uuid, g.node, g.sharedBy, g.pods)
		case g.mem > g.memMiB:
			t.Errorf("GPU %s of %s: %d MiB assigned, %d MiB shared out", uuid, g.node, g.mem, g.memMiB)
		case g.cores > api.CoresPerGPU:
			t.Errorf("GPU %s of %s: %d cores assigned", uuid, g.node, g.cores)
		}
	}
	return bound
}
