package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

var (
	mig1gR = api.MIGResource("1g.5gb")
	mig2gR = api.MIGResource("2g.10gb")
	mig3gR = api.MIGResource("3g.20gb")
)

// The agent on dgx-a100-mig serves one resource per MIG profile beside
// the whole and shared ones, which offer GPUs 4-7 only; an XID on a GPU in
// MIG mode takes out exactly its instances; Allocate answers with the MIG
// UUIDs; the inventory lists the instances.
func TestMIGOnDGXA100MIG(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	e := newEnv(t, nvmlmock.DGXA100MIG(), nil, withPublisher(kube.New(cs, "n1", nil, nil))).start(true)
	// GPUs 4-7 whole: 4 GPUs, 4 x 39 memory units, 400 core units; GPUs
	// 0-1: 14 x 1g.5gb, GPUs 2-3: 2 x (3g.20gb, 2g.10gb, 1g.5gb).
	all := map[corev1.ResourceName]int{gpuR: 4, memR: 156, coreR: 400, mig1gR: 16, mig2gR: 2, mig3gR: 2}
	e.kubelet.waitCounts("registration", all, all)
	for _, r := range []corev1.ResourceName{mig1gR, mig2gR, mig3gR} {
		if _, err := os.Stat(filepath.Join(e.dir, deviceplugin.SocketName(r))); err != nil {
			t.Errorf("socket of %s: %v", r, err)
		}
	}
	// NUMA: GPUs 0-3 are on node 0.
	for _, id := range append(e.m.MIGUUIDs(0), e.m.MIGUUIDs(3)[2]) {
		d := e.kubelet.device(mig1gR, id)
		if d == nil {
			t.Fatalf("%s device %s not listed", mig1gR, id)
		}
		if got := d.GetTopology().GetNodes(); len(got) != 1 || got[0].ID != 0 {
			t.Errorf("%s topology %v, want NUMA node 0", id, got)
		}
	}
	if d := e.kubelet.device(gpuR, e.uuid(0)); d != nil {
		t.Errorf("GPU 0, in MIG mode, is offered whole: %v", d)
	}

	// Preferred packs onto one GPU; Allocate answers with the MIG UUIDs.
	ids, err := e.kubelet.preferred(mig1gR, e.kubelet.healthyIDs(mig1gR), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{e.m.MIGUUIDs(0)[0], e.m.MIGUUIDs(0)[1]}, ids); diff != "" {
		t.Errorf("preferred 2 x 1g.5gb on a fresh node (-want +got):\n%s", diff)
	}
	resp, err := e.kubelet.allocate(mig1gR, e.m.MIGUUIDs(0)[1])
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CdiDevices) != 1 || resp.CdiDevices[0].Name != "nvidia.com/gpu="+e.m.MIGUUIDs(0)[1] || resp.Envs["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Errorf("Allocate response %v", resp)
	}
	ids, err = e.kubelet.preferred(mig1gR, e.kubelet.healthyIDs(mig1gR), nil, 1)
	if err != nil || len(ids) != 1 || !strings.HasPrefix(ids[0], "MIG-") {
		t.Fatalf("preferred = %v, %v", ids, err)
	}
	if g := gpuOfMIG(e.m, ids[0]); g != 0 {
		t.Errorf("preferred 1g.5gb after one on GPU 0 is on GPU %d, want GPU 0 (packed)", g)
	}
	if _, err := e.kubelet.allocate(mig3gR, e.m.MIGUUIDs(0)[0]); err == nil {
		t.Error("Allocate of a 1g.5gb instance as 3g.20gb succeeded")
	}

	// An XID on GPU 2 takes out its three instances, nothing else.
	for e.m.InjectXID(2, 79) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	e.kubelet.waitCounts("GPU 2's instances unhealthy", all, map[corev1.ResourceName]int{gpuR: 4, memR: 156, coreR: 400, mig1gR: 15, mig2gR: 1, mig3gR: 1})
	for i, r := range []corev1.ResourceName{mig3gR, mig2gR, mig1gR} {
		if d := e.kubelet.device(r, e.m.MIGUUIDs(2)[i]); d == nil || d.Health != pluginapi.Unhealthy {
			t.Errorf("%s %s after XID 79 on GPU 2: %v", r, e.m.MIGUUIDs(2)[i], d)
		}
	}
	if _, err := e.kubelet.allocate(mig3gR, e.m.MIGUUIDs(2)[0]); err == nil || !strings.Contains(err.Error(), "XID 79") {
		t.Errorf("Allocate on GPU 2 after XID 79 = %v, want refused", err)
	}

	// The inventory: MIG GPUs unsliced with their instances, GPU 2's unhealthy.
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		if err != nil {
			t.Fatalf("inventory annotation: %v", err)
		}
		if ok && !inv.GPUs[2].Healthy {
			if inv.GPUs[0].MIG == nil || len(inv.GPUs[0].MIG.Instances) != 7 || inv.GPUs[0].MemoryUnits != 0 || inv.GPUs[4].MIG != nil || inv.GPUs[4].MemoryUnits != 39 {
				t.Errorf("inventory GPUs %+v", inv.GPUs)
			}
			for _, in := range inv.GPUs[2].MIG.Instances {
				if in.Healthy {
					t.Errorf("instance %s of GPU 2 healthy in the inventory after XID 79", in.UUID)
				}
			}
			for _, r := range []corev1.ResourceName{mig1gR, mig2gR, mig3gR} {
				if !strings.Contains(strings.Join(inv.Resources, " "), string(r)) {
					t.Errorf("inventory resources %v lack %s", inv.Resources, r)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for GPU 2 unhealthy in the inventory")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gpuOfMIG(m *nvmlmock.Machine, uuid string) int {
	for i := range m.Profile().GPUs {
		for _, u := range m.MIGUUIDs(i) {
			if u == uuid {
				return i
			}
		}
	}
	return -1
}

// The agent records the MIG instances the kubelet allocated to a pod in
// its assignment (ContainerAssignment.MIG), with each instance's profile
// and GPU.
func TestAgentRecordsMIGAllocations(t *testing.T) {
	sealer, err := api.NewSealer([]byte("tessera-node-agent-mig-test-seal-key"))
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "infer", UID: "uid-infer"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{mig1gR: resource.MustParse("2")},
		}}}},
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, p)
	kubelet := &fakeSource{}
	m := nvmlmock.DGXA100MIG()
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ml", Name: "infer", Container: "main", Resource: mig1gR, DeviceIDs: []string{m.MIGUUIDs(2)[2], m.MIGUUIDs(0)[4]}})
	newEnv(t, m, nil, withPublisher(kube.New(cs, "n1", &podtrust.Filter{Sealer: sealer}, nil)), func(o *deviceplugin.Options) { o.Kubelet = kubelet }).start(false)
	want := []api.MIGRef{
		{UUID: m.MIGUUIDs(0)[4], Profile: "1g.5gb", GPU: api.GPURef{UUID: m.UUID(0), Index: 0}},
		{UUID: m.MIGUUIDs(2)[2], Profile: "1g.5gb", GPU: api.GPURef{UUID: m.UUID(2), Index: 2}},
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := cs.CoreV1().Pods("ml").Get(context.Background(), "infer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, ok, err := api.GetAssignment(got.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if len(a.Containers) != 1 || a.Containers[0].Name != "main" {
				t.Fatalf("assignment %+v", a)
			}
			if diff := cmp.Diff(want, a.Containers[0].MIG); diff != "" {
				t.Errorf("recorded MIG instances (-want +got):\n%s", diff)
			}
			if len(a.Containers[0].GPUs) != 0 || a.Containers[0].Shared != nil {
				t.Errorf("MIG allocations recorded as whole or shared: %+v", a.Containers[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the pod's assignment")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A GPU in MIG mode that falls off the bus takes its instances out of
// allocatable (unhealthy, still listed) until it answers again; no other
// GPU's instances move.
func TestLostMIGGPUTakesOutItsInstances(t *testing.T) {
	m := nvmlmock.DGXA100MIG()
	e := newEnv(t, m, nil).start(true)
	all := map[corev1.ResourceName]int{gpuR: 4, memR: 156, coreR: 400, mig1gR: 16, mig2gR: 2, mig3gR: 2}
	e.kubelet.waitCounts("registration", all, all)
	m.SetLost(0, true)
	e.kubelet.waitCounts("GPU 0 lost", all, map[corev1.ResourceName]int{gpuR: 4, memR: 156, coreR: 400, mig1gR: 9, mig2gR: 2, mig3gR: 2})
	for _, id := range m.MIGUUIDs(0) {
		if d := e.kubelet.device(mig1gR, id); d == nil || d.Health != pluginapi.Unhealthy {
			t.Errorf("instance %s of the lost GPU: %v", id, d)
		}
	}
	m.SetLost(0, false)
	e.clock.Add(time.Hour) // past the recovery delay
	e.kubelet.waitCounts("GPU 0 back", all, all)
}
