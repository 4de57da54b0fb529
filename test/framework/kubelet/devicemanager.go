// Package kubelet runs pieces of the real kubelet in-process for tests.
//
// DeviceManager wraps k8s.io/kubernetes/pkg/kubelet/cm/devicemanager (the
// kubelet's device-plugin manager, unmodified) together with the real
// topology manager and, when asked, the real CPU manager (static policy),
// wired the way the kubelet's container manager wires them. Device plugins under test register with it over
// DevicePluginDir/kubelet.sock exactly as on a node. Because that path is
// fixed, test packages must run their tests in a private mount namespace:
// see RunInPrivateMountNamespace.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/cpuset"
)

// KubeletSocket is where the device manager serves the Registration API.
const KubeletSocket = DevicePluginDir + "/kubelet.sock"

// CheckpointFile is the device manager's checkpoint.
const CheckpointFile = DevicePluginDir + "/kubelet_internal_checkpoint"

// Options configure a DeviceManager.
type Options struct {
	// NUMANodes are the machine's NUMA node IDs, as cadvisor would report
	// them to the kubelet. Empty: a single node 0.
	NUMANodes []int
	// TopologyPolicy is the kubelet's --topology-manager-policy: "none"
	// (default), "best-effort", "restricted" or "single-numa-node".
	TopologyPolicy string
	// TopologyScope is --topology-manager-scope: "container" (default) or
	// "pod".
	TopologyScope string
	// TopologyPolicyOptions is --topology-manager-policy-options.
	TopologyPolicyOptions map[string]string
	// CPUManagerPolicy is --cpu-manager-policy: "" or "none" runs no CPU
	// manager; "static" runs the kubelet's CPU manager, a hint provider of
	// the topology manager, over NUMACPUs, keeping ReservedCPUs (at least
	// 1, as the kubelet demands) and its checkpoint in StateDir.
	CPUManagerPolicy string
	// NUMACPUs are the CPUs of each NUMA node (static CPU manager only);
	// every CPU is a core of its own, the NUMA node its socket.
	NUMACPUs map[int]cpuset.CPUSet
	// ReservedCPUs is kube-reserved + system-reserved CPU (default 1).
	ReservedCPUs int
	// StateDir holds the CPU manager's checkpoint, cpu_manager_state.
	StateDir string
}

func (o Options) withDefaults() Options {
	if len(o.NUMANodes) == 0 {
		o.NUMANodes = []int{0}
	}
	if o.TopologyPolicy == "" {
		o.TopologyPolicy = topologymanager.PolicyNone
	}
	if o.TopologyScope == "" {
		o.TopologyScope = "container"
	}
	return o
}

// DeviceManager is a running device manager plus topology manager, with the
// set of "active pods" a kubelet would report to them.
type DeviceManager struct {
	opts Options

	mu       sync.Mutex
	manager  *devicemanager.ManagerImpl
	topology topologymanager.Manager
	cpus     cpumanager.Manager // nil without a CPU manager
	pods     *podSet
	sources  *sourcesReady
	stopped  bool
}

// StartDeviceManager starts a device manager with a clean DevicePluginDir
// (no checkpoint, no sockets). It refuses to run unless DevicePluginDir is
// a tmpfs in a private mount namespace.
func StartDeviceManager(opts Options) (*DeviceManager, error) {
	if err := checkDevicePluginDir(); err != nil {
		return nil, err
	}
	if err := clearDir(DevicePluginDir); err != nil {
		return nil, err
	}
	d := &DeviceManager{opts: opts.withDefaults(), pods: &podSet{pods: map[types.UID]*v1.Pod{}}, sources: &sourcesReady{ready: true}}
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

// StartDeviceManagerForTest is StartDeviceManager that fails t on error and
// stops the manager when t ends.
func StartDeviceManagerForTest(t testing.TB, opts Options) *DeviceManager {
	t.Helper()
	d, err := StartDeviceManager(opts)
	if err != nil {
		t.Fatalf("start device manager: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stop device manager: %v", err)
		}
	})
	return d
}

