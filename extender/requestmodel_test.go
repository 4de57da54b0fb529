package extender

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
)

// withInitSlice gives p an init container (a sidecar when sidecar) asking
// for memUnits and cores, before its other init containers.
func withInitSlice(p *corev1.Pod, name string, sidecar bool, memUnits, cores int64) *corev1.Pod {
	c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}
	if memUnits > 0 {
		c.Resources.Limits[api.ResourceGPUMemory] = *resource.NewQuantity(memUnits, resource.DecimalSI)
	}
	if cores > 0 {
		c.Resources.Limits[api.ResourceGPUCore] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	if sidecar {
		always := corev1.ContainerRestartPolicyAlways
		c.RestartPolicy = &always
	}
	p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	return p
}

// TestSlicesAtTheirPeak: the extender counts a pod's slices the way the
// kubelet runs its containers (gpureq.PeakAmount): an init container's slice
// does not add to the regular containers', a sidecar's does.
func TestSlicesAtTheirPeak(t *testing.T) {
	a100 := "NVIDIA A100-SXM4-40GB"
	node := testbuild.Node("n").GPUs(1, a100, 40960).Obj()
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Reason
	}{
		{name: "init and main slices of 30 GiB fit a 40 GiB GPU", pod: withInitSlice(testbuild.Pod("p").Shared(30, 60).Obj(), "init", false, 30, 60)},
		{name: "a sidecar's slice adds up", pod: withInitSlice(testbuild.Pod("p").Shared(30, 40).Obj(), "side", true, 20, 40), want: SliceTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := BuildNodeState(NewNodeInfo(node), nil)
			if got := Check(st, mustDemand(t, tc.pod)); got != tc.want {
				t.Errorf("Check() = %q, want %q", got, tc.want)
			}
		})
	}

	// Bound with both slices recorded on GPU 0, the pod holds its peak.
	bound := withInitSlice(testbuild.Pod("b").Shared(30, 60).Node("n").On(0, 30720, 60).Obj(), "init", false, 30, 60)
	a, _, err := api.GetAssignment(bound.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "init", Shared: &api.SharedGPU{GPU: a.Containers[0].Shared.GPU, MemoryMiB: 30720, Cores: 60}})
	if err := api.SetAssignment(bound.Annotations, a); err != nil {
		t.Fatal(err)
	}
	st := BuildNodeState(NewNodeInfo(node), []*PodUse{NewPodUse(bound)})
	if got, want := (gpureq.Amount{MemMiB: st.GPUs[0].MemUsedMiB, Cores: st.GPUs[0].CoresUsed}), (gpureq.Amount{MemMiB: 30720, Cores: 60}); got != want {
		t.Errorf("GPU 0 uses %+v, want the pod's peak %+v", got, want)
	}
}

// TestCoreOnlySliceBase: a core-only slice is cores% of the smallest shared
// capacity of the node's GPUs, rounded up, whichever GPU serves it.
func TestCoreOnlySliceBase(t *testing.T) {
	nb := testbuild.Node("n").GPUs(2, "NVIDIA A100-SXM4-80GB", 81920)
	nb.Inv.GPUs[1].MemoryMiB, nb.Inv.GPUs[1].MemoryUnits = 40960, 39 // a reserve left 39 units
	info := NewNodeInfo(nb.Obj())
	if info.SliceBaseMiB != 39*1024 {
		t.Fatalf("SliceBaseMiB = %d, want %d", info.SliceBaseMiB, 39*1024)
	}
	d := mustDemand(t, testbuild.Pod("p").Shared(0, 30).Obj())
	u, err := ChoosePlacement(testPolicy(t, PolicyBinpack), BuildNodeState(info, nil), "uid-p", d)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Shared) != 1 || u.Shared[0].MemMiB != 11981 || u.Shared[0].Cores != 30 { // ceil(0.3 * 39936)
		t.Errorf("ChoosePlacement() slices %+v, want one of 11981 MiB and 30 cores", u.Shared)
	}
}

// TestPodQuotaUseSidecars: quota counts sidecars beside the regular
// containers, as the GPU fit does.
func TestPodQuotaUseSidecars(t *testing.T) {
	p := withInitSlice(testbuild.Pod("p").Shared(4, 20).Obj(), "side", true, 2, 10)
	p = withInitSlice(p, "init", false, 5, 50)
	want := quota.Resources{api.ResourceGPUMemory: 7, api.ResourceGPUCore: 60}
	if diff := cmp.Diff(want, equota.Use(p)); diff != "" {
		t.Errorf("quota.Use() mismatch (-want +got):\n%s", diff)
	}
	d := mustDemand(t, p)
	if mem, cores := d.SharedTotals(); mem != 7 || cores != 60 {
		t.Errorf("SharedTotals() = %d, %d; want the quota's 7, 60", mem, cores)
	}
}
