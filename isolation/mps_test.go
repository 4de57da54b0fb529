package isolation

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api"
)

type fakeComputeMode struct {
	mu    sync.Mutex
	calls []string
	fail  error
}

func (f *fakeComputeMode) SetComputeMode(index int, exclusive bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	mode := "default"
	if exclusive {
		mode = "exclusive-process"
	}
	f.calls = append(f.calls, fmt.Sprintf("%d=%s", index, mode))
	return nil
}

func (f *fakeComputeMode) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		out = append(out, s.Text())
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func fakeBinary(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "fake-mps-control"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newTestMPS(t *testing.T, cm ComputeModeSetter, metrics *Metrics) *MPS {
	t.Helper()
	dir := t.TempDir()
	m, err := NewMPS(MPSConfig{
		Binary:       fakeBinary(t),
		PipeBase:     filepath.Join(dir, "pipe"),
		LogBase:      filepath.Join(dir, "log"),
		ComputeMode:  cm,
		StartTimeout: 10 * time.Second,
		StopTimeout:  5 * time.Second,
		RestartDelay: 20 * time.Millisecond,
		Metrics:      metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop() })
	return m
}

var (
	gpu5 = api.GPURef{UUID: "GPU-55555555-5555-5555-5555-555555555555", Index: 5}
	gpu6 = api.GPURef{UUID: "GPU-66666666-6666-6666-6666-666666666666", Index: 6}
)

func TestMPSDaemonLifecycle(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cm := &fakeComputeMode{}
	reg := prometheus.NewPedanticRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m := newTestMPS(t, cm, metrics)

	// First tenant on GPU 5: one daemon, exclusive-process mode first.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu5}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if diff := cmp.Diff([]string{gpu5.UUID}, m.Running()); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"5=exclusive-process"}, cm.take()); diff != "" {
		t.Errorf("compute mode calls (-want +got):\n%s", diff)
	}
	started := readLines(t, filepath.Join(m.LogDir(gpu5.UUID), "started"))
	if len(started) != 1 || !strings.Contains(started[0], "visible="+gpu5.UUID+" pipe="+m.PipeDir(gpu5.UUID)) {
		t.Errorf("the daemon ran with %q; want it limited to GPU 5 with its own pipe directory", started)
	}
	if fi, err := os.Stat(filepath.Join(m.PipeDir(gpu5.UUID), ControlPipe)); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("no control pipe after Sync: %v", err)
	}

	// A second GPU: GPU 5's daemon is left as it is.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu6}, {gpu5}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if diff := cmp.Diff([]string{gpu5.UUID, gpu6.UUID}, m.Running()); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
	if n := len(readLines(t, filepath.Join(m.LogDir(gpu5.UUID), "started"))); n != 1 {
		t.Errorf("GPU 5's daemon started %d times, want 1", n)
	}
	cm.take()

	// The daemon dies: the supervisor restarts it.
	m.mu.Lock()
	pid := m.daemons[gpu5.UUID].pid()
	m.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the daemon's restart", func() bool {
		return len(readLines(t, filepath.Join(m.LogDir(gpu5.UUID), "started"))) == 2
	})
	eventually(t, "the restart metric", func() bool {
		return metricValue(t, reg, "tessera_mps_daemon_restarts_total", map[string]string{"gpu": gpu5.UUID}) == 1
	})

	// GPU 5 loses its last tenant: its daemon is told to quit and the GPU
	// goes back to the default compute mode.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu6}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if diff := cmp.Diff([]string{gpu6.UUID}, m.Running()); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
	if q := readLines(t, filepath.Join(m.LogDir(gpu5.UUID), "quit")); len(q) != 1 {
		t.Errorf("GPU 5's daemon quit %d times, want once (asked to quit, not killed)", len(q))
	}
	if diff := cmp.Diff([]string{"5=default"}, cm.take()); diff != "" {
		t.Errorf("compute mode calls (-want +got):\n%s", diff)
	}

	if err := m.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := m.Running(); len(got) != 0 {
		t.Errorf("running after Stop: %v", got)
	}
	if diff := cmp.Diff([]string{"6=default"}, cm.take()); diff != "" {
		t.Errorf("compute mode calls (-want +got):\n%s", diff)
	}
}

