package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/isolation"
	"github.com/tessera-gpu/tessera/nri"
	"github.com/tessera-gpu/tessera/topology"
)

// isolationFlags configure the NRI plugin, the MPS daemons and the memory
// watchdog.
type isolationFlags struct {
	nriSocket        string
	stateDir         string
	mpsBinary        string
	mpsDir           string
	procRoot         string
	cpuManagerState  string
	watchdogAction   string
	watchdogInterval time.Duration
}

func (f *isolationFlags) register(fs interface {
	StringVar(*string, string, string, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}) {
	fs.StringVar(&f.nriSocket, "nri-socket", nri.DefaultSocketPath, `the container runtime's NRI socket; "" turns the NRI plugin off, and with it shared GPU units (they are refused without isolation)`)
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/tessera", "directory of the agent's checkpoints (the NRI plugin's ledger)")
	fs.StringVar(&f.mpsBinary, "mps-control", isolation.DefaultMPSBinary, "the MPS control daemon program run per shared GPU")
	fs.StringVar(&f.mpsDir, "mps-dir", "", "base directory of the MPS daemons' pipe and log directories (default <state-dir>/mps)")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "where the host's /proc is mounted (device majors, processes' cgroups)")
	fs.StringVar(&f.cpuManagerState, "cpu-manager-state", nri.DefaultCPUManagerState, "the kubelet's CPU manager state file (containers with exclusive CPUs keep them)")
	fs.StringVar(&f.watchdogAction, "watchdog-action", string(isolation.ActionWarn), "what the GPU memory watchdog does to a container over its limit: none, warn, kill, evict")
	fs.DurationVar(&f.watchdogInterval, "watchdog-interval", 0, "period of the GPU memory watchdog (default 5s)")
}

// nodeIsolation is the NRI plugin, the MPS daemons it starts and the memory
// watchdog that polices what MPS cannot.
type nodeIsolation struct {
	plugin *nri.Plugin
	mps    *isolation.MPS
	wd     *isolation.Watchdog
}

type isolationDeps struct {
	flags   *isolationFlags
	cfg     *api.NodeAgentConfig
	backend *gpu.Backend
	topo    *topology.Topology
	kubelet kubeletstate.Source
	// checkpoint is the device manager's checkpoint (init containers).
	checkpoint kubeletstate.Source
	client     kubernetes.Interface // nil without an API server
	trust      *podtrust.Filter     // nil without an API server: nothing is trusted
	events     isolation.EventRecorder
	reg        prometheus.Registerer
	inventory  func() *api.GPUInventory
}

// newIsolation builds the node's isolation. It starts nothing; run starts it.
func newIsolation(d isolationDeps) (*nodeIsolation, error) {
	f := d.flags
	action, err := isolation.ParseAction(f.watchdogAction)
	if err != nil {
		return nil, fmt.Errorf("--watchdog-action: %w", err)
	}
	if action == isolation.ActionEvict && d.client == nil {
		return nil, errors.New("--watchdog-action=evict needs an API server (--kubeconfig or in-cluster, and --node-name)")
	}
	isoMetrics, err := isolation.NewMetrics(d.reg)
	if err != nil {
		return nil, err
	}
	mpsDir := f.mpsDir
	if mpsDir == "" {
		mpsDir = filepath.Join(f.stateDir, "mps")
	}
	mps, err := isolation.NewMPS(isolation.MPSConfig{
		Binary:      f.mpsBinary,
		PipeBase:    filepath.Join(mpsDir, "pipe"),
		LogBase:     filepath.Join(mpsDir, "log"),
		ComputeMode: isolation.NVMLComputeMode{Lib: d.backend.NVML},
		Metrics:     isoMetrics,
		ProcRoot:    f.procRoot,
	})
	if err != nil {
		return nil, err
	}
	uvm, err := nri.UVMMajor(f.procRoot)
	if err != nil {
		return nil, err
	}
	// A MIG instance's access devices, added when CDI is off.
	migCaps, err := nri.ReadMIGCaps(f.procRoot)
	if err != nil {
		return nil, err
	}
	gpus, err := nri.GPUsFromTopology(d.topo, d.backend)
	if err != nil {
		return nil, err
	}
	// Pods that bypassed the extender are placed on this node alone: best fit at
	// GPU level packs them as the extender would.
	policy, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		return nil, err
	}
	nriMetrics, err := nri.NewMetrics(d.reg)
	if err != nil {
		return nil, err
	}
	decide := nri.OptionsFromConfig(d.cfg, uvm, mps.PipeDir, policy)
	decide.MIGCaps = migCaps
	pcfg := nri.Config{
		SocketPath:  f.nriSocket,
		StateDir:    f.stateDir,
		Decide:      decide,
		GPUs:        gpus,
		NUMANodes:   d.topo.NUMANodes,
		Allocations: nri.KubeletAllocations{Source: d.kubelet, InitContainers: d.checkpoint},
		MPS:         mps,
		Health:      nri.HealthFromInventory(d.inventory),
		CPUs:        nri.CPUManagerState{Path: f.cpuManagerState},
		Metrics:     nriMetrics,
		Trust:       d.trust,
	}
	wcfg := isolation.WatchdogConfig{
		Processes:   d.backend,
		Utilization: &isolation.NVMLUtilization{Lib: d.backend.NVML},
		Action:      action,
		ProcRoot:    f.procRoot,
		Interval:    f.watchdogInterval,
		Events:      d.events,
		Metrics:     isoMetrics,
	}
	if d.client != nil {
		pcfg.Recorder = nri.KubeRecorder{Client: d.client, Trust: d.trust}
		wcfg.Evictor = isolation.KubeEvictor{Client: d.client}
	}
	plugin, err := nri.New(pcfg)
	if err != nil {
		mps.Stop()
		return nil, err
	}
	for _, g := range d.topo.GPUs {
		wcfg.GPUs = append(wcfg.GPUs, api.GPURef{UUID: g.UUID, Index: g.Index})
	}
	wcfg.Limits = plugin.Ledger()
	wd, err := isolation.NewWatchdog(wcfg)
	if err != nil {
		mps.Stop()
		return nil, err
	}
	return &nodeIsolation{plugin: plugin, mps: mps, wd: wd}, nil
}

// run runs the NRI plugin and the watchdog until ctx ends, then stops the
// MPS daemons.
func (n *nodeIsolation) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := n.plugin.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error(err, "NRI plugin stopped")
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		if err := n.wd.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error(err, "GPU memory watchdog stopped")
		}
	}()
	<-done
	<-done
	n.mps.Stop()
}

// eventRecorder records Events through the API server, or logs them when
// there is none.
func eventRecorder(ctx context.Context, client kubernetes.Interface, nodeName string) (isolation.EventRecorder, func()) {
	if client == nil {
		return logEvents{logger: klog.FromContext(ctx)}, func() {}
	}
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-node", Host: nodeName}), b.Shutdown
}

// logEvents writes Events to the log.
type logEvents struct{ logger klog.Logger }

var _ isolation.EventRecorder = logEvents{}

func (l logEvents) Eventf(obj kruntime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	var ref any = fmt.Sprintf("%T", obj)
	switch o := obj.(type) {
	case metav1.Object:
		ref = klog.KObj(o)
	case *corev1.ObjectReference:
		ref = o.Kind + " " + klog.KRef(o.Namespace, o.Name).String()
	}
	l.logger.Info("Event", "type", eventtype, "reason", reason, "object", ref, "message", fmt.Sprintf(messageFmt, args...))
}
