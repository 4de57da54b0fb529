package isolation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
)

// Action is what the watchdog does to a container over its GPU memory
// limit.
type Action string

// Actions.
const (
	// ActionNone only records metrics and logs.
	ActionNone Action = "none"
	// ActionWarn also emits a Warning event on the pod (once per excess).
	ActionWarn Action = "warn"
	// ActionKill kills the container's processes on the GPU (SIGKILL).
	ActionKill Action = "kill"
	// ActionEvict evicts the pod through the Eviction API.
	ActionEvict Action = "evict"
)

// ParseAction parses an Action.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionNone, ActionWarn, ActionKill, ActionEvict:
		return a, nil
	}
	return "", fmt.Errorf("watchdog action %q is not one of none, warn, kill, evict", s)
}

// EventReasonGPUMemoryExceeded is the reason of the watchdog's events.
const EventReasonGPUMemoryExceeded = "GPUMemoryLimitExceeded"

// ContainerLimit is one container's GPU use and limit, from the NRI
// plugin's ledger.
type ContainerLimit struct {
	ContainerID string
	PodUID      string
	Namespace   string
	Pod         string
	Container   string
	GPU         api.GPURef
	// LimitMiB is the container's GPU memory limit on GPU; 0 means none
	// (a whole GPU).
	LimitMiB int64
}

// Limits lists the containers the node runs on GPUs and their limits.
type Limits interface {
	ContainerLimits() []ContainerLimit
}

// ProcessSource lists a GPU's compute processes; gpu.Interface satisfies it.
type ProcessSource interface {
	Processes(index int) ([]gpu.Process, error)
}

// ProcessUtilization is one process's SM utilisation over NVML's last
// sampling window.
type ProcessUtilization struct {
	PID       uint32
	SMPercent uint32
}

// UtilizationSource reports per-process SM utilisation of a GPU;
// NVMLUtilization implements it.
type UtilizationSource interface {
	ProcessUtilization(index int) ([]ProcessUtilization, error)
}

// EventRecorder emits Kubernetes events; client-go's record.EventRecorder
// satisfies it.
type EventRecorder interface {
	Eventf(object kruntime.Object, eventtype, reason, messageFmt string, args ...interface{})
}

// Evictor evicts a pod.
type Evictor interface {
	Evict(ctx context.Context, namespace, name string, uid types.UID, reason string) error
}

// WatchdogConfig configures a Watchdog.
type WatchdogConfig struct {
	// GPUs are the GPUs to poll.
	GPUs []api.GPURef
	// Processes lists each GPU's processes; required.
	Processes ProcessSource
	// Utilization reports per-process SM utilisation; optional.
	Utilization UtilizationSource
	// Limits lists the containers and their limits; required.
	Limits Limits
	// Action is taken on containers over their limit.
	Action Action
	// ProcRoot is where /proc is mounted ("/proc" when empty).
	ProcRoot string
	// Interval is the polling period (5s when 0).
	Interval time.Duration
	// Events records warnings; required for ActionWarn and used, when
	// set, to tell a pod why it was killed or evicted.
	Events EventRecorder
	// Evictor evicts pods; required for ActionEvict.
	Evictor Evictor
	// Kill kills a process; SIGKILL through kill(2) when nil.
	Kill func(pid int) error
	// Metrics records metrics; optional.
	Metrics *Metrics
}

// Watchdog enforces containers' GPU memory limits by polling NVML.
type Watchdog struct {
	cfg WatchdogConfig

	mu       sync.Mutex
	over     map[string]bool // container IDs over their limit at the last poll
	evicted  map[string]bool // pod UIDs evicted
	reported map[uint32]bool // PIDs of unknown cgroups already logged
}

