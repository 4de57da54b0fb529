package kube_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

const (
	gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
	gpu1 = "GPU-11111111-0000-0000-0000-000000000000"
	gpu2 = "GPU-22222222-0000-0000-0000-000000000000"
)

var gpuIndex = map[string]int{gpu0: 0, gpu1: 1, gpu2: 2}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// testTrust seals and checks assignments in tests.
func testTrust(t testing.TB) *podtrust.Filter {
	t.Helper()
	s, err := api.NewSealer([]byte("tessera-node-kube-unit-test-seal-key"))
	if err != nil {
		t.Fatal(err)
	}
	return &podtrust.Filter{Sealer: s}
}

// pod returns a pod whose containers "main", "a", "b" and "c" ask for 2
// whole GPUs ("main", "a", "c") or 4 memory units and 50 cores ("b").
func pod(ns, name, nodeName string, annotations map[string]string) *corev1.Pod {
	ctr := func(name string, res corev1.ResourceList) corev1.Container {
		return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: res}}
	}
	whole := corev1.ResourceList{api.ResourceGPU: resource.MustParse("2")}
	slice := corev1.ResourceList{api.ResourceGPUMemory: resource.MustParse("4"), api.ResourceGPUCore: resource.MustParse("50")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Annotations: annotations, ResourceVersion: "1"},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{
			ctr("main", whole), ctr("a", whole), ctr("b", slice), ctr("c", whole),
		}},
	}
}

// sealed returns the annotations of Tessera's assignment cs on the pod
// name (whose UID pod sets).
func sealed(t *testing.T, name string, cs ...api.ContainerAssignment) map[string]string {
	t.Helper()
	a := api.NewAssignment()
	a.Containers = cs
	ann, err := testTrust(t).Sealer.AssignmentAnnotations(types.UID("uid-"+name), a)
	if err != nil {
		t.Fatal(err)
	}
	return ann
}

