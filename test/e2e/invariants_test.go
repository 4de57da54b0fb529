package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// gpuUse is what the pods bound to a node use of one GPU, by their
// assignments.
type gpuUse struct {
	whole   []string // pod/container
	shared  []string
	memMiB  int64
	cores   int64
	inv     api.InventoryGPU
	reserve uint64
}

// occupancy maps node -> GPU UUID -> use, over every bound pod that is not
// finished, from the assignment annotations.
func occupancy(t *testing.T, c *nodesim.Cluster) (map[string]map[string]*gpuUse, []v1.Pod) {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]*gpuUse{}
	for _, n := range c.Nodes() {
		inv := inventory(t, c, n.Name)
		out[n.Name] = map[string]*gpuUse{}
		for _, g := range inv.GPUs {
			out[n.Name][g.UUID] = &gpuUse{inv: g, reserve: inv.MemoryReserveMiB}
		}
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		a, ok, err := api.GetAssignment(p.Annotations)
		if err != nil {
			t.Errorf("pod %s/%s: malformed assignment: %v", p.Namespace, p.Name, err)
			continue
		}
		if !ok {
			continue
		}
		for _, ca := range a.Containers {
			who := p.Namespace + "/" + p.Name + "/" + ca.Name
			for _, g := range ca.GPUs {
				u := out[p.Spec.NodeName][g.UUID]
				if u == nil {
					t.Errorf("%s: whole GPU %s is not on node %s", who, g.UUID, p.Spec.NodeName)
					continue
				}
				u.whole = append(u.whole, who)
			}
			if s := ca.Shared; s != nil {
				for _, g := range s.GPUs() { // a multi-GPU slice holds its amount on each
					u := out[p.Spec.NodeName][g.UUID]
					if u == nil {
						t.Errorf("%s: shared GPU %s is not on node %s", who, g.UUID, p.Spec.NodeName)
						continue
					}
					u.shared = append(u.shared, who)
					u.memMiB += s.MemoryMiB
					u.cores += s.Cores
				}
			}
		}
	}
	return out, pods.Items
}

// checkNoOvercommit fails t when any GPU is used whole twice, whole and
// shared at once, or beyond its memory or compute by shared slices.
func checkNoOvercommit(t *testing.T, occ map[string]map[string]*gpuUse) {
	t.Helper()
	for node, gpus := range occ {
		for uuid, u := range gpus {
			where := fmt.Sprintf("node %s GPU %d (%s)", node, u.inv.Index, uuid)
			if len(u.whole) > 1 {
				t.Errorf("%s is used whole by %d containers: %v", where, len(u.whole), u.whole)
			}
			if len(u.whole) > 0 && len(u.shared) > 0 {
				t.Errorf("%s is used whole by %v and shared by %v", where, u.whole, u.shared)
			}
			if limit := int64(u.inv.MemoryMiB - u.reserve); u.memMiB > limit {
				t.Errorf("%s: shared slices hold %d MiB of %d: %v", where, u.memMiB, limit, u.shared)
			}
			if u.cores > 100 {
				t.Errorf("%s: shared slices hold %d%% compute: %v", where, u.cores, u.shared)
			}
		}
	}
}

// checkRunningPods checks every Running pod against its node's record: the
// node ran it, and each container with Tessera resources received exactly
// its assignment (checkIsolated).
func checkRunningPods(t *testing.T, c *nodesim.Cluster, pods []v1.Pod) (running int) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != v1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		running++
		rec, err := c.Record(p)
		if err != nil || rec == nil || rec.Phase != string(v1.PodRunning) {
			t.Errorf("Running pod %s/%s: node %s has no running record (%v, %+v)", p.Namespace, p.Name, p.Spec.NodeName, err, rec)
			continue
		}
		for _, ctr := range p.Spec.Containers {
			if usesTessera(ctr) {
				checkIsolated(t, c, p, rec, ctr.Name)
			}
		}
	}
	return running
}

func usesTessera(c v1.Container) bool {
	for r := range c.Resources.Limits {
		if strings.HasPrefix(string(r), api.Domain+"/") {
			return true
		}
	}
	return false
}

// occupancyTable renders occ for failure messages.
func occupancyTable(occ map[string]map[string]*gpuUse) string {
	var b strings.Builder
	var nodes []string
	for n := range occ {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		var gs []*gpuUse
		for _, u := range occ[n] {
			gs = append(gs, u)
		}
		sort.Slice(gs, func(i, j int) bool { return gs[i].inv.Index < gs[j].inv.Index })
		for _, u := range gs {
			fmt.Fprintf(&b, "%s gpu%d whole=%v shared=%v mem=%d cores=%d\n", n, u.inv.Index, u.whole, u.shared, u.memMiB, u.cores)
		}
	}
	return b.String()
}
