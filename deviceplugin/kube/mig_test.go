package kube_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

const (
	migA = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
	migB = "MIG-bbbbbbbb-0000-0000-0000-000000000000"
	migC = "MIG-cccccccc-0000-0000-0000-000000000000"
	migD = "MIG-dddddddd-0000-0000-0000-000000000000"
)

// migs: GPU 1 holds migB (start 3) and migA (start 5) of 1g.5gb; GPU 0
// holds migC, a 3g.20gb, and migD, a 1g.5gb at start 6.
var migs = map[string]kube.MIGDevice{
	migA: {MIGRef: api.MIGRef{UUID: migA, Profile: "1g.5gb", GPU: api.GPURef{UUID: gpu1, Index: 1}}, Start: 5},
	migB: {MIGRef: api.MIGRef{UUID: migB, Profile: "1g.5gb", GPU: api.GPURef{UUID: gpu1, Index: 1}}, Start: 3},
	migC: {MIGRef: api.MIGRef{UUID: migC, Profile: "3g.20gb", GPU: api.GPURef{UUID: gpu0, Index: 0}}, Start: 0},
	migD: {MIGRef: api.MIGRef{UUID: migD, Profile: "1g.5gb", GPU: api.GPURef{UUID: gpu0, Index: 0}}, Start: 6},
}

func migPod(name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + name), Annotations: annotations, ResourceVersion: "1"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{
			{Name: "small", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.MIGResource("1g.5gb"): resource.MustParse("3")}}},
			{Name: "big", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.MIGResource("3g.20gb"): resource.MustParse("1")}}},
		}},
	}
}

// SyncPods records the MIG instances the kubelet allocated, by GPU index
// and placement, clears those a container no longer holds, and never takes
// a MIG allocation for shared units.
func TestSyncPodsRecordsMIG(t *testing.T) {
	stale := sealed(t, "stale", api.ContainerAssignment{Name: "big", MIG: []api.MIGRef{migs[migC].MIGRef}})
	cs := fake.NewClientset(migPod("fresh", nil), migPod("stale", stale))
	c := kube.New(cs, "n1", testTrust(t), nil)
	allocs := []kubeletstate.ContainerDevices{
		{Namespace: "ml", Name: "fresh", Container: "small", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{migA, migD, migB}},
		{Namespace: "ml", Name: "fresh", Container: "big", Resource: api.MIGResource("3g.20gb"), DeviceIDs: []string{migC}},
		// The kubelet says stale's big holds nothing now; small holds one,
		// and an instance the node does not have, or of another profile,
		// is not recorded.
		{Namespace: "ml", Name: "stale", Container: "small", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{migA, "MIG-eeeeeeee-0000-0000-0000-000000000000", migC}},
	}
	ctx := context.Background()
	shared, err := c.SyncPods(ctx, allocs, gpuIndex, migs)
	if err != nil {
		t.Fatal(err)
	}
	if len(shared) != 0 {
		t.Errorf("MIG allocations reported as shared placements: %v", shared)
	}
	for _, tc := range []struct {
		pod  string
		want []api.ContainerAssignment
	}{
		{"fresh", []api.ContainerAssignment{
			{Name: "big", MIG: []api.MIGRef{migs[migC].MIGRef}},
			{Name: "small", MIG: []api.MIGRef{migs[migD].MIGRef, migs[migB].MIGRef, migs[migA].MIGRef}},
		}},
		{"stale", []api.ContainerAssignment{{Name: "small", MIG: []api.MIGRef{migs[migA].MIGRef}}}},
	} {
		p, err := cs.CoreV1().Pods("ml").Get(ctx, tc.pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, ok, err := api.GetAssignment(p.Annotations)
		if err != nil || !ok {
			t.Fatalf("pod %s assignment: %v, found %v", tc.pod, err, ok)
		}
		if diff := cmp.Diff(tc.want, a.Containers); diff != "" {
			t.Errorf("pod %s containers (-want +got):\n%s", tc.pod, diff)
		}
		if err := a.Validate(); err != nil {
			t.Errorf("pod %s assignment does not validate: %v", tc.pod, err)
		}
	}
	// Unchanged: nothing written again.
	before := patches(cs)
	if _, err := c.SyncPods(ctx, allocs, gpuIndex, migs); err != nil {
		t.Fatal(err)
	}
	if n := patches(cs) - before; n != 0 {
		t.Errorf("%d patches for unchanged MIG allocations", n)
	}
}

// A MIG instance the kubelet still lists for a container but the node no
// longer has (its layout changed under the pod: destroyed out of band, a
// GPU reset, a mock machine restarted) stays recorded as it was: the pod
// keeps its GPU, which the extender and dynamic MIG then count as having a
// tenant. The instances the node has are recorded as usual.
func TestSyncPodsKeepsRecordedUnknownMIG(t *testing.T) {
	gone := api.MIGRef{UUID: "MIG-99999999-0000-0000-0000-000000000000", Profile: "3g.20gb", GPU: api.GPURef{UUID: gpu0, Index: 0}}
	held := sealed(t, "held", api.ContainerAssignment{Name: "big", MIG: []api.MIGRef{gone}}, api.ContainerAssignment{Name: "small", MIG: []api.MIGRef{migs[migA].MIGRef}})
	cs := fake.NewClientset(migPod("held", held))
	c := kube.New(cs, "n1", testTrust(t), nil)
	allocs := []kubeletstate.ContainerDevices{
		{Namespace: "ml", Name: "held", Container: "big", Resource: api.MIGResource("3g.20gb"), DeviceIDs: []string{gone.UUID}},
		{Namespace: "ml", Name: "held", Container: "small", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{migA, migB}},
	}
	ctx := context.Background()
	if _, err := c.SyncPods(ctx, allocs, gpuIndex, migs); err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods("ml").Get(ctx, "held", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, ok, err := api.GetAssignment(p.Annotations)
	if err != nil || !ok {
		t.Fatalf("assignment: %v, found %v", err, ok)
	}
	want := []api.ContainerAssignment{
		{Name: "big", MIG: []api.MIGRef{gone}},
		{Name: "small", MIG: []api.MIGRef{migs[migB].MIGRef, migs[migA].MIGRef}},
	}
	if diff := cmp.Diff(want, a.Containers); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	// Once the kubelet no longer lists it, it goes.
	allocs = allocs[1:]
	if _, err := c.SyncPods(ctx, allocs, gpuIndex, migs); err != nil {
		t.Fatal(err)
	}
	p, _ = cs.CoreV1().Pods("ml").Get(ctx, "held", metav1.GetOptions{})
	if a, _, _ := api.GetAssignment(p.Annotations); a == nil || a.Container("big") != nil {
		t.Fatalf("an instance the kubelet freed is still recorded: %+v", a)
	}
}
