package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// A gang is planned only on nodes kube-scheduler would bind its members
// to (internal/eligible): with one of the two A100 nodes cordoned, a gang
// of 2 × 8 A100 GPUs is not planned at all (before, the planner put a
// member on the cordoned node, where kube-scheduler never bound it, and
// the plan expired and came back); once the node is uncordoned the gang
// runs on both.
func TestGangWaitsForACordonedNode(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ns := namespace(t, c, "e2e-cordon")
	waitReleased(t, c)
	const cordoned = "a100-1"
	setUnschedulable(t, client, cordoned, true)
	t.Cleanup(func() {
		if err := patchUnschedulable(context.Background(), client, cordoned, false); err != nil {
			t.Errorf("uncordon %s: %v", cordoned, err)
		}
	})
	waitExtenderSeesCordon(t, c, ns, cordoned)
	members := []string{"cg-0", "cg-1"}
	for _, m := range members {
		create(t, client, ns, podSpec{name: m, gpus: 8, annotations: map[string]string{
			api.AnnotationGang: "cg", api.AnnotationGangMinMember: "2", api.AnnotationGPUModel: "A100"}})
	}
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		for _, m := range members {
			p := getPod(t, client, ns, m)
			if plan, ok, _ := api.GetGangPlan(p.Annotations); ok || p.Spec.NodeName != "" {
				t.Fatalf("member %s planned (%+v) or bound (%q) while only one A100 node may take a member", m, plan, p.Spec.NodeName)
			}
		}
	}
	setUnschedulable(t, client, cordoned, false)
	on := map[string]bool{}
	for _, m := range members {
		p, _ := waitRunning(t, c, ns, m, 90*time.Second)
		on[p.Spec.NodeName] = true
	}
	if !on["a100-1"] || !on["a100-2"] {
		t.Errorf("members run on %v, want a100-1 and a100-2", on)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// setUnschedulable cordons (or uncordons) node.
func setUnschedulable(t *testing.T, client kubernetes.Interface, node string, on bool) {
	t.Helper()
	if err := patchUnschedulable(t.Context(), client, node, on); err != nil {
		t.Fatal(err)
	}
}

func patchUnschedulable(ctx context.Context, client kubernetes.Interface, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// A GPU request the extender could never place is refused at creation by
// the extender's webhook, with the reason (before, the pod was created and
// stayed Pending with the reason in FailedScheduling events); a valid one
// in the same namespace is created.
func TestImpossibleRequestRefusedAtCreation(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-impossible")
	client := c.Client()
	for _, tc := range []struct {
		spec podSpec
		want string
	}{
		{podSpec{name: "cores", cores: 150}, `asks for 150 tessera.dev/gpu-core`},
		{podSpec{name: "nvlink", gpus: 2, annotations: map[string]string{api.AnnotationNVLink: "maybe"}}, `annotation tessera.dev/nvlink`},
		{podSpec{name: "model", gpus: 1, annotations: map[string]string{api.AnnotationGPUModel: "A100||H100"}}, `annotation tessera.dev/gpu-model`},
		{podSpec{name: "count", gpus: 1, annotations: map[string]string{api.AnnotationGPUCount: "2"}}, `annotation ` + api.AnnotationGPUCount},
	} {
		_, err := client.CoreV1().Pods(ns).Create(t.Context(), tc.spec.pod(ns), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "pod "+ns+"/"+tc.spec.name+": invalid GPU request") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create %s = %v, want a refusal containing %q", tc.spec.name, err, tc.want)
		}
	}
	create(t, client, ns, podSpec{name: "valid", gpus: 2, annotations: map[string]string{api.AnnotationNVLink: api.NVLinkRequired}})
	waitRunning(t, c, ns, "valid", 60*time.Second)
	deleteAll(t, c, ns)
}

// waitExtenderSeesCordon waits until the extender's node informer has seen
// node cordoned: a probe pod held by a gate of its own (nothing places
// it) is listed by /status/pods with node's reason naming the cordon.
func waitExtenderSeesCordon(t *testing.T, c *nodesim.Cluster, ns, node string) {
	t.Helper()
	probe := podSpec{name: "cordon-probe", gpus: 1}.pod(ns)
	probe.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "e2e.tessera.dev/probe"}}
	client := c.Client()
	if _, err := client.CoreV1().Pods(ns).Create(t.Context(), probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.CoreV1().Pods(ns).Delete(context.Background(), probe.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Errorf("deleting the probe: %v", err)
		}
	}()
	last, err := waitStatus(t, c, extender.StatusPodPath+ns+"/"+probe.Name, func(st extender.PodStatus) bool {
		return st.Pending != nil && slices.ContainsFunc(st.Pending.Nodes, func(f extender.NodeFit) bool {
			return f.Node == node && strings.Contains(f.Reason, "cordoned")
		})
	})
	if err != nil {
		t.Fatalf("the extender does not see %s cordoned: %v\nlast: %s", node, err, last)
	}
}
