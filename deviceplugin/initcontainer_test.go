package deviceplugin_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// A tester's pod on the demo's p1 (pcie-2numa, 4 x L40S): s/initw's init
// container asks for 2 whole GPUs, its app container for 1. The kubelet
// allocated GPUs 0 and 1 to the init container and handed GPU 1 on to the
// app container; the pod holds both until it ends. The PodResources API
// lists no regular init container, so the agent recorded only the app
// container's GPU 1: the status views showed GPU 0 free, and the extender
// counted the pod's second GPU as "held for a pending whole-GPU pod" for
// the pod's whole life. The agent now takes the init container's devices
// from the kubelet's checkpoint (by the pod's UID) and records them: the
// pod's assignment names GPUs 0 and 1 for init and GPU 1 for main, and
// both GPUs are held here (withheld from shared use).
func TestRecordsTheGPUsOfAnInitContainer(t *testing.T) {
	limits := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "s", Name: "initw", UID: "uid-initw"},
		Spec: corev1.PodSpec{NodeName: "n1",
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox", Command: []string{"sleep", "1"}, Resources: limits(2)}},
			Containers:     []corev1.Container{{Name: "main", Image: "busybox", Resources: limits(1)}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, pod)
	sealer, err := api.NewSealer([]byte("tessera-node-agent-unit-test-seal-key"))
	if err != nil {
		t.Fatal(err)
	}
	trust := &podtrust.Filter{Sealer: sealer}
	pods := uidPodWatch{fakePodWatch: &fakePodWatch{updates: make(chan podsUpdate)}, uids: map[string]types.UID{"s/initw": "uid-initw"}}
	podResources, checkpoint := &listingSource{}, &fakeSource{}
	e := newEnv(t, nvmlmock.PCIe2NUMA(), nil, withPublisher(kube.New(cs, "n1", trust, nil)), func(o *deviceplugin.Options) {
		o.Pods = pods
		o.Kubelet = kubeletstate.First{podResources, checkpoint}
	})
	podResources.setPods(kubeletstate.PodRef{Namespace: "s", Name: "initw"})
	podResources.set(kubeletstate.ContainerDevices{Namespace: "s", Name: "initw", Container: "main", Resource: gpuR, DeviceIDs: []string{e.uuid(1)}})
	checkpoint.set(
		kubeletstate.ContainerDevices{PodUID: "uid-initw", Container: "init", Resource: gpuR, DeviceIDs: []string{e.uuid(0), e.uuid(1)}},
		kubeletstate.ContainerDevices{PodUID: "uid-initw", Container: "main", Resource: gpuR, DeviceIDs: []string{e.uuid(1)}},
		// An earlier pod of the same name, gone: not s/initw's.
		kubeletstate.ContainerDevices{PodUID: "uid-initw-before", Container: "init", Resource: gpuR, DeviceIDs: []string{e.uuid(3)}},
	)
	e.start(true)

	gpu := func(i int) api.GPURef { return api.GPURef{UUID: e.uuid(i), Index: i} }
	want := []api.ContainerAssignment{{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}}, {Name: "main", GPUs: []api.GPURef{gpu(1)}}}
	var got []api.ContainerAssignment
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods("s").Get(ctx, "initw", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		trust.Pod(p) // the agent's record, sealed
		if a, ok, err := api.GetAssignment(p.Annotations); ok && err == nil {
			got = a.Containers
		}
		return cmp.Equal(want, got), nil
	})
	if err != nil {
		t.Fatalf("s/initw's recorded GPUs: %v\n(-want +got):\n%s", err, cmp.Diff(want, got))
	}
	var shared []string
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		shared = e.agent.Inventory().WithheldFromShared
		return cmp.Equal([]string{e.uuid(0), e.uuid(1)}, shared), nil
	})
	if err != nil {
		t.Errorf("GPUs withheld from shared use: %v, want GPUs 0 and 1 (s/initw holds both)", shared)
	}
}