func TestMPSStartFailures(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)

	t.Run("daemon exits at once", func(t *testing.T) {
		cm := &fakeComputeMode{}
		m := newTestMPS(t, cm, nil)
		if err := os.MkdirAll(m.LogDir(gpu5.UUID), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.LogDir(gpu5.UUID), "fail"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		err := m.Sync(ctx, [][]api.GPURef{{gpu5}})
		if err == nil || !strings.Contains(err.Error(), gpu5.UUID) || !strings.Contains(err.Error(), "exited before it accepted clients") {
			t.Fatalf("Sync error %v; want one naming the GPU and the early exit", err)
		}
		if got := m.Running(); len(got) != 0 {
			t.Errorf("running: %v, want none", got)
		}
		if diff := cmp.Diff([]string{"5=exclusive-process", "5=default"}, cm.take()); diff != "" {
			t.Errorf("compute mode calls (-want +got):\n%s", diff)
		}
	})

	t.Run("compute mode cannot be set", func(t *testing.T) {
		m := newTestMPS(t, &fakeComputeMode{fail: errors.New("insufficient permissions")}, nil)
		err := m.Sync(ctx, [][]api.GPURef{{gpu5}})
		if err == nil || !strings.Contains(err.Error(), "insufficient permissions") {
			t.Fatalf("Sync error %v; want the compute mode failure", err)
		}
		if got := m.Running(); len(got) != 0 {
			t.Errorf("running: %v, want none", got)
		}
		if _, err := os.Stat(filepath.Join(m.LogDir(gpu5.UUID), "started")); err == nil {
			t.Error("the daemon was started although the compute mode could not be set")
		}
	})

	t.Run("binary missing", func(t *testing.T) {
		cm := &fakeComputeMode{}
		m := newTestMPS(t, cm, nil)
		m.cfg.Binary = filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
		if err := m.Sync(ctx, [][]api.GPURef{{gpu5}}); err == nil {
			t.Fatal("Sync succeeded without a daemon binary")
		}
		if diff := cmp.Diff([]string{"5=exclusive-process", "5=default"}, cm.take()); diff != "" {
			t.Errorf("compute mode calls (-want +got):\n%s", diff)
		}
	})
}

func TestNVMLComputeMode(t *testing.T) {
	var got []nvml.ComputeMode
	dev := &mock.Device{SetComputeModeFunc: func(mode nvml.ComputeMode) nvml.Return {
		got = append(got, mode)
		return nvml.SUCCESS
	}}
	lib := &mock.Interface{DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
		if i != 3 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return dev, nvml.SUCCESS
	}}
	cm := NVMLComputeMode{Lib: lib}
	if err := cm.SetComputeMode(3, true); err != nil {
		t.Fatal(err)
	}
	if err := cm.SetComputeMode(3, false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]nvml.ComputeMode{nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, nvml.COMPUTEMODE_DEFAULT}, got); diff != "" {
		t.Errorf("modes set (-want +got):\n%s", diff)
	}
	if err := cm.SetComputeMode(0, true); err == nil {
		t.Error("SetComputeMode of an unknown GPU succeeded")
	}
	dev.SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { return nvml.ERROR_NO_PERMISSION }
	if err := cm.SetComputeMode(3, true); err == nil {
		t.Error("SetComputeMode succeeded although NVML refused")
	}
}

