package nri

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/topology"
)

// --- fakes of the plugin's collaborators ---

type fakeAllocations struct {
	mu  sync.Mutex
	m   map[string]Devices // podUID/container
	err error              // returned by every read when set
}

func (f *fakeAllocations) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeAllocations) set(podUID, container string, d Devices) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[podUID+"/"+container] = d
}

func (f *fakeAllocations) ContainerDevices(_ context.Context, pod Pod, container string) (Devices, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return Devices{}, f.err
	}
	return f.m[pod.UID+"/"+container], nil
}

type fakeMPS struct {
	mu    sync.Mutex
	last  []string
	calls int
}

// Sync records the groups' keys (a GPU alone: its UUID).
func (f *fakeMPS) Sync(_ context.Context, groups [][]api.GPURef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.last = nil
	for _, g := range groups {
		uuids := make([]string, len(g))
		for i, r := range g {
			uuids[i] = r.UUID
		}
		f.last = append(f.last, gpureq.GroupKey(uuids))
	}
	return nil
}

func (f *fakeMPS) running() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.last...)
}

type fakeObserver struct{ ch chan bool }

func (f *fakeObserver) SetNRIConnected(c bool) { f.ch <- c }

func (f *fakeObserver) want(t *testing.T, c bool) {
	t.Helper()
	select {
	case got := <-f.ch:
		if got != c {
			t.Fatalf("observer told connected=%v, want %v", got, c)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("observer not told connected=%v in time", c)
	}
}

type fakeRecorder struct {
	mu   sync.Mutex
	recs []string
}

func (f *fakeRecorder) RecordShared(_ context.Context, pod Pod, container string, s api.SharedGPU) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, fmt.Sprintf("%s %s %s %dMiB %d%%", pod, container, s.GPU.UUID, s.MemoryMiB, s.Cores))
	return nil
}

// pluginCount is an adaptation.Metrics that reports the number of
// connected (synchronized) plugins.
type pluginCount struct{ ch chan int }

func (pluginCount) RecordPluginInvocation(string, string, error)      {}
func (pluginCount) RecordPluginLatency(string, string, time.Duration) {}
func (pluginCount) RecordPluginAdjustments(string, string, *adaptation.ContainerAdjustment, int, int) {
}
func (m pluginCount) UpdatePluginCount(n int) {
	select {
	case m.ch <- n:
	default:
	}
}

// --- the runtime side ---

// runtime is the runtime side of NRI in-process. Plugins reach it through a
// proxy on nri.sock, so that Stop can drop their connections the way a
// runtime process that exits does (Adaptation.Stop leaves external plugins'
// connections open).
type runtime struct {
	*adaptation.Adaptation
	plugins chan int

	listener net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
}

func startRuntime(t *testing.T, dir string, pods []*adaptation.PodSandbox, ctrs []*adaptation.Container) *runtime {
	t.Helper()
	r := &runtime{plugins: make(chan int, 16)}
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	inner := filepath.Join(dir, "runtime.sock")
	a, err := adaptation.New("containerd", "v2.1.0", sync, update,
		adaptation.WithSocketPath(inner),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")),
		adaptation.WithMetrics(pluginCount{r.plugins}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	r.Adaptation = a
	outer := filepath.Join(dir, "nri.sock")
	os.Remove(outer)
	if r.listener, err = net.Listen("unix", outer); err != nil {
		t.Fatal(err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := r.listener.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", inner)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(c, up)
			go pipe(up, c)
		}
	}()
	return r
}

// Stop stops the runtime and drops every plugin connection.
func (r *runtime) Stop() {
	r.Adaptation.Stop()
	r.listener.Close()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// waitPlugin waits until the plugin is synchronized and receives events.
func (r *runtime) waitPlugin(t *testing.T) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case n := <-r.plugins:
			if n == 1 {
				return
			}
		case <-deadline:
			t.Fatal("the plugin did not connect to the runtime in time")
		}
	}
}

// observed renders the parts of a runtime adjustment the plugin sets, in a
// form that diffs readably.
type observed struct {
	Env         []string
	Mounts      []string
	CDIDevices  []string
	Devices     []string
	CgroupRules []string
	CPUs, Mems  string
	Annotations []string
}

