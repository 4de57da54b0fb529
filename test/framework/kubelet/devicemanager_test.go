package kubelet_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"

	"github.com/tessera-gpu/tessera/test/framework/kubelet"
)

func TestMain(m *testing.M) {
	os.Exit(kubelet.RunInPrivateMountNamespace(m))
}

const devResource = "example.com/dev"

func devPod(name string, count int64) *v1.Pod {
	q := *resource.NewQuantity(count, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "c",
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{devResource: q}, Limits: v1.ResourceList{devResource: q}},
		}}},
	}
}

// hintStrings renders hints as "0,1:preferred", sorted.
func hintStrings(hints []topologymanager.TopologyHint) []string {
	out := []string{}
	for _, h := range hints {
		s := fmt.Sprint(h.NUMANodeAffinity.GetBits())
		if h.Preferred {
			s += ":preferred"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func checkHints(t *testing.T, what string, got []topologymanager.TopologyHint, want ...string) {
	t.Helper()
	slices.Sort(want)
	if g := hintStrings(got); !slices.Equal(g, want) {
		t.Errorf("%s: hints %v, want %v", what, g, want)
	}
}

// numaOf maps the devices of numaDevices("dev", 0, 0, 1, 1).
var numaOf = map[string]int{"dev-0": 0, "dev-1": 0, "dev-2": 1, "dev-3": 1}

func allocated(t *testing.T, dm *kubelet.DeviceManager, pod *v1.Pod) sets.Set[string] {
	t.Helper()
	return dm.AllocatedDevices(pod.UID, "c")[devResource]
}

func TestDeviceManagerCapacityAllocateAndHints(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}, TopologyPolicy: topologymanager.PolicySingleNumaNode})
	p := startTestPlugin(t, newTestPlugin(devResource, "test-dev.sock", numaDevices("dev", 0, 0, 1, 1)))
	p.waitRegistered(t, 1)
	if err := dm.WaitForResource(t.Context(), devResource, 4, 4, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	pod1 := devPod("pod-1", 2)
	checkHints(t, "2 of 4 free devices", dm.GetTopologyHints(pod1, &pod1.Spec.Containers[0])[devResource],
		"[0]:preferred", "[1]:preferred", "[0 1]")
	pod3 := devPod("pod-3-devs", 3)
	checkHints(t, "3 of 4 free devices", dm.GetTopologyHints(pod3, &pod3.Spec.Containers[0])[devResource],
		"[0 1]:preferred")

	// Admission with single-numa-node: both devices from one NUMA node, and
	// the plugin's Allocate got exactly those.
	opts, err := dm.AdmitPod(pod1)
	if err != nil {
		t.Fatalf("admit pod-1: %v", err)
	}
	got := allocated(t, dm, pod1)
	if got.Len() != 2 {
		t.Fatalf("pod-1 got devices %v, want 2", sets.List(got))
	}
	node := numaOf[sets.List(got)[0]]
	for d := range got {
		if numaOf[d] != node {
			t.Errorf("pod-1 devices %v span NUMA nodes under single-numa-node", sets.List(got))
		}
	}
	allocs := p.allocations()
	if len(allocs) != 1 || !slices.Equal(allocs[0], sets.List(got)) {
		t.Fatalf("plugin Allocate calls %v, want one with %v", allocs, sets.List(got))
	}
	wantEnv := strings.Join(sets.List(got), ",")
	if !hasEnv(opts["c"].Envs, "TEST_DEVICES", wantEnv) {
		t.Errorf("container run options envs %v lack TEST_DEVICES=%s", opts["c"].Envs, wantEnv)
	}
	if !hasAnnotation(opts["c"].Annotations, "test.tessera.io/devices", wantEnv) {
		t.Errorf("container run options annotations %v lack the plugin's", opts["c"].Annotations)
	}

	// Only the other NUMA node can now hold 2 devices on its own.
	other := 1 - node
	var otherDevs []string
	for d, n := range numaOf {
		if n == other {
			otherDevs = append(otherDevs, d)
		}
	}
	slices.Sort(otherDevs)
	pod2 := devPod("pod-2", 2)
	checkHints(t, "2 devices with one NUMA node taken", dm.GetTopologyHints(pod2, &pod2.Spec.Containers[0])[devResource],
		fmt.Sprintf("[%d]:preferred", other), "[0 1]")

	// One device turns unhealthy: capacity keeps it, allocatable does not.
	p.setHealth(otherDevs[0], pluginapi.Unhealthy)
	if err := dm.WaitForResource(t.Context(), devResource, 4, 3, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// pod-2 no longer fits; admission fails before reaching the plugin.
	_, err = dm.AdmitPod(pod2)
	var admErr *kubelet.AdmissionError
	if !errors.As(err, &admErr) {
		t.Fatalf("admit pod-2 with only 1 healthy free device: err=%v, want an AdmissionError", err)
	}
	t.Logf("pod-2 rejected as expected: %v", err)
	if n := len(p.allocations()); n != 1 {
		t.Errorf("plugin saw %d Allocate calls, want still 1", n)
	}
	// A 1-device pod gets the one healthy free device.
	pod4 := devPod("pod-4", 1)
	if _, err := dm.AdmitPod(pod4); err != nil {
		t.Fatalf("admit pod-4: %v", err)
	}
	if got := sets.List(allocated(t, dm, pod4)); !slices.Equal(got, otherDevs[1:]) {
		t.Errorf("pod-4 got %v, want the healthy %v", got, otherDevs[1:])
	}
	// Healthy again: allocatable is back.
	p.setHealth(otherDevs[0], pluginapi.Healthy)
	if err := dm.WaitForResource(t.Context(), devResource, 4, 4, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceManagerRestartKeepsCheckpointAndPluginReRegisters(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	p := startTestPlugin(t, newTestPlugin(devResource, "test-dev.sock", numaDevices("dev", 0, 0, 1, 1)))
	p.waitRegistered(t, 1)
	if err := dm.WaitForResource(t.Context(), devResource, 4, 4, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	podA := devPod("pod-a", 2)
	if _, err := dm.AdmitPod(podA); err != nil {
		t.Fatalf("admit pod-a: %v", err)
	}
	devsA := allocated(t, dm, podA)
	if devsA.Len() != 2 || len(p.allocations()) != 1 {
		t.Fatalf("pod-a devices %v, plugin allocations %v", sets.List(devsA), p.allocations())
	}

	// Restart while the plugin does not register again.
	p.setPaused(true)
	if err := dm.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kubelet.CheckpointFile); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	// The resource is known from the checkpoint, with no devices until the
	// plugin registers again.
	c, a, _ := dm.GetCapacity()
	if cq, aq := c[devResource], a[devResource]; cq.Value() != 0 || aq.Value() != 0 {
		t.Errorf("after restart, before re-registration: capacity=%s allocatable=%s, want 0 and 0", cq.String(), aq.String())
	}
	podB := devPod("pod-b", 2)
	if _, err := dm.AdmitPod(podB); err == nil {
		t.Fatal("pod-b admitted although no plugin registered with the restarted manager")
	} else {
		t.Logf("pod-b rejected before re-registration, as expected: %v", err)
	}
	// pod-a's allocation came back from the checkpoint, without the plugin.
	if got := allocated(t, dm, podA); !got.Equal(devsA) {
		t.Errorf("pod-a devices after restart %v, want %v", sets.List(got), sets.List(devsA))
	}
	runA, err := dm.ContainerRunOptions(podA, &podA.Spec.Containers[0])
	if err != nil {
		t.Fatalf("run options of pod-a after restart: %v", err)
	}
	if !hasEnv(runA.Envs, "TEST_DEVICES", strings.Join(sets.List(devsA), ",")) {
		t.Errorf("pod-a run options after restart: envs %v", runA.Envs)
	}
	if n := len(p.allocations()); n != 1 {
		t.Fatalf("plugin saw %d Allocate calls while not registered, want 1", n)
	}

	// The plugin registers again; an Allocate reaches it, and pod-a's
	// checkpointed devices are not handed out twice.
	p.setPaused(false)
	p.waitRegistered(t, 2)
	if err := dm.WaitForResource(t.Context(), devResource, 4, 4, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := dm.AdmitPod(podB); err != nil {
		t.Fatalf("admit pod-b after re-registration: %v", err)
	}
	devsB := allocated(t, dm, podB)
	allocs := p.allocations()
	if len(allocs) != 2 || !slices.Equal(allocs[1], sets.List(devsB)) {
		t.Fatalf("plugin Allocate calls %v, want a second one with %v", allocs, sets.List(devsB))
	}
	if devsB.Len() != 2 || devsB.HasAny(sets.List(devsA)...) {
		t.Errorf("pod-b got %v, overlapping pod-a's checkpointed %v", sets.List(devsB), sets.List(devsA))
	}
	podC := devPod("pod-c", 1)
	if _, err := dm.AdmitPod(podC); err == nil {
		t.Fatal("pod-c admitted although all 4 devices are allocated")
	}
	// pod-a goes away: its devices are free again.
	dm.RemovePod(podA.UID)
	if _, err := dm.AdmitPod(podC); err != nil {
		t.Fatalf("admit pod-c after pod-a left: %v", err)
	}
	if devsC := allocated(t, dm, podC); devsC.Len() != 1 || !devsA.IsSuperset(devsC) {
		t.Errorf("pod-c got %v, want one of pod-a's former %v", sets.List(devsC), sets.List(devsA))
	}
}

func hasEnv(envs []kubecontainer.EnvVar, name, value string) bool {
	for _, e := range envs {
		if e.Name == name && e.Value == value {
			return true
		}
	}
	return false
}

func hasAnnotation(annotations []kubecontainer.Annotation, name, value string) bool {
	for _, a := range annotations {
		if a.Name == name && a.Value == value {
			return true
		}
	}
	return false
}