// metricValue is the value of the metric called name with exactly labels in
// reg, or -1 when there is none.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
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
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// An agent that restarts adopts the daemon its predecessor left running
// (its clients keep their server) rather than starting a second one; a pid
// file of a daemon that is gone is ignored.
func TestMPSAdoptsRunningDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cm := &fakeComputeMode{}
	m := newTestMPS(t, cm, nil)
	pipe, log := m.PipeDir(gpu5.UUID), m.LogDir(gpu5.UUID)
	for _, d := range []string{pipe, log} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The previous agent's daemon.
	prev := exec.Command(fakeBinary(t), "-f")
	prev.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+gpu5.UUID, "CUDA_MPS_PIPE_DIRECTORY="+pipe, "CUDA_MPS_LOG_DIRECTORY="+log)
	prev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := prev.Start(); err != nil {
		t.Fatal(err)
	}
	prevDone := make(chan error, 1)
	go func() { prevDone <- prev.Wait() }()
	eventually(t, "the previous daemon's control pipe", func() bool {
		_, err := os.Stat(filepath.Join(pipe, ControlPipe))
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(log, mpsPidFile), []byte(strconv.Itoa(prev.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := m.Sync(ctx, [][]api.GPURef{{gpu5}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(readLines(t, filepath.Join(log, "started"))); n != 1 {
		t.Fatalf("daemon started %d times; want the running one adopted", n)
	}
	// No tenants left: the adopted daemon is told to quit.
	if err := m.Sync(ctx, nil); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	select {
	case err := <-prevDone:
		if err != nil {
			t.Errorf("adopted daemon exited with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the adopted daemon did not quit")
	}

	// Its pid file now names a process that is gone: a new daemon starts.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu5}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(readLines(t, filepath.Join(log, "started"))); n != 2 {
		t.Fatalf("daemon started %d times, want a new one after the stale pid file", n)
	}
	if diff := cmp.Diff([]string{"5=exclusive-process", "5=default", "5=exclusive-process"}, cm.take()); diff != "" {
		t.Errorf("compute mode calls (-want +got):\n%s", diff)
	}
}

func TestNVMLUtilization(t *testing.T) {
	var asked []uint64
	samples := []nvml.ProcessUtilizationSample{
		{Pid: 7, TimeStamp: 100, SmUtil: 10},
		{Pid: 7, TimeStamp: 300, SmUtil: 40},
		{Pid: 9, TimeStamp: 200, SmUtil: 5},
	}
	ret := nvml.SUCCESS
	dev := &mock.Device{GetProcessUtilizationFunc: func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		asked = append(asked, since)
		return samples, ret
	}}
	lib := &mock.Interface{DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }}
	u := &NVMLUtilization{Lib: lib}
	got, err := u.ProcessUtilization(0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]ProcessUtilization{{PID: 7, SMPercent: 40}, {PID: 9, SMPercent: 5}}, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	// The next call asks only for newer samples; none is no error.
	ret = nvml.ERROR_NOT_FOUND
	if got, err := u.ProcessUtilization(0); err != nil || len(got) != 0 {
		t.Errorf("no new samples: %v, %v", got, err)
	}
	if diff := cmp.Diff([]uint64{0, 300}, asked); diff != "" {
		t.Errorf("timestamps asked (-want +got):\n%s", diff)
	}
	ret = nvml.ERROR_NOT_SUPPORTED
	if _, err := u.ProcessUtilization(0); err == nil {
		t.Error("an NVML failure yielded no error")
	}
}

// A multi-GPU slice's GPUs are served by one daemon for the set: it sees
// every GPU of the set, each in exclusive-process mode, under a pipe
// directory of its own; a GPU is never under two daemons, and the set's
// daemon stops (both GPUs back to the default mode) with its last tenant.
func TestMPSGroupDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cm := &fakeComputeMode{}
	m := newTestMPS(t, cm, nil)
	set := []api.GPURef{gpu6, gpu5} // any order: the daemon orders by index
	key := gpu5.UUID + "," + gpu6.UUID

	if err := m.Sync(ctx, [][]api.GPURef{set}); err != nil {
		t.Fatal(err)
	}
	if got := m.Running(); !cmp.Equal(got, []string{key}) {
		t.Fatalf("running %v, want the set's one daemon %q", got, key)
	}
	if got, want := cm.take(), []string{"5=exclusive-process", "6=exclusive-process"}; !cmp.Equal(got, want) {
		t.Errorf("compute mode calls %v, want %v", got, want)
	}
	pipe := m.PipeDir(key)
	if base := filepath.Base(pipe); !strings.HasPrefix(base, "set-") || len(base) != len("set-")+16 {
		t.Errorf("pipe directory %s: want set-<16 hex digits>", pipe)
	}
	if m.PipeDir(gpu5.UUID) == pipe || filepath.Base(m.PipeDir(gpu5.UUID)) != gpu5.UUID {
		t.Errorf("GPU 5 alone has pipe directory %s, the set %s", m.PipeDir(gpu5.UUID), pipe)
	}
	started := readLines(t, filepath.Join(m.LogDir(key), "started"))
	if len(started) != 1 || !strings.Contains(started[0], "visible="+gpu5.UUID+","+gpu6.UUID+" pipe="+pipe) {
		t.Fatalf("daemon start records %q, want one seeing both GPUs by index with pipe %s", started, pipe)
	}

	// GPU 5 alone and the set at once: refused, the set's daemon kept.
	err := m.Sync(ctx, [][]api.GPURef{set, {gpu5}})
	if err == nil || !strings.Contains(err.Error(), "already under") {
		t.Fatalf("Sync of overlapping groups: %v, want a refusal naming the GPU's daemon", err)
	}
	if got := m.Running(); !cmp.Equal(got, []string{key}) {
		t.Fatalf("running %v after the refused group, want only %q", got, key)
	}
	if n := len(readLines(t, filepath.Join(m.LogDir(key), "started"))); n != 1 {
		t.Errorf("the set's daemon started %d times, want once (never restarted for another group)", n)
	}

	// The set's last tenant leaves: GPU 5 alone may then get its own.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu5}}); err != nil {
		t.Fatal(err)
	}
	if q := readLines(t, filepath.Join(m.LogDir(key), "quit")); len(q) != 1 {
		t.Errorf("the set's daemon quit %d times, want once", len(q))
	}
	if got, want := cm.take(), []string{"5=default", "6=default", "5=exclusive-process"}; !cmp.Equal(got, want) {
		t.Errorf("compute mode calls %v, want %v", got, want)
	}
	if got := m.Running(); !cmp.Equal(got, []string{gpu5.UUID}) {
		t.Errorf("running %v, want GPU 5's own daemon", got)
	}
}

// After an agent restart a set's daemon is found again: its directories
// are a function of its GPUs, so the new agent adopts it rather than
// starting a second daemon over the same GPUs.
func TestMPSAdoptsRunningSetDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m := newTestMPS(t, &fakeComputeMode{}, nil)
	key := gpu5.UUID + "," + gpu6.UUID
	pipe, log := m.PipeDir(key), m.LogDir(key)
	for _, d := range []string{pipe, log} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	prev := exec.Command(fakeBinary(t), "-f")
	prev.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+key, "CUDA_MPS_PIPE_DIRECTORY="+pipe, "CUDA_MPS_LOG_DIRECTORY="+log)
	prev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := prev.Start(); err != nil {
		t.Fatal(err)
	}
	prevDone := make(chan error, 1)
	go func() { prevDone <- prev.Wait() }()
	eventually(t, "the previous daemon's control pipe", func() bool {
		_, err := os.Stat(filepath.Join(pipe, ControlPipe))
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(log, mpsPidFile), []byte(strconv.Itoa(prev.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The ledger's group, GPUs in any order.
	if err := m.Sync(ctx, [][]api.GPURef{{gpu6, gpu5}}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if n := len(readLines(t, filepath.Join(log, "started"))); n != 1 {
		t.Fatalf("the set's daemon started %d times; want the running one adopted", n)
	}
	if err := m.Sync(ctx, nil); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	select {
	case <-prevDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the adopted set daemon did not quit")
	}
}