func observe(a *adaptation.ContainerAdjustment) observed {
	var o observed
	if a == nil {
		return o
	}
	for _, kv := range a.GetEnv() {
		o.Env = append(o.Env, kv.GetKey()+"="+kv.GetValue())
	}
	for _, m := range a.GetMounts() {
		o.Mounts = append(o.Mounts, fmt.Sprintf("%s -> %s (%s %s)", m.GetSource(), m.GetDestination(), m.GetType(), strings.Join(m.GetOptions(), ",")))
	}
	for _, d := range a.GetCDIDevices() {
		o.CDIDevices = append(o.CDIDevices, d.GetName())
	}
	for _, d := range a.GetLinux().GetDevices() {
		o.Devices = append(o.Devices, fmt.Sprintf("%s %s %d:%d", d.GetPath(), d.GetType(), d.GetMajor(), d.GetMinor()))
	}
	for _, r := range a.GetLinux().GetResources().GetDevices() {
		verb := "deny"
		if r.GetAllow() {
			verb = "allow"
		}
		minor := "*"
		if r.GetMinor() != nil {
			minor = fmt.Sprint(r.GetMinor().GetValue())
		}
		o.CgroupRules = append(o.CgroupRules, fmt.Sprintf("%s %s %d:%s %s", verb, r.GetType(), r.GetMajor().GetValue(), minor, r.GetAccess()))
	}
	o.CPUs = a.GetLinux().GetResources().GetCpu().GetCpus()
	o.Mems = a.GetLinux().GetResources().GetCpu().GetMems()
	for k, v := range a.GetAnnotations() {
		o.Annotations = append(o.Annotations, k+"="+v)
	}
	sort.Strings(o.Annotations)
	return o
}

// machine is the DGX A100 mock: 8 GPUs, 4 per NUMA node.
func machine(t *testing.T) ([]GPU, []topology.NUMANode) {
	t.Helper()
	m := nvmlmock.DGXA100()
	sys := t.TempDir()
	if err := m.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: sys})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := GPUsFromTopology(topo, lib)
	if err != nil {
		t.Fatal(err)
	}
	return gpus, topo.NUMANodes
}

type harness struct {
	reg      *prometheus.Registry
	dir      string
	gpus     []GPU
	plugin   *Plugin
	allocs   *fakeAllocations
	mps      *fakeMPS
	observer *fakeObserver
	recorder *fakeRecorder
	done     chan error
	cancel   context.CancelFunc
}

// newHarness starts a plugin on the DGX A100 mock; configure adjusts its
// configuration before New.
func newHarness(t *testing.T, configure ...func(*Config)) *harness {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gpus, numa := machine(t)
	policy, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		reg: reg, dir: dir, gpus: gpus,
		allocs:   &fakeAllocations{m: map[string]Devices{}},
		mps:      &fakeMPS{},
		observer: &fakeObserver{ch: make(chan bool, 16)},
		recorder: &fakeRecorder{},
		done:     make(chan error, 1),
	}
	cfg := Config{
		SocketPath: filepath.Join(dir, "nri.sock"),
		StateDir:   filepath.Join(dir, "state"),
		Decide: Options{
			MemoryUnitMiB: 1024, MemoryReserveMiB: 1024,
			CDIKind: api.DefaultCDIKind, CDIDeviceName: api.CDINameUUID,
			UVMMajor:   508,
			MPSPipeDir: func(uuid string) string { return "/var/lib/tessera/mps/" + uuid + "/pipe" },
			Policy:     policy,
		},
		GPUs: gpus, NUMANodes: numa,
		Allocations:      h.allocs,
		MPS:              h.mps,
		Observer:         h.observer,
		Recorder:         h.recorder,
		Trust:            testTrust(),
		Metrics:          metrics,
		RetryInterval:    20 * time.Millisecond,
		MaxRetryInterval: 200 * time.Millisecond,
	}
	for _, f := range configure {
		f(&cfg)
	}
	h.plugin, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, h.cancel = context.WithCancel(ctx)
	go func() { h.done <- h.plugin.Run(ctx) }()
	t.Cleanup(func() {
		h.cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return h
}

// testTrust is the trust filter of the tests' plugins: sandbox seals the
// assignments it is given with its key, as Tessera would.
func testTrust() *podtrust.Filter {
	s, err := api.NewSealer([]byte("tessera-nri-unit-test-seal-key-0123"))
	if err != nil {
		panic(err)
	}
	return &podtrust.Filter{Sealer: s}
}

// sandbox returns the sandbox of pod name; an assignment in ann is sealed
// for it unless ann carries a seal already (use unsealedSandbox for a
// tenant's own).
func sandbox(name string, ann map[string]string) *adaptation.PodSandbox {
	sb := unsealedSandbox(name, ann)
	if v, ok := ann[api.AnnotationAssignment]; ok {
		if _, sealed := ann[api.AnnotationAssignmentSeal]; !sealed {
			sb.Annotations = maps.Clone(ann)
			sb.Annotations[api.AnnotationAssignmentSeal] = testTrust().Sealer.Seal(types.UID(sb.Uid), api.AnnotationAssignment, v)
		}
	}
	return sb
}

func unsealedSandbox(name string, ann map[string]string) *adaptation.PodSandbox {
	return &adaptation.PodSandbox{Id: "sb-" + name, Name: name, Namespace: "ns", Uid: "uid-" + name, Annotations: ann}
}

func container(sb *adaptation.PodSandbox, name string, env ...string) *adaptation.Container {
	return &adaptation.Container{Id: sb.Id + "-" + name, PodSandboxId: sb.Id, Name: name, Env: env}
}

func create(t *testing.T, r *runtime, sb *adaptation.PodSandbox, c *adaptation.Container) (observed, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := r.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: sb, Container: c})
	if err != nil {
		return observed{}, err
	}
	return observe(resp.GetAdjust()), nil
}

