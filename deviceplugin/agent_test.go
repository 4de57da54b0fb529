package deviceplugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

var (
	gpuR  = api.ResourceGPU
	memR  = api.ResourceGPUMemory
	coreR = api.ResourceGPUCore
)

type fakeNRI struct{ connected atomic.Bool }

func (f *fakeNRI) Connected() bool { return f.connected.Load() }

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is an agent on a mock machine with a fake kubelet in a private
// device-plugin directory.
type env struct {
	t       testing.TB
	dir     string
	m       *nvmlmock.Machine
	cfg     *api.NodeAgentConfig
	agent   *deviceplugin.Agent
	kubelet *fakeKubelet
	nri     *fakeNRI
	clock   *fakeClock
	reg     *prometheus.Registry
	stop    func()
}

type envOption func(*deviceplugin.Options)

func withPublisher(p deviceplugin.Publisher) envOption {
	return func(o *deviceplugin.Options) { o.Publisher = p }
}

func machineTopology(t testing.TB, m *nvmlmock.Machine) (*topology.Topology, gpu.Interface) {
	t.Helper()
	dir := t.TempDir()
	if err := m.WriteSysfs(dir); err != nil {
		t.Fatal(err)
	}
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	return topo, lib
}

// newEnv starts the agent; the fake kubelet is started first unless
// noKubelet.
func newEnv(t testing.TB, m *nvmlmock.Machine, mutate func(*api.NodeAgentConfig), extra ...envOption) *env {
	t.Helper()
	e := &env{t: t, dir: shortTempDir(t), m: m, nri: &fakeNRI{}, clock: &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, reg: prometheus.NewRegistry()}
	e.cfg = api.NewNodeAgentConfig()
	e.cfg.MemoryReserveMiB = 1024
	e.cfg.HealthCheckInterval.Duration = 20 * time.Millisecond
	e.cfg.XIDRecoveryDelay.Duration = time.Hour
	e.cfg.KubeletSyncInterval.Duration = 50 * time.Millisecond
	e.cfg.AllocationGrace.Duration = time.Hour
	if mutate != nil {
		mutate(e.cfg)
	}
	topo, lib := machineTopology(t, m)
	metrics, err := deviceplugin.NewMetrics(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	opts := deviceplugin.Options{
		Config:    e.cfg,
		NodeName:  "n1",
		PluginDir: e.dir,
		Topology:  topo,
		GPU:       lib,
		Kubelet:   &kubeletstate.Checkpoint{Path: filepath.Join(e.dir, kubeletstate.CheckpointFile)},
		NRI:       e.nri,
		Metrics:   metrics,
		Now:       e.clock.Now,
		StopDrain: -1,
	}
	for _, o := range extra {
		o(&opts)
	}
	e.agent, err = deviceplugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) start(withKubelet bool) *env {
	e.t.Helper()
	if withKubelet {
		e.kubelet = startFakeKubelet(e.t, e.dir)
	}
	ctx := context.Background()
	if _, ok := e.t.(*testing.B); ok {
		ctx = klog.NewContext(ctx, logr.Discard())
	} else {
		_, ctx = ktesting.NewTestContext(e.t)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.agent.Run(ctx) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("Run = %v", err)
				}
			case <-time.After(20 * time.Second):
				e.t.Error("Run did not return after cancel")
			}
		})
	}
	e.t.Cleanup(e.stop)
	return e
}

func (e *env) uuid(i int) string { return e.m.UUID(i) }

func (e *env) totals() map[corev1.ResourceName]int {
	n := len(e.m.Profile().GPUs)
	units := int((e.m.Profile().GPUs[0].MemoryMiB - e.cfg.MemoryReserveMiB) / e.cfg.MemoryUnitMiB)
	return map[corev1.ResourceName]int{gpuR: n, memR: n * units, coreR: n * api.CoresPerGPU}
}

// healthyBut is the healthy device counts with the given GPUs' whole
// device (gpuGone) and units (unitsGone) missing.
func (e *env) healthyBut(gpuGone, unitsGone int) map[corev1.ResourceName]int {
	tot := e.totals()
	n := len(e.m.Profile().GPUs)
	return map[corev1.ResourceName]int{
		gpuR:  tot[gpuR] - gpuGone,
		memR:  tot[memR] - unitsGone*tot[memR]/n,
		coreR: tot[coreR] - unitsGone*api.CoresPerGPU,
	}
}

// writeCheckpoint writes a device manager checkpoint holding allocs
// (resource -> device IDs, one container each).
func (e *env) writeCheckpoint(allocs map[corev1.ResourceName][]string) {
	e.t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	var entries []entry
	i := 0
	for r, ids := range allocs {
		entries = append(entries, entry{PodUID: fmt.Sprintf("uid-%d", i), ContainerName: "c", ResourceName: string(r), DeviceIDs: map[string][]string{"0": ids}})
		i++
	}
	b, err := json.Marshal(map[string]any{"Data": map[string]any{"PodDeviceEntries": entries, "RegisteredDevices": map[string][]string{}}, "Checksum": 1})
	if err != nil {
		e.t.Fatal(err)
	}
	tmp := filepath.Join(e.dir, ".ckpt.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(e.dir, kubeletstate.CheckpointFile)); err != nil {
		e.t.Fatal(err)
	}
}

func unitsOf(r corev1.ResourceName, uuid string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, devices.DeviceID(r, uuid, i))
	}
	return out
}

func TestRegistersAllResourcesWithTopology(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil).start(true)
	// dgx-a100: 8 GPUs, 8 x (40 - 1 reserved) memory units, 800 core units.
	want := map[corev1.ResourceName]int{gpuR: 8, memR: 312, coreR: 800}
	if diff := cmp.Diff(want, e.totals()); diff != "" {
		t.Fatalf("test expectation drifted (-want +got):\n%s", diff)
	}
	e.kubelet.waitCounts("registration", e.totals(), want)
	// Whole GPUs carry their NUMA node; shared units none (the kubelet
	// then offers the plugin every unit, and it takes the slice's own
	// GPU's: deviceplugin/devices Model.Devices).
	for _, tc := range []struct {
		r    corev1.ResourceName
		id   string
		numa int64 // -1: no topology
	}{
		{gpuR, e.uuid(0), 0},
		{gpuR, e.uuid(7), 1},
		{memR, e.uuid(3) + "::mem::38", -1},
		{coreR, e.uuid(4) + "::core::0", -1},
	} {
		d := e.kubelet.device(tc.r, tc.id)
		if d == nil {
			t.Errorf("%s device %s not listed", tc.r, tc.id)
			continue
		}
		got := d.GetTopology().GetNodes()
		if tc.numa < 0 && d.GetTopology() != nil || tc.numa >= 0 && (len(got) != 1 || got[0].ID != tc.numa) {
			t.Errorf("%s device %s topology %v, want NUMA node %d", tc.r, tc.id, d.GetTopology(), tc.numa)
		}
	}
	if d := e.kubelet.device(memR, e.uuid(0)+"::mem::39"); d != nil {
		t.Errorf("the reserved unit %s is advertised", d.ID)
	}
	e.kubelet.mu.Lock()
	for r, c := range e.kubelet.clients {
		if !c.opts.GetPreferredAllocationAvailable || c.opts.PreStartRequired {
			t.Errorf("%s options %v", r, c.opts)
		}
	}
	e.kubelet.mu.Unlock()
	for _, r := range api.Resources() {
		if _, err := os.Stat(filepath.Join(e.dir, deviceplugin.SocketName(r))); err != nil {
			t.Errorf("socket of %s: %v", r, err)
		}
	}
}

