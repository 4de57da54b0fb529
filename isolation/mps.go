// Package isolation enforces what the NRI plugin decided for shared GPUs:
//
//   - MPS runs and supervises one MPS control daemon per MPS group with
//     shared tenants: a GPU alone, or the set of GPUs of multi-GPU slices
//     (gpureq's group rule: a GPU is under at most one daemon). Each has
//     its own pipe and log directories, its GPUs in exclusive-process
//     compute mode; it is stopped when the group has no shared tenant left.
//     Containers reach it through the pipe directory the NRI plugin mounts;
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
//     make the MPS server cap their memory and SMs.
//   - Watchdog polls NVML for every process's GPU memory, maps each process
//     to its container through /proc/PID/cgroup, and acts on containers over
//     their limit (none, warn, kill, evict). It also exports used vs limit
//     and per-container SM utilisation as metrics. It is best effort: it
//     sees a process only after it has allocated.
package isolation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// DefaultMPSBinary is NVIDIA's MPS control program.
const DefaultMPSBinary = "nvidia-cuda-mps-control"

// ControlPipe is the pipe an MPS control daemon creates in its pipe
// directory once it accepts clients.
const ControlPipe = "control"

// ComputeModeSetter switches a GPU between the default and the
// exclusive-process compute mode. NVMLComputeMode implements it.
type ComputeModeSetter interface {
	SetComputeMode(index int, exclusiveProcess bool) error
}

// MPSConfig configures MPS.
type MPSConfig struct {
	// Binary is the MPS control program (DefaultMPSBinary when empty).
	Binary string
	// PipeBase and LogBase hold one directory per MPS group (DirName).
	PipeBase, LogBase string
	// ComputeMode sets the GPUs' compute mode; required.
	ComputeMode ComputeModeSetter
	// StartTimeout bounds the wait for a daemon's control pipe (10s).
	StartTimeout time.Duration
	// StopTimeout bounds the wait for a daemon to quit before it is
	// killed (10s).
	StopTimeout time.Duration
	// RestartDelay is the wait before a daemon that exited is restarted
	// (1s).
	RestartDelay time.Duration
	// Metrics records daemon restarts; optional.
	Metrics *Metrics
	// ProcRoot is where /proc is mounted ("/proc" when empty); it is read
	// to adopt the daemons a previous agent left running.
	ProcRoot string
}

// MPS runs one supervised MPS control daemon per MPS group (a GPU alone or
// the GPUs of multi-GPU slices) with shared tenants.
type MPS struct {
	cfg MPSConfig

	mu      sync.Mutex
	daemons map[string]*daemon
}

type daemon struct {
	// key is the group's gpureq.GroupKey; gpus its GPUs by index.
	key     string
	gpus    []api.GPURef
	pipeDir string
	logDir  string

	mu       sync.Mutex
	pidv     int           // the daemon process (its own process group)
	exited   chan struct{} // closed when the process has exited
	stopping bool
	stopped  chan struct{} // closed when supervision ended
	restarts int
}

