// Package deviceplugin is the node agent's side of the kubelet device plugin
// API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): one gRPC server and
// socket per Tessera resource in the device-plugin directory, registration
// with the kubelet (again whenever kubelet.sock is recreated, seen through
// fsnotify), and the Agent that ties them to the device model (package
// devices), the preferred-allocation policy (package preferred), GPU health
// (package health), the kubelet's record of allocations (package
// kubeletstate) and, when there is an API server, the annotations of package
// kube.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/health"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/deviceplugin/preferred"
	"github.com/tessera-gpu/tessera/topology"
)

// KubeletSocketName is the kubelet's registration socket in the
// device-plugin directory.
const KubeletSocketName = "kubelet.sock"

// DefaultPluginDir is where the kubelet looks for device plugins.
const DefaultPluginDir = pluginapi.DevicePluginPath

// SocketName is the socket of resource r's plugin in the device-plugin
// directory, e.g. tessera-gpu-memory.sock.
func SocketName(r corev1.ResourceName) string {
	return "tessera-" + filepath.Base(string(r)) + ".sock"
}

// NRI reports whether the NRI plugin that isolates shared containers is
// connected. Until it is, shared units are refused.
type NRI interface {
	Connected() bool
}

// RuntimeUse tells which GPUs the containers that exist in the container
// runtime use; *nri.Ledger implements it. Those GPUs are in use whatever
// the API server and the kubelet say: a pod deleted with no grace period
// is gone from both at once, while its containers run on until the kubelet
// has killed them, and a GPU offered to the other kind meanwhile would be
// refused to the next pod at container creation.
type RuntimeUse interface {
	GPUsInUse() (whole, shared map[string]bool)
}

// Publisher is what the agent writes to (and reads from) the API server;
// *kube.Client implements it.
type Publisher interface {
	PublishInventory(ctx context.Context, inv *api.GPUInventory) error
	SetSharedIsolation(ctx context.Context, connected bool, message string) error
	SyncPods(ctx context.Context, allocs []kubeletstate.ContainerDevices, gpuIndex map[string]int, migs map[string]kube.MIGDevice) (map[kubeletstate.ContainerKey]string, error)
}

// PodWatch follows the pods bound to the node; *kube.PodWatch implements
// it. Run calls changed with the GPUs the shared parts of their assignments
// name, and with released set when a pod ended or went away since the last
// call (the kubelet frees its devices), until ctx ends. Assigned reads the
// same GPUs from the API server itself, with those of pods the kubelet has
// not started: it sees every pod bound before the call, where the watch
// may lag by a few milliseconds.
type PodWatch interface {
	Run(ctx context.Context, changed func(assigned map[string]bool, released bool))
	Assigned(ctx context.Context) (devices.Assignments, error)
}

// syncedPoll is how often the agent reads the kubelet while it waits for
// a (re)started kubelet to list the node's pods.
const syncedPoll = 200 * time.Millisecond

// syncedMaxWait bounds that wait (pollSynced).
const syncedMaxWait = 2 * time.Minute

// assignedReadTimeout bounds the API read of assigned GPUs that a whole-GPU
// allocation makes; past it, the watch's view decides.
const assignedReadTimeout = 2 * time.Second

// After a pod ends, the agent reads the kubelet's allocations at once and
// again after these delays: the kubelet drops a pod's devices from its
// PodResources answer only once it has stopped the pod, shortly after the
// API server shows it gone.
const (
	releaseRereadSoon  = 250 * time.Millisecond
	releaseRereadLater = time.Second
)