// start builds and starts a manager pair on DevicePluginDir, as
// pkg/kubelet/cm/container_manager_linux.go does.
func (d *DeviceManager) start() error {
	topo := make([]cadvisorapi.Node, 0, len(d.opts.NUMANodes))
	for _, id := range d.opts.NUMANodes {
		topo = append(topo, cadvisorapi.Node{Id: id})
	}
	tm, err := topologymanager.NewManager(topo, d.opts.TopologyPolicy, d.opts.TopologyScope, d.opts.TopologyPolicyOptions)
	if err != nil {
		return fmt.Errorf("create topology manager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(topo, tm)
	if err != nil {
		return fmt.Errorf("create device manager: %w", err)
	}
	tm.AddHintProvider(dm)
	var cm cpumanager.Manager
	if d.opts.CPUManagerPolicy == "static" {
		if cm, err = d.startCPUManager(tm); err != nil {
			return err
		}
	}
	if err := dm.Start(d.pods.list, d.sources, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("start device manager: %w", err)
	}
	d.mu.Lock()
	d.manager, d.topology, d.cpus, d.stopped = dm, tm, cm, false
	d.mu.Unlock()
	klog.V(2).InfoS("Device manager started", "socket", KubeletSocket, "numaNodes", d.opts.NUMANodes, "topologyPolicy", d.opts.TopologyPolicy)
	return nil
}

// startCPUManager starts the kubelet's static CPU manager over the NUMA
// nodes' CPUs, as a hint provider of tm, as the container manager does.
func (d *DeviceManager) startCPUManager(tm topologymanager.Manager) (cpumanager.Manager, error) {
	mi := &cadvisorapi.MachineInfo{}
	for _, id := range d.opts.NUMANodes {
		n := cadvisorapi.Node{Id: id}
		for _, cpu := range d.opts.NUMACPUs[id].List() {
			n.Cores = append(n.Cores, cadvisorapi.Core{Id: cpu, Threads: []int{cpu}, SocketID: id})
		}
		mi.Topology = append(mi.Topology, n)
		mi.NumCores += len(n.Cores)
	}
	mi.NumSockets = len(d.opts.NUMANodes)
	mi.NumPhysicalCores = mi.NumCores
	reserved := max(1, d.opts.ReservedCPUs)
	cm, err := cpumanager.NewManager("static", nil, time.Hour, mi, cpuset.New(),
		v1.ResourceList{v1.ResourceCPU: *resource.NewQuantity(int64(reserved), resource.DecimalSI)}, d.opts.StateDir, tm)
	if err != nil {
		return nil, fmt.Errorf("create CPU manager: %w", err)
	}
	tm.AddHintProvider(cm)
	if err := cm.Start(cpumanager.ActivePodsFunc(d.pods.list), d.sources, noPodStatus{}, noRuntime{}, containermap.NewContainerMap()); err != nil {
		return nil, fmt.Errorf("start CPU manager: %w", err)
	}
	return cm, nil
}

// noPodStatus and noRuntime are what the CPU manager's reconcile loop
// reads and writes: the simulated node has no container statuses (so the
// loop leaves every container alone) and no runtime to update.
type noPodStatus struct{}

func (noPodStatus) GetPodStatus(types.UID) (v1.PodStatus, bool) { return v1.PodStatus{}, false }

type noRuntime struct{}

func (noRuntime) UpdateContainerResources(context.Context, string, *runtimeapi.ContainerResources) error {
	return nil
}

// ExclusiveCPUs are the CPUs the CPU manager gave a container for itself
// (empty without a static CPU manager).
func (d *DeviceManager) ExclusiveCPUs(podUID, container string) cpuset.CPUSet {
	d.mu.Lock()
	cm := d.cpus
	d.mu.Unlock()
	if cm == nil {
		return cpuset.New()
	}
	return cm.GetExclusiveCPUs(podUID, container)
}

// AllocatableCPUs are the CPUs the CPU manager may give containers
// exclusively (empty without a static CPU manager).
func (d *DeviceManager) AllocatableCPUs() cpuset.CPUSet {
	d.mu.Lock()
	cm := d.cpus
	d.mu.Unlock()
	if cm == nil {
		return cpuset.New()
	}
	return cm.GetAllocatableCPUs()
}

// Manager is the underlying devicemanager.ManagerImpl (it changes on
// Restart).
func (d *DeviceManager) Manager() *devicemanager.ManagerImpl {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.manager
}

// TopologyManager is the topology manager the device manager reports to.
func (d *DeviceManager) TopologyManager() topologymanager.Manager {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.topology
}

// Stop stops the device manager's registration server (which disconnects
// every plugin). It is safe to call more than once.
func (d *DeviceManager) Stop() error {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return nil
	}
	d.stopped = true
	m := d.manager
	d.mu.Unlock()
	if err := m.Stop(); err != nil {
		return fmt.Errorf("stop device manager: %w", err)
	}
	return nil
}

// Restart stops the device manager and starts a new one on the same
// directory, like a kubelet restart: the new manager reads the checkpoint
// (allocations and registered resource names) and plugins must register
// again. The active pods are kept.
func (d *DeviceManager) Restart() error {
	if err := d.Stop(); err != nil {
		return err
	}
	return d.start()
}

// SetSourcesReady sets what the manager's config.SourcesReady reports
// (default true). While false, the manager keeps allocations of pods that
// are not active, as a restarting kubelet does before it has seen all pods.
func (d *DeviceManager) SetSourcesReady(ready bool) {
	d.sources.set(ready)
}

// GetCapacity returns the device plugin resources' capacity and
// allocatable (unhealthy devices count in capacity only) and the resource
// names that are no longer served.
func (d *DeviceManager) GetCapacity() (capacity, allocatable v1.ResourceList, inactive []string) {
	return d.Manager().GetCapacity()
}

// WaitForResource polls GetCapacity every 50ms until resource has exactly
// the given capacity and allocatable, or fails after timeout.
func (d *DeviceManager) WaitForResource(ctx context.Context, resource v1.ResourceName, capacity, allocatable int64, timeout time.Duration) error {
	var gotC, gotA int64
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		c, a, _ := d.GetCapacity()
		cq, aq := c[resource], a[resource]
		gotC, gotA = cq.Value(), aq.Value()
		return gotC == capacity && gotA == allocatable, nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for %s capacity=%d allocatable=%d (last seen capacity=%d allocatable=%d): %w",
			timeout, resource, capacity, allocatable, gotC, gotA, err)
	}
	return nil
}