// NewMPS validates cfg.
func NewMPS(cfg MPSConfig) (*MPS, error) {
	if cfg.PipeBase == "" || cfg.LogBase == "" {
		return nil, errors.New("mps: pipe and log base directories are required")
	}
	if cfg.ComputeMode == nil {
		return nil, errors.New("mps: no compute mode setter")
	}
	if cfg.Binary == "" {
		cfg.Binary = DefaultMPSBinary
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	if cfg.RestartDelay <= 0 {
		cfg.RestartDelay = time.Second
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	return &MPS{cfg: cfg, daemons: map[string]*daemon{}}, nil
}

// DirName is the name of the pipe and log directories of the daemon of the
// group key (gpureq.GroupKey): a GPU's UUID for a GPU alone; "set-" and 16
// hex digits of the key's SHA-256 for a set of GPUs (a unix socket path is
// at most 107 bytes: the UUIDs of a set would not fit).
func DirName(key string) string {
	if !strings.Contains(key, ",") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "set-" + hex.EncodeToString(sum[:8])
}

// PipeDir is the pipe directory of the daemon of group key
// (gpureq.GroupKey): the NRI plugin mounts it into the group's shared
// containers.
func (m *MPS) PipeDir(key string) string { return filepath.Join(m.cfg.PipeBase, DirName(key)) }

// LogDir is the log directory of the daemon of group key.
func (m *MPS) LogDir(key string) string { return filepath.Join(m.cfg.LogBase, DirName(key)) }

// Running lists the group keys with a daemon, sorted (a GPU alone: its
// UUID).
func (m *MPS) Running() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for u := range m.daemons {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Sync makes the daemons match groups, the MPS groups with shared tenants
// (each the GPUs one daemon serves: a GPU alone, or the GPUs of multi-GPU
// slices): it stops the daemons of the other groups and starts the missing
// ones (each started daemon accepts clients when Sync returns). A GPU is
// under at most one daemon: a group that shares a GPU with a running
// daemon it is not, or with another group of groups, is refused (the
// group rule of package gpureq keeps the ledger from asking that). Errors
// of several groups are joined; a group whose daemon failed to start has
// none.
func (m *MPS) Sync(ctx context.Context, groups [][]api.GPURef) error {
	logger := klog.FromContext(ctx).WithName("mps")
	want := map[string][]api.GPURef{}
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		gpus := append([]api.GPURef(nil), g...)
		sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
		want[gpureq.GroupKey(uuidsOf(gpus))] = gpus
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for key, d := range m.daemons {
		if _, ok := want[key]; ok {
			continue
		}
		logger.Info("Stopping the MPS daemon of a group without shared tenants", "gpus", key)
		if err := m.stop(d); err != nil {
			errs = append(errs, err)
		}
		delete(m.daemons, key)
	}
	under := map[string]string{} // GPU UUID -> the key of its daemon
	for key, d := range m.daemons {
		for _, g := range d.gpus {
			under[g.UUID] = key
		}
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if _, ok := m.daemons[key]; ok {
			continue
		}
		var clash error
		for _, g := range want[key] {
			if other, ok := under[g.UUID]; ok {
				clash = fmt.Errorf("MPS daemon of GPUs [%s]: GPU %s is already under the daemon of [%s]; a GPU is under one daemon at a time", key, g.UUID, other)
				break
			}
		}
		if clash != nil {
			errs = append(errs, clash)
			continue
		}
		d, err := m.start(logger, key, want[key])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.daemons[key] = d
		for _, g := range d.gpus {
			under[g.UUID] = key
		}
		logger.Info("Started the MPS daemon", "gpus", key, "pipeDir", d.pipeDir)
	}
	return errors.Join(errs...)
}

func uuidsOf(gpus []api.GPURef) []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = g.UUID
	}
	return out
}

// name names the daemon in errors: its GPU, or its GPUs.
func (d *daemon) name() string {
	if len(d.gpus) == 1 {
		return "GPU " + d.gpus[0].UUID
	}
	return "GPUs [" + d.key + "]"
}

// Stop stops every daemon.
func (m *MPS) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for uuid, d := range m.daemons {
		errs = append(errs, m.stop(d))
		delete(m.daemons, uuid)
	}
	return errors.Join(errs...)
}

func (m *MPS) env(d *daemon) []string {
	return append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+strings.Join(uuidsOf(d.gpus), ","),
		api.EnvMPSPipeDirectory+"="+d.pipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.logDir,
	)
}

func (m *MPS) start(logger klog.Logger, key string, gpus []api.GPURef) (*daemon, error) {
	d := &daemon{key: key, gpus: gpus, pipeDir: m.PipeDir(key), logDir: m.LogDir(key), stopped: make(chan struct{})}
	for _, dir := range []string{d.pipeDir, d.logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("MPS daemon of %s: %w", d.name(), err)
		}
	}
	for i, g := range gpus {
		if err := m.cfg.ComputeMode.SetComputeMode(g.Index, true); err != nil {
			m.resetComputeMode(logger, gpus[:i])
			return nil, fmt.Errorf("MPS daemon of %s: setting exclusive-process compute mode on GPU %s: %w", d.name(), g.UUID, err)
		}
	}
	if pid := m.adoptable(d); pid > 0 {
		// Its clients keep their server across the agent's restart.
		logger.Info("Adopting the running MPS daemon of a previous agent", "gpus", key, "pid", pid)
		m.adopt(d, pid)
		go m.supervise(logger.WithValues("gpus", key), d)
		return d, nil
	}
	// A control pipe left by a daemon that died must not pass for ours.
	os.Remove(filepath.Join(d.pipeDir, ControlPipe))
	if err := m.launch(d); err != nil {
		m.resetComputeMode(logger, gpus)
		return nil, err
	}
	if err := m.waitReady(d); err != nil {
		m.kill(d)
		m.resetComputeMode(logger, gpus)
		return nil, err
	}
	go m.supervise(logger.WithValues("gpus", key), d)
	return d, nil
}

func (m *MPS) launch(d *daemon) error {
	cmd := exec.Command(m.cfg.Binary, "-f")
	cmd.Env = m.env(d)
	cmd.Dir = d.logDir
	// Its own process group: signals meant for the agent do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("MPS daemon of %s: starting %s: %w", d.name(), m.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	d.mu.Lock()
	d.pidv, d.exited = cmd.Process.Pid, exited
	d.mu.Unlock()
	// The pid file lets an agent that restarts adopt the daemon rather than
	// start a second one on the same pipe directory.
	pidFile := filepath.Join(d.logDir, mpsPidFile)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("MPS daemon of %s: writing %s: %w", d.name(), pidFile, err)
	}
	return nil
}

// mpsPidFile holds the daemon's PID in its log directory (which, unlike the
// pipe directory, no container sees).
const mpsPidFile = "tessera-mps-control.pid"