// Options configure an Agent. Config, PluginDir, Topology and GPU are
// required.
type Options struct {
	// Config is the node agent configuration, defaulted and validated.
	Config *api.NodeAgentConfig
	// NodeName names the node in logs and messages.
	NodeName string
	// PluginDir is the kubelet's device-plugin directory.
	PluginDir string
	// KubeletSocket is the kubelet's registration socket;
	// PluginDir/kubelet.sock when empty.
	KubeletSocket string
	// Dial connects to the kubelet's socket; a unix dialer when nil.
	Dial Dialer
	// Topology is the node's GPU topology.
	Topology *topology.Topology
	// GPU checks GPU health and watches XIDs.
	GPU health.Checker
	// Kubelet reads the kubelet's allocations; by default the PodResources
	// API at kubeletstate.DefaultPodResourcesSocket, else the checkpoint
	// in PluginDir.
	Kubelet kubeletstate.Source
	// Publisher writes to the API server; nil runs without one.
	Publisher Publisher
	// Pods follows the node's pods; nil runs without: then a GPU assigned
	// to a slice counts as shared only once the kubelet has admitted the
	// slice's pod, and a GPU the kubelet freed is seen at the next read
	// of the kubelet.
	Pods PodWatch
	// NRI reports the NRI plugin's connection; nil means not connected.
	NRI NRI
	// Runtime tells the GPUs the runtime's containers use (the NRI
	// plugin's ledger); nil: only the kubelet's and the API server's
	// view count. Call RuntimeChanged when it changes.
	Runtime RuntimeUse
	// Metrics records metrics; nil records none.
	Metrics *Metrics
	// Events records the Events of GPU health (healthevents.go): when a
	// GPU turns unhealthy, a Warning on the Node and on every pod that
	// holds it; when it is healthy again, a Normal on the Node. Nil
	// records none.
	Events EventRecorder
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// NRISentinel is a host file the device plugin mounts at
	// api.NRISentinelPath in every container it allocates devices to, so
	// that only a container the NRI plugin saw (and took the mount out of)
	// can be created; empty when the node runs no NRI plugin.
	NRISentinel string
	// NRIWait is how long Allocate of shared units waits for an NRI plugin
	// that is not connected (the container runtime restarting) before it
	// refuses them: DefaultNRIWait when 0, no wait when negative.
	NRIWait time.Duration
	// StopDrain is how long Run, told to stop, goes on serving the kubelet
	// after it published an inventory that withholds every GPU, so that a
	// pod bound just before the extender saw it is still admitted:
	// DefaultStopDrain when 0, none when negative.
	StopDrain time.Duration
}

// Defaults of Options.
const (
	DefaultNRIWait   = 10 * time.Second
	DefaultStopDrain = 2 * time.Second
)

// Agent is the node agent's device plugin side.
type Agent struct {
	opts     Options
	cfg      *api.NodeAgentConfig
	model    *devices.Model
	kinds    []Kind
	health   *health.Watcher
	watched  []health.GPU // the GPUs whose health is watched, by index
	gpuIndex map[string]int
	migs     map[string]kube.MIGDevice // MIG UUID -> instance, for SyncPods

	// set in Run
	logger  klog.Logger
	state   *state
	plugins []*plugin

	registerNow chan struct{}
	syncNow     chan struct{}
	publishNow  chan struct{}

	// healthSeen is the GPUs' health the last Events were raised for
	// (reportHealth); every GPU starts healthy, as the watcher's do. Only
	// Run, then the health watch's callback (one goroutine), use it.
	healthSeen devices.HealthMap

	// absentMIG are the configured MIG resources no instance of the node
	// has: not served, logged at Run.
	absentMIG []corev1.ResourceName

	mu         sync.Mutex
	placements map[kubeletstate.ContainerKey]string
	// lastKubelet is the kubelet's last answer, with what keepLive kept.
	lastKubelet []kubeletstate.ContainerDevices
	registered  map[corev1.ResourceName]bool
}