func sharedAssignment(t *testing.T, container string, g GPU, mem, cores int64) map[string]string {
	return annotate(t, api.ContainerAssignment{Name: container, Shared: &api.SharedGPU{GPU: api.GPURef{UUID: g.UUID, Index: g.Index}, MemoryMiB: mem, Cores: cores}})
}

// uvm and nvidia device rules and nodes of the DGX A100 mock (GPU minors
// equal indices there).
func wantRules(minors ...int) []string {
	out := []string{"deny c 195:* rwm", "deny c 508:* rwm"}
	for _, m := range minors {
		out = append(out, fmt.Sprintf("allow c 195:%d rw", m))
	}
	return append(out, "allow c 195:255 rw", "allow c 508:0 rw", "allow c 508:1 rw")
}

func wantNodes(minors ...int) []string {
	var out []string
	for _, m := range minors {
		out = append(out, fmt.Sprintf("/dev/nvidia%d c 195:%d", m, m))
	}
	return append(out, "/dev/nvidiactl c 195:255", "/dev/nvidia-uvm c 508:0", "/dev/nvidia-uvm-tools c 508:1")
}

func TestPluginOverNRI(t *testing.T) {
	h := newHarness(t)
	g := h.gpus
	for i, x := range g {
		if x.Minor != i || x.Index != i {
			t.Fatalf("mock GPU %d has minor %d: the expectations below assume minor = index", i, x.Minor)
		}
	}

	wholePod := sandbox("whole", nil)
	wholeCtr := container(wholePod, "train", api.EnvNVIDIAVisibleDevices+"="+g[0].UUID+","+g[1].UUID)
	h.allocs.set(wholePod.Uid, "train", Devices{Whole: []string{g[1].UUID, g[0].UUID}})

	sharedPod := sandbox("shared", sharedAssignment(t, "infer", g[5], 4096, 25))
	sharedCtr := container(sharedPod, "infer", api.EnvNVIDIAVisibleDevices+"=void")
	h.allocs.set(sharedPod.Uid, "infer", Devices{MemoryUnits: 4, CoreUnits: 25})

	mixedPod := sandbox("mixed", sharedAssignment(t, "helper", g[5], 8192, 50))
	mixedTrain := container(mixedPod, "train")
	mixedHelper := container(mixedPod, "helper")
	h.allocs.set(mixedPod.Uid, "train", Devices{Whole: []string{g[2].UUID}})
	h.allocs.set(mixedPod.Uid, "helper", Devices{MemoryUnits: 8, CoreUnits: 50})

	plainPod := sandbox("plain", nil)
	plainCtr := container(plainPod, "web")

	rt := startRuntime(t, h.dir, nil, nil)
	t.Cleanup(rt.Stop)
	rt.waitPlugin(t)
	h.observer.want(t, true)
	if !h.plugin.Connected() {
		t.Fatal("Connected() = false after the observer was told true")
	}

	sharedEnv := func(uuid, index, mem, cores string) []string {
		return []string{
			"NVIDIA_VISIBLE_DEVICES=" + uuid, "TESSERA_GPU_UUIDS=" + uuid, "TESSERA_GPU_INDICES=" + index, "TESSERA_GPU_SHARED=true",
			"CUDA_MPS_PIPE_DIRECTORY=/run/tessera/mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=" + mem + "M", "TESSERA_GPU_MEMORY_LIMIT_MIB=" + mem,
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + cores, "TESSERA_GPU_CORES=" + cores,
		}
	}
	mpsMount := func(uuid string) []string {
		return []string{"/var/lib/tessera/mps/" + uuid + "/pipe -> /run/tessera/mps (bind rbind,rw)"}
	}
	numa0 := "0-63,128-191"
	numa1 := "64-127,192-255"

	for _, tc := range []struct {
		name string
		sb   *adaptation.PodSandbox
		c    *adaptation.Container
		want observed
	}{
		{"container without GPUs", plainPod, plainCtr, observed{
			Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
			CgroupRules: []string{"deny c 195:* rwm", "deny c 508:* rwm"},
		}},
		{"whole pod", wholePod, wholeCtr, observed{
			Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + g[0].UUID + "," + g[1].UUID, "TESSERA_GPU_UUIDS=" + g[0].UUID + "," + g[1].UUID, "TESSERA_GPU_INDICES=0,1", "TESSERA_GPU_SHARED=false"},
			Devices:     wantNodes(0, 1),
			CgroupRules: wantRules(0, 1),
			CPUs:        numa0, Mems: "0",
		}},
		{"shared pod", sharedPod, sharedCtr, observed{
			Env:         sharedEnv(g[5].UUID, "5", "4096", "25"),
			Mounts:      mpsMount(g[5].UUID),
			Devices:     wantNodes(5),
			CgroupRules: wantRules(5),
			CPUs:        numa1, Mems: "1",
		}},
		{"mixed pod, whole container", mixedPod, mixedTrain, observed{
			Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + g[2].UUID, "TESSERA_GPU_UUIDS=" + g[2].UUID, "TESSERA_GPU_INDICES=2", "TESSERA_GPU_SHARED=false"},
			Devices:     wantNodes(2),
			CgroupRules: wantRules(2),
			CPUs:        numa0, Mems: "0",
		}},
		{"mixed pod, shared container (second tenant of GPU 5)", mixedPod, mixedHelper, observed{
			Env:         sharedEnv(g[5].UUID, "5", "8192", "50"),
			Mounts:      mpsMount(g[5].UUID),
			Devices:     wantNodes(5),
			CgroupRules: wantRules(5),
			CPUs:        numa1, Mems: "1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := create(t, rt, tc.sb, tc.c)
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("adjustment (-want +got):\n%s", diff)
			}
		})
	}
	if got, want := h.mps.running(), []string{g[5].UUID}; !cmp.Equal(got, want) {
		t.Errorf("MPS daemons = %v, want %v", got, want)
	}

	t.Run("a cpuset update by the kubelet is narrowed to the GPUs' NUMA node again", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := rt.UpdateContainer(ctx, &adaptation.UpdateContainerRequest{
			Pod: sharedPod, Container: sharedCtr,
			LinuxResources: &adaptation.LinuxResources{Cpu: &adaptation.LinuxCPU{Cpus: "60-70,200"}},
		})
		if err != nil {
			t.Fatalf("UpdateContainer: %v", err)
		}
		var got []string
		for _, u := range resp.GetUpdate() {
			got = append(got, u.GetContainerId()+" "+u.GetLinux().GetResources().GetCpu().GetCpus()+" mems "+u.GetLinux().GetResources().GetCpu().GetMems())
		}
		if diff := cmp.Diff([]string{sharedCtr.Id + " 64-70,200 mems 1"}, got); diff != "" {
			t.Errorf("updates (-want +got):\n%s", diff)
		}
		// A container without GPUs is left alone.
		resp, err = rt.UpdateContainer(ctx, &adaptation.UpdateContainerRequest{
			Pod: plainPod, Container: plainCtr,
			LinuxResources: &adaptation.LinuxResources{Cpu: &adaptation.LinuxCPU{Cpus: "60-70"}},
		})
		if err != nil {
			t.Fatalf("UpdateContainer: %v", err)
		}
		for _, u := range resp.GetUpdate() {
			if c := u.GetLinux().GetResources().GetCpu().GetCpus(); c != "" && c != "60-70" {
				t.Errorf("a container without GPUs was moved to CPUs %q", c)
			}
		}
	})

	t.Run("invalid assignments are refused with the pod, the GPU and the reason", func(t *testing.T) {
		over := sandbox("greedy", sharedAssignment(t, "c", g[5], 30000, 10))
		h.allocs.set(over.Uid, "c", Devices{MemoryUnits: 30, CoreUnits: 10})
		unknown := sandbox("lost", annotate(t, api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: "GPU-deadbeef-0000", Index: 9}, MemoryMiB: 1024}}))
		h.allocs.set(unknown.Uid, "c", Devices{MemoryUnits: 1})
		taken := sandbox("taken", nil)
		h.allocs.set(taken.Uid, "c", Devices{Whole: []string{g[0].UUID}})
		for _, tc := range []struct {
			sb   *adaptation.PodSandbox
			want string
		}{
			{over, `refusing to create container "c" of pod ns/greedy: GPU ` + g[5].UUID + `: over-committed: 12288 MiB of its 39936 shared MiB are in use by 2 container(s) and the container asks for 30000 MiB`},
			{unknown, `refusing to create container "c" of pod ns/lost: GPU GPU-deadbeef-0000: assigned by the annotation but not a GPU of this node`},
			{taken, `refusing to create container "c" of pod ns/taken: GPU ` + g[0].UUID + `: already allocated whole to ns/whole container train`},
		} {
			_, err := create(t, rt, tc.sb, container(tc.sb, "c"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CreateContainer of %s: error %v\nwant one containing %q", tc.sb.Name, err, tc.want)
			}
		}
	})

	t.Run("a pod that bypassed the extender is placed locally and recorded", func(t *testing.T) {
		sb := sandbox("bypass", nil)
		h.allocs.set(sb.Uid, "c", Devices{MemoryUnits: 2, CoreUnits: 10})
		got, err := create(t, rt, sb, container(sb, "c"))
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		// Best fit: GPU 5 is the fullest GPU with room.
		if diff := cmp.Diff(sharedEnv(g[5].UUID, "5", "2048", "10"), got.Env); diff != "" {
			t.Errorf("env (-want +got):\n%s", diff)
		}
		want := []string{"ns/bypass c " + g[5].UUID + " 2048MiB 10%"}
		h.recorder.mu.Lock()
		defer h.recorder.mu.Unlock()
		if diff := cmp.Diff(want, h.recorder.recs); diff != "" {
			t.Errorf("recorded assignments (-want +got):\n%s", diff)
		}
	})

	t.Run("pod removal and container stop free the ledger and stop an MPS daemon without tenants", func(t *testing.T) {
		for _, name := range []string{"shared", "bypass"} {
			if err := rt.RemovePodSandbox(context.Background(), &adaptation.RemovePodSandboxRequest{Pod: sandbox(name, nil)}); err != nil {
				t.Fatal(err)
			}
		}
		// The helper container exits: stopping it frees its slice.
		if _, err := rt.StopContainer(context.Background(), &adaptation.StopContainerRequest{Pod: mixedPod, Container: mixedHelper}); err != nil {
			t.Fatal(err)
		}
		want := []string{"ns/mixed train", "ns/whole train"}
		if diff := cmp.Diff(want, ledgerNames(h.plugin.Ledger().Snapshot())); diff != "" {
			t.Errorf("ledger (-want +got):\n%s", diff)
		}
		if got := h.mps.running(); len(got) != 0 {
			t.Errorf("MPS daemons = %v, want none", got)
		}
	})

	t.Run("runtime restart: the plugin reconnects and resynchronizes", func(t *testing.T) {
		rt.Stop()
		h.observer.want(t, false)
		if got := gathered(t, h.reg, "tessera_nri_connected", map[string]string{}); got != 0 {
			t.Errorf("tessera_nri_connected = %v after the runtime stopped, want 0", got)
		}
		// The restarted runtime still runs the mixed pod's train container
		// only: the whole pod went away while it was down. It also runs a
		// container it created while the plugin was away, on GPU 3.
		latePod := sandbox("late", nil)
		lateCtr := container(latePod, "c")
		h.allocs.set(latePod.Uid, "c", Devices{Whole: []string{g[3].UUID}})
		rt2 := startRuntime(t, h.dir, []*adaptation.PodSandbox{mixedPod, latePod}, []*adaptation.Container{mixedTrain, lateCtr})
		t.Cleanup(rt2.Stop)
		rt2.waitPlugin(t)
		h.observer.want(t, true)
		if got := gathered(t, h.reg, "tessera_nri_connected", map[string]string{}); got != 1 {
			t.Errorf("tessera_nri_connected = %v after reconnecting, want 1", got)
		}
		eventually := time.Now().Add(10 * time.Second)
		for len(h.plugin.Ledger().Snapshot()) != 2 && time.Now().Before(eventually) {
			time.Sleep(10 * time.Millisecond)
		}
		if diff := cmp.Diff([]string{"ns/late c", "ns/mixed train"}, ledgerNames(h.plugin.Ledger().Snapshot())); diff != "" {
			t.Errorf("ledger after resync (-want +got):\n%s", diff)
		}
		// GPU 3 is accounted: nobody else gets it.
		thief := sandbox("thief", nil)
		h.allocs.set(thief.Uid, "c", Devices{Whole: []string{g[3].UUID}})
		if _, err := create(t, rt2, thief, container(thief, "c")); err == nil || !strings.Contains(err.Error(), "already allocated whole to ns/late container c") {
			t.Errorf("CreateContainer on a GPU a container created while disconnected holds: %v", err)
		}
		// GPU 0 was freed by the resync: another pod may now have it.
		sb := sandbox("next", nil)
		h.allocs.set(sb.Uid, "c", Devices{Whole: []string{g[0].UUID}})
		got, err := create(t, rt2, sb, container(sb, "c"))
		if err != nil {
			t.Fatalf("CreateContainer after the restart: %v", err)
		}
		if diff := cmp.Diff(wantRules(0), got.CgroupRules); diff != "" {
			t.Errorf("cgroup rules (-want +got):\n%s", diff)
		}
	})

	// whole, shared, mixed x2, bypass, next; greedy, lost, taken, thief.
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tessera_nri_container_decisions_total", map[string]string{"result": ResultIsolated}, 6},
		{"tessera_nri_container_decisions_total", map[string]string{"result": ResultRefused}, 4},
		{"tessera_nri_ledger_containers", map[string]string{}, 3},
	} {
		if got := gathered(t, h.reg, m.name, m.labels); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
}