// adoptable returns the PID of a daemon of d's group that a previous agent
// started and that still serves the pipe directory, or 0.
func (m *MPS) adoptable(d *daemon) int {
	b, err := os.ReadFile(filepath.Join(d.logDir, mpsPidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(filepath.Join(m.cfg.ProcRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil || !strings.Contains(string(cmdline), filepath.Base(m.cfg.Binary)) {
		return 0
	}
	if _, err := os.Stat(filepath.Join(d.pipeDir, ControlPipe)); err != nil {
		return 0
	}
	return pid
}

// adopt supervises a running daemon that this process did not start.
func (m *MPS) adopt(d *daemon, pid int) {
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			if _, err := os.Stat(filepath.Join(m.cfg.ProcRoot, strconv.Itoa(pid))); err != nil {
				return
			}
			if st, err := os.ReadFile(filepath.Join(m.cfg.ProcRoot, strconv.Itoa(pid), "stat")); err == nil && zombie(st) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	d.mu.Lock()
	d.pidv, d.exited = pid, exited
	d.mu.Unlock()
}

// zombie reports whether a /proc/PID/stat line is a zombie's (state Z).
func zombie(stat []byte) bool {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func (m *MPS) waitReady(d *daemon) error {
	d.mu.Lock()
	exited := d.exited
	d.mu.Unlock()
	deadline := time.NewTimer(m.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(filepath.Join(d.pipeDir, ControlPipe)); err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("MPS daemon of %s exited before it accepted clients (see %s)", d.name(), d.logDir)
		case <-deadline.C:
			return fmt.Errorf("MPS daemon of %s: no control pipe in %s after %s", d.name(), d.pipeDir, m.cfg.StartTimeout)
		case <-tick.C:
		}
	}
}

// supervise restarts the daemon whenever it exits until it is stopped.
func (m *MPS) supervise(logger klog.Logger, d *daemon) {
	defer close(d.stopped)
	for {
		d.mu.Lock()
		exited := d.exited
		d.mu.Unlock()
		<-exited
		d.mu.Lock()
		stopping := d.stopping
		d.mu.Unlock()
		if stopping {
			return
		}
		logger.Error(nil, "The MPS daemon exited; restarting it", "retryIn", m.cfg.RestartDelay)
		for {
			time.Sleep(m.cfg.RestartDelay)
			d.mu.Lock()
			stopping := d.stopping
			d.mu.Unlock()
			if stopping {
				return
			}
			os.Remove(filepath.Join(d.pipeDir, ControlPipe))
			err := m.launch(d)
			if err == nil {
				err = m.waitReady(d)
			}
			if err == nil {
				d.mu.Lock()
				d.restarts++
				d.mu.Unlock()
				for _, g := range d.gpus {
					m.cfg.Metrics.observeMPSRestart(g.UUID)
				}
				logger.Info("Restarted the MPS daemon")
				break
			}
			logger.Error(err, "Restarting the MPS daemon failed; retrying")
			m.kill(d)
		}
	}
}

// stop asks the daemon to quit (echo quit | nvidia-cuda-mps-control), kills
// it when it does not in time, and puts its GPUs back in the default
// compute mode.
func (m *MPS) stop(d *daemon) error {
	d.mu.Lock()
	d.stopping = true
	exited := d.exited
	d.mu.Unlock()
	quit := exec.Command(m.cfg.Binary)
	quit.Env = m.env(d)
	quit.Stdin = strings.NewReader("quit\n")
	quitErr := quit.Run()
	select {
	case <-exited:
	case <-time.After(m.cfg.StopTimeout):
		m.kill(d)
	}
	// A daemon the supervisor relaunched meanwhile is killed too.
	for done := false; !done; {
		select {
		case <-d.stopped:
			done = true
		case <-time.After(50 * time.Millisecond):
			m.kill(d)
		}
	}
	var errs []error
	if quitErr != nil {
		errs = append(errs, fmt.Errorf("asking the MPS daemon of %s to quit: %w", d.name(), quitErr))
	}
	for _, g := range d.gpus {
		if err := m.cfg.ComputeMode.SetComputeMode(g.Index, false); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: restoring the default compute mode: %w", g.UUID, err))
		}
	}
	return errors.Join(errs...)
}

// kill kills the daemon's process group and waits for it to exit.
func (m *MPS) kill(d *daemon) {
	d.mu.Lock()
	pid, exited := d.pidv, d.exited
	d.mu.Unlock()
	if pid <= 0 {
		return
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
}

func (m *MPS) resetComputeMode(logger klog.Logger, gpus []api.GPURef) {
	for _, g := range gpus {
		if err := m.cfg.ComputeMode.SetComputeMode(g.Index, false); err != nil {
			logger.Error(err, "Restoring the default compute mode", "gpu", g.UUID)
		}
	}
}

// pid returns the daemon's process ID (0 when none), for tests.
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pidv
}