// New validates opts and builds the agent.
func New(opts Options) (*Agent, error) {
	if opts.Config == nil {
		return nil, errors.New("no node agent configuration")
	}
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("node agent configuration: %w", err)
	}
	if opts.PluginDir == "" {
		return nil, errors.New("no device-plugin directory")
	}
	if opts.Topology == nil || opts.GPU == nil {
		return nil, errors.New("no GPU topology or GPU backend")
	}
	if opts.KubeletSocket == "" {
		opts.KubeletSocket = filepath.Join(opts.PluginDir, KubeletSocketName)
	}
	if opts.Dial == nil {
		opts.Dial = unixDialer
	}
	if opts.Kubelet == nil {
		opts.Kubelet = kubeletstate.First{
			&kubeletstate.PodResources{Socket: kubeletstate.DefaultPodResourcesSocket},
			&kubeletstate.Checkpoint{Path: filepath.Join(opts.PluginDir, kubeletstate.CheckpointFile)},
		}
	}
	if opts.NRIWait == 0 {
		opts.NRIWait = DefaultNRIWait
	}
	if opts.StopDrain == 0 {
		opts.StopDrain = DefaultStopDrain
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	cfg := opts.Config
	var gpus []devices.GPU
	var watched []health.GPU
	gpuIndex := map[string]int{}
	migs := map[string]kube.MIGDevice{}
	for _, g := range opts.Topology.GPUs {
		gpus = append(gpus, ModelGPU(g))
		watched = append(watched, health.GPU{Index: g.Index, UUID: g.UUID})
		gpuIndex[g.UUID] = g.Index
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				migs[in.UUID] = kube.MIGDevice{MIGRef: api.MIGRef{UUID: in.UUID, Profile: in.Profile, GPU: api.GPURef{UUID: g.UUID, Index: g.Index}}, Start: in.Start}
			}
		}
	}
	resources, absent := ServedResources(cfg, gpus)
	model, err := devices.New(gpus, devices.Options{Resources: resources, MemoryUnitMiB: cfg.MemoryUnitMiB, MemoryReserveMiB: cfg.MemoryReserveMiB})
	if err != nil {
		return nil, fmt.Errorf("device model: %w", err)
	}
	policy, err := preferred.NewGPUPolicy(opts.Topology)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation policy: %w", err)
	}
	kinds, err := newKinds(kindEnv{cfg: cfg, resources: resources, model: model, policy: policy})
	if err != nil {
		return nil, err
	}
	a := &Agent{
		opts:        opts,
		cfg:         cfg,
		model:       model,
		kinds:       kinds,
		watched:     watched,
		gpuIndex:    gpuIndex,
		migs:        migs,
		registerNow: make(chan struct{}, 1),
		syncNow:     make(chan struct{}, 1),
		publishNow:  make(chan struct{}, 1),
		placements:  map[kubeletstate.ContainerKey]string{},
		registered:  map[corev1.ResourceName]bool{},
		absentMIG:   absent,
	}
	a.health = health.New(opts.GPU, watched, health.Options{
		IgnoredXIDs:   cfg.IgnoredXIDs,
		CheckInterval: cfg.HealthCheckInterval.Duration,
		RecoveryDelay: cfg.XIDRecoveryDelay.Duration,
		Now:           opts.Now,
		OnXID:         opts.Metrics.observeXID,
	})
	return a, nil
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run serves the device plugins until ctx ends. Before it serves, it reads
// the GPUs' health and what the kubelet has allocated, so that its first
// device lists already withhold what is in use.
func (a *Agent) Run(ctx context.Context) error {
	a.logger = klog.FromContext(ctx).WithName("deviceplugin")
	ctx = klog.NewContext(ctx, a.logger)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	for _, l := range a.opts.Topology.LostGPUs {
		a.logger.Info("GPU lost at start; it is not advertised", "gpu", l.Index, "error", l.Error)
	}
	a.logMIG()
	if err := os.MkdirAll(a.opts.PluginDir, 0o750); err != nil {
		return fmt.Errorf("creating the device-plugin directory: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the device-plugin directory: %w", err)
	}
	defer watcher.Close()
	if err := watcher.Add(a.opts.PluginDir); err != nil {
		return fmt.Errorf("watching the device-plugin directory %s: %w", a.opts.PluginDir, err)
	}

	a.state = newState(a.logger, a.model, a.kinds, a.cfg.AllocationGrace.Duration, a.opts.Now, a.opts.Metrics)
	// A changed or sent device list may change the inventory's withheld
	// lists: publish them without waiting for the ticker.
	a.state.onChange = func() { poke(a.publishNow) }
	a.health.CheckAll(ctx)
	initialHealth := a.health.Health()
	a.state.setHealth(initialHealth)
	if err := a.syncKubelet(ctx); err != nil {
		a.logger.Error(err, "Cannot read the kubelet's allocations yet; retrying", "interval", a.cfg.KubeletSyncInterval.Duration)
	}
	// A GPU found unhealthy at start raises its Events too, with the pods
	// the kubelet says hold it.
	a.reportHealth(initialHealth)
	shares := false
	for _, k := range a.kinds {
		a.plugins = append(a.plugins, newPlugin(a.logger, k, filepath.Join(a.opts.PluginDir, SocketName(k.Resource())), a))
		if _, ok := k.(SharedKind); ok {
			shares = true
		}
	}
	if !a.nriConnected() && shares {
		a.logger.Info("WARNING: the NRI plugin is not connected; shared GPU units are refused until it is (isolated sharing requires NRI)", "node", a.opts.NodeName)
	}

	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	run(func() { a.watch(ctx, watcher) })
	run(func() { a.registrar(ctx) })
	run(func() { a.syncLoop(ctx) })
	run(func() { a.state.runExpiry(ctx, min(a.cfg.AllocationGrace.Duration/4+time.Millisecond, time.Second)) })
	run(func() {
		err := a.health.Run(ctx, func(h devices.HealthMap) {
			a.state.setHealth(h)
			poke(a.publishNow)
			a.reportHealth(h)
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			a.logger.Error(err, "Health watch ended")
		}
	})
	if a.opts.Publisher != nil {
		run(func() { a.publishLoop(ctx) })
	}
	if a.opts.Pods != nil {
		run(func() { a.opts.Pods.Run(ctx, a.podsChanged) })
	}
	if _, err := os.Stat(a.opts.KubeletSocket); err == nil {
		poke(a.registerNow)
	} else {
		a.logger.Info("Waiting for the kubelet to create its registration socket", "socket", a.opts.KubeletSocket)
	}

	<-ctx.Done()
	wg.Wait()
	a.drain()
	for _, p := range a.plugins {
		p.stop()
	}
	return nil
}

// drain, when the agent stops, publishes an inventory that withholds
// every GPU from both kinds, so that the extender binds no pod here until
// the next agent has offered the kubelet its devices again (a pod bound
// meanwhile would be refused by the kubelet: the plugins' devices turn
// unhealthy when they stop). Then it goes on serving for StopDrain, for
// the pods bound before the extender saw the inventory.
func (a *Agent) drain() {
	a.state.stop()
	if a.opts.Publisher != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.opts.Publisher.PublishInventory(ctx, a.Inventory()); err != nil {
			a.logger.Error(err, "Publishing the stopping agent's inventory (every GPU withheld)")
		} else {
			a.logger.Info("Published every GPU withheld: the agent is stopping", "drain", a.opts.StopDrain)
		}
	}
	if a.opts.StopDrain > 0 {
		time.Sleep(a.opts.StopDrain)
	}
}