// NewWatchdog validates cfg.
func NewWatchdog(cfg WatchdogConfig) (*Watchdog, error) {
	if cfg.Processes == nil || cfg.Limits == nil {
		return nil, errors.New("watchdog: a process source and the container limits are required")
	}
	if _, err := ParseAction(string(cfg.Action)); err != nil {
		return nil, err
	}
	if cfg.Action == ActionWarn && cfg.Events == nil {
		return nil, errors.New("watchdog: action warn needs an event recorder")
	}
	if cfg.Action == ActionEvict && cfg.Evictor == nil {
		return nil, errors.New("watchdog: action evict needs an evictor")
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Kill == nil {
		cfg.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	return &Watchdog{cfg: cfg, over: map[string]bool{}, evicted: map[string]bool{}, reported: map[uint32]bool{}}, nil
}

// Run polls until ctx ends.
func (w *Watchdog) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("watchdog")
	ctx = klog.NewContext(ctx, logger)
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		w.Poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Usage is one container's use of one GPU at a poll.
type Usage struct {
	Limit     ContainerLimit
	PIDs      []uint32
	UsedBytes uint64
	SMPercent uint32
	// Over is true when the container holds more than its limit.
	Over bool
}

// Report is what one poll saw and did.
type Report struct {
	Containers []Usage
	// Unknown are PIDs on a GPU whose cgroup maps to no known container.
	Unknown []uint32
	// Actions describe what was done, e.g. "kill 4242", "evict ns/p",
	// "warn ns/p/c".
	Actions []string
}

// containerID matches a container runtime ID at the end of a cgroup path:
// .../<id>, .../cri-containerd-<id>.scope, .../crio-<id>.scope.
var containerID = regexp.MustCompile(`([0-9a-f]{64})(?:\.scope)?$`)

// ContainerIDOfPID returns the container ID in the cgroup of a process,
// read from procRoot/PID/cgroup (cgroup v1 or v2); "" when none.
func ContainerIDOfPID(procRoot string, pid uint32) (string, error) {
	m, err := cgroups.ParseCgroupFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return "", err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if id := containerID.FindStringSubmatch(filepath.Base(m[k])); id != nil {
			return id[1], nil
		}
	}
	return "", nil
}

// Poll checks every GPU once and acts on containers over their limit.
func (w *Watchdog) Poll(ctx context.Context) Report {
	logger := klog.FromContext(ctx)
	limits := map[string]ContainerLimit{} // container ID + GPU UUID
	known := map[string]bool{}
	for _, l := range w.cfg.Limits.ContainerLimits() {
		limits[l.ContainerID+"/"+l.GPU.UUID] = l
		known[l.ContainerID] = true
	}
	var rep Report
	usage := map[string]*Usage{}
	var order []string
	for _, g := range w.cfg.GPUs {
		procs, err := w.cfg.Processes.Processes(g.Index)
		if err != nil {
			logger.Error(err, "Listing the GPU's processes", "gpu", g.UUID)
			if w.cfg.Metrics != nil {
				w.cfg.Metrics.pollFailures.WithLabelValues(g.UUID).Inc()
			}
			continue
		}
		sm := map[uint32]uint32{}
		if w.cfg.Utilization != nil {
			samples, err := w.cfg.Utilization.ProcessUtilization(g.Index)
			if err != nil {
				logger.V(4).Info("No per-process utilisation", "gpu", g.UUID, "err", err)
			}
			for _, s := range samples {
				sm[s.PID] = s.SMPercent
			}
		}
		for _, p := range procs {
			id, err := ContainerIDOfPID(w.cfg.ProcRoot, p.PID)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				logger.V(2).Info("Reading a GPU process's cgroup", "pid", p.PID, "err", err)
			}
			l, ok := limits[id+"/"+g.UUID]
			if id == "" || !ok {
				rep.Unknown = append(rep.Unknown, p.PID)
				w.reportUnknown(logger, p.PID, g.UUID, id, known[id])
				continue
			}
			key := id + "/" + g.UUID
			u := usage[key]
			if u == nil {
				u = &Usage{Limit: l}
				usage[key] = u
				order = append(order, key)
			}
			u.PIDs = append(u.PIDs, p.PID)
			u.UsedBytes += p.UsedMemory
			u.SMPercent += sm[p.PID]
		}
	}
	sort.Strings(order)
	if w.cfg.Metrics != nil {
		w.cfg.Metrics.memoryUsed.Reset()
		w.cfg.Metrics.memoryLimit.Reset()
		w.cfg.Metrics.smUtil.Reset()
	}
	nowOver := map[string]bool{}
	for _, key := range order {
		u := usage[key]
		l := u.Limit
		limitBytes := uint64(l.LimitMiB) << 20
		u.Over = l.LimitMiB > 0 && u.UsedBytes > limitBytes
		if m := w.cfg.Metrics; m != nil {
			labels := []string{l.Namespace, l.Pod, l.Container, l.GPU.UUID}
			m.memoryUsed.WithLabelValues(labels...).Set(float64(u.UsedBytes))
			if l.LimitMiB > 0 {
				m.memoryLimit.WithLabelValues(labels...).Set(float64(limitBytes))
			}
			m.smUtil.WithLabelValues(labels...).Set(float64(u.SMPercent))
		}
		rep.Containers = append(rep.Containers, *u)
		if u.Over {
			nowOver[l.ContainerID] = true
			rep.Actions = append(rep.Actions, w.act(ctx, *u)...)
		}
	}
	w.mu.Lock()
	w.over = nowOver
	w.mu.Unlock()
	return rep
}