func TestWaitsForKubeletAndReRegistersWhenItRestarts(t *testing.T) {
	e := newEnv(t, nvmlmock.PCIe2NUMA(), nil).start(false)
	time.Sleep(100 * time.Millisecond) // the agent runs with no kubelet
	e.kubelet = startFakeKubelet(t, e.dir)
	all := e.totals()
	e.kubelet.waitCounts("first registration", all, all)

	for round := 0; round < 2; round++ {
		// GPUs allocated whole in earlier rounds are withheld from shared use.
		waitInventory(t, e, fmt.Sprintf("round %d: the kubelet has the devices", round), 0, round)
		e.kubelet.stop()
		// The stopped kubelet's streams ended: it knows no device until
		// the plugins register again, so the inventory withholds every
		// GPU and the extender binds nothing to the node meanwhile.
		waitInventory(t, e, fmt.Sprintf("round %d: the kubelet stopped", round), len(e.m.Profile().GPUs), len(e.m.Profile().GPUs))
		// The kubelet's device manager removes the plugin sockets on start.
		for _, r := range api.Resources() {
			os.Remove(filepath.Join(e.dir, deviceplugin.SocketName(r)))
		}
		e.kubelet = startFakeKubelet(t, e.dir)
		// GPUs allocated whole in earlier rounds keep their units withheld.
		e.kubelet.waitCounts(fmt.Sprintf("re-registration %d", round), all, e.healthyBut(0, round))
		// The new kubelet reaches the plugin: an Allocate works.
		if _, err := e.kubelet.allocate(gpuR, e.uuid(round)); err != nil {
			t.Fatalf("Allocate after re-registration: %v", err)
		}
	}
	if got := mustMetric(t, e.reg, "tessera_node_kubelet_registrations_total", map[string]string{"resource": string(gpuR), "result": "success"}); got != 3 {
		t.Errorf("gpu registrations = %v, want 3", got)
	}
}

// waitInventory waits until the agent's inventory withholds wantWhole GPUs
// from whole use and wantShared from shared use.
func waitInventory(t *testing.T, e *env, what string, wantWhole, wantShared int) {
	t.Helper()
	var whole, shared []string
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		inv := e.agent.Inventory()
		whole, shared = inv.WithheldFromWhole, inv.WithheldFromShared
		return len(whole) == wantWhole && len(shared) == wantShared, nil
	})
	if err != nil {
		t.Fatalf("%s: inventory withholds %v from whole, %v from shared use; want %d and %d GPUs", what, whole, shared, wantWhole, wantShared)
	}
}

func TestAllocateWholeGPUs(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	ids, err := e.kubelet.preferred(gpuR, e.kubelet.healthyIDs(gpuR), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{e.uuid(0), e.uuid(1)}, ids); diff != "" {
		t.Errorf("preferred 2 of dgx-a100 (-want +got):\n%s", diff)
	}
	resp, err := e.kubelet.allocate(gpuR, e.uuid(1), e.uuid(0))
	if err != nil {
		t.Fatal(err)
	}
	var cdi []string
	for _, d := range resp.CdiDevices {
		cdi = append(cdi, d.Name)
	}
	if diff := cmp.Diff([]string{"nvidia.com/gpu=" + e.uuid(0), "nvidia.com/gpu=" + e.uuid(1)}, cdi); diff != "" {
		t.Errorf("CDI devices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}, resp.Envs); diff != "" {
		t.Errorf("envs (-want +got):\n%s", diff)
	}
	// GPUs 0 and 1 are whole now: their units are withheld, their gpu
	// devices stay healthy (the kubelet knows they are allocated).
	e.kubelet.waitCounts("units withheld", all, e.healthyBut(0, 2))
	for _, r := range []corev1.ResourceName{memR, coreR} {
		id := devices.DeviceID(r, e.uuid(1), 0)
		if d := e.kubelet.device(r, id); d == nil || d.Health != pluginapi.Unhealthy {
			t.Errorf("%s of an allocated GPU: %v, want unhealthy", id, d)
		}
	}
	// Unknown and duplicate devices are refused.
	for _, ids := range [][]string{{"GPU-nope"}, {e.uuid(2), e.uuid(2)}} {
		if _, err := e.kubelet.allocate(gpuR, ids...); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Allocate(%v) = %v, want FailedPrecondition", ids, err)
		}
	}
}

func withNRIWait(d time.Duration) envOption {
	return func(o *deviceplugin.Options) { o.NRIWait = d }
}

func TestSharedUnitsRefusedWithoutNRI(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil, withNRIWait(100*time.Millisecond)).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	for _, r := range []corev1.ResourceName{memR, coreR} {
		_, err := e.kubelet.allocate(r, unitsOf(r, e.uuid(2), 4)...)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "requires the Tessera NRI plugin") || !strings.Contains(err.Error(), "fail closed") {
			t.Errorf("Allocate %s without NRI = %v, want a fail-closed NRI error", r, err)
		}
	}
	// Nothing was allocated: every device stays healthy.
	e.kubelet.waitCounts("nothing withheld", all, all)
	if got := mustMetric(t, e.reg, "tessera_node_allocations_total", map[string]string{"resource": string(memR), "result": "error"}); got != 1 {
		t.Errorf("memory allocation errors = %v, want 1", got)
	}
}

// An NRI plugin away for a moment (the runtime restarting): Allocate of
// shared units waits for it instead of failing the pod.
func TestSharedUnitsWaitForNRI(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil, withNRIWait(time.Minute)).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	time.AfterFunc(300*time.Millisecond, func() { e.nri.connected.Store(true) })
	start := time.Now()
	if _, err := e.kubelet.allocate(memR, unitsOf(memR, e.uuid(2), 4)...); err != nil {
		t.Fatalf("Allocate while the NRI plugin reconnects: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Allocate returned after %s, before the NRI plugin connected", d)
	}
}

