package gpu_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

func TestRealBackendWithoutLibrary(t *testing.T) {
	lib := gpu.NewNVML(nvml.New(nvml.WithLibraryPath("/nonexistent/libnvidia-ml.so.1")))
	err := lib.Init()
	if !errors.Is(err, gpu.ErrLibraryNotFound) {
		t.Fatalf("Init() = %v, want ErrLibraryNotFound", err)
	}
	if !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
		t.Errorf("Init() error %q does not name libnvidia-ml.so.1", err)
	}
	// Nothing after a failed Init may reach the unloaded library.
	if _, err := lib.DeviceCount(); !errors.Is(err, gpu.ErrNotInitialized) {
		t.Errorf("DeviceCount() after failed Init = %v, want ErrNotInitialized", err)
	}
	if _, err := lib.Device(0); !errors.Is(err, gpu.ErrNotInitialized) {
		t.Errorf("Device(0) after failed Init = %v, want ErrNotInitialized", err)
	}
	if err := lib.WatchXIDs(context.Background(), make(chan gpu.XIDEvent)); !errors.Is(err, gpu.ErrNotInitialized) {
		t.Errorf("WatchXIDs after failed Init = %v, want ErrNotInitialized", err)
	}
	if err := lib.Shutdown(); err != nil {
		t.Errorf("Shutdown() after failed Init = %v, want nil", err)
	}
}

func TestOpen(t *testing.T) {
	tests := []struct {
		spec     string
		wantMock bool
		wantErr  string
	}{
		{spec: "real"},
		{spec: ""},
		{spec: "mock:dgx-a100", wantMock: true},
		{spec: "mock:pcie-2numa", wantMock: true},
		{spec: "mock:no-such-machine", wantErr: `unknown mock machine "no-such-machine"`},
		{spec: "fake", wantErr: `--nvml="fake": want "real", mock:NAME (one of dgx-1v, dgx-a100, dgx-a100-mig, dgx-h100-mig, pcie-2numa) or mock:PATH`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			b, err := gpu.Open(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open(%q) = %v, want error containing %q", tc.spec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tc.spec, err)
			}
			if got := b.Mock != nil; got != tc.wantMock {
				t.Errorf("Open(%q).Mock set = %v, want %v", tc.spec, got, tc.wantMock)
			}
		})
	}
}

func openMock(t *testing.T, m *nvmlmock.Machine) gpu.Interface {
	t.Helper()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	return lib
}

func TestDeviceInfoFromMock(t *testing.T) {
	m := nvmlmock.DGXA100()
	lib := openMock(t, m)
	n, err := lib.DeviceCount()
	if err != nil || n != 8 {
		t.Fatalf("DeviceCount() = %d, %v; want 8", n, err)
	}
	got, err := lib.Device(4)
	if err != nil {
		t.Fatal(err)
	}
	want := gpu.DeviceInfo{Index: 4, UUID: m.UUID(4), Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, PCIBusID: "0000:87:00.0", Minor: 4}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Device(4) mismatch (-want +got):\n%s", diff)
	}
	if v, err := lib.DriverVersion(); err != nil || v != "550.54.15" {
		t.Errorf("DriverVersion() = %q, %v", v, err)
	}
	if _, err := lib.Device(8); !errors.Is(err, gpu.ErrNoDevice) {
		t.Errorf("Device(8) = %v, want ErrNoDevice", err)
	}
}