// watch turns events in the device-plugin directory into work: a new
// kubelet.sock means the kubelet (re)started and the plugins must register
// again; a changed checkpoint means allocations changed.
func (a *Agent) watch(ctx context.Context, w *fsnotify.Watcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			switch {
			case ev.Name == a.opts.KubeletSocket && ev.Has(fsnotify.Create):
				a.logger.Info("The kubelet created its registration socket; registering again", "socket", ev.Name)
				poke(a.registerNow)
			case filepath.Base(ev.Name) == kubeletstate.CheckpointFile && ev.Has(fsnotify.Create|fsnotify.Write|fsnotify.Rename):
				poke(a.syncNow)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			a.logger.Error(err, "Watching the device-plugin directory")
		}
	}
}

// Resources lists the resources the agent serves: the configuration's and
// the MIG profiles of the node (ServedResources), in order.
func (a *Agent) Resources() []corev1.ResourceName { return a.model.Resources() }

// Registered lists the resources registered with the current kubelet.
func (a *Agent) Registered() []corev1.ResourceName {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []corev1.ResourceName
	for r := range a.registered {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// devices implements handler.
func (a *Agent) devices(k Kind) ([]devices.Device, <-chan struct{}) {
	return a.state.devices(k.Resource())
}

// sent implements handler.
func (a *Agent) sent(k Kind, list []devices.Device, stream uint64) {
	a.state.markSent(k.Resource(), list, stream)
}

// streamEnded implements handler.
func (a *Agent) streamEnded(k Kind, stream uint64) {
	a.state.streamEnded(k.Resource(), stream)
}

// assignedFor is, for an AssignedReader, the GPUs assigned to slices of the
// node's pods as the API server lists them now (assignedNow), and whether
// it could read them; none and false for other kinds.
func (a *Agent) assignedFor(ctx context.Context, k Kind) (devices.Assignments, bool) {
	if _, ok := k.(AssignedReader); ok {
		return a.assignedNow(ctx)
	}
	return devices.Assignments{}, false
}

// preferred implements handler: the preferred set among the devices that
// are usable now (a device that turned unhealthy or withheld after the
// kubelet's last list is left out; must-include devices are kept).
func (a *Agent) preferred(ctx context.Context, k Kind, available, mustInclude []string, size int) ([]string, error) {
	r := k.Resource()
	pa, ok := k.(PreferredAllocator)
	if !ok {
		err := fmt.Errorf("%s has no preferred allocation", r)
		a.opts.Metrics.observePreferred(r, err)
		return nil, err
	}
	h, u := a.state.snapshot()
	fresh, read := a.assignedFor(ctx, k)
	// Usable: what the watch or the API server calls assigned is withheld
	// (fail closed). Preferred: the API server's answer alone says which
	// GPUs slices are assigned to now, and which of them to slices of pods
	// the kubelet has not started; the watch may still list one whose pod
	// has just ended.
	u = u.WithAssigned(fresh.GPUs)
	rank := u
	if read {
		rank.Assigned, rank.Unstarted = fresh.GPUs, fresh.Unstarted
		if _, shared := k.(SharedKind); shared {
			rank.Admitting = a.admitting(ctx, r, size, fresh.Slices)
		}
	}
	usableIDs := make([]string, 0, len(available))
	must := map[string]bool{}
	for _, id := range mustInclude {
		must[id] = true
	}
	for _, id := range available {
		g, err := k.Lookup(id)
		if err != nil {
			a.opts.Metrics.observePreferred(r, err)
			return nil, err
		}
		if ok, _ := usable(k, g.UUID, h, u); ok || must[id] {
			usableIDs = append(usableIDs, id)
		}
	}
	ids, err := pa.Preferred(usableIDs, mustInclude, size, rank)
	a.opts.Metrics.observePreferred(r, err)
	if err != nil {
		return nil, err
	}
	a.logger.V(4).Info("Preferred allocation", "resource", r, "size", size, "available", len(available), "preferred", ids)
	return ids, nil
}

// ErrNRIRequired is returned (wrapped) by Allocate of shared units while the
// NRI plugin is not connected.
var ErrNRIRequired = errors.New("isolated GPU sharing requires the Tessera NRI plugin, which is not connected")

// allocateRequest implements handler.
func (a *Agent) allocateRequest(ctx context.Context, k Kind, containers [][]string) ([]*pluginapi.ContainerAllocateResponse, error) {
	r := k.Resource()
	// The request's context carries gRPC's, not the agent's, logger.
	logger := a.logger.WithValues("resource", r)
	_, shared := k.(SharedKind)
	assigned, _ := a.assignedFor(ctx, k)
	if shared {
		a.waitNRI(ctx, logger)
	}
	var resps []*pluginapi.ContainerAllocateResponse
	err := a.state.allocate(func(h devices.HealthMap, u devices.Usage) ([]devices.Allocation, error) {
		if shared && !a.nriConnected() {
			return nil, fmt.Errorf("refusing to allocate %s on %s: %w; shared units are never handed out without isolation (fail closed)", r, a.nodeLabel(), ErrNRIRequired)
		}
		var err error
		resps, err = k.Allocate(containers, h, u.WithAssigned(assigned.GPUs))
		if err != nil {
			return nil, err
		}
		if a.opts.NRISentinel != "" {
			for _, r := range resps {
				r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: api.NRISentinelPath, HostPath: a.opts.NRISentinel, ReadOnly: true})
			}
		}
		allocs := make([]devices.Allocation, 0, len(containers))
		for _, ids := range containers {
			allocs = append(allocs, devices.Allocation{Resource: r, DeviceIDs: sortedIDs(ids)})
		}
		return allocs, nil
	})
	a.opts.Metrics.observeAllocate(r, err)
	if err != nil {
		logger.Error(err, "Allocate refused", "devices", summarize(containers))
		return nil, err
	}
	logger.Info("Allocated", "devices", summarize(containers))
	return resps, nil
}

func (a *Agent) nodeLabel() string {
	if a.opts.NodeName == "" {
		return "this node"
	}
	return "node " + a.opts.NodeName
}

// summarize renders the device IDs of a request compactly for logs.
func summarize(containers [][]string) string {
	var parts []string
	for _, ids := range containers {
		if len(ids) > 4 {
			parts = append(parts, fmt.Sprintf("%s ... (%d devices)", strings.Join(ids[:2], ","), len(ids)))
			continue
		}
		parts = append(parts, strings.Join(ids, ","))
	}
	return strings.Join(parts, "; ")
}
