// Package deviceplugin_test runs Tessera's node agent against the kubelet's
// own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager,
// unmodified, with the real topology manager) in a private mount namespace,
// on mock GPU machines.
package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/kubelet"
	"github.com/tessera-gpu/tessera/topology"
)

func TestMain(m *testing.M) {
	os.Exit(kubelet.RunInPrivateMountNamespace(m))
}

const (
	gpuR  = api.ResourceGPU
	memR  = api.ResourceGPUMemory
	coreR = api.ResourceGPUCore
	wait  = 20 * time.Second
)

type fakeNRI struct{ connected atomic.Bool }

func (f *fakeNRI) Connected() bool { return f.connected.Load() }

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// node is the node agent on a mock machine, serving the device manager's
// directory.
type node struct {
	m     *nvmlmock.Machine
	cfg   *api.NodeAgentConfig
	nri   *fakeNRI
	clock *clock
	stop  func()
}

// startAgent runs the node agent with a 1 GiB reserve per GPU.
func startAgent(t *testing.T, m *nvmlmock.Machine, nriConnected bool, mutate ...func(*deviceplugin.Options)) *node {
	t.Helper()
	n := &node{m: m, nri: &fakeNRI{}, clock: &clock{now: time.Now()}}
	n.nri.connected.Store(nriConnected)
	n.cfg = api.NewNodeAgentConfig()
	n.cfg.MemoryReserveMiB = 1024
	n.cfg.HealthCheckInterval.Duration = 50 * time.Millisecond
	n.cfg.XIDRecoveryDelay.Duration = time.Hour
	n.cfg.KubeletSyncInterval.Duration = 100 * time.Millisecond

	sysfs := t.TempDir()
	if err := m.WriteSysfs(sysfs); err != nil {
		t.Fatal(err)
	}
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: sysfs})
	if err != nil {
		t.Fatal(err)
	}
	opts := deviceplugin.Options{
		Config:    n.cfg,
		NodeName:  "n1",
		PluginDir: kubelet.DevicePluginDir,
		Topology:  topo,
		GPU:       lib,
		// No PodResources API in-process: the device manager's checkpoint
		// is the kubelet's record.
		Kubelet: &kubeletstate.Checkpoint{Path: kubelet.CheckpointFile},
		NRI:     n.nri,
		Now:     n.clock.Now,
	}
	for _, f := range mutate {
		f(&opts)
	}
	agent, err := deviceplugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent: %v", err)
				}
			case <-time.After(wait):
				t.Error("agent did not stop")
			}
		})
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) uuid(i int) string { return n.m.UUID(i) }

// index maps device IDs of resource r to the sorted GPU indices they are on.
func (n *node) indices(t *testing.T, r v1.ResourceName, ids []string) []int {
	t.Helper()
	seen := map[int]bool{}
	for _, id := range ids {
		uuid, _, err := devices.ParseDeviceID(r, id)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for i := range n.m.Profile().GPUs {
			if n.m.UUID(i) == uuid {
				seen[i], found = true, true
			}
		}
		if !found {
			t.Fatalf("device %s is on no GPU of the machine", id)
		}
	}
	out := []int{}
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

func podOf(name string, requests map[v1.ResourceName]int64) *v1.Pod {
	rl := v1.ResourceList{}
	for r, q := range requests {
		rl[r] = *resource.NewQuantity(q, resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "c",
			Resources: v1.ResourceRequirements{Requests: rl, Limits: rl},
		}}},
	}
}

