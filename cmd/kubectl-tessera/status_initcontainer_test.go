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

// TestStatusInitContainerHoldsItsGPUs is a tester's pods on the demo's p1
// (4 x L40S): s/initw, whose init container asks for 2 whole GPUs and its
// app container for 1, and s/w2 (2 whole GPUs, on GPUs 2 and 3), both
// Running; s/one (1 GPU) Pending. The kubelet gave the init container GPUs
// 0 and 1 and handed GPU 1 on to the app container; the pod holds both
// until it ends. The status showed "0 free" and "1 whole s/initw": the
// node agent recorded only what the PodResources API lists, which leaves
// out regular init containers. It now records the init container's GPUs
// too (from the kubelet's checkpoint), and the view shows GPU 0 held by
// s/initw. With only the app container's GPU recorded (an older agent), the
// view still counts the pod's second GPU, on a row of GPUs not recorded.
func TestStatusInitContainerHoldsItsGPUs(t *testing.T) {
	limits := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	gpu := func(i int) api.GPURef { return api.GPURef{UUID: uuid("c1", i), Index: i} }
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "s", Name: name, UID: types.UID("uid-s-" + name), Annotations: map[string]string{},
				CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec:   corev1.PodSpec{NodeName: "p1", NodeSelector: map[string]string{"kubernetes.io/hostname": "p1"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	assign := func(cs ...api.ContainerAssignment) *api.Assignment {
		a := api.NewAssignment()
		a.Containers = cs
		return a
	}
	initw := pod("initw")
	initw.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Command: []string{"sleep", "1"}, Resources: limits(2)}}
	initw.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Resources: limits(1)}}
	w2 := pod("w2")
	w2.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Resources: limits(2)}}
	one := pod("one")
	one.Spec.NodeName, one.Status.Phase = "", corev1.PodPending
	one.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Resources: limits(1)}}
	one.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
		Message: "0/1 nodes are available: 1 tessera: fewer than 1 whole GPUs free."}}

	for _, tc := range []struct {
		name   string
		initw  *api.Assignment
		golden string
		want   []string // GPU rows, from the use on
	}{
		{"as the node agent records it", assign(api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}}, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(1)}}),
			"status-initw.txt", []string{"0 whole s/initw", "1 whole s/initw", "2 whole s/w2", "3 whole s/w2"}},
		{"the app container's GPU recorded alone", assign(api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(1)}}),
			"status-initw-unrecorded.txt", []string{"0 free", "1 whole s/initw", "2 whole s/w2", "3 whole s/w2", "? whole s/initw: 1 GPU(s), GPUs not recorded yet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{l40sNode(t, "p1", 4),
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: api.SealKeySecretName}, Data: map[string][]byte{api.SealKeyDataKey: []byte(sealKey)}},
				sealed(t, initw.DeepCopy(), tc.initw), sealed(t, w2.DeepCopy(), assign(api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(2), gpu(3)}})), one.DeepCopy()}
			e := &env{client: fake.NewClientset(objs...), server: "https://127.0.0.1:6443", sealKeyNamespace: "kube-system",
				now: func() time.Time { return now }, stderr: &bytes.Buffer{}}
			var out bytes.Buffer
			if err := e.status(t.Context(), &out); err != nil {
				t.Fatal(err)
			}
			var rows []string
			for _, l := range strings.Split(out.String(), "\n") {
				f := strings.Fields(l)
				if len(f) > 0 && f[0] == "p1" {
					f = f[1:]
				}
				switch {
				case len(f) > 2 && f[1] == "L40S":
					// GPU, model, use, memory bar and size, compute, pods
					rows = append(rows, strings.TrimSpace(f[0]+" "+f[2]+" "+strings.Join(f[min(len(f), 6):], " ")))
				case len(f) > 1 && f[0] == "?":
					rows = append(rows, strings.Join(f, " "))
				}
			}
			if strings.Join(rows, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("GPU rows:\n%s\nwant:\n%s\n%s", strings.Join(rows, "\n"), strings.Join(tc.want, "\n"), out.String())
			}
			golden(t, tc.golden, out.Bytes())
		})
	}
}