// With the NRI plugin, every container allocated Tessera devices gets the
// sentinel mount that only the NRI plugin takes out (api.NRISentinelPath).
func TestAllocateAddsTheNRISentinel(t *testing.T) {
	for _, sentinel := range []string{"", "/var/lib/tessera/nri-sentinel"} {
		e := newEnv(t, nvmlmock.DGXA100(), nil, func(o *deviceplugin.Options) { o.NRISentinel = sentinel })
		e.nri.connected.Store(true)
		e.start(true)
		all := e.totals()
		e.kubelet.waitCounts("registration", all, all)
		for _, a := range []struct {
			r   corev1.ResourceName
			ids []string
		}{{gpuR, []string{e.uuid(0)}}, {memR, unitsOf(memR, e.uuid(2), 4)}, {coreR, unitsOf(coreR, e.uuid(2), 10)}} {
			resp, err := e.kubelet.allocate(a.r, a.ids...)
			if err != nil {
				t.Fatalf("Allocate %s: %v", a.r, err)
			}
			var got []string
			for _, m := range resp.Mounts {
				if m.ContainerPath == api.NRISentinelPath {
					got = append(got, m.HostPath)
				}
			}
			if want := []string{sentinel}; (sentinel == "" && len(got) > 0) || (sentinel != "" && !slices.Equal(got, want)) {
				t.Errorf("sentinel %q: Allocate %s mounts %v at %s", sentinel, a.r, got, api.NRISentinelPath)
			}
		}
		e.stop()
	}
}

func TestSharedAndWholeExcludeEachOther(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil)
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	// Shared units on GPU 2 withhold GPU 2 from tessera.dev/gpu.
	ids, err := e.kubelet.preferred(memR, e.kubelet.healthyIDs(memR), nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	byGPU := map[string]int{}
	for _, id := range ids {
		u, _, _ := devices.ParseDeviceID(memR, id)
		byGPU[u]++
	}
	if len(byGPU) != 1 {
		t.Errorf("preferred memory units span %d GPUs, want 1: %v", len(byGPU), ids)
	}
	resp, err := e.kubelet.allocate(memR, unitsOf(memR, e.uuid(2), 8)...)
	if err != nil {
		t.Fatalf("Allocate shared with NRI: %v", err)
	}
	if len(resp.CdiDevices) != 0 || len(resp.Devices) != 0 || len(resp.Mounts) != 0 || resp.Envs["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Errorf("shared Allocate hands out a GPU itself: %v", resp)
	}
	e.kubelet.waitCounts("GPU 2 withheld", all, e.healthyBut(1, 0))
	if d := e.kubelet.device(gpuR, e.uuid(2)); d.Health != pluginapi.Unhealthy {
		t.Errorf("GPU 2 is %s while serving shared units", d.Health)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(2)); err == nil || !strings.Contains(err.Error(), "serves shared units") {
		t.Errorf("whole Allocate of a shared GPU = %v", err)
	}
	// Whole GPU 5 withholds its units; shared units of GPU 5 are refused.
	if _, err := e.kubelet.allocate(gpuR, e.uuid(5)); err != nil {
		t.Fatal(err)
	}
	e.kubelet.waitCounts("GPU 2 and GPU 5's units withheld", all, e.healthyBut(1, 1))
	if _, err := e.kubelet.allocate(coreR, unitsOf(coreR, e.uuid(5), 10)...); err == nil || !strings.Contains(err.Error(), devices.ReasonWholeInUse) {
		t.Errorf("shared Allocate on a whole GPU = %v", err)
	}
	// Preferred whole GPUs leave out the withheld GPU 2 even when offered.
	got, err := e.kubelet.preferred(gpuR, []string{e.uuid(2), e.uuid(3)}, nil, 1)
	if err != nil || len(got) != 1 || got[0] != e.uuid(3) {
		t.Errorf("preferred of {2, 3} = %v, %v; want GPU 3", got, err)
	}
}

func TestXIDMakesOneGPUUnhealthyAndItRecovers(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	deadline := time.Now().Add(20 * time.Second)
	for e.m.InjectXID(3, 79) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never registered for XID events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Exactly GPU 3 and its units drop.
	e.kubelet.waitCounts("GPU 3 unhealthy", all, e.healthyBut(1, 1))
	for _, r := range api.Resources() {
		if d := e.kubelet.device(r, devices.DeviceID(r, e.uuid(3), 0)); d.Health != pluginapi.Unhealthy {
			t.Errorf("%s of GPU 3 is %s after XID 79", r, d.Health)
		}
	}
	// Allocation avoids it: preferred leaves it out, Allocate refuses it,
	// the others still allocate.
	got, err := e.kubelet.preferred(gpuR, []string{e.uuid(2), e.uuid(3)}, nil, 1)
	if err != nil || len(got) != 1 || got[0] != e.uuid(2) {
		t.Errorf("preferred of {2, 3} = %v, %v; want GPU 2", got, err)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(3)); err == nil || !strings.Contains(err.Error(), "XID 79") {
		t.Errorf("Allocate of GPU 3 = %v, want refused for XID 79", err)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(2)); err != nil {
		t.Errorf("Allocate of GPU 2 = %v", err)
	}
	// An application XID changes nothing.
	e.m.InjectXID(4, 13)
	// After the recovery delay a sound health check brings GPU 3 back.
	e.clock.Add(time.Hour)
	e.kubelet.waitCounts("GPU 3 recovered (GPU 2 whole)", all, e.healthyBut(0, 1))
	if got := mustMetric(t, e.reg, "tessera_node_xid_events_total", map[string]string{"gpu": "3", "xid": "79", "ignored": "false"}); got != 1 {
		t.Errorf("XID 79 count = %v, want 1", got)
	}
}

func TestLostGPUIsUnhealthyUntilItReturns(t *testing.T) {
	e := newEnv(t, nvmlmock.PCIe2NUMA(), nil).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	e.m.SetLost(1, true)
	e.kubelet.waitCounts("GPU 1 lost", all, e.healthyBut(1, 1))
	e.m.SetLost(1, false)
	e.kubelet.waitCounts("GPU 1 back", all, all)
}

