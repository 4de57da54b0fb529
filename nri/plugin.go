package nri

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/topology"
)

// DefaultSocketPath is the runtime's NRI socket.
const DefaultSocketPath = nriapi.DefaultSocketPath

// Plugin name and index under which the plugin registers with the runtime.
const (
	DefaultPluginName = "tessera"
	DefaultPluginIdx  = "10"
)

// ConnectionObserver is told when the plugin connects to the runtime (after
// its Synchronize, when it receives events) and when it loses it. The device
// plugin implements it: it refuses shared units while not connected.
type ConnectionObserver interface {
	SetNRIConnected(connected bool)
}

// Allocations says what the kubelet allocated to a container of Tessera
// resources (the node agent reads its PodResources API).
type Allocations interface {
	ContainerDevices(ctx context.Context, pod Pod, container string) (Devices, error)
}

// AssignmentRecorder records on a pod the shared slice the plugin placed
// locally for a container, because the pod bypassed the scheduler extender.
// The node agent wires a client-go implementation.
type AssignmentRecorder interface {
	RecordShared(ctx context.Context, pod Pod, container string, shared api.SharedGPU) error
}

// Health says which GPUs are unhealthy now, by UUID, with the reason.
type Health interface {
	Unhealthy() map[string]string
}

// MPSController runs one MPS control daemon per MPS group that has shared
// tenants (a GPU alone, or the GPUs of multi-GPU slices: gpureq's group
// rule): Sync starts those missing for groups and stops the others.
// isolation.MPS implements it.
type MPSController interface {
	Sync(ctx context.Context, groups [][]api.GPURef) error
}

// CPUAssignments says whether the kubelet's CPU manager gave a container
// exclusive CPUs (CPUManagerState reads its checkpoint).
type CPUAssignments interface {
	HasExclusiveCPUs(podUID, container string) (bool, error)
}

// Config configures a Plugin. GPUs, StateDir, Allocations and MPS are
// required.
type Config struct {
	// SocketPath is the runtime's NRI socket (DefaultSocketPath when empty).
	SocketPath string
	// PluginName and PluginIdx register the plugin (DefaultPluginName,
	// DefaultPluginIdx when empty).
	PluginName, PluginIdx string
	// StateDir holds the ledger checkpoint.
	StateDir string
	// Decide are the static decision options. Decide.MPSPipeDir is
	// required.
	Decide Options
	// GPUs and NUMANodes describe the node (see GPUsFromTopology).
	GPUs      []GPU
	NUMANodes []topology.NUMANode
	// Allocations reads the kubelet's allocations.
	Allocations Allocations
	// MPS runs the MPS daemons of shared GPUs.
	MPS MPSController
	// Observer is told about the connection; optional.
	Observer ConnectionObserver
	// Recorder records locally placed assignments; optional (without it a
	// pod that bypassed the extender is refused).
	Recorder AssignmentRecorder
	// Trust removes from a pod sandbox's annotations every decision that
	// Tessera did not seal for that pod; nil trusts none (fail closed).
	Trust *podtrust.Filter
	// Health reports unhealthy GPUs; optional (all healthy).
	Health Health
	// CPUs tells exclusive CPUs; optional (then no container counts as
	// having exclusive CPUs).
	CPUs CPUAssignments
	// Metrics records metrics; optional.
	Metrics *Metrics
	// RetryInterval is the first wait between connection attempts (1s
	// when 0); it doubles up to MaxRetryInterval (30s when 0) while the
	// runtime stays unreachable.
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
}

// Plugin is the NRI plugin. Create it with New and run it with Run.
type Plugin struct {
	cfg    Config
	ledger *Ledger
	logger klog.Logger

	// mu serialises decisions with the ledger updates they lead to.
	mu        sync.Mutex
	connected atomic.Bool
	// wg tracks background work (accountUnknown) that Run waits for; bg
	// is its context, which ends with Run's.
	wg sync.WaitGroup
	bg context.Context
}

