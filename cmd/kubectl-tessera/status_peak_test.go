package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
)

// l40sNode is node name of gpus L40S-48GB (the demo's pcie-2numa machine):
// 47 memory units of 1 GiB each.
func l40sNode(t *testing.T, name string, gpus int) *corev1.Node {
	t.Helper()
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}, SharedIsolation: true}
	for i := 0; i < gpus; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: uuid("c1", i), Model: "NVIDIA L40S", MemoryMiB: 49152, MemoryUnits: 47, Healthy: true})
		row := make([]string, gpus)
		for j := range row {
			row[j] = "SYS"
		}
		row[i] = "X"
		inv.Links = append(inv.Links, row)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	return n
}

// sliceLimits asks for memUnits tessera.dev/gpu-memory and, when cores >
// 0, cores tessera.dev/gpu-core.
func sliceLimits(memUnits, cores int64) corev1.ResourceRequirements {
	lim := corev1.ResourceList{api.ResourceGPUMemory: *resource.NewQuantity(memUnits, resource.DecimalSI)}
	if cores > 0 {
		lim[api.ResourceGPUCore] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return corev1.ResourceRequirements{Limits: lim}
}

// TestStatusSidecarInitPeak is the demo's sidecar pod on node p1 (4 x
// L40S, 47 GiB units): a sidecar (10 units, 20 %), then a regular init
// container (30 units, 80 %), then the app container (10 units, 20 %), all
// on GPU 3, with fill7 (7 units, no compute limit) beside it. The pod
// takes its peak, side+init = 40 units / 100 % (kubelet's rule, what the
// extender's fit counts: 47-40 = 7 left, taken by fill7), not the sum of
// its containers (50 units / 120 %): the status shows GPU 3 full, 47.0/47Gi
// at 100 %, not 57.0/47Gi at 120 %. The assignment lists its containers by
// name (init, main, side), not in start order.
func TestStatusSidecarInitPeak(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	gpu3 := api.GPURef{UUID: uuid("c1", 3), Index: 3}
	slice := func(memUnits, cores int64) *api.SharedGPU {
		return &api.SharedGPU{GPU: gpu3, MemoryMiB: memUnits * 1024, Cores: cores}
	}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "s", Name: name, UID: types.UID("uid-s-" + name), Annotations: map[string]string{},
				CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec:   corev1.PodSpec{NodeName: "p1", NodeSelector: map[string]string{"kubernetes.io/hostname": "p1"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	sidecar := pod("sidecar")
	sidecar.Spec.InitContainers = []corev1.Container{
		{Name: "side", Image: "busybox", RestartPolicy: &always, Resources: sliceLimits(10, 20)},
		{Name: "init", Image: "busybox", Command: []string{"sleep", "1"}, Resources: sliceLimits(30, 80)},
	}
	sidecar.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Resources: sliceLimits(10, 20)}}
	sa := api.NewAssignment()
	sa.Containers = []api.ContainerAssignment{{Name: "init", Shared: slice(30, 80)}, {Name: "main", Shared: slice(10, 20)}, {Name: "side", Shared: slice(10, 20)}}
	fill7 := pod("fill7")
	fill7.Spec.Containers = []corev1.Container{{Name: "c", Image: "busybox", Resources: sliceLimits(7, 0)}}
	fa := api.NewAssignment()
	fa.Containers = []api.ContainerAssignment{{Name: "c", Shared: slice(7, 0)}}

	for _, tc := range []struct {
		name   string
		pods   []runtime.Object
		golden string
		want   string // GPU 3's row, from the use on
	}{
		{"sidecar alone", []runtime.Object{sealed(t, sidecar.DeepCopy(), sa)}, "status-sidecar.txt", "shared [########..] 40.0/47Gi 100% s/sidecar"},
		{"sidecar and fill7", []runtime.Object{sealed(t, sidecar.DeepCopy(), sa), sealed(t, fill7, fa)}, "status-sidecar-fill7.txt", "shared [##########] 47.0/47Gi 100% s/fill7 s/sidecar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]runtime.Object{l40sNode(t, "p1", 4),
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: api.SealKeySecretName}, Data: map[string][]byte{api.SealKeyDataKey: []byte(sealKey)}}},
				tc.pods...)
			e := &env{client: fake.NewClientset(objs...), server: "https://127.0.0.1:6443", sealKeyNamespace: "kube-system",
				now: func() time.Time { return now }, stderr: &bytes.Buffer{}}
			var out bytes.Buffer
			if err := e.status(t.Context(), &out); err != nil {
				t.Fatal(err)
			}
			row := ""
			for _, l := range strings.Split(out.String(), "\n") {
				if f := strings.Fields(l); len(f) > 2 && f[0] == "3" && f[1] == "L40S" {
					row = strings.Join(f[2:], " ")
				}
			}
			if row != tc.want {
				t.Errorf("GPU 3: %q, want %q (the pod's peak, not the sum of its containers)\n%s", row, tc.want, out.String())
			}
			golden(t, tc.golden, out.Bytes())
		})
	}
}