// expectResources waits until the device manager reports exactly these
// capacities and allocatables.
func expectResources(t *testing.T, dm *kubelet.DeviceManager, what string, want map[v1.ResourceName][2]int64) {
	t.Helper()
	for r, ca := range want {
		if err := dm.WaitForResource(t.Context(), r, ca[0], ca[1], wait); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// dgxA100 is the dgx-a100's resources with a 1 GiB reserve: capacity and
// allocatable with gpusDown GPUs unhealthy or withheld from tessera.dev/gpu
// and unitsDown GPUs' units unhealthy or withheld.
func dgxA100(gpusDown, unitsDown int64) map[v1.ResourceName][2]int64 {
	return map[v1.ResourceName][2]int64{
		gpuR:  {8, 8 - gpusDown},
		memR:  {8 * 39, (8 - unitsDown) * 39},
		coreR: {800, (8 - unitsDown) * 100},
	}
}

func admit(t *testing.T, dm *kubelet.DeviceManager, pod *v1.Pod) map[string][]string {
	t.Helper()
	if _, err := dm.AdmitPod(pod); err != nil {
		t.Fatalf("admit %s: %v", pod.Name, err)
	}
	out := map[string][]string{}
	for r, ids := range dm.AllocatedDevices(pod.UID, "c") {
		out[r] = sorted(ids.UnsortedList())
	}
	return out
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func TestRegistersAllResourcesWithKubeletCapacity(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	startAgent(t, nvmlmock.DGXA100(), false)
	// 8 GPUs, 8 x (40 - 1 reserved) memory units, 800 core units.
	expectResources(t, dm, "registration", dgxA100(0, 0))
	for _, name := range []string{"tessera-gpu.sock", "tessera-gpu-memory.sock", "tessera-gpu-core.sock"} {
		if _, err := os.Stat(filepath.Join(kubelet.DevicePluginDir, name)); err != nil {
			t.Errorf("plugin socket: %v", err)
		}
	}
}

// Whole GPUs' hints carry their NUMA nodes; shared units give none.
func TestTopologyHintsCarryTheGPUsNUMANodes(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}, TopologyPolicy: topologymanager.PolicyBestEffort})
	startAgent(t, nvmlmock.DGXA100(), false)
	expectResources(t, dm, "registration", dgxA100(0, 0))
	hints := func(r v1.ResourceName, count int64) []string {
		pod := podOf(fmt.Sprintf("hints-%s-%d", filepath.Base(string(r)), count), map[v1.ResourceName]int64{r: count})
		var out []string
		for _, h := range dm.GetTopologyHints(pod, &pod.Spec.Containers[0])[string(r)] {
			s := fmt.Sprint(h.NUMANodeAffinity.GetBits())
			if h.Preferred {
				s += ":preferred"
			}
			out = append(out, s)
		}
		sort.Strings(out)
		return out
	}
	for _, tc := range []struct {
		r     v1.ResourceName
		count int64
		want  []string
	}{
		// GPUs 0-3 on NUMA node 0, 4-7 on node 1.
		{gpuR, 2, []string{"[0 1]", "[0]:preferred", "[1]:preferred"}},
		{gpuR, 4, []string{"[0 1]", "[0]:preferred", "[1]:preferred"}},
		{gpuR, 5, []string{"[0 1]:preferred"}},
		// Shared units carry no NUMA node: no hints, so the kubelet
		// offers the plugin every unit and it takes the slice's own GPU's
		// (with hints it offered only the lowest NUMA node's that had
		// units enough, whichever GPU the slice was on).
		{memR, 156, nil},
		{coreR, 400, nil},
	} {
		if diff := cmp.Diff(tc.want, hints(tc.r, tc.count)); diff != "" {
			t.Errorf("%s x %d hints (-want +got):\n%s", tc.r, tc.count, diff)
		}
	}
}

// bestEffortOnNVML is go-gpuallocator's own answer, on devices it builds
// from the machine's NVML itself.
func bestEffortOnNVML(t *testing.T, m *nvmlmock.Machine, available []int, size int) []int {
	t.Helper()
	devs, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(m.NVML()))
	if err != nil {
		t.Fatal(err)
	}
	var avail []*gpuallocator.Device
	for _, i := range available {
		avail = append(avail, devs[i])
	}
	out := []int{}
	for _, d := range gpuallocator.NewBestEffortPolicy().Allocate(avail, nil, size) {
		out = append(out, d.Index)
	}
	sort.Ints(out)
	return out
}

func TestAllocateFourGPUsOnDGX1VIsGoGPUAllocatorsBest(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	n := startAgent(t, nvmlmock.DGX1V(), false)
	expectResources(t, dm, "registration", map[v1.ResourceName][2]int64{gpuR: {8, 8}})

	first := n.indices(t, gpuR, admit(t, dm, podOf("train-a", map[v1.ResourceName]int64{gpuR: 4}))[string(gpuR)])
	// go-gpuallocator ranks a face of the hybrid cube-mesh best: every GPU
	// has NVLinks to the three others.
	want := bestEffortOnNVML(t, n.m, []int{0, 1, 2, 3, 4, 5, 6, 7}, 4)
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("first 4 GPUs (-go-gpuallocator +kubelet):\n%s", diff)
	}
	if !slices.Equal(first, []int{0, 1, 2, 3}) && !slices.Equal(first, []int{4, 5, 6, 7}) {
		t.Errorf("first 4 GPUs %v are not a face of the cube-mesh", first)
	}
	var rest []int
	for i := 0; i < 8; i++ {
		if !slices.Contains(first, i) {
			rest = append(rest, i)
		}
	}
	second := n.indices(t, gpuR, admit(t, dm, podOf("train-b", map[v1.ResourceName]int64{gpuR: 4}))[string(gpuR)])
	if diff := cmp.Diff(bestEffortOnNVML(t, n.m, rest, 4), second); diff != "" {
		t.Errorf("second 4 GPUs (-go-gpuallocator +kubelet):\n%s", diff)
	}
	// go-gpuallocator's own table for the DGX-1 (besteffort_test.go):
	// "Must include with allocation size 4" gives 4,5,6,7.
	if got := bestEffortOnNVML(t, n.m, rest, 4); !slices.Equal(got, rest) {
		t.Errorf("the rest %v is not a best set %v", rest, got)
	}
}