func TestRebuildsUsageFromTheKubeletCheckpoint(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil)
	// Before the agent starts, the kubelet holds GPU 5 whole and memory
	// units of GPU 6: a restarted agent must withhold both from its very
	// first lists.
	e.writeCheckpoint(map[corev1.ResourceName][]string{gpuR: {e.uuid(5)}, memR: unitsOf(memR, e.uuid(6), 3)})
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("withheld from the start", all, e.healthyBut(1, 1))
	if d := e.kubelet.device(gpuR, e.uuid(6)); d.Health != pluginapi.Unhealthy {
		t.Errorf("GPU 6 (shared units held) is %s", d.Health)
	}
	if d := e.kubelet.device(memR, e.uuid(5)+"::mem::0"); d.Health != pluginapi.Unhealthy {
		t.Errorf("units of GPU 5 (held whole) are %s", d.Health)
	}
	// The pods go away: the kubelet's checkpoint no longer holds them.
	e.writeCheckpoint(nil)
	e.kubelet.waitCounts("released", all, all)
}

func TestPendingAllocationsSettleAndExpire(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	if _, err := e.kubelet.allocate(gpuR, e.uuid(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(1)); err != nil {
		t.Fatal(err)
	}
	e.kubelet.waitCounts("pending", all, e.healthyBut(0, 2))
	// The kubelet reports GPU 0 (settling it) but not GPU 1.
	e.writeCheckpoint(map[corev1.ResourceName][]string{gpuR: {e.uuid(0)}})
	time.Sleep(200 * time.Millisecond)
	e.kubelet.waitCounts("GPU 1 still pending", all, e.healthyBut(0, 2))
	// GPU 1 expires after the grace period; GPU 0 stays as the kubelet
	// holds it...
	e.clock.Add(2 * time.Hour)
	e.kubelet.waitCounts("GPU 1 expired", all, e.healthyBut(0, 1))
	// ...until the kubelet releases it.
	e.writeCheckpoint(nil)
	e.kubelet.waitCounts("GPU 0 released", all, all)
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nvmlmock.DGXA100(), nil).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	if _, err := e.kubelet.allocate(gpuR, e.uuid(7)); err != nil {
		t.Fatal(err)
	}
	e.kubelet.waitCounts("GPU 7 whole", all, e.healthyBut(0, 1))
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tessera_node_devices", map[string]string{"resource": string(gpuR), "state": "healthy"}, 8},
		{"tessera_node_devices", map[string]string{"resource": string(memR), "state": "withheld"}, 39},
		{"tessera_node_devices", map[string]string{"resource": string(memR), "state": "healthy"}, 7 * 39},
		{"tessera_node_devices", map[string]string{"resource": string(coreR), "state": "unhealthy"}, 0},
		{"tessera_node_allocations_total", map[string]string{"resource": string(gpuR), "result": "success"}, 1},
		{"tessera_node_gpu_healthy", map[string]string{"gpu": "7", "uuid": e.uuid(7)}, 1},
	} {
		if got := mustMetric(t, e.reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// mustMetric returns the value of the gathered sample of name with labels.
func mustMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func TestPublishesInventoryAndSharedIsolationCondition(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	e := newEnv(t, nvmlmock.DGXA100(), nil, withPublisher(kube.New(cs, "n1", nil, nil))).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	ctx := context.Background()
	waitNode := func(what string, cond func(*corev1.Node) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if err == nil && cond(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %v", what, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitNode("the inventory", func(n *corev1.Node) bool {
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		if err != nil {
			t.Fatalf("inventory annotation: %v", err)
		}
		return ok && len(inv.GPUs) == 8 && inv.GPUs[3].Healthy && inv.GPUs[0].MemoryUnits == 39 && inv.Links[0][1] == "NVS12" && !inv.SharedIsolation
	})
	waitNode("the condition", func(n *corev1.Node) bool {
		for _, c := range n.Status.Conditions {
			if c.Type == api.ConditionSharedGPUIsolation {
				return c.Status == corev1.ConditionFalse && c.Reason == api.ReasonNRINotConnected && strings.Contains(c.Message, "NRI")
			}
		}
		return false
	})
	for e.m.InjectXID(3, 48) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	waitNode("GPU 3 unhealthy in the inventory", func(n *corev1.Node) bool {
		inv, _, _ := api.GetGPUInventory(n.Annotations)
		return inv != nil && !inv.GPUs[3].Healthy && inv.GPUs[3].Reason == "XID 48"
	})
}

// The inventory withholds every GPU until the kubelet was sent the
// device lists, and again once the agent stops (then it goes on serving
// for StopDrain), so that the extender binds no pod the kubelet would
// refuse for devices no plugin offers.
func TestInventoryWithholdsAllWhenStopping(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	e := newEnv(t, nvmlmock.DGXA100(), nil, withPublisher(kube.New(cs, "n1", nil, nil)),
		func(o *deviceplugin.Options) { o.StopDrain = 300 * time.Millisecond }).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	withheld := func() (whole, shared int) {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		if err != nil || !ok {
			return -1, -1
		}
		return len(inv.WithheldFromWhole), len(inv.WithheldFromShared)
	}
	deadline := time.Now().Add(20 * time.Second)
	for w, s := withheld(); w != 0 || s != 0; w, s = withheld() {
		if time.Now().After(deadline) {
			t.Fatalf("after every list was sent, %d GPUs still withheld from whole use and %d from shared", w, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	e.stop()
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the agent stopped %s after it was told to, before its drain of 300ms", d)
	}
	if w, s := withheld(); w != 8 || s != 8 {
		t.Errorf("the stopped agent's inventory withholds %d GPUs from whole use and %d from shared, want all 8", w, s)
	}
}

func TestBuildInventory(t *testing.T) {
	for _, name := range nvmlmock.ProfileNames() {
		t.Run(name, func(t *testing.T) {
			m := nvmlmock.Builtin(name)
			topo, _ := machineTopology(t, m)
			cfg := api.NewNodeAgentConfig()
			var gpus []devices.GPU
			for _, g := range topo.GPUs {
				gpus = append(gpus, deviceplugin.ModelGPU(g))
			}
			resources, _ := deviceplugin.ServedResources(cfg, gpus)
			model, err := devices.New(gpus, devices.Options{Resources: resources, MemoryUnitMiB: cfg.MemoryUnitMiB})
			if err != nil {
				t.Fatal(err)
			}
			inv := deviceplugin.BuildInventory(topo, model, cfg, devices.HealthMap{m.UUID(0): {Reason: "XID 79"}}, true)
			if err := inv.Validate(); err != nil {
				t.Fatalf("inventory does not validate: %v", err)
			}
			if inv.GPUs[0].Healthy || inv.GPUs[0].Reason != "XID 79" || !inv.GPUs[1].Healthy {
				t.Errorf("health in inventory: %+v", inv.GPUs[:2])
			}
			if !inv.SharedIsolation {
				t.Error("sharedIsolation = false with NRI connected")
			}
			for i, g := range m.Profile().GPUs {
				want := int(g.MemoryMiB / 1024)
				if g.MIG != nil {
					want = 0 // never sliced
				}
				if inv.GPUs[i].MemoryUnits != want {
					t.Errorf("GPU %d: memory units %d, want %d", i, inv.GPUs[i].MemoryUnits, want)
				}
				if (g.MIG != nil) != (inv.GPUs[i].MIG != nil) {
					t.Fatalf("GPU %d: MIG in the inventory %+v, in the machine %+v", i, inv.GPUs[i].MIG, g.MIG)
				}
				if g.MIG == nil {
					continue
				}
				var got, want2 []string
				for k, in := range inv.GPUs[i].MIG.Instances {
					got = append(got, fmt.Sprintf("%s %s@%d+%d %v", in.UUID, in.Profile, in.Start, in.Size, in.Healthy))
					want2 = append(want2, fmt.Sprintf("%s %s@%d+%d %v", m.MIGUUIDs(i)[k], g.MIG.Instances[k].Profile, g.MIG.Instances[k].Start, g.MIG.Instances[k].Size, i != 0))
				}
				if diff := cmp.Diff(want2, got); diff != "" {
					t.Errorf("GPU %d MIG instances (-want +got):\n%s", i, diff)
				}
			}
			for _, g := range m.Profile().GPUs {
				for _, in := range migInstances(g) {
					if !slices.Contains(inv.Resources, string(api.MIGResource(in.Profile))) {
						t.Errorf("inventory resources %v lack %s", inv.Resources, api.MIGResource(in.Profile))
					}
				}
			}
			if b, _ := json.Marshal(inv); len(b) > 16<<10 {
				t.Errorf("inventory of %d bytes is too large for an annotation", len(b))
			}
		})
	}
}

// A machine of 8 GPUs with 192 GiB each: 1536 memory units at 1 GiB.
func big192Machine(t testing.TB) *nvmlmock.Machine {
	t.Helper()
	p, err := nvmlmock.Load(nvmlmock.DGXA100Name)
	if err != nil {
		t.Fatal(err)
	}
	p.Name = "b200-like"
	for i := range p.GPUs {
		p.GPUs[i].Model = "NVIDIA B200"
		p.GPUs[i].MemoryMiB = 192 * 1024
	}
	m, err := nvmlmock.New(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestListAndWatchFitsTheKubeletsMessageLimit(t *testing.T) {
	e := newEnv(t, big192Machine(t), func(c *api.NodeAgentConfig) { c.MemoryReserveMiB = 0 }).start(true)
	want := map[corev1.ResourceName]int{gpuR: 8, memR: 1536, coreR: 800}
	e.kubelet.waitCounts("registration", want, want)
	e.kubelet.mu.Lock()
	resp := &pluginapi.ListAndWatchResponse{Devices: e.kubelet.clients[memR].devices}
	e.kubelet.mu.Unlock()
	n := proto.Size(resp)
	t.Logf("ListAndWatch of %d memory devices (8 x 192 GiB at 1 GiB): %d bytes (%.1f KiB); the kubelet's limit is 4 MiB", len(resp.Devices), n, float64(n)/1024)
	if n >= 512<<10 {
		t.Errorf("ListAndWatch message is %d bytes, want well under 4 MiB (< 512 KiB)", n)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	m := nvmlmock.PCIe2NUMA()
	topo, lib := machineTopology(t, m)
	bad := api.NewNodeAgentConfig()
	bad.MemoryReserveMiB = 48 * 1024
	for _, tc := range []struct {
		name string
		opts deviceplugin.Options
		want string
	}{
		{"no config", deviceplugin.Options{PluginDir: "/x", Topology: topo, GPU: lib}, "configuration"},
		{"no dir", deviceplugin.Options{Config: api.NewNodeAgentConfig(), Topology: topo, GPU: lib}, "directory"},
		{"reserve too large", deviceplugin.Options{Config: bad, PluginDir: "/x", Topology: topo, GPU: lib}, "leaves nothing"},
	} {
		if _, err := deviceplugin.New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// fakePodWatch hands the agent what a test sends; Assigned answers what
// the test set as the API server's truth.
type fakePodWatch struct {
	updates chan podsUpdate

	mu           sync.Mutex
	apiView      map[string]bool
	apiUnstarted map[string]bool
	apiSlices    []devices.SlicePod
	apiErr       error
	apiReads     int
}

func (f *fakePodWatch) Assigned(context.Context) (devices.Assignments, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.apiReads++
	return devices.Assignments{GPUs: maps.Clone(f.apiView), Unstarted: maps.Clone(f.apiUnstarted), Slices: slices.Clone(f.apiSlices)}, f.apiErr
}

// setAPI makes the API server's answer view, every pod started, or err.
func (f *fakePodWatch) setAPI(view map[string]bool, err error) {
	f.setAPIUnstarted(view, nil, err)
}

// setAPIUnstarted is setAPI with the GPUs of unstarted pods' slices.
func (f *fakePodWatch) setAPIUnstarted(view, unstarted map[string]bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.apiView, f.apiUnstarted, f.apiErr = view, unstarted, err
}

type podsUpdate struct {
	assigned map[string]bool
	released bool
}

var _ deviceplugin.PodWatch = (*fakePodWatch)(nil)

func (f *fakePodWatch) Run(ctx context.Context, changed func(map[string]bool, bool)) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-f.updates:
			changed(u.assigned, u.released)
		}
	}
}

// fakeSource is a kubelet whose allocations a test sets; the agent reads
// them only when it syncs.
type fakeSource struct {
	mu     sync.Mutex
	allocs []kubeletstate.ContainerDevices
}

func (f *fakeSource) Allocations(context.Context) ([]kubeletstate.ContainerDevices, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]kubeletstate.ContainerDevices(nil), f.allocs...), nil
}

func (f *fakeSource) Name() string { return "fake" }

func (f *fakeSource) set(allocs ...kubeletstate.ContainerDevices) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs = allocs
}

// A slice's GPU is withheld from whole use as soon as the pod watch reports
// its assignment, before the kubelet admits the slice; and a pod that ends
// makes the agent read the kubelet's allocations again at once.
func TestPodWatchWithholdsAssignedGPUsAndRereadsOnRelease(t *testing.T) {
	pods := &fakePodWatch{updates: make(chan podsUpdate)}
	kubelet := &fakeSource{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes read the kubelet
	}, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	pods.updates <- podsUpdate{assigned: map[string]bool{e.uuid(3): true}}
	e.kubelet.waitCounts("GPU 3 withheld for its slice", all, e.healthyBut(1, 0))
	if d := e.kubelet.device(gpuR, e.uuid(3)); d.Health != pluginapi.Unhealthy {
		t.Errorf("GPU 3 is %s while assigned to a slice", d.Health)
	}
	got, err := e.kubelet.preferred(gpuR, []string{e.uuid(3), e.uuid(4)}, nil, 1)
	if err != nil || len(got) != 1 || got[0] != e.uuid(4) {
		t.Errorf("preferred of {3, 4} = %v, %v; want GPU 4", got, err)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(3)); err == nil || !strings.Contains(err.Error(), "assigned to shared units") {
		t.Errorf("whole Allocate of an assigned GPU = %v", err)
	}
	// Once assigned nowhere, GPU 3 is offered whole again.
	pods.updates <- podsUpdate{assigned: map[string]bool{}}
	e.kubelet.waitCounts("GPU 3 offered again", all, all)

	// A slice bound a moment ago that the watch has not reported yet: a
	// whole-GPU allocation reads the API server and avoids its GPU.
	pods.setAPI(map[string]bool{e.uuid(6): true}, nil)
	pods.mu.Lock()
	readsBefore := pods.apiReads
	pods.mu.Unlock()
	got, err = e.kubelet.preferred(gpuR, []string{e.uuid(6), e.uuid(7)}, nil, 1)
	if err != nil || len(got) != 1 || got[0] != e.uuid(7) {
		t.Errorf("preferred of {6, 7} with GPU 6 assigned in the API = %v, %v; want GPU 7", got, err)
	}
	if _, err := e.kubelet.allocate(gpuR, e.uuid(6)); err == nil || !strings.Contains(err.Error(), "assigned to shared units") {
		t.Errorf("whole Allocate of a GPU assigned in the API = %v", err)
	}
	// When the API server cannot be read, the watch's view decides.
	pods.setAPI(nil, errors.New("apiserver down"))
	if _, err := e.kubelet.allocate(gpuR, e.uuid(6)); err != nil {
		t.Errorf("whole Allocate with the API unreadable: %v", err)
	}
	pods.mu.Lock()
	if n := pods.apiReads - readsBefore; n != 3 {
		t.Errorf("API reads = %d, want one per whole-GPU call (3)", n)
	}
	pods.mu.Unlock()
	e.kubelet.waitCounts("GPU 6 allocated whole", all, e.healthyBut(0, 1))
	pods.setAPI(nil, nil)

	// The kubelet holds GPU 5 whole; a change without a release is not a
	// reason to read it.
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ns", Name: "w", Container: "c", Resource: gpuR, DeviceIDs: []string{e.uuid(5)}})
	pods.updates <- podsUpdate{assigned: map[string]bool{e.uuid(1): true}}
	e.kubelet.waitCounts("GPU 1 withheld", all, e.healthyBut(1, 1))
	if d := e.kubelet.device(memR, devices.DeviceID(memR, e.uuid(5), 0)); d.Health != pluginapi.Healthy {
		t.Errorf("GPU 5's units are %s before the agent read the kubelet", d.Health)
	}
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 5's units withheld after the read", all, e.healthyBut(0, 2))
	kubelet.set()
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 5's units offered again", all, e.healthyBut(0, 1))
}

// A slice's units come from the GPUs already shared or assigned to slices,
// those of a slice bound a moment ago (in the API server, not yet in the
// watch) included: units of a free GPU would make the agent withhold that
// GPU from whole use while the slice runs on its assigned GPU, and a
// whole-GPU pod bound meanwhile would then be refused by the kubelet (seen
// in TestSliceAndWholeGPUPodTogether: "Requested: 7, Available: 6").
//
// A GPU whose units the agent last read as allocated, or that its pod watch
// still reports assigned, may be one whose slice has just ended: the GPU
// the API server says a slice is assigned to comes first (seen again in
// TestSliceAndWholeGPUPodTogether, with the same message, when a slice was
// created right after another on the node had been deleted).
func TestUnitsComeFromAssignedGPUs(t *testing.T) {
	pods := &fakePodWatch{updates: make(chan podsUpdate)}
	kubelet := &fakeSource{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes read the kubelet
	}, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	// GPU 2's units are the best fit by count (fewer free after a slice's
	// units), GPU 6 is the one the API server says a slice is assigned to.
	avail := append(unitsOf(memR, e.uuid(2), 8), unitsOf(memR, e.uuid(6), 39)...)
	check := func(name string, apiView, unstarted map[string]bool, want string) {
		t.Helper()
		pods.setAPIUnstarted(apiView, unstarted, nil)
		got, err := e.kubelet.preferred(memR, avail, nil, 4)
		if err != nil || len(got) != 4 {
			t.Fatalf("%s: preferred = %v, %v", name, got, err)
		}
		for _, id := range got {
			if uuid, _, _ := devices.ParseDeviceID(memR, id); uuid != want {
				t.Errorf("%s: preferred %v, want units of %s", name, got, want)
				break
			}
		}
	}
	check("nothing assigned: best fit", nil, nil, e.uuid(2))
	check("GPU 6 assigned in the API server", map[string]bool{e.uuid(6): true}, nil, e.uuid(6))

	// The agent last read GPU 2's units as allocated (a slice that has
	// ended since, which the kubelet has not yet let go).
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ns", Name: "ended", Container: "c", Resource: memR, DeviceIDs: unitsOf(memR, e.uuid(2), 4)})
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 2 withheld from whole use for its units", all, e.healthyBut(1, 0))
	check("GPU 2 shared by an ended slice, GPU 6 assigned", map[string]bool{e.uuid(6): true}, nil, e.uuid(6))
	check("GPU 2 shared, nothing assigned", nil, nil, e.uuid(2))
	// Or GPU 2's units are those of a running slice: the slice the kubelet
	// admits now is one of a pod it has not started, assigned GPU 6.
	both := map[string]bool{e.uuid(2): true, e.uuid(6): true}
	check("GPU 2's slice runs, GPU 6's is not started", both, map[string]bool{e.uuid(6): true}, e.uuid(6))
	check("both slices started: best fit", both, nil, e.uuid(2))
	kubelet.set()
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 2 offered whole again", all, all)

	// The pod watch has not yet seen GPU 2's slice end; the API server
	// has.
	pods.updates <- podsUpdate{assigned: map[string]bool{e.uuid(2): true}}
	e.kubelet.waitCounts("GPU 2 withheld for the watch's slice", all, e.healthyBut(1, 0))
	check("GPU 2 assigned in the watch only, GPU 6 in the API server", map[string]bool{e.uuid(6): true}, nil, e.uuid(6))
}

// admit is the kubelet taking the pod in: it lists it from now on.
func (l *listingSource) admit(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = append(l.pods, kubeletstate.PodRef{Namespace: "ns", Name: name})
}

// add records an allocation.
func (l *listingSource) add(c kubeletstate.ContainerDevices) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.allocs = append(l.allocs, c)
}

// The burst seen on make demo: four 8 GiB / 20-core slices and a later
// one, bound at once to one node, r-s1 assigned GPU 7 and the others GPU
// 0, none started. The kubelet admits them one at a time, oldest first,
// each listed (PodResources) from its admission on and holding its units
// after. Every slice's units come from its own GPU: before, the GPUs of
// all unstarted slices ranked alike and best fit chose, so r-s1 got units
// of GPU 0 and ag-s1 (its GPU's units full in the kubelet's books) units
// of GPU 7, which a whole-GPU pod later took while they were allocated.
func TestBurstOfSlicesGetsUnitsOfTheirAssignedGPUs(t *testing.T) {
	pods := &fakePodWatch{updates: make(chan podsUpdate)}
	kubelet := &listingSource{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes read the kubelet
	}, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	slice := func(name string, sec int, gpu int) devices.SlicePod {
		return devices.SlicePod{Namespace: "ns", Name: name, UID: "uid-" + name, Created: t0.Add(time.Duration(sec) * time.Second),
			Containers: []devices.SliceContainer{{Name: "c", Units: map[corev1.ResourceName]int64{memR: 8, coreR: 20}, GPUs: []string{e.uuid(gpu)}}}}
	}
	burst := []devices.SlicePod{slice("r-s1", 0, 7), slice("r-s2", 0, 0), slice("r-s3", 0, 0), slice("r-s4", 1, 0), slice("ag-s1", 2, 0)}
	gpus := map[string]bool{e.uuid(0): true, e.uuid(7): true}
	pods.mu.Lock()
	pods.apiView, pods.apiUnstarted, pods.apiSlices = gpus, gpus, burst
	pods.mu.Unlock()

	taken := map[string]bool{}
	for _, p := range burst { // the kubelet's order
		kubelet.admit(p.Name)
		for _, r := range []corev1.ResourceName{coreR, memR} {
			var avail []string
			for _, id := range e.kubelet.healthyIDs(r) {
				if !taken[id] {
					avail = append(avail, id)
				}
			}
			size := int(p.Containers[0].Units[r])
			got, err := e.kubelet.preferred(r, avail, nil, size)
			if err != nil || len(got) != size {
				t.Fatalf("%s: preferred %s = %v, %v", p.Name, r, got, err)
			}
			for _, id := range got {
				if uuid, _, _ := devices.ParseDeviceID(r, id); uuid != p.Containers[0].GPUs[0] {
					t.Errorf("%s: preferred %s unit %s, not of its GPU %s", p.Name, r, id, p.Containers[0].GPUs[0])
				}
				taken[id] = true
			}
			if _, err := e.kubelet.allocate(r, got...); err != nil {
				t.Fatalf("%s: Allocate %s: %v", p.Name, r, err)
			}
			kubelet.add(kubeletstate.ContainerDevices{Namespace: "ns", Name: p.Name, Container: "c", Resource: r, DeviceIDs: got})
		}
	}
}

// livePodWatch is a fakePodWatch that also says which pods run.
type livePodWatch struct {
	*fakePodWatch
	mu   sync.Mutex
	live map[string]bool
}

var (
	_ deviceplugin.LivePods = (*livePodWatch)(nil)
	_ deviceplugin.LivePods = (*kube.PodWatch)(nil)
)

func (l *livePodWatch) Live(namespace, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live[namespace+"/"+name]
}

func (l *livePodWatch) LiveList() []kubeletstate.PodRef {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []kubeletstate.PodRef
	for key, live := range l.live {
		if ns, name, _ := strings.Cut(key, "/"); live {
			out = append(out, kubeletstate.PodRef{Namespace: ns, Name: name})
		}
	}
	return out
}

func (l *livePodWatch) setLive(key string, live bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live[key] = live
}

// A kubelet that has just restarted answers PodResources with no
// allocations until it has synced its pods: the devices of a pod the watch
// still sees running stay held, and are released once the pod has ended.
func TestLivePodKeepsItsDevicesThroughAnEmptyKubeletAnswer(t *testing.T) {
	pods := &livePodWatch{fakePodWatch: &fakePodWatch{updates: make(chan podsUpdate)}, live: map[string]bool{"ns/w": true}}
	kubelet := &fakeSource{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes read the kubelet
	}, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ns", Name: "w", Container: "c", Resource: gpuR, DeviceIDs: []string{e.uuid(5)}})
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 5's units withheld", all, e.healthyBut(0, 1))
	// The restarted kubelet's empty answer: w still runs.
	kubelet.set()
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	time.Sleep(300 * time.Millisecond)
	e.kubelet.waitCounts("GPU 5's units still withheld", all, e.healthyBut(0, 1))
	// w ends: its GPU is released.
	pods.setLive("ns/w", false)
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	e.kubelet.waitCounts("GPU 5's units offered again", all, all)
}

// fakeRuntime is the runtime's containers' GPU use a test sets (the NRI
// plugin's ledger in the node agent).
type fakeRuntime struct {
	mu            sync.Mutex
	whole, shared map[string]bool
}

var _ deviceplugin.RuntimeUse = (*fakeRuntime)(nil)

func (f *fakeRuntime) GPUsInUse() (whole, shared map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.whole), maps.Clone(f.shared)
}

func (f *fakeRuntime) set(whole, shared map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.whole, f.shared = whole, shared
}

// A pod deleted with no grace period is gone from the API server and the
// kubelet at once while its container runs on until the kubelet kills it:
// its GPU stays withheld from the other kind while the runtime has the
// container (the NRI plugin's ledger), and is offered again once it has
// not. Seen in TestRealNodeLifecycle: a whole-GPU pod bound right after a
// slice's forced deletion was given the slice's GPU, and the NRI plugin
// refused its container ("serves 1 shared container(s) ... and cannot
// also be used whole").
func TestRuntimeContainersKeepTheirGPUsAfterAForcedDeletion(t *testing.T) {
	pods := &fakePodWatch{updates: make(chan podsUpdate)}
	kubelet := &fakeSource{}
	runtime := &fakeRuntime{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes read the kubelet
	}, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet; o.Runtime = runtime })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)

	// A slice runs on GPU 3, a whole-GPU pod on GPU 5.
	kubelet.set(
		kubeletstate.ContainerDevices{Namespace: "ns", Name: "slice", Container: "c", Resource: memR, DeviceIDs: []string{devices.DeviceID(memR, e.uuid(3), 0)}},
		kubeletstate.ContainerDevices{Namespace: "ns", Name: "whole", Container: "c", Resource: gpuR, DeviceIDs: []string{e.uuid(5)}},
	)
	runtime.set(map[string]bool{e.uuid(5): true}, map[string]bool{e.uuid(3): true})
	pods.updates <- podsUpdate{assigned: map[string]bool{e.uuid(3): true}, released: true}
	e.kubelet.waitCounts("both running", all, e.healthyBut(1, 1))

	// Both deleted with no grace period: the API server and the kubelet
	// forget them, their containers still run.
	kubelet.set()
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	time.Sleep(300 * time.Millisecond)
	e.kubelet.waitCounts("forgotten by the kubelet and the API server, running in the runtime", all, e.healthyBut(1, 1))
	if _, err := e.kubelet.allocate(gpuR, e.uuid(3)); err == nil || !strings.Contains(err.Error(), "shared") {
		t.Errorf("whole Allocate of the GPU a slice's container still uses = %v", err)
	}
	got, err := e.kubelet.preferred(gpuR, []string{e.uuid(3), e.uuid(4)}, nil, 1)
	if err != nil || len(got) != 1 || got[0] != e.uuid(4) {
		t.Errorf("preferred of {3, 4} = %v, %v; want GPU 4", got, err)
	}

	// The containers stop: the runtime's change offers both GPUs again.
	runtime.set(map[string]bool{}, map[string]bool{})
	e.agent.RuntimeChanged()
	e.kubelet.waitCounts("the containers stopped", all, all)
}

