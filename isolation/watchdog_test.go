package isolation

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

type staticLimits []ContainerLimit

func (s staticLimits) ContainerLimits() []ContainerLimit { return s }

type fakeEvents struct {
	mu     sync.Mutex
	events []string
}

func (f *fakeEvents) Eventf(obj kruntime.Object, eventtype, reason, format string, args ...interface{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pod := obj.(*corev1.Pod)
	f.events = append(f.events, fmt.Sprintf("%s/%s %s %s: %s", pod.Namespace, pod.Name, eventtype, reason, fmt.Sprintf(format, args...)))
}

type fakeEvictor struct{ evicted []string }

func (f *fakeEvictor) Evict(_ context.Context, namespace, name string, uid types.UID, _ string) error {
	f.evicted = append(f.evicted, namespace+"/"+name+" "+string(uid))
	return nil
}

func cid(c byte) string { return strings.Repeat(string(c), 64) }

func writeCgroup(t *testing.T, procRoot string, pid int, content string) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

type fakeUtil map[int][]ProcessUtilization

func (f fakeUtil) ProcessUtilization(index int) ([]ProcessUtilization, error) { return f[index], nil }

// watchdogMachine is a DGX A100 mock with processes of three containers on
// it, and a /proc with their cgroups:
//   - pid 101, container a (shared, GPU 5, limit 4096 MiB): 5 GiB, over;
//   - pid 102, container b (shared, GPU 5, limit 4096 MiB): 1 GiB;
//   - pid 103, container c (whole GPU 0, no limit): 30 GiB, cgroup v1;
//   - pid 104 on GPU 5: sshd's cgroup, no container;
//   - pid 105 on GPU 5: no /proc entry (it exited).
func watchdogMachine(t *testing.T) (gpu.Interface, []api.GPURef, string, staticLimits) {
	t.Helper()
	m := nvmlmock.DGXA100()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	var gpus []api.GPURef
	for i := 0; i < 8; i++ {
		gpus = append(gpus, api.GPURef{UUID: m.UUID(i), Index: i})
	}
	m.SetProcesses(5, []nvml.ProcessInfo{
		{Pid: 101, UsedGpuMemory: 5 << 30},
		{Pid: 102, UsedGpuMemory: 1 << 30},
		{Pid: 104, UsedGpuMemory: 8 << 30},
		{Pid: 105, UsedGpuMemory: 1 << 30},
	})
	m.SetProcesses(0, []nvml.ProcessInfo{{Pid: 103, UsedGpuMemory: 30 << 30}})
	proc := t.TempDir()
	writeCgroup(t, proc, 101, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduida.slice/cri-containerd-"+cid('a')+".scope\n")
	writeCgroup(t, proc, 102, "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduidb.slice/cri-containerd-"+cid('b')+".scope\n")
	writeCgroup(t, proc, 103, "12:memory:/kubepods/poduidc/"+cid('c')+"\n11:devices:/kubepods/poduidc/"+cid('c')+"\n0::/\n")
	writeCgroup(t, proc, 104, "0::/system.slice/sshd.service\n")
	limits := staticLimits{
		{ContainerID: cid('a'), PodUID: "uida", Namespace: "ns", Pod: "a", Container: "main", GPU: gpus[5], LimitMiB: 4096},
		{ContainerID: cid('b'), PodUID: "uidb", Namespace: "ns", Pod: "b", Container: "main", GPU: gpus[5], LimitMiB: 4096},
		{ContainerID: cid('c'), PodUID: "uidc", Namespace: "ns", Pod: "c", Container: "train", GPU: gpus[0]},
	}
	return lib, gpus, proc, limits
}

func TestContainerIDOfPID(t *testing.T) {
	proc := t.TempDir()
	for pid, tc := range map[int]struct{ cgroup, want string }{
		1: {"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + cid('a') + ".scope\n", cid('a')},
		2: {"0::/kubepods/burstable/pod2/" + cid('b') + "\n", cid('b')},
		3: {"5:cpu,cpuacct:/kubepods/pod3/" + cid('c') + "\n0::/\n", cid('c')},
		4: {"0::/kubepods.slice/crio-" + cid('d') + ".scope\n", cid('d')},
		5: {"0::/user.slice/session-1.scope\n", ""},
		6: {"0::/kubepods/pod6/" + cid('e')[:63] + "\n", ""},
	} {
		writeCgroup(t, proc, pid, tc.cgroup)
		got, err := ContainerIDOfPID(proc, uint32(pid))
		if err != nil || got != tc.want {
			t.Errorf("pid %d (%q): %q, %v; want %q", pid, tc.cgroup, got, err, tc.want)
		}
	}
	if _, err := ContainerIDOfPID(proc, 999); err == nil {
		t.Error("a PID without /proc entry yielded no error")
	}
}

func TestWatchdogActions(t *testing.T) {
	for _, tc := range []struct {
		action      Action
		wantActions []string
		wantKilled  []int
		wantEvicted []string
		wantEvents  []string
	}{
		{action: ActionNone},
		{
			action:      ActionWarn,
			wantActions: []string{"warn ns/a/main"},
			wantEvents:  []string{"ns/a Warning GPUMemoryLimitExceeded: container main holds 5120 MiB of GPU memory on GPU 5 (%s), over its limit of 4096 MiB"},
		},
		{
			action:      ActionKill,
			wantActions: []string{"kill 101"},
			wantKilled:  []int{101},
			wantEvents:  []string{"ns/a Warning GPUMemoryLimitExceeded: container main holds 5120 MiB of GPU memory on GPU 5 (%s), over its limit of 4096 MiB: killed its processes [101]"},
		},
		{
			action:      ActionEvict,
			wantActions: []string{"evict ns/a"},
			wantEvicted: []string{"ns/a uida"},
			wantEvents:  []string{"ns/a Warning GPUMemoryLimitExceeded: container main holds 5120 MiB of GPU memory on GPU 5 (%s), over its limit of 4096 MiB: evicting the pod"},
		},
	} {
		t.Run(string(tc.action), func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			lib, gpus, proc, limits := watchdogMachine(t)
			events := &fakeEvents{}
			evictor := &fakeEvictor{}
			var killed []int
			reg := prometheus.NewPedanticRegistry()
			metrics, err := NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			w, err := NewWatchdog(WatchdogConfig{
				GPUs: gpus, Processes: lib, Limits: limits, Action: tc.action, ProcRoot: proc,
				Utilization: fakeUtil{5: {{PID: 101, SMPercent: 30}, {PID: 102, SMPercent: 12}, {PID: 104, SMPercent: 50}}, 0: {{PID: 103, SMPercent: 97}}},
				Events:      events, Evictor: evictor,
				Kill:    func(pid int) error { killed = append(killed, pid); return nil },
				Metrics: metrics,
			})
			if err != nil {
				t.Fatal(err)
			}
			rep := w.Poll(ctx)

			if diff := cmp.Diff(tc.wantActions, rep.Actions); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantKilled, killed); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvicted, evictor.evicted); diff != "" {
				t.Errorf("evicted (-want +got):\n%s", diff)
			}
			var wantEvents []string
			for _, e := range tc.wantEvents {
				wantEvents = append(wantEvents, fmt.Sprintf(e, gpus[5].UUID))
			}
			if diff := cmp.Diff(wantEvents, events.events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			// The processes of no known container are left alone.
			if diff := cmp.Diff([]uint32{104, 105}, rep.Unknown); diff != "" {
				t.Errorf("unknown processes (-want +got):\n%s", diff)
			}
			type row struct {
				Container string
				PIDs      []uint32
				UsedMiB   uint64
				SM        uint32
				Over      bool
			}
			var got []row
			for _, u := range rep.Containers {
				got = append(got, row{u.Limit.Pod + "/" + u.Limit.Container, u.PIDs, u.UsedBytes >> 20, u.SMPercent, u.Over})
			}
			want := []row{
				{"a/main", []uint32{101}, 5120, 30, true},
				{"b/main", []uint32{102}, 1024, 12, false},
				{"c/train", []uint32{103}, 30720, 97, false},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("containers (-want +got):\n%s", diff)
			}
			a := map[string]string{"namespace": "ns", "pod": "a", "container": "main", "gpu": gpus[5].UUID}
			c := map[string]string{"namespace": "ns", "pod": "c", "container": "train", "gpu": gpus[0].UUID}
			for _, m := range []struct {
				name   string
				labels map[string]string
				want   float64
			}{
				{"tessera_container_gpu_memory_used_bytes", a, 5 << 30},
				{"tessera_container_gpu_memory_limit_bytes", a, 4 << 30},
				{"tessera_container_gpu_sm_utilization_percent", a, 30},
				{"tessera_container_gpu_memory_used_bytes", c, 30 << 30},
				{"tessera_container_gpu_memory_limit_bytes", c, -1}, // a whole GPU has no limit
				{"tessera_watchdog_unknown_processes_total", map[string]string{}, 2},
			} {
				if got := metricValue(t, reg, m.name, m.labels); got != m.want {
					t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
				}
			}

			// A second poll of the same excess warns and evicts no more.
			rep = w.Poll(ctx)
			switch tc.action {
			case ActionWarn, ActionEvict, ActionNone:
				if len(rep.Actions) != 0 {
					t.Errorf("second poll acted again: %v", rep.Actions)
				}
			case ActionKill:
				// The mock process is still there (a real one would be
				// gone): it is killed again.
				if diff := cmp.Diff([]string{"kill 101"}, rep.Actions); diff != "" {
					t.Errorf("second poll (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestWatchdogConfig(t *testing.T) {
	lib, gpus, _, limits := watchdogMachine(t)
	for name, cfg := range map[string]WatchdogConfig{
		"no source":         {Limits: limits, Action: ActionNone},
		"bad action":        {Processes: lib, Limits: limits, Action: "shout"},
		"warn without sink": {Processes: lib, Limits: limits, Action: ActionWarn, GPUs: gpus},
		"evict no evictor":  {Processes: lib, Limits: limits, Action: ActionEvict, GPUs: gpus},
	} {
		if _, err := NewWatchdog(cfg); err == nil {
			t.Errorf("%s: NewWatchdog succeeded", name)
		}
	}
}

func TestKubeEvictor(t *testing.T) {
	cs := fake.NewSimpleClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uida"}})
	var got *policyv1.Eviction
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, kruntime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		got = action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		return true, nil, nil
	})
	if err := (KubeEvictor{Client: cs}).Evict(context.Background(), "ns", "a", "uida", "over its limit"); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Name != "a" || got.Namespace != "ns" || got.DeleteOptions == nil || *got.DeleteOptions.Preconditions.UID != "uida" {
		t.Fatalf("eviction %+v; want pod ns/a with a UID precondition", got)
	}
}