func TestAllocateTwoGPUsOnDGXA100IsNUMAAligned(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	n := startAgent(t, nvmlmock.DGXA100(), false)
	expectResources(t, dm, "registration", dgxA100(0, 0))
	numa := func(i int) int { return n.m.Profile().GPUs[i].NUMANode }
	var got [][]int
	for k := 0; k < 4; k++ {
		pod := podOf(fmt.Sprintf("pair-%d", k), map[v1.ResourceName]int64{gpuR: 2})
		run, err := dm.AdmitPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		idx := n.indices(t, gpuR, sorted(dm.AllocatedDevices(pod.UID, "c")[string(gpuR)].UnsortedList()))
		if numa(idx[0]) != numa(idx[1]) {
			t.Errorf("pair %d: GPUs %v span NUMA nodes %d and %d", k, idx, numa(idx[0]), numa(idx[1]))
		}
		got = append(got, idx)
		// The runtime gets exactly these GPUs as CDI devices.
		var cdi []string
		for _, d := range run["c"].CDIDevices {
			cdi = append(cdi, d.Name)
		}
		want := []string{"nvidia.com/gpu=" + n.uuid(idx[0]), "nvidia.com/gpu=" + n.uuid(idx[1])}
		if diff := cmp.Diff(sorted(want), sorted(cdi)); diff != "" {
			t.Errorf("pair %d CDI devices (-want +got):\n%s", k, diff)
		}
	}
	// Each pair also shares a PCIe switch (PXB), the best PCIe path.
	if diff := cmp.Diff([][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, got); diff != "" {
		t.Errorf("pairs (-want +got):\n%s", diff)
	}
	// Whole GPUs withhold their units: every GPU is whole now.
	expectResources(t, dm, "all units withheld", dgxA100(0, 8))
}

func TestKubeletRestartReRegistersAndHonoursTheCheckpoint(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	startAgent(t, nvmlmock.DGXA100(), false)
	expectResources(t, dm, "registration", dgxA100(0, 0))
	before := admit(t, dm, podOf("held", map[v1.ResourceName]int64{gpuR: 2}))[string(gpuR)]
	expectResources(t, dm, "held GPUs' units withheld", dgxA100(0, 2))

	if err := dm.Restart(); err != nil {
		t.Fatal(err)
	}
	// Same capacity after re-registration; the held GPUs' units stay
	// withheld (the agent keeps them from the kubelet's checkpoint).
	expectResources(t, dm, "after the kubelet restart", dgxA100(0, 2))
	// Only an Allocate that reaches the plugin proves re-registration: the
	// CDI devices come from the plugin's answer.
	pod := podOf("after", map[v1.ResourceName]int64{gpuR: 6})
	run, err := dm.AdmitPod(pod)
	if err != nil {
		t.Fatalf("admit after restart: %v", err)
	}
	after := sorted(dm.AllocatedDevices(pod.UID, "c")[string(gpuR)].UnsortedList())
	if len(run["c"].CDIDevices) != 6 {
		t.Errorf("Allocate after the restart did not reach the plugin: run options %+v", run["c"])
	}
	for _, id := range after {
		if slices.Contains(before, id) {
			t.Errorf("GPU %s of the checkpointed pod was allocated again", id)
		}
	}
	if _, err := dm.AdmitPod(podOf("one-too-many", map[v1.ResourceName]int64{gpuR: 1})); err == nil {
		t.Error("a ninth GPU was admitted")
	}
	expectResources(t, dm, "every GPU whole", dgxA100(0, 8))
}

func TestXID79TakesOutExactlyOneGPUUntilItRecovers(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	n := startAgent(t, nvmlmock.DGXA100(), false)
	expectResources(t, dm, "registration", dgxA100(0, 0))
	deadline := time.Now().Add(wait)
	for n.m.InjectXID(3, 79) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never registered for XID events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Exactly GPU 3 and its 39 + 100 units leave allocatable; capacity
	// keeps them (the kubelet counts unhealthy devices in capacity).
	expectResources(t, dm, "after XID 79 on GPU 3", dgxA100(1, 1))
	got := n.indices(t, gpuR, admit(t, dm, podOf("seven", map[v1.ResourceName]int64{gpuR: 7}))[string(gpuR)])
	if diff := cmp.Diff([]int{0, 1, 2, 4, 5, 6, 7}, got); diff != "" {
		t.Errorf("7 GPUs (-want +got):\n%s", diff)
	}
	if _, err := dm.AdmitPod(podOf("eighth", map[v1.ResourceName]int64{gpuR: 1})); err == nil {
		t.Error("the unhealthy GPU was admitted")
	}
	// Recovery: past the delay, sound health checks bring GPU 3 back; its
	// units are the only ones not withheld (the 7 others are whole).
	n.clock.Add(2 * time.Hour)
	expectResources(t, dm, "after recovery", map[v1.ResourceName][2]int64{gpuR: {8, 8}, memR: {312, 39}, coreR: {800, 100}})
	if got := admit(t, dm, podOf("eighth-again", map[v1.ResourceName]int64{gpuR: 1}))[string(gpuR)]; !slices.Equal(got, []string{n.uuid(3)}) {
		t.Errorf("after recovery the eighth GPU is %v, want GPU 3", got)
	}
}

func TestSharedAndWholeExcludeEachOther(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	n := startAgent(t, nvmlmock.DGXA100(), true)
	expectResources(t, dm, "registration", dgxA100(0, 0))

	shared := admit(t, dm, podOf("infer", map[v1.ResourceName]int64{memR: 10, coreR: 30}))
	memGPUs := n.indices(t, memR, shared[string(memR)])
	coreGPUs := n.indices(t, coreR, shared[string(coreR)])
	if len(memGPUs) != 1 || len(coreGPUs) != 1 {
		t.Fatalf("shared units spread over GPUs: memory %v, core %v", memGPUs, coreGPUs)
	}
	// The GPU(s) serving shared units leave tessera.dev/gpu.
	sharedGPUs := map[int]bool{memGPUs[0]: true, coreGPUs[0]: true}
	expectResources(t, dm, "shared GPU withheld from whole use", map[v1.ResourceName][2]int64{gpuR: {8, 8 - int64(len(sharedGPUs))}})
	if _, err := dm.AdmitPod(podOf("all-eight", map[v1.ResourceName]int64{gpuR: 8})); err == nil {
		t.Error("8 whole GPUs admitted while one serves shared units")
	}
	whole := n.indices(t, gpuR, admit(t, dm, podOf("rest", map[v1.ResourceName]int64{gpuR: int64(8 - len(sharedGPUs))}))[string(gpuR)])
	for _, i := range whole {
		if sharedGPUs[i] {
			t.Errorf("GPU %d is whole and shared", i)
		}
	}
	// Whole GPUs withhold their units: only the shared GPU's remain.
	expectResources(t, dm, "whole GPUs' units withheld", map[v1.ResourceName][2]int64{
		memR:  {312, 39 * int64(len(sharedGPUs))},
		coreR: {800, 100 * int64(len(sharedGPUs))},
	})
}

// slicePods is a deviceplugin.PodWatch whose API server lists fixed
// unstarted slices.
type slicePods struct{ a devices.Assignments }

func (s *slicePods) Run(ctx context.Context, changed func(map[string]bool, bool)) {
	changed(s.a.GPUs, false)
	<-ctx.Done()
}

func (s *slicePods) Assigned(context.Context) (devices.Assignments, error) { return s.a, nil }

// The burst seen on make demo, through the kubelet's device manager: 8 GiB
// / 20-core slices bound at once, r-s1 assigned GPU 7 and the others GPU 0,
// none started, admitted in creation order. Each slice's units are those
// of its own GPU in the kubelet's books (before, the units of r-s2..r-s4
// came from GPU 7: every unstarted slice's GPU ranked alike). The agent
// tells them apart by the checkpoint the device manager writes after each
// container: a pod holding its units is no longer the one admitted.
func TestBurstOfSlicesGetsUnitsOfTheirAssignedGPUs(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	m := nvmlmock.DGXA100()
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	type slice struct {
		name string
		sec  int
		gpu  int
	}
	burst := []slice{{"r-s1", 0, 7}, {"r-s2", 0, 0}, {"r-s3", 0, 0}, {"r-s4", 1, 0}, {"ag-s1", 2, 0}}
	pods := &slicePods{a: devices.Assignments{GPUs: map[string]bool{m.UUID(0): true, m.UUID(7): true}}}
	pods.a.Unstarted = pods.a.GPUs
	for _, s := range burst {
		pods.a.Slices = append(pods.a.Slices, devices.SlicePod{Namespace: "default", Name: s.name, UID: s.name + "-uid", Created: t0.Add(time.Duration(s.sec) * time.Second),
			Containers: []devices.SliceContainer{{Name: "c", Units: map[v1.ResourceName]int64{memR: 8, coreR: 20}, GPUs: []string{m.UUID(s.gpu)}}}})
	}
	n := startAgent(t, m, true, func(o *deviceplugin.Options) { o.Pods = pods })
	// GPUs 0 and 7 are assigned: withheld from whole use.
	expectResources(t, dm, "registration", dgxA100(2, 0))
	for _, s := range burst {
		got := admit(t, dm, podOf(s.name, map[v1.ResourceName]int64{memR: 8, coreR: 20}))
		for _, r := range []v1.ResourceName{memR, coreR} {
			if gpus := n.indices(t, r, got[string(r)]); !slices.Equal(gpus, []int{s.gpu}) {
				t.Errorf("%s: %s units of GPUs %v, want of its GPU %d", s.name, r, gpus, s.gpu)
			}
		}
	}
}

func TestSharedUnitsFailClosedWithoutNRI(t *testing.T) {
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	startAgent(t, nvmlmock.DGXA100(), false)
	expectResources(t, dm, "registration", dgxA100(0, 0))
	_, err := dm.AdmitPod(podOf("infer", map[v1.ResourceName]int64{memR: 4}))
	var adm *kubelet.AdmissionError
	if !errors.As(err, &adm) || !strings.Contains(adm.Message, "requires the Tessera NRI plugin") {
		t.Fatalf("admitting shared units without NRI = %v, want an admission error naming NRI", err)
	}
	// Nothing is held: all devices stay allocatable.
	expectResources(t, dm, "nothing allocated", dgxA100(0, 0))
}

// tesseraNodeBinary is bin/tessera-node as `make build` leaves it, or
// $TESSERA_NODE_BIN, or a fresh build of ./cmd/tessera-node.
func tesseraNodeBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TESSERA_NODE_BIN"); p != "" {
		return p
	}
	out := filepath.Join(t.TempDir(), "tessera-node")
	// Built in the main module (the repository root), with its go.mod, as
	// `make build` builds it: not with this test module's dependency set.
	cmd := exec.Command("go", "build", "-o", out, "./cmd/tessera-node")
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build tessera-node: %v\n%s", err, b)
	}
	return out
}