// listingSource is a kubelet whose allocations and listed pods a test sets.
type listingSource struct {
	fakeSource
	pods []kubeletstate.PodRef
	err  error // when set, the listing fails
}

var _ kubeletstate.PodsLister = (*listingSource)(nil)

func (l *listingSource) AllocationsAndPods(ctx context.Context) ([]kubeletstate.ContainerDevices, []kubeletstate.PodRef, error) {
	a, _ := l.Allocations(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, nil, l.err
	}
	return a, append([]kubeletstate.PodRef{}, l.pods...), nil
}

func (l *listingSource) setErr(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
}

func (l *listingSource) setPods(pods ...kubeletstate.PodRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = pods
}

// After the kubelet restarts, the inventory withholds every GPU until the
// kubelet lists every pod the watch sees running on the node: before it
// has synced its pods, a restarted kubelet still counts the units of pods
// that ended while it was down, and refused a slice bound then.
func TestRestartedKubeletMustListTheRunningPodsBeforeGPUsAreOffered(t *testing.T) {
	pods := &livePodWatch{fakePodWatch: &fakePodWatch{updates: make(chan podsUpdate)}, live: map[string]bool{"ns/w": true, "ns/done": false}}
	kubelet := &listingSource{}
	w := kubeletstate.PodRef{Namespace: "ns", Name: "w"}
	kubelet.setPods(w)
	// PodResources first, the checkpoint when it does not answer, as the
	// node agent's command sets it up.
	sources := kubeletstate.First{kubelet, &fakeSource{}}
	e := newEnv(t, nvmlmock.PCIe2NUMA(), nil, func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = sources })
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	gpus := len(e.m.Profile().GPUs)
	waitInventory(t, e, "the kubelet lists w", 0, 0)

	e.kubelet.stop()
	kubelet.setPods() // the restarted kubelet has not synced its pods
	e.kubelet = startFakeKubelet(t, e.dir)
	e.kubelet.waitCounts("re-registration", all, all)
	waitInventory(t, e, "registered again, w not listed yet", gpus, gpus)
	time.Sleep(500 * time.Millisecond) // several reads of the kubelet
	waitInventory(t, e, "still not listed", gpus, gpus)
	// Only the checkpoint answers (PodResources not up yet): still waiting.
	kubelet.setErr(errors.New("pod-resources socket not there yet"))
	kubelet.setPods(w)
	time.Sleep(500 * time.Millisecond)
	waitInventory(t, e, "only the checkpoint answers", gpus, gpus)
	kubelet.setErr(nil)
	kubelet.setPods(w, kubeletstate.PodRef{Namespace: "ns", Name: "other"})
	waitInventory(t, e, "the kubelet lists w", 0, 0)
}

