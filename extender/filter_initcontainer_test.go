package extender

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// A tester's pod on the demo's p1 (4 x L40S): s/initw, an init container
// of 2 whole GPUs before an app container of 1, holds 2 GPUs for its whole
// life (the kubelet hands one of the init container's GPUs on to the app
// container and keeps the other allocated to the pod; kube-scheduler counts
// max(init, app) = 2); s/w2 holds the other 2. A pod of 1 GPU is refused,
// and rightly so, but the refusal said "GPUs held for pending whole-GPU
// pods count as used" where no pod was pending. It now says what holds the
// GPUs: nothing more when every GPU is recorded (the node agent records
// the init container's GPUs too, from the kubelet's checkpoint), and the
// pods whose GPUs are not recorded yet, by name, when some are not.
func TestFilterInitContainerHoldsItsGPUs(t *testing.T) {
	gpu := func(i int) api.GPURef { return api.GPURef{UUID: testbuild.GPUUUID("p1", i), Index: i} }
	limits := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	initw := func(recorded ...api.ContainerAssignment) *corev1.Pod {
		p := testbuild.Pod("initw").Node("p1").Obj()
		p.Namespace = "s"
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "p1"}
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Command: []string{"sleep", "1"}, Resources: limits(2)}}
		p.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox", Resources: limits(1)}}
		if recorded != nil {
			a := api.NewAssignment()
			a.Containers = recorded
			if err := api.SetAssignment(p.Annotations, a); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	w2 := testbuild.Pod("w2").Whole(2).Node("p1").Holding(2, 3).Obj()
	w2.Namespace = "s"

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		// held is what the ledger counts initw to hold, pending what of it
		// is not recorded.
		held, pending int
		want          string
	}{
		{"as the node agent records it: the init container's GPUs and the one handed on",
			initw(api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{gpu(0), gpu(1)}}, api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(1)}}),
			2, 0, "tessera: fewer than 1 whole GPUs free"},
		{"only the app container's GPU recorded (an agent that reads PodResources alone)",
			initw(api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{gpu(1)}}),
			2, 1, "tessera: fewer than 1 whole GPUs free; 1 held for pods bound here whose GPUs are not recorded yet: s/initw"},
		{"nothing recorded yet",
			initw(),
			2, 2, "tessera: fewer than 1 whole GPUs free; 2 held for pods bound here whose GPUs are not recorded yet: s/initw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCache(t, []*corev1.Node{testbuild.Node("p1").GPUs(4, "NVIDIA L40S", 49152).Obj()}, []*corev1.Pod{tc.pod, w2})
			st := mustState(t, c, "p1")
			u := st.Pods[tc.pod.UID]
			if u == nil || u.Err != nil {
				t.Fatalf("s/initw not counted: %+v", u)
			}
			if u.WholeGPUs() != tc.held || u.WholePending != tc.pending {
				t.Errorf("s/initw holds %d whole GPUs, %d not recorded; want %d, %d (max(init 2, app 1), each GPU once)", u.WholeGPUs(), u.WholePending, tc.held, tc.pending)
			}
			if st.FreeGPUs() != 0 {
				t.Errorf("%d GPUs free, want 0", st.FreeGPUs())
			}
			one := testbuild.Pod("one").Whole(1).Obj()
			one.Namespace = "s"
			one.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "p1"}
			s := NewServer(c, testPolicy(t, PolicyBinpack), newFakePods(), nil, nil)
			names := []string{"p1"}
			res := s.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: one, NodeNames: &names})
			if got := res.FailedNodes["p1"]; got != tc.want {
				t.Errorf("p1 refused with\n%q, want\n%q", got, tc.want)
			}
		})
	}
}