// The "must show": the built binary on a mock dgx-a100, with only
// a device-plugin directory and a node name, registers with the kubelet
// listening there and serves its allocations.
func TestBinaryRegistersWithTheKubelet(t *testing.T) {
	bin := tesseraNodeBinary(t)
	dm := kubelet.StartDeviceManagerForTest(t, kubelet.Options{NUMANodes: []int{0, 1}})
	var log strings.Builder
	cmd := exec.Command(bin, "--nvml=mock:dgx-a100", "--device-plugin-dir", kubelet.DevicePluginDir, "--node-name", "n1",
		"--metrics-addr=", "--pod-resources-socket", filepath.Join(t.TempDir(), "none.sock"),
		"--nri-socket", filepath.Join(t.TempDir(), "no-runtime.sock"), "--state-dir", t.TempDir(),
		"--cdi-spec-dirs=") // no CDI spec names the mock GPUs here
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("tessera-node exited with %v\n%s", err, log.String())
			}
		case <-time.After(wait):
			cmd.Process.Kill() //nolint:errcheck // best effort
			t.Errorf("tessera-node did not stop on SIGTERM\n%s", log.String())
		}
	}()
	// No reserve by default: 8 x 40 memory units.
	expectResources(t, dm, "the binary's registration", map[v1.ResourceName][2]int64{gpuR: {8, 8}, memR: {320, 320}, coreR: {800, 800}})
	run := admit(t, dm, podOf("binary", map[v1.ResourceName]int64{gpuR: 2}))
	if len(run[string(gpuR)]) != 2 {
		t.Errorf("allocated %v", run)
	}
}
