package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// TestMIGDynamic runs its own cluster with dynamic MIG on (the extender's
// and the node agent's --dynamic-mig): a dgx-a100-mig node (GPUs 0-1 in
// 7 × 1g.5gb, 2-3 in 3g.20gb + 2g.10gb + 1g.5gb) has no 4g.20gb
// instance. Two 2g.10gb pods run first (tenants on GPUs 2 and 3, the
// cheapest to repartition); then a pod asking tessera.dev/mig-4g.20gb
// waits, the extender asks the node to repartition a GPU without a tenant
// (0 or 1), the agent does, and the pod runs with exactly its new
// instance; the tenants' GPUs keep their layouts, the node records the
// request as applied and, the pod placed, the extender withdraws it. A
// second dgx-a100-mig node, mig-off, runs its agent without --dynamic-mig:
// it is never asked, and a pod only it may take is told no node serves
// dynamic MIG. The repartitioned layout survives a restart of mig-1's
// agent (the mock keeps it, as a driver does), and big keeps its instance.
func TestMIGDynamic(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const ns = "mig-dynamic"
	c := ownCluster(ctx, t, ns, []nodesim.NodeSpec{
		{Name: "mig-1", Profile: "dgx-a100-mig", AgentArgs: []string{"--dynamic-mig"}},
		{Name: "mig-off", Profile: "dgx-a100-mig"},
	}, "--dynamic-mig")
	if !inventory(t, c, "mig-1").DynamicMIG || inventory(t, c, "mig-off").DynamicMIG {
		t.Fatalf("dynamicMIG in the inventories: mig-1 %v, mig-off %v, want true, false", inventory(t, c, "mig-1").DynamicMIG, inventory(t, c, "mig-off").DynamicMIG)
	}
	noRequestOn := func(node string) {
		t.Helper()
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := n.Annotations[api.AnnotationMIGLayoutRequest]; ok {
			t.Fatalf("node %s, whose agent serves no request, was asked: %s", node, v)
		}
	}
	layouts := func(inv *api.GPUInventory) map[string]string { // GPU UUID -> its instances
		out := map[string]string{}
		for _, g := range inv.GPUs {
			if g.MIG == nil {
				continue
			}
			var s []string
			for _, in := range g.MIG.Instances {
				s = append(s, fmt.Sprintf("%s@%d:%s", in.Profile, in.Start, in.UUID))
			}
			out[g.UUID] = strings.Join(s, ",")
		}
		return out
	}
	before := layouts(inventory(t, c, "mig-1"))
	gpuOf := map[string]string{} // MIG UUID -> GPU UUID
	for _, g := range inventory(t, c, "mig-1").GPUs {
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				gpuOf[in.UUID] = g.UUID
			}
		}
	}
	migPod := func(name, profile string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []v1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{api.MIGResource(profile): *resource.NewQuantity(1, resource.DecimalSI)}}}}},
		}
	}

	on := func(p *v1.Pod, node string) *v1.Pod {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		return p
	}

	// Only mig-off may take it, and its agent serves no request: it waits,
	// told why, and mig-off is not asked.
	mustCreate(t, c, on(migPod("stuck", "4g.20gb"), "mig-off"))
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return slices.Contains(eventedPods(t, c.Client(), ns, "MIGRepartitionUnavailable"), "stuck"), nil
	})
	if err != nil {
		t.Fatalf("stuck was never told that no node serves dynamic MIG: %v", err)
	}
	noRequestOn("mig-off")
	if err := c.Client().CoreV1().Pods(ns).Delete(ctx, "stuck", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Tenants on GPUs 2 and 3: each has one 2g.10gb, so two 2g.10gb pods
	// take both. Those GPUs would be the cheapest to repartition (one
	// instance in the way of a 4g.20gb); with tenants, only GPU 0 or 1 may be.
	tenantGPUs := map[string]bool{}
	for _, name := range []string{"tenant-a", "tenant-b"} {
		mustCreate(t, c, on(migPod(name, "2g.10gb"), "mig-1"))
		_, rec := waitRunning(t, c, ns, name, time.Minute)
		got := rec.Containers[0].Allocated[string(api.MIGResource("2g.10gb"))]
		if len(got) != 1 || gpuOf[got[0]] == "" {
			t.Fatalf("%s allocated %v", name, rec.Containers[0].Allocated)
		}
		tenantGPUs[gpuOf[got[0]]] = true
		waitAssignmentWith(t, c, ns, name, func(a *api.Assignment) bool {
			ca := a.Container("main")
			return ca != nil && len(ca.MIG) == 1
		})
		t.Logf("%s runs on GPU %s with %s", name, gpuOf[got[0]], got[0])
	}
	if len(tenantGPUs) != 2 {
		t.Fatalf("the tenants share a GPU: %v", tenantGPUs)
	}

	// No GPU has a 4g.20gb: the pod waits, a GPU without a tenant is
	// repartitioned, the pod runs with its new instance.
	mustCreate(t, c, migPod("big", "4g.20gb"))
	pod, rec := waitRunning(t, c, ns, "big", 3*time.Minute)
	if pod.Spec.NodeName != "mig-1" {
		t.Fatalf("big runs on %s", pod.Spec.NodeName)
	}
	ids := rec.Containers[0].Allocated[string(api.MIGResource("4g.20gb"))]
	if len(ids) != 1 {
		t.Fatalf("big allocated %v, want one 4g.20gb instance", rec.Containers[0].Allocated)
	}
	uuid := ids[0]
	if v := rec.Containers[0].Env[api.EnvNVIDIAVisibleDevices]; v != uuid {
		t.Errorf("big: %s=%q, want exactly %s", api.EnvNVIDIAVisibleDevices, v, uuid)
	}
	for _, d := range rec.Containers[0].CDIDevices {
		if !strings.HasSuffix(d, "="+uuid) {
			t.Errorf("big: CDI device %q is not its instance %s", d, uuid)
		}
	}
	inv := inventory(t, c, "mig-1")
	var newGPU string
	for _, g := range inv.GPUs {
		if g.MIG == nil {
			continue
		}
		for _, in := range g.MIG.Instances {
			if in.UUID == uuid {
				if in.Profile != "4g.20gb" {
					t.Errorf("big's instance %s is a %s", uuid, in.Profile)
				}
				newGPU = g.UUID
			}
		}
	}
	if newGPU == "" {
		t.Fatalf("big's instance %s is in no GPU of the inventory", uuid)
	}
	if tenantGPUs[newGPU] {
		t.Fatalf("a tenant's GPU %s was repartitioned", newGPU)
	}
	after := layouts(inv)
	for g := range tenantGPUs {
		if after[g] != before[g] {
			t.Errorf("a tenant's GPU changed: %s -> %s", before[g], after[g])
		}
	}
	changed := 0
	for g := range before {
		if after[g] != before[g] {
			changed++
			t.Logf("GPU %s repartitioned: %s -> %s", g, before[g], after[g])
		}
	}
	if changed != 1 {
		t.Errorf("%d GPUs changed, want 1", changed)
	}
	// The node records the request as applied; big placed, the extender
	// withdraws it. The pod's Event named the node and GPU asked.
	var gen int64
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, "mig-1", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st, err := api.ParseMIGLayoutStatus(n.Annotations[api.AnnotationMIGLayoutStatus])
		_, asked := n.Annotations[api.AnnotationMIGLayoutRequest]
		if err == nil {
			gen = st.Generation
		}
		return err == nil && st.State == api.MIGLayoutApplied && !asked, nil
	})
	if err != nil {
		t.Errorf("request %d never Applied and withdrawn: %v", gen, err)
	}
	evs, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=big,reason=MIGRepartitionRequested"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) == 0 || !strings.Contains(evs.Items[0].Message, "node mig-1 was asked") || !strings.Contains(evs.Items[0].Message, newGPU) {
		t.Errorf("big's MIGRepartitionRequested events %v, want one naming mig-1 and GPU %s", evs.Items, newGPU)
	}
	noRequestOn("mig-off")

	// mig-1's agent restarts: the mock keeps the layout as a driver would,
	// so big's instance is still there and still recorded as big's.
	pidFile := filepath.Join(c.NodeStateDir("mig-1"), "agent.pid")
	oldPID, _ := os.ReadFile(pidFile)
	if err := c.RestartAgent(ctx, "mig-1"); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pid, _ := os.ReadFile(pidFile)
		return len(pid) > 0 && string(pid) != string(oldPID), nil
	})
	if err != nil {
		t.Fatalf("mig-1's agent did not restart: %v", err)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if got := layouts(inventory(t, c, "mig-1")); got[newGPU] != after[newGPU] {
			t.Fatalf("GPU %s after the agent restarted: %s, want %s", newGPU, got[newGPU], after[newGPU])
		}
		a, ok, err := api.GetAssignment(getPod(t, c.Client(), ns, "big").Annotations)
		if err != nil || !ok || a.Container("main") == nil || len(a.Container("main").MIG) != 1 || a.Container("main").MIG[0].UUID != uuid {
			t.Fatalf("big's assignment after the agent restarted: %+v %v %v", a, ok, err)
		}
	}
	// The tenants still run.
	for _, name := range []string{"tenant-a", "tenant-b"} {
		if p := getPod(t, c.Client(), ns, name); p.Status.Phase != v1.PodRunning {
			t.Errorf("%s is %s", name, p.Status.Phase)
		}
	}
	t.Logf("big runs with %s (4g.20gb) on GPU %s; the tenants' GPUs are unchanged", uuid, newGPU)
}