var (
	_ stub.SynchronizeInterface     = (*Plugin)(nil)
	_ stub.CreateContainerInterface = (*Plugin)(nil)
	_ stub.UpdateContainerInterface = (*Plugin)(nil)
	_ stub.StopContainerInterface   = (*Plugin)(nil)
	_ stub.RemoveContainerInterface = (*Plugin)(nil)
	_ stub.RemovePodInterface       = (*Plugin)(nil)
	_ stub.ShutdownInterface        = (*Plugin)(nil)
)

// New validates cfg and opens the ledger from its checkpoint.
func New(cfg Config) (*Plugin, error) {
	if len(cfg.GPUs) == 0 {
		return nil, errors.New("nri plugin: no GPUs")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("nri plugin: no state directory")
	}
	if cfg.Allocations == nil || cfg.MPS == nil {
		return nil, errors.New("nri plugin: kubelet allocations and MPS controller are required")
	}
	if cfg.Decide.MPSPipeDir == nil {
		return nil, errors.New("nri plugin: no MPS pipe directory")
	}
	if cfg.Decide.MemoryUnitMiB == 0 {
		return nil, errors.New("nri plugin: memory unit must be greater than 0 MiB")
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = DefaultSocketPath
	}
	if cfg.PluginName == "" {
		cfg.PluginName = DefaultPluginName
	}
	if cfg.PluginIdx == "" {
		cfg.PluginIdx = DefaultPluginIdx
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.MaxRetryInterval < cfg.RetryInterval {
		cfg.MaxRetryInterval = max(30*time.Second, cfg.RetryInterval)
	}
	l, err := OpenLedger(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("nri plugin: %w", err)
	}
	return &Plugin{cfg: cfg, ledger: l, logger: klog.Background().WithName("nri"), bg: context.Background()}, nil
}

// Connected reports whether the plugin is connected to the runtime and
// receives its events. (It satisfies the device plugin's NRI interface.)
func (p *Plugin) Connected() bool { return p.connected.Load() }

// Ledger returns the plugin's ledger (read it with Snapshot).
func (p *Plugin) Ledger() *Ledger { return p.ledger }

func (p *Plugin) setConnected(c bool) {
	if p.connected.Swap(c) == c {
		return
	}
	p.logger.Info("NRI connection changed", "connected", c, "socket", p.cfg.SocketPath)
	p.cfg.Metrics.setConnected(c)
	if p.cfg.Observer != nil {
		p.cfg.Observer.SetNRIConnected(c)
	}
}

// Run connects to the runtime and serves its events until ctx ends,
// reconnecting whenever the connection is lost (the runtime restarted) or
// cannot be made yet. It returns nil when ctx ends.
func (p *Plugin) Run(ctx context.Context) error {
	p.logger = klog.FromContext(ctx).WithName("nri")
	ctx = klog.NewContext(ctx, p.logger)
	p.bg = ctx
	// Bring the MPS daemons in line with the ledger rebuilt from the
	// checkpoint before the runtime reconnects.
	if err := p.syncMPS(ctx); err != nil {
		p.logger.Error(err, "Starting the MPS daemons of the checkpointed shared containers")
	}
	wait := p.cfg.RetryInterval
	for {
		closed := make(chan struct{})
		var once sync.Once
		st, err := stub.New(p,
			stub.WithPluginName(p.cfg.PluginName),
			stub.WithPluginIdx(p.cfg.PluginIdx),
			stub.WithSocketPath(p.cfg.SocketPath),
			// A plugin that does not answer fails the container's
			// creation rather than letting it run unisolated.
			stub.WithFailurePolicy(&nriapi.FailurePolicy{FailRequest: true}),
			stub.WithOnClose(func() { once.Do(func() { close(closed) }) }),
			stub.WithLogger(stubLogger{p.logger.WithName("stub")}),
		)
		if err != nil {
			return fmt.Errorf("nri plugin: %w", err)
		}
		if err := st.Start(ctx); err != nil {
			p.logger.V(2).Info("Cannot connect to the runtime's NRI socket yet; retrying", "socket", p.cfg.SocketPath, "err", err, "retryIn", wait)
		} else {
			wait = p.cfg.RetryInterval
			select {
			case <-closed:
				p.logger.Info("The runtime closed the NRI connection; reconnecting", "socket", p.cfg.SocketPath)
			case <-ctx.Done():
				st.Stop()
			}
		}
		p.setConnected(false)
		select {
		case <-ctx.Done():
			p.wg.Wait()
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, p.cfg.MaxRetryInterval)
	}
}

// stubLogger routes the NRI stub's logs to klog: its routine messages at
// verbosity 2.
type stubLogger struct{ l klog.Logger }

func (s stubLogger) Debugf(_ context.Context, format string, args ...interface{}) {
	s.l.V(4).Info(fmt.Sprintf(format, args...))
}

func (s stubLogger) Infof(_ context.Context, format string, args ...interface{}) {
	s.l.V(2).Info(fmt.Sprintf(format, args...))
}

func (s stubLogger) Warnf(_ context.Context, format string, args ...interface{}) {
	s.l.Info("WARNING: " + fmt.Sprintf(format, args...))
}

func (s stubLogger) Errorf(_ context.Context, format string, args ...interface{}) {
	s.l.Error(nil, fmt.Sprintf(format, args...))
}

// Synchronize implements stub.SynchronizeInterface: it frees the ledger
// entries of pods and containers that no longer exist or have stopped,
// accounts running containers it has not seen, and from then on the plugin
// receives events.
func (p *Plugin) Synchronize(ctx context.Context, pods []*nriapi.PodSandbox, containers []*nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	podUIDs := map[string]bool{}
	for _, pod := range pods {
		podUIDs[pod.GetUid()] = true
	}
	byID := map[string]bool{} // containers that may use a GPU
	for _, c := range containers {
		if c.GetState() != nriapi.ContainerState_CONTAINER_STOPPED {
			byID[c.GetId()] = true
		}
	}
	p.mu.Lock()
	err := p.ledger.Retain(func(e Entry) bool {
		keep := podUIDs[e.PodUID] && byID[e.ContainerID]
		if !keep {
			p.logger.Info("Freeing the GPU use of a container that is gone", "pod", klog.KRef(e.Namespace, e.Pod), "container", e.Container)
		}
		return keep
	})
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := p.syncMPS(ctx); err != nil {
		p.logger.Error(err, "Syncing the MPS daemons")
	}
	// Containers the runtime created while the plugin was away are
	// accounted in the background: the runtime waits for this reply.
	bySandbox := map[string]*nriapi.PodSandbox{}
	for _, pod := range pods {
		bySandbox[pod.GetId()] = pod
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.accountUnknown(p.bg, bySandbox, containers)
	}()
	p.setConnected(true)
	return nil, nil
}

// accountUnknown records in the ledger the GPU use of running containers it
// has no entry for: containers the runtime created while the plugin was not
// connected (they run without the plugin's adjustment, which is logged), so
// that later decisions do not hand their GPUs out again.
func (p *Plugin) accountUnknown(ctx context.Context, sandboxes map[string]*nriapi.PodSandbox, containers []*nriapi.Container) {
	changed := false
	for _, c := range containers {
		if ctx.Err() != nil {
			return
		}
		if c.GetState() == nriapi.ContainerState_CONTAINER_STOPPED {
			continue
		}
		sb := sandboxes[c.GetPodSandboxId()]
		if sb == nil {
			continue
		}
		known := false
		for _, e := range p.ledger.Snapshot() {
			known = known || e.ContainerID == c.GetId()
		}
		if known {
			continue
		}
		pod := p.podOf(sb)
		logger := p.logger.WithValues("pod", klog.KRef(pod.Namespace, pod.Name), "container", c.GetName())
		devs, err := p.cfg.Allocations.ContainerDevices(ctx, pod, c.GetName())
		if err != nil {
			logger.Error(err, "Reading the kubelet's allocations of a running container the plugin has not seen")
			continue
		}
		if devs.Empty() {
			continue
		}
		req := Request{Pod: pod, Container: containerOf(c), Devices: devs}
		p.mu.Lock()
		d, err := Decide(p.cfg.Decide, p.node(), req)
		switch {
		case err != nil:
			logger.Error(err, "A running container the plugin has not seen conflicts with the ledger; it runs without isolation")
		case d.PlacedLocally:
			// No assignment: the device plugin gave it no GPU.
		default:
			if err := p.ledger.Put(d.Entry); err != nil {
				logger.Error(err, "Recording a running container the plugin has not seen")
			} else {
				changed = true
				logger.Info("WARNING: the container was created while the NRI plugin was not connected: it runs without Tessera's device rules and limits until it restarts; its GPU use is now accounted", "gpus", d.Entry.GPUs, "shared", d.Entry.Shared, "mig", d.Entry.MIG)
			}
		}
		p.mu.Unlock()
	}
	if changed {
		if err := p.syncMPS(ctx); err != nil {
			p.logger.Error(err, "Syncing the MPS daemons")
		}
	}
}

// Shutdown implements stub.ShutdownInterface.
func (p *Plugin) Shutdown(context.Context) { p.setConnected(false) }

// CreateContainer implements stub.CreateContainerInterface.
func (p *Plugin) CreateContainer(ctx context.Context, sandbox *nriapi.PodSandbox, ctr *nriapi.Container) (*nriapi.ContainerAdjustment, []*nriapi.ContainerUpdate, error) {
	pod := p.podOf(sandbox)
	logger := p.logger.WithValues("pod", klog.KRef(pod.Namespace, pod.Name), "container", ctr.GetName())
	req := Request{Pod: pod, Container: containerOf(ctr)}
	devs, err := p.cfg.Allocations.ContainerDevices(ctx, pod, ctr.GetName())
	if err != nil {
		if why := gpuSigns(p.cfg.Decide, req); why != "" {
			err = &DecisionError{Pod: pod.String(), Container: ctr.GetName(), Reason: fmt.Sprintf("cannot read what the kubelet allocated to it (%v) and %s", err, why)}
			logger.Error(err, "Container creation refused")
			p.cfg.Metrics.observeDecision(ResultRefused)
			return nil, nil, err
		}
		logger.V(2).Info("Cannot read the kubelet's allocations; the container shows no sign of Tessera GPUs and is taken to hold none", "err", err)
		devs = Devices{}
	}
	req.Devices = devs
	if devs.Empty() {
		return p.createNonGPU(logger, req)
	}
	if p.cfg.CPUs != nil {
		excl, err := p.cfg.CPUs.HasExclusiveCPUs(pod.UID, ctr.GetName())
		if err != nil {
			// Do not touch the cpuset of a container that may own its CPUs.
			logger.Error(err, "Reading the kubelet's CPU assignments; the container's cpuset is left alone")
			excl = true
		}
		req.Container.ExclusiveCPUs = excl
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	node := p.node()
	d, err := Decide(p.cfg.Decide, node, req)
	if err != nil {
		logger.Error(err, "Container creation refused")
		p.cfg.Metrics.observeDecision(ResultRefused)
		return nil, nil, err
	}
	if d.PlacedLocally {
		if p.cfg.Recorder == nil {
			err := &DecisionError{Pod: pod.String(), Container: ctr.GetName(), GPU: d.Entry.Shared.GPU.UUID, Reason: "the pod bypassed the scheduler extender and this node cannot record a local placement"}
			logger.Error(err, "Container creation refused")
			p.cfg.Metrics.observeDecision(ResultRefused)
			return nil, nil, err
		}
		if err := p.cfg.Recorder.RecordShared(ctx, pod, ctr.GetName(), *d.Entry.Shared); err != nil {
			err = &DecisionError{Pod: pod.String(), Container: ctr.GetName(), GPU: d.Entry.Shared.GPU.UUID, Reason: fmt.Sprintf("placed locally (the pod bypassed the scheduler extender) but the assignment cannot be recorded on the pod: %v", err)}
			logger.Error(err, "Container creation refused")
			p.cfg.Metrics.observeDecision(ResultRefused)
			return nil, nil, err
		}
		logger.Info("Placed the shared slice of a pod that bypassed the scheduler extender", "gpus", d.Entry.Shared.UUIDs(), "memoryMiB", d.Entry.Shared.MemoryMiB, "cores", d.Entry.Shared.Cores)
	}
	if d.Entry.Shared != nil {
		if err := p.cfg.MPS.Sync(ctx, mpsGroups(append(node.Ledger, d.Entry))); err != nil {
			err = &DecisionError{Pod: pod.String(), Container: ctr.GetName(), GPU: d.Entry.Shared.GPU.UUID, Reason: fmt.Sprintf("its MPS control daemon is not running, so the container's limits could not be enforced: %v", err)}
			logger.Error(err, "Container creation refused")
			p.cfg.Metrics.observeDecision(ResultRefused)
			return nil, nil, err
		}
	}
	if err := p.ledger.Put(d.Entry); err != nil {
		err = &DecisionError{Pod: pod.String(), Container: ctr.GetName(), Reason: fmt.Sprintf("recording its GPU use: %v", err)}
		logger.Error(err, "Container creation refused")
		p.cfg.Metrics.observeDecision(ResultRefused)
		return nil, nil, err
	}
	p.cfg.Metrics.observeDecision(ResultIsolated)
	p.cfg.Metrics.setLedger(len(p.ledger.Snapshot()))
	logger.Info("Isolating container", "gpus", d.Entry.GPUs, "shared", d.Entry.Shared, "mig", d.Entry.MIG)
	return toNRI(d.Adjustment), nil, nil
}

// createNonGPU applies Decide's decision on a container the kubelet
// allocated no Tessera resource to: every GPU hidden (ActionVoid), or left
// alone (ActionLeave). It takes no lock: such a decision reads no ledger.
func (p *Plugin) createNonGPU(logger klog.Logger, req Request) (*nriapi.ContainerAdjustment, []*nriapi.ContainerUpdate, error) {
	d, err := Decide(p.cfg.Decide, &Node{GPUs: p.cfg.GPUs, NUMANodes: p.cfg.NUMANodes}, req)
	if err != nil {
		logger.Error(err, "Container creation refused")
		p.cfg.Metrics.observeDecision(ResultRefused)
		return nil, nil, err
	}
	why := gpuSigns(p.cfg.Decide, req)
	switch d.Action {
	case ActionVoid:
		if why != "" || len(d.Voided) > 0 {
			logger.Info("The kubelet allocated no Tessera resource to the container: it gets no GPU", "signs", why, "overridden", d.Voided)
		} else {
			logger.V(4).Info("The kubelet allocated no Tessera resource to the container: it gets no GPU")
		}
		return toNRI(d.Adjustment), nil, nil
	case ActionLeave:
		if why != "" {
			logger.Info("The kubelet allocated no Tessera resource to the container, yet " + why + "; leaving it alone as configured (nri.nonGPUContainers, nri.nonGPUExemptNamespaces)")
		}
		return nil, nil, nil
	}
	err = &DecisionError{Pod: req.Pod.String(), Container: req.Container.Name, Reason: fmt.Sprintf("decision %s on a container without Tessera resources", d.Action)}
	logger.Error(err, "Container creation refused")
	p.cfg.Metrics.observeDecision(ResultRefused)
	return nil, nil, err
}

// UpdateContainer implements stub.UpdateContainerInterface: a cpuset the
// kubelet's CPU manager reconciles for an aligned container is narrowed to
// its GPUs' NUMA node(s) again.
func (p *Plugin) UpdateContainer(_ context.Context, sandbox *nriapi.PodSandbox, ctr *nriapi.Container, res *nriapi.LinuxResources) ([]*nriapi.ContainerUpdate, error) {
	pod := p.podOf(sandbox)
	cpus := res.GetCpu().GetCpus()
	if cpus == "" || api.NUMAAlignmentDisabled(pod.Annotations) {
		return nil, nil
	}
	p.mu.Lock()
	node := p.node()
	p.mu.Unlock()
	var entry *Entry
	for i, e := range node.Ledger {
		if e.Key() == (Key{PodUID: pod.UID, Container: ctr.GetName()}) && e.ContainerID == ctr.GetId() {
			entry = &node.Ledger[i]
		}
	}
	if entry == nil {
		return nil, nil
	}
	if p.cfg.CPUs != nil {
		if excl, err := p.cfg.CPUs.HasExclusiveCPUs(pod.UID, ctr.GetName()); err != nil || excl {
			return nil, nil
		}
	}
	aligned, mems := Realign(node, *entry, cpus)
	if aligned == "" {
		return nil, nil
	}
	u := &nriapi.ContainerUpdate{ContainerId: ctr.GetId()}
	u.SetLinuxCPUSetCPUs(aligned)
	u.SetLinuxCPUSetMems(mems)
	p.logger.V(2).Info("Keeping a container on its GPUs' NUMA node(s)", "pod", klog.KRef(pod.Namespace, pod.Name), "container", ctr.GetName(), "requested", cpus, "cpus", aligned)
	return []*nriapi.ContainerUpdate{u}, nil
}

// StopContainer implements stub.StopContainerInterface: a stopped container
// (an init container that completed, one that exited) uses no GPU; its
// entry is freed. If it restarts, CreateContainer records it again.
func (p *Plugin) StopContainer(ctx context.Context, sandbox *nriapi.PodSandbox, ctr *nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	return nil, p.RemoveContainer(ctx, sandbox, ctr)
}

// RemoveContainer implements stub.RemoveContainerInterface.
func (p *Plugin) RemoveContainer(ctx context.Context, sandbox *nriapi.PodSandbox, ctr *nriapi.Container) error {
	p.mu.Lock()
	err := p.ledger.RemoveContainer(sandbox.GetUid(), ctr.GetName(), ctr.GetId())
	p.mu.Unlock()
	if err != nil {
		p.logger.Error(err, "Freeing a removed container's GPU use", "pod", klog.KRef(sandbox.GetNamespace(), sandbox.GetName()), "container", ctr.GetName())
		return nil
	}
	if err := p.syncMPS(ctx); err != nil {
		p.logger.Error(err, "Syncing the MPS daemons")
	}
	return nil
}

// RemovePodSandbox implements stub.RemovePodInterface.
func (p *Plugin) RemovePodSandbox(ctx context.Context, sandbox *nriapi.PodSandbox) error {
	p.mu.Lock()
	err := p.ledger.RemovePod(sandbox.GetUid())
	p.mu.Unlock()
	if err != nil {
		p.logger.Error(err, "Freeing a removed pod's GPU use", "pod", klog.KRef(sandbox.GetNamespace(), sandbox.GetName()))
		return nil
	}
	if err := p.syncMPS(ctx); err != nil {
		p.logger.Error(err, "Syncing the MPS daemons")
	}
	return nil
}

func (p *Plugin) syncMPS(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	entries := p.ledger.Snapshot()
	p.cfg.Metrics.setLedger(len(entries))
	return p.cfg.MPS.Sync(ctx, mpsGroups(entries))
}

// node is the node state now. Call with p.mu held.
func (p *Plugin) node() *Node {
	n := &Node{GPUs: p.cfg.GPUs, NUMANodes: p.cfg.NUMANodes, Ledger: p.ledger.Snapshot()}
	if p.cfg.Health != nil {
		n.Unhealthy = p.cfg.Health.Unhealthy()
	}
	return n
}

// sharedGPUs lists the GPUs with shared tenants in entries, by index.
func sharedGPUs(entries []Entry) []api.GPURef {
	seen := map[string]bool{}
	var out []api.GPURef
	for _, e := range entries {
		if e.Shared == nil {
			continue
		}
		for _, g := range e.Shared.GPUs() {
			if !seen[g.UUID] {
				seen[g.UUID] = true
				out = append(out, g)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// mpsGroups lists the MPS groups of the shared slices in entries (each
// slice's GPUs, gpureq.GroupKey), in key order, each by index: the
// daemons the node needs. The ledger is derived from the sealed
// assignments and the kubelet, so are they.
func mpsGroups(entries []Entry) [][]api.GPURef {
	byKey := map[string][]api.GPURef{}
	for _, e := range entries {
		if e.Shared != nil {
			byKey[gpureq.GroupKey(e.Shared.UUIDs())] = e.Shared.GPUs()
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]api.GPURef, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// gpuSigns says why a container looks like it uses Tessera GPUs, or "".
func gpuSigns(opts Options, req Request) string {
	if a, found, err := api.GetAssignment(req.Pod.Annotations); err != nil {
		return "its pod's assignment annotation is malformed"
	} else if found && a.Container(req.Container.Name) != nil {
		return "its pod's assignment annotation lists it"
	}
	if visibleDevicesIsList(req.Container.Env[api.EnvNVIDIAVisibleDevices]) {
		return api.EnvNVIDIAVisibleDevices + " lists GPUs"
	}
	for _, n := range req.Container.CDIDevices {
		if opts.CDIKind != "" && strings.HasPrefix(n, opts.CDIKind+"=") {
			return "it requests the CDI device " + n
		}
	}
	return ""
}

// podOf is the pod of a sandbox, with only the decision annotations
// Tessera sealed for it.
func (p *Plugin) podOf(s *nriapi.PodSandbox) Pod {
	ann := maps.Clone(s.GetAnnotations())
	if ignored := p.cfg.Trust.Annotations(types.UID(s.GetUid()), ann); len(ignored) > 0 {
		p.logger.Info("Ignoring annotations Tessera did not write", "pod", klog.KRef(s.GetNamespace(), s.GetName()), "ignored", fmt.Sprint(ignored))
	}
	return Pod{Namespace: s.GetNamespace(), Name: s.GetName(), UID: s.GetUid(), Annotations: ann}
}

func containerOf(c *nriapi.Container) Container {
	out := Container{ID: c.GetId(), Name: c.GetName(), Env: map[string]string{}}
	for _, kv := range c.GetEnv() {
		k, v, _ := strings.Cut(kv, "=")
		out.Env[k] = v
	}
	for _, d := range c.GetCDIDevices() {
		out.CDIDevices = append(out.CDIDevices, d.GetName())
	}
	for _, d := range c.GetLinux().GetDevices() {
		out.DeviceNodes = append(out.DeviceNodes, DeviceNode{Path: d.GetPath(), Type: d.GetType(), Major: d.GetMajor(), Minor: d.GetMinor()})
	}
	for _, m := range c.GetMounts() {
		out.MountDestinations = append(out.MountDestinations, m.GetDestination())
	}
	out.Annotations = c.GetAnnotations()
	out.CPUs = c.GetLinux().GetResources().GetCpu().GetCpus()
	return out
}

// toNRI translates an Adjustment.
func toNRI(a Adjustment) *nriapi.ContainerAdjustment {
	adj := &nriapi.ContainerAdjustment{}
	for _, n := range a.CDIDevices {
		adj.AddCDIDevice(&nriapi.CDIDevice{Name: n})
	}
	for _, path := range a.RemoveDeviceNodes {
		adj.RemoveDevice(path)
	}
	for _, d := range a.AddDeviceNodes {
		adj.AddDevice(&nriapi.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, FileMode: nriapi.FileMode(0o666)})
	}
	if len(a.CgroupRules) > 0 {
		if adj.Linux == nil {
			adj.Linux = &nriapi.LinuxContainerAdjustment{}
		}
		if adj.Linux.Resources == nil {
			adj.Linux.Resources = &nriapi.LinuxResources{}
		}
		for _, r := range a.CgroupRules {
			rule := &nriapi.LinuxDeviceCgroup{Allow: r.Allow, Type: r.Type, Access: r.Access}
			if r.Major != nil {
				rule.Major = nriapi.Int64(*r.Major)
			}
			if r.Minor != nil {
				rule.Minor = nriapi.Int64(*r.Minor)
			}
			adj.Linux.Resources.Devices = append(adj.Linux.Resources.Devices, rule)
		}
	}
	for _, e := range a.Env {
		adj.AddEnv(e.Name, e.Value)
	}
	for _, dst := range a.RemoveMounts {
		adj.RemoveMount(dst)
	}
	for _, m := range a.Mounts {
		adj.AddMount(&nriapi.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: m.Options})
	}
	for _, key := range a.RemoveAnnotations {
		adj.RemoveAnnotation(key)
	}
	for _, an := range a.SetAnnotations {
		adj.AddAnnotation(an.Key, an.Value)
	}
	if a.CPUSetCPUs != "" {
		adj.SetLinuxCPUSetCPUs(a.CPUSetCPUs)
	}
	if a.CPUSetMems != "" {
		adj.SetLinuxCPUSetMems(a.CPUSetMems)
	}
	return adj
}