func assignmentValue(t *testing.T, cs ...api.ContainerAssignment) string {
	t.Helper()
	a := api.NewAssignment()
	a.Containers = cs
	v, err := api.EncodeAssignment(a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func patches(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func TestPublishInventory(t *testing.T) {
	cs := fake.NewClientset(node("n1"))
	c := kube.New(cs, "n1", testTrust(t), nil)
	inv := &api.GPUInventory{
		APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU)},
		GPUs:      []api.InventoryGPU{{Index: 0, UUID: gpu0, Model: "A100", MemoryMiB: 40960, MemoryUnits: 40, Healthy: true}},
		Links:     [][]string{{"X"}}, NVLinkCliques: [][]int{{0}},
	}
	ctx := context.Background()
	for range 2 {
		if err := c.PublishInventory(ctx, inv); err != nil {
			t.Fatal(err)
		}
	}
	if n := patches(cs); n != 1 {
		t.Errorf("%d patches for two identical inventories, want 1", n)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := api.GetGPUInventory(n.Annotations)
	if err != nil || !ok {
		t.Fatalf("inventory annotation: ok %v err %v", ok, err)
	}
	if diff := cmp.Diff(inv, got); diff != "" {
		t.Errorf("inventory (-want +got):\n%s", diff)
	}
	inv.GPUs[0].Healthy, inv.GPUs[0].Reason = false, "XID 79"
	if err := c.PublishInventory(ctx, inv); err != nil {
		t.Fatal(err)
	}
	if n := patches(cs); n != 2 {
		t.Errorf("%d patches after a change, want 2", n)
	}
	if err := kube.New(cs, "absent", testTrust(t), nil).PublishInventory(ctx, inv); err == nil {
		t.Error("publishing on a missing node gave no error")
	}
}

func TestSetSharedIsolation(t *testing.T) {
	cs := fake.NewClientset(node("n1"))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := kube.New(cs, "n1", testTrust(t), func() time.Time { return now })
	ctx := context.Background()
	if err := c.SetSharedIsolation(ctx, false, "NRI is required"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetSharedIsolation(ctx, false, "NRI is required"); err != nil {
		t.Fatal(err)
	}
	if n := patches(cs); n != 1 {
		t.Errorf("%d patches for the same condition twice, want 1", n)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.NodeCondition{{
		Type: api.ConditionSharedGPUIsolation, Status: corev1.ConditionFalse, Reason: api.ReasonNRINotConnected,
		Message: "NRI is required", LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now),
	}}
	if diff := cmp.Diff(want, n.Status.Conditions); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
}

func TestSyncPods(t *testing.T) {
	// mixed's assignment is stale: the kubelet says c holds no whole GPU.
	// forged is a tenant's, copied is mixed's seal on another pod.
	forged := assignmentValue(t, api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpu1, Index: 1}, MemoryMiB: 4096}})
	copied := sealed(t, "mixed", api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpu2, Index: 2}, MemoryMiB: 4096}})
	objects := []runtime.Object{
		pod("ml", "mixed", "n1", sealed(t, "mixed",
			api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpu2, Index: 2}, MemoryMiB: 4096}},
			api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{{UUID: gpu0, Index: 0}}})),
		pod("ml", "plain", "n1", nil),
		pod("ml", "broken", "n1", map[string]string{api.AnnotationAssignment: "{not json"}),
		pod("ml", "forged", "n1", map[string]string{api.AnnotationAssignment: forged}),
		pod("ml", "copied", "n1", copied),
		pod("ml", "elsewhere", "n2", nil),
	}
	cs := fake.NewClientset(objects...)
	c := kube.New(cs, "n1", testTrust(t), nil)
	allocs := []kubeletstate.ContainerDevices{
		{Namespace: "ml", Name: "mixed", Container: "a", Resource: api.ResourceGPU, DeviceIDs: []string{gpu1, gpu0}},
		{Namespace: "ml", Name: "mixed", Container: "b", Resource: api.ResourceGPUMemory, DeviceIDs: []string{gpu0 + "::mem::0"}},
		{Namespace: "ml", Name: "plain", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu2}},
		{Namespace: "ml", Name: "broken", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu1}},
		{Namespace: "ml", Name: "forged", Container: "b", Resource: api.ResourceGPUMemory, DeviceIDs: []string{gpu0 + "::mem::1"}},
		{Namespace: "ml", Name: "copied", Container: "b", Resource: api.ResourceGPUMemory, DeviceIDs: []string{gpu0 + "::mem::2"}},
		{Namespace: "ml", Name: "gone", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu1}},
		{Namespace: "ml", Name: "elsewhere", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu1}},
		{PodUID: "uid-only", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu1}},
	}
	ctx := context.Background()
	shared, err := c.SyncPods(ctx, allocs, gpuIndex, nil)
	if err == nil {
		t.Error("SyncPods with a pod on another node gave no error")
	}
	if diff := cmp.Diff(map[kubeletstate.ContainerKey]string{{Namespace: "ml", Name: "mixed", Container: "b"}: gpu2}, shared); diff != "" {
		t.Errorf("shared placements (-want +got):\n%s", diff)
	}
	annotation := func(name string) string {
		p, err := cs.CoreV1().Pods("ml").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Annotations[api.AnnotationAssignment]
	}
	for _, tc := range []struct {
		pod, want string
	}{
		{"mixed", assignmentValue(t,
			api.ContainerAssignment{Name: "a", GPUs: []api.GPURef{{UUID: gpu0, Index: 0}, {UUID: gpu1, Index: 1}}},
			api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpu2, Index: 2}, MemoryMiB: 4096}},
		)},
		{"plain", assignmentValue(t, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{{UUID: gpu2, Index: 2}}})},
		// A hand-written value is not Tessera's: the kubelet's whole GPUs
		// are recorded over it; a forged or copied slice is left alone and
		// not reported as the container's (shared, above).
		{"broken", assignmentValue(t, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{{UUID: gpu1, Index: 1}}})},
		{"forged", forged},
		{"copied", copied[api.AnnotationAssignment]},
		{"elsewhere", ""},
	} {
		if got := annotation(tc.pod); got != tc.want {
			t.Errorf("pod %s annotation = %s\nwant %s", tc.pod, got, tc.want)
		}
	}
	// Nothing changed: no pod is read or written again.
	before := len(cs.Actions())
	allocs = allocs[:7]
	if _, err := c.SyncPods(ctx, allocs, gpuIndex, nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range cs.Actions()[before:] {
		if a.GetResource().Resource == "pods" && a.(interface{ GetName() string }).GetName() != "gone" {
			t.Errorf("unchanged pods were touched again: %v", a)
		}
	}
}

// A multi-GPU slice's container is reported on all its GPUs (its MPS
// group key); a sealed slice whose cores on each GPU times its GPUs exceed
// the container's request is not Tessera's decision for it (the trust
// filter drops it) and is not reported.
func TestSyncPodsMultiGPUSlice(t *testing.T) {
	slice := func(cores int64) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpu0, Index: 0}, Spread: []api.GPURef{{UUID: gpu2, Index: 2}}, MemoryMiB: 2048, Cores: cores}}
	}
	cs := fake.NewClientset(pod("ml", "multi", "n1", sealed(t, "multi", slice(25))), pod("ml", "greedy", "n1", sealed(t, "greedy", slice(26))))
	c := kube.New(cs, "n1", testTrust(t), nil)
	units := []string{gpu1 + "::mem::0", gpu1 + "::mem::1", gpu1 + "::mem::2", gpu1 + "::mem::3"}
	allocs := []kubeletstate.ContainerDevices{
		{Namespace: "ml", Name: "multi", Container: "b", Resource: api.ResourceGPUMemory, DeviceIDs: units},
		{Namespace: "ml", Name: "greedy", Container: "b", Resource: api.ResourceGPUMemory, DeviceIDs: units},
	}
	shared, err := c.SyncPods(context.Background(), allocs, gpuIndex, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[kubeletstate.ContainerKey]string{{Namespace: "ml", Name: "multi", Container: "b"}: gpu0 + "," + gpu2}, shared); diff != "" {
		t.Errorf("shared placements (-want +got):\n%s", diff)
	}
}
