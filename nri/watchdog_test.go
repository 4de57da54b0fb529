package nri

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/isolation"
)

// The watchdog enforces the limits the plugin recorded: its ledger is the
// watchdog's Limits, and the runtime's container IDs are what the
// processes' cgroups name.
func TestWatchdogEnforcesLedgerLimits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m := nvmlmock.DGXA100()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	g5 := api.GPURef{UUID: m.UUID(5), Index: 5}
	l, err := OpenLedger(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	small, big := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, e := range []Entry{
		{PodUID: "u1", Namespace: "ns", Pod: "small", Container: "c", ContainerID: small, Shared: &api.SharedGPU{GPU: g5, MemoryMiB: 1024, Cores: 10}},
		{PodUID: "u2", Namespace: "ns", Pod: "big", Container: "c", ContainerID: big, Shared: &api.SharedGPU{GPU: g5, MemoryMiB: 8192, Cores: 10}},
	} {
		if err := l.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	m.SetProcesses(5, []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 2 << 30}, {Pid: 4343, UsedGpuMemory: 2 << 30}})
	proc := t.TempDir()
	for pid, id := range map[string]string{"4242": small, "4343": big} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + pid + ".slice/cri-containerd-" + id + ".scope\n"
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var killed []int
	w, err := isolation.NewWatchdog(isolation.WatchdogConfig{
		GPUs: []api.GPURef{g5}, Processes: lib, Limits: l, Action: isolation.ActionKill, ProcRoot: proc,
		Kill: func(pid int) error { killed = append(killed, pid); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	rep := w.Poll(ctx)
	if diff := cmp.Diff([]int{4242}, killed); diff != "" {
		t.Errorf("killed (-want +got):\n%s", diff)
	}
	if len(rep.Unknown) != 0 {
		t.Errorf("processes of ledger containers reported unknown: %v", rep.Unknown)
	}
}
