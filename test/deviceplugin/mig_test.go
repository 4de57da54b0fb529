package deviceplugin_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/kubelet"
)

var (
	mig1gR = api.MIGResource("1g.5gb")
	mig2gR = api.MIGResource("2g.10gb")
	mig3gR = api.MIGResource("3g.20gb")
)

// dgxA100MIG is dgx-a100-mig's resources with a 1 GiB reserve: GPUs 4-7
// whole and sliced, GPUs 0-1 in 7 x 1g.5gb, GPUs 2-3 in 3g.20gb + 2g.10gb
// + 1g.5gb; capacity and allocatable with gpu2Down when GPU 2 is
// unhealthy.
func dgxA100MIG(gpu2Down bool) map[v1.ResourceName][2]int64 {
	var d int64
	if gpu2Down {
		d = 1
	}
	return map[v1.ResourceName][2]int64{
		gpuR:   {4, 4},
		memR:   {4 * 39, 4 * 39},
		coreR:  {400, 400},
		mig1gR: {16, 16 - d},
		mig2gR: {2, 2 - d},
		mig3gR: {2, 2 - d},
	}
}

// The kubelet's real device manager (with the topology manager,
// single-numa-node) allocates tessera.dev/mig-1g.5gb on the mock DGX A100
// with MIG: the runtime gets exactly the instances as CDI devices, a pod's
// instances land on one GPU (the agent's preferred allocation), and an XID
// on a GPU in MIG mode takes out exactly its instances.
func TestKubeletAllocatesMIGInstancesOnDGXA100MIG(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}, TopologyPolicy: topologymanager.PolicySingleNumaNode})
	n := startAgent(t, nvmlmock.DGXA100MIG(), false)
	expectResources(t, dm, "registration", dgxA100MIG(false))

	gpuOf := map[string]int{}
	for i := range n.m.Profile().GPUs {
		for _, u := range n.m.MIGUUIDs(i) {
			gpuOf[u] = i
		}
	}
	// Two pods of 2 x 1g.5gb and one of 1: each on one GPU, none shared
	// between pods, the third packed onto a GPU already in use. No NRI
	// plugin is connected: MIG needs none.
	held := map[string]string{}
	var gpus [][]int
	for _, tc := range []struct {
		name string
		n    int64
	}{{"mig-a", 2}, {"mig-b", 2}, {"mig-c", 1}} {
		pod := podOf(tc.name, map[v1.ResourceName]int64{mig1gR: tc.n})
		run, err := dm.AdmitPod(pod)
		if err != nil {
			t.Fatalf("admit %s: %v", tc.name, err)
		}
		ids := sorted(dm.AllocatedDevices(pod.UID, "c")[string(mig1gR)].UnsortedList())
		if int64(len(ids)) != tc.n {
			t.Fatalf("%s: allocated %v, want %d instances", tc.name, ids, tc.n)
		}
		var onGPUs []int
		for _, id := range ids {
			g, ok := gpuOf[id]
			if !ok {
				t.Fatalf("%s: device %s is no MIG instance of the machine", tc.name, id)
			}
			if other, dup := held[id]; dup {
				t.Errorf("%s: instance %s also allocated to %s", tc.name, id, other)
			}
			held[id] = tc.name
			if !slices.Contains(onGPUs, g) {
				onGPUs = append(onGPUs, g)
			}
		}
		gpus = append(gpus, onGPUs)
		var cdi []string
		for _, d := range run["c"].CDIDevices {
			cdi = append(cdi, d.Name)
		}
		var want []string
		for _, id := range ids {
			want = append(want, "nvidia.com/gpu="+id)
		}
		if diff := cmp.Diff(want, sorted(cdi)); diff != "" {
			t.Errorf("%s: CDI devices (-want +got):\n%s", tc.name, diff)
		}
		if v := envOf(run["c"].Envs, api.EnvNVIDIAVisibleDevices); v != api.VisibleDevicesVoid {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want void (CDI passes the instances)", tc.name, v)
		}
	}
	// a takes GPU 0's first two; b joins it (the GPU in use); c too.
	if diff := cmp.Diff([][]int{{0}, {0}, {0}}, gpus); diff != "" {
		t.Errorf("GPUs of the pods' instances (-want +got):\n%s", diff)
	}
	expectResources(t, dm, "5 instances allocated", map[v1.ResourceName][2]int64{mig1gR: {16, 16}})

	// An XID on GPU 2 takes out its three instances, and nothing else.
	deadline := time.Now().Add(wait)
	for n.m.InjectXID(2, 79) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never registered for XID events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	expectResources(t, dm, "after XID 79 on GPU 2", dgxA100MIG(true))
	if _, err := dm.AdmitPod(podOf("big-3", map[v1.ResourceName]int64{mig3gR: 2})); err == nil {
		t.Error("two 3g.20gb were admitted with GPU 2's unhealthy")
	}
	got := sorted(admit(t, dm, podOf("big", map[v1.ResourceName]int64{mig3gR: 1}))[string(mig3gR)])
	if diff := cmp.Diff([]string{n.m.MIGUUIDs(3)[0]}, got); diff != "" {
		t.Errorf("3g.20gb with GPU 2 unhealthy (-want +got):\n%s", diff)
	}
}

func envOf(envs []kubecontainer.EnvVar, name string) string {
	for _, e := range envs {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