// The inventory names the GPUs whose devices the agent withholds, so that
// the extender does not place the other kind there before the kubelet can
// admit it; a GPU leaves the list once the kubelet was offered it again.
func TestPublishesWithheldGPUs(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	pods := &fakePodWatch{updates: make(chan podsUpdate)}
	kubelet := &fakeSource{}
	e := newEnv(t, nvmlmock.DGXA100(), func(c *api.NodeAgentConfig) {
		c.KubeletSyncInterval.Duration = time.Hour // only pokes publish and read the kubelet
	}, withPublisher(kube.New(cs, "n1", nil, nil)), func(o *deviceplugin.Options) { o.Pods = pods; o.Kubelet = kubelet })
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	waitWithheld := func(what string, whole, shared []string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			var inv *api.GPUInventory
			if err == nil {
				inv, _, err = api.GetGPUInventory(n.Annotations)
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if inv != nil && cmp.Equal(inv.WithheldFromWhole, whole) && cmp.Equal(inv.WithheldFromShared, shared) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: inventory %+v", what, inv)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitWithheld("nothing withheld", nil, nil)

	pods.updates <- podsUpdate{assigned: map[string]bool{e.uuid(3): true}}
	waitWithheld("GPU 3 withheld from whole use", []string{e.uuid(3)}, nil)
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	waitWithheld("GPU 3 released", nil, nil)
	if d := e.kubelet.device(gpuR, e.uuid(3)); d.Health != pluginapi.Healthy {
		t.Errorf("GPU 3 published as released while the kubelet has it %s", d.Health)
	}

	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ns", Name: "w", Container: "c", Resource: gpuR, DeviceIDs: []string{e.uuid(5), e.uuid(6)}})
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	waitWithheld("GPUs 5 and 6 withheld from shared use", nil, []string{e.uuid(5), e.uuid(6)})
	kubelet.set()
	pods.updates <- podsUpdate{assigned: map[string]bool{}, released: true}
	waitWithheld("GPUs 5 and 6 released", nil, nil)
}

func migInstances(g api.MockGPU) []api.MockMIGInstance {
	if g.MIG == nil {
		return nil
	}
	return g.MIG.Instances
}