func TestNVLinksFromMock(t *testing.T) {
	tests := []struct {
		machine     *nvmlmock.Machine
		gpu         int
		wantLinks   int
		wantRemotes map[gpu.NVLinkRemote]int
	}{
		{nvmlmock.DGXA100(), 0, 12, map[gpu.NVLinkRemote]int{gpu.RemoteSwitch: 12}},
		{nvmlmock.DGX1V(), 0, 6, map[gpu.NVLinkRemote]int{gpu.RemoteGPU: 6}},
		{nvmlmock.PCIe2NUMA(), 0, 0, map[gpu.NVLinkRemote]int{}},
	}
	for _, tc := range tests {
		t.Run(tc.machine.Profile().Name, func(t *testing.T) {
			links, err := openMock(t, tc.machine).NVLinks(tc.gpu)
			if err != nil {
				t.Fatal(err)
			}
			if len(links) != tc.wantLinks {
				t.Errorf("GPU %d has %d NVLinks, want %d", tc.gpu, len(links), tc.wantLinks)
			}
			remotes := map[gpu.NVLinkRemote]int{}
			for _, l := range links {
				remotes[l.Remote]++
			}
			if diff := cmp.Diff(tc.wantRemotes, remotes); diff != "" {
				t.Errorf("far ends mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMemoryAndProcesses(t *testing.T) {
	m := nvmlmock.PCIe2NUMA()
	lib := openMock(t, m)
	const gib = 1 << 30
	m.SetMemoryUsed(1, 1*gib)
	m.SetProcesses(1, []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 2 * gib}, {Pid: 200, UsedGpuMemory: 3 * gib}})

	mem, err := lib.MemoryInfo(1)
	if err != nil {
		t.Fatal(err)
	}
	total := uint64(49152) << 20
	if diff := cmp.Diff(gpu.Memory{Total: total, Used: 6 * gib, Free: total - 6*gib}, mem); diff != "" {
		t.Errorf("MemoryInfo(1) mismatch (-want +got):\n%s", diff)
	}
	procs, err := lib.Processes(1)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Process{{PID: 100, UsedMemory: 2 * gib}, {PID: 200, UsedMemory: 3 * gib}}
	if diff := cmp.Diff(want, procs); diff != "" {
		t.Errorf("Processes(1) mismatch (-want +got):\n%s", diff)
	}
	if procs, err := lib.Processes(0); err != nil || len(procs) != 0 {
		t.Errorf("Processes(0) = %v, %v; want none", procs, err)
	}
}

func TestLostGPU(t *testing.T) {
	m := nvmlmock.DGXA100()
	lib := openMock(t, m)
	m.SetLost(3, true)
	for name, err := range map[string]error{
		"CheckHealth": lib.CheckHealth(3),
		"Device":      func() error { _, err := lib.Device(3); return err }(),
		"MemoryInfo":  func() error { _, err := lib.MemoryInfo(3); return err }(),
	} {
		if !errors.Is(err, gpu.ErrGPULost) {
			t.Errorf("%s(3) on a lost GPU = %v, want ErrGPULost", name, err)
		}
	}
	if err := lib.CheckHealth(2); err != nil {
		t.Errorf("CheckHealth(2) = %v; one lost GPU must not affect another", err)
	}
	m.SetLost(3, false)
	if err := lib.CheckHealth(3); err != nil {
		t.Errorf("CheckHealth(3) after recovery = %v", err)
	}
}

func TestWatchXIDs(t *testing.T) {
	m := nvmlmock.DGX1V()
	lib := openMock(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan gpu.XIDEvent, 4)
	done := make(chan error, 1)
	go func() { done <- lib.WatchXIDs(ctx, events) }()

	// Registration happens inside WatchXIDs; retry the injection until an
	// event set has registered the GPU.
	deadline := time.Now().Add(10 * time.Second)
	for m.InjectXID(5, 79) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("WatchXIDs never registered GPU 5 for XID events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case ev := <-events:
		want := gpu.XIDEvent{Index: 5, UUID: m.UUID(5), XID: 79}
		if diff := cmp.Diff(want, ev); diff != "" {
			t.Errorf("event mismatch (-want +got):\n%s", diff)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no XID event delivered")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WatchXIDs returned %v after cancel, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchXIDs did not return after cancel")
	}
	if n := m.InjectXID(5, 79); n != 0 {
		t.Errorf("event set still registered after WatchXIDs returned (%d deliveries)", n)
	}
}

func TestMockComputeModeAndUtilization(t *testing.T) {
	m := nvmlmock.DGXA100()
	dev, ret := m.NVML().DeviceGetHandleByIndex(2)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := dev.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
		t.Fatalf("SetComputeMode = %v", ret)
	}
	if got := m.ComputeMode(2); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("ComputeMode(2) = %v, want exclusive process", got)
	}
	if got := m.ComputeMode(1); got != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("ComputeMode(1) = %v, want default", got)
	}
	if _, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("utilisation without processes = %v, want ERROR_NOT_FOUND", ret)
	}
	m.SetProcesses(2, []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1 << 30}, {Pid: 8}})
	m.SetProcessUtilization(2, 7, 65)
	samples, ret := dev.GetProcessUtilization(0)
	if ret != nvml.SUCCESS || len(samples) != 2 || samples[0].Pid != 7 || samples[0].SmUtil != 65 || samples[1].SmUtil != 0 {
		t.Errorf("GetProcessUtilization = %+v, %v", samples, ret)
	}
	m.SetLost(2, true)
	if ret := dev.SetComputeMode(nvml.COMPUTEMODE_DEFAULT); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("SetComputeMode on a lost GPU = %v", ret)
	}
}