// AdmitPod runs the kubelet's resource admission for pod and then asks for
// each container's run options, as the kubelet does before starting it:
//
//  1. the pod joins the active pods;
//  2. the topology manager's Admit collects the device manager's topology
//     hints (per the policy) and calls devicemanager.Allocate for every init
//     and app container; that reaches the device plugin's Allocate;
//  3. GetDeviceRunContainerOptions for every container returns what the
//     plugin answered (envs, mounts, devices, annotations).
//
// When admission fails, the pod leaves the active pods again and the error
// carries the admission reason and message.
func (d *DeviceManager) AdmitPod(pod *v1.Pod) (map[string]*devicemanager.DeviceRunContainerOptions, error) {
	d.pods.add(pod)
	res := d.TopologyManager().Admit(&lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: d.pods.listExcept(pod.UID)})
	if !res.Admit {
		d.pods.remove(pod.UID)
		return nil, &AdmissionError{Reason: res.Reason, Message: res.Message}
	}
	out := map[string]*devicemanager.DeviceRunContainerOptions{}
	for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		o, err := d.Manager().GetDeviceRunContainerOptions(pod, &c)
		if err != nil {
			return nil, fmt.Errorf("run options for container %s of pod %s: %w", c.Name, pod.Name, err)
		}
		out[c.Name] = o
	}
	return out, nil
}

// AllocateContainer calls devicemanager.Allocate for one container of pod
// (the pod joins the active pods) and then GetDeviceRunContainerOptions,
// without the topology manager in between.
func (d *DeviceManager) AllocateContainer(pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	d.pods.add(pod)
	m := d.Manager()
	if err := m.Allocate(pod, container); err != nil {
		return nil, fmt.Errorf("allocate for container %s of pod %s: %w", container.Name, pod.Name, err)
	}
	o, err := m.GetDeviceRunContainerOptions(pod, container)
	if err != nil {
		return nil, fmt.Errorf("run options for container %s of pod %s: %w", container.Name, pod.Name, err)
	}
	return o, nil
}

// ContainerRunOptions is GetDeviceRunContainerOptions for an admitted pod,
// e.g. after Restart: with the allocation in the checkpoint it does not
// call the plugin again.
func (d *DeviceManager) ContainerRunOptions(pod *v1.Pod, container *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return d.Manager().GetDeviceRunContainerOptions(pod, container)
}

// GetTopologyHints are the device manager's NUMA hints for a container.
func (d *DeviceManager) GetTopologyHints(pod *v1.Pod, container *v1.Container) map[string][]topologymanager.TopologyHint {
	return d.Manager().GetTopologyHints(pod, container)
}

// GetPodTopologyHints are the device manager's NUMA hints for a whole pod.
func (d *DeviceManager) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	return d.Manager().GetPodTopologyHints(pod)
}

// AllocatedDevices maps each resource to the device IDs allocated to a
// container.
func (d *DeviceManager) AllocatedDevices(podUID types.UID, container string) map[string]sets.Set[string] {
	out := map[string]sets.Set[string]{}
	for res, devs := range d.Manager().GetDevices(string(podUID), container) {
		ids := sets.New[string]()
		for id := range devs {
			ids.Insert(id)
		}
		out[res] = ids
	}
	return out
}

// RemovePod drops pod from the active pods; the device manager frees its
// devices the next time it garbage-collects (on the next allocation or
// hint request).
func (d *DeviceManager) RemovePod(uid types.UID) {
	d.pods.remove(uid)
}

// AdmissionError is a pod the kubelet's resource admission rejected.
type AdmissionError struct {
	Reason  string
	Message string
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("pod not admitted: %s: %s", e.Reason, e.Message)
}

// podSet is the kubelet's list of active pods.
type podSet struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

func (s *podSet) add(p *v1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[p.UID] = p
}

func (s *podSet) remove(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pods, uid)
}

func (s *podSet) list() []*v1.Pod { return s.listExcept("") }

func (s *podSet) listExcept(uid types.UID) []*v1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*v1.Pod, 0, len(s.pods))
	for id, p := range s.pods {
		if id != uid {
			out = append(out, p)
		}
	}
	return out
}

// sourcesReady implements the kubelet's config.SourcesReady.
type sourcesReady struct {
	mu    sync.Mutex
	ready bool
}

func (s *sourcesReady) AddSource(string) {}

func (s *sourcesReady) AllReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

func (s *sourcesReady) set(ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = ready
}

// clearDir removes everything inside dir (not dir itself).
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	return nil
}