// gathered is the value of the counter or gauge called name with exactly
// labels in reg, or -1.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if !cmp.Equal(got, labels) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func ledgerNames(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Namespace+"/"+e.Pod+" "+e.Container)
	}
	sort.Strings(out)
	return out
}

// A plugin that cannot reach the runtime keeps retrying and stays
// disconnected; it returns when its context ends.
func TestPluginRetriesUntilTheRuntimeComes(t *testing.T) {
	h := newHarness(t)
	time.Sleep(100 * time.Millisecond) // several failed attempts
	if h.plugin.Connected() {
		t.Fatal("connected without a runtime")
	}
	rt := startRuntime(t, h.dir, nil, nil)
	t.Cleanup(rt.Stop)
	rt.waitPlugin(t)
	h.observer.want(t, true)
}

func TestPluginConfigRequired(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no GPUs", Config{}},
		{"no state dir", Config{GPUs: []GPU{{}}}},
		{"no collaborators", Config{GPUs: []GPU{{}}, StateDir: t.TempDir()}},
	} {
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("%s: New succeeded", tc.name)
		}
	}
}

// Containers the kubelet allocated no Tessera resource to get no GPU over
// NRI, whatever their spec asks for, unless the operator leaves them alone.
func TestPluginNonGPUContainers(t *testing.T) {
	voided := func(extra ...string) observed {
		return observed{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}, CgroupRules: append([]string{"deny c 195:* rwm", "deny c 508:* rwm"}, extra...)}
	}
	// greedy asks for every GPU in every way the NVIDIA container runtime
	// honours.
	greedy := func(sb *adaptation.PodSandbox, name string) *adaptation.Container {
		c := container(sb, name, "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=0", "PATH=/bin")
		c.Linux = &adaptation.LinuxContainer{Devices: []*adaptation.LinuxDevice{
			{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
			{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
			{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
		}}
		c.Mounts = []*adaptation.Mount{{Source: "/dev/null", Destination: api.NVIDIAVolumeMountsDir + "/all", Type: "bind"}}
		c.Annotations = map[string]string{"cdi.k8s.io/greedy": "nvidia.com/gpu=all"}
		return c
	}
	// NRI's adaptation (v0.12) drops removals of the container's own
	// device nodes (the cgroup rules deny them); it applies mount and
	// annotation removals.
	greedyVoided := voided()
	greedyVoided.Env = []string{"NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_IMEX_CHANNELS="}
	greedyVoided.Mounts = []string{" -> -" + api.NVIDIAVolumeMountsDir + "/all ( )"}
	greedyVoided.Annotations = []string{"-cdi.k8s.io/greedy="}

	t.Run("void (default)", func(t *testing.T) {
		h := newHarness(t)
		g := h.gpus
		rt := startRuntime(t, h.dir, nil, nil)
		t.Cleanup(rt.Stop)
		rt.waitPlugin(t)
		h.observer.want(t, true)

		plain := sandbox("plain", nil)
		gpuPod := sandbox("gpu", annotate(t, api.ContainerAssignment{Name: "train", GPUs: []api.GPURef{{UUID: g[2].UUID, Index: 2}}}))
		h.allocs.set(gpuPod.Uid, "train", Devices{Whole: []string{g[2].UUID}})
		for _, tc := range []struct {
			name string
			sb   *adaptation.PodSandbox
			c    *adaptation.Container
			want observed
		}{
			{"env unset", plain, container(plain, "a"), voided()},
			{"env none", plain, container(plain, "b", "NVIDIA_VISIBLE_DEVICES=none"), voided()},
			{"env UUID list", plain, container(plain, "c", "NVIDIA_VISIBLE_DEVICES="+g[0].UUID), voided()},
			{"env all, device nodes, device list mount, CDI annotation", plain, greedy(plain, "d"), greedyVoided},
			{"the GPU pod's GPU container", gpuPod, container(gpuPod, "train"), observed{
				Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + g[2].UUID, "TESSERA_GPU_UUIDS=" + g[2].UUID, "TESSERA_GPU_INDICES=2", "TESSERA_GPU_SHARED=false"},
				Devices:     wantNodes(2),
				CgroupRules: wantRules(2),
				CPUs:        "0-63,128-191", Mems: "0",
			}},
			{"the GPU pod's sidecar without GPU requests", gpuPod, greedy(gpuPod, "sidecar"), greedyVoided},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := create(t, rt, tc.sb, tc.c)
				if err != nil {
					t.Fatalf("CreateContainer: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("adjustment (-want +got):\n%s", diff)
				}
			})
		}
		if diff := cmp.Diff([]string{"ns/gpu train"}, ledgerNames(h.plugin.Ledger().Snapshot())); diff != "" {
			t.Errorf("ledger (-want +got):\n%s", diff)
		}

		t.Run("kubelet unreadable", func(t *testing.T) {
			h.allocs.fail(fmt.Errorf("kubelet down"))
			defer h.allocs.fail(nil)
			got, err := create(t, rt, plain, container(plain, "e", "NVIDIA_VISIBLE_DEVICES=all"))
			if err != nil {
				t.Fatalf("CreateContainer of a container without signs of GPUs: %v", err)
			}
			if diff := cmp.Diff(voided(), got); diff != "" {
				t.Errorf("adjustment (-want +got):\n%s", diff)
			}
			_, err = create(t, rt, plain, container(plain, "f", "NVIDIA_VISIBLE_DEVICES="+g[0].UUID))
			if want := "cannot read what the kubelet allocated to it (kubelet down) and NVIDIA_VISIBLE_DEVICES lists GPUs"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("CreateContainer of a container listing GPUs: %v, want an error containing %q", err, want)
			}
		})
	})

	for _, tc := range []struct {
		name   string
		nonGPU NonGPU
	}{
		{"leave", NonGPU{Leave: true}},
		{"exempt namespace", NonGPU{ExemptNamespaces: []string{"ns"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.Decide.NonGPU = tc.nonGPU })
			rt := startRuntime(t, h.dir, nil, nil)
			t.Cleanup(rt.Stop)
			rt.waitPlugin(t)
			h.observer.want(t, true)
			sb := sandbox("plain", nil)
			got, err := create(t, rt, sb, greedy(sb, "c"))
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			if diff := cmp.Diff(observed{}, got); diff != "" {
				t.Errorf("adjustment of a container left alone (-want +got):\n%s", diff)
			}
		})
	}
}