func (w *Watchdog) reportUnknown(logger klog.Logger, pid uint32, gpuUUID, id string, knownElsewhere bool) {
	if w.cfg.Metrics != nil {
		w.cfg.Metrics.unknown.Inc()
	}
	w.mu.Lock()
	seen := w.reported[pid]
	w.reported[pid] = true
	w.mu.Unlock()
	if seen {
		return
	}
	msg := "A GPU process belongs to no known container; left alone"
	if knownElsewhere {
		msg = "A container's process uses a GPU the container was not given; left alone (device isolation should have prevented it)"
	}
	logger.Info(msg, "pid", pid, "gpu", gpuUUID, "containerID", id)
}

func (w *Watchdog) act(ctx context.Context, u Usage) []string {
	logger := klog.FromContext(ctx)
	l := u.Limit
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Pod, UID: types.UID(l.PodUID)}}
	msg := fmt.Sprintf("container %s holds %d MiB of GPU memory on GPU %d (%s), over its limit of %d MiB", l.Container, u.UsedBytes>>20, l.GPU.Index, l.GPU.UUID, l.LimitMiB)
	w.mu.Lock()
	already := w.over[l.ContainerID]
	w.mu.Unlock()
	logger.Info("Container over its GPU memory limit", "pod", klog.KObj(pod), "container", l.Container, "gpu", l.GPU.UUID, "usedMiB", u.UsedBytes>>20, "limitMiB", l.LimitMiB, "action", w.cfg.Action)
	count := func(action string, err error) {
		if w.cfg.Metrics == nil {
			return
		}
		result := "ok"
		if err != nil {
			result = "error"
		}
		w.cfg.Metrics.actions.WithLabelValues(action, result).Inc()
	}
	var done []string
	switch w.cfg.Action {
	case ActionNone:
	case ActionWarn:
		if !already {
			w.cfg.Events.Eventf(pod, corev1.EventTypeWarning, EventReasonGPUMemoryExceeded, "%s", msg)
			count(string(ActionWarn), nil)
			done = append(done, "warn "+l.Namespace+"/"+l.Pod+"/"+l.Container)
		}
	case ActionKill:
		for _, pid := range u.PIDs {
			err := w.cfg.Kill(int(pid))
			count(string(ActionKill), err)
			if err != nil {
				logger.Error(err, "Killing a process over its container's GPU memory limit", "pid", pid)
				continue
			}
			done = append(done, "kill "+strconv.FormatUint(uint64(pid), 10))
		}
		if w.cfg.Events != nil && len(done) > 0 {
			w.cfg.Events.Eventf(pod, corev1.EventTypeWarning, EventReasonGPUMemoryExceeded, "%s: killed its processes %v", msg, u.PIDs)
		}
	case ActionEvict:
		w.mu.Lock()
		evicted := w.evicted[l.PodUID]
		w.mu.Unlock()
		if evicted {
			break
		}
		err := w.cfg.Evictor.Evict(ctx, l.Namespace, l.Pod, types.UID(l.PodUID), msg)
		count(string(ActionEvict), err)
		if err != nil {
			logger.Error(err, "Evicting a pod over its GPU memory limit", "pod", klog.KObj(pod))
			break
		}
		w.mu.Lock()
		w.evicted[l.PodUID] = true
		w.mu.Unlock()
		done = append(done, "evict "+l.Namespace+"/"+l.Pod)
		if w.cfg.Events != nil {
			w.cfg.Events.Eventf(pod, corev1.EventTypeWarning, EventReasonGPUMemoryExceeded, "%s: evicting the pod", msg)
		}
	}
	return done
}
