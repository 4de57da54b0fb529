// Package nodesim simulates Kubernetes GPU nodes from real parts: per
// node, the kubelet's device manager and topology manager
// (k8s.io/kubernetes, in-process), the container runtime's side of NRI
// (containerd/nri pkg/adaptation, in-process) and the real tessera-node
// binary on a mock GPU machine. Only the kubelet's pod lifecycle around
// them and the containers themselves are simulated: a pod bound to the
// node is admitted (topology manager + device manager Allocate, reaching
// the node agent's device plugins), "run" (RunPodSandbox, CreateContainer,
// StartContainer through NRI, reaching the node agent's NRI plugin), and
// what the plugins answered is recorded (PodRecord) before the pod goes
// Running.
//
// Each node is its own process (cmd tessera-nodesim) in its own mount
// namespace, because the device manager's directory is fixed. Cluster
// starts a control plane, tessera-extender and N such nodes.
package nodesim

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/utils/cpuset"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/kubelet"
)

//go:embed fake-mps-control
var fakeMPSControl []byte

// FakeMPSControl is the stand-in for nvidia-cuda-mps-control that
// simulated (and real) test nodes give their agent.
func FakeMPSControl() []byte { return fakeMPSControl }

// Label keys a simulated node carries besides kubernetes.io/hostname.
const (
	LabelProfile = "sim.tessera.dev/mock-machine"
	LabelGPU     = "nvidia.com/gpu.present"
)

// NodeConfig configures one simulated node.
type NodeConfig struct {
	// Name of the Node.
	Name string
	// Profile is a built-in mock machine (nvmlmock: dgx-a100, dgx-1v,
	// pcie-2numa). The node's GPU UUIDs are derived from Name, so two nodes
	// of one profile have different GPUs.
	Profile string
	// Kubeconfig of the API server for the node itself (a kubelet's
	// rights: Nodes, Leases, pods' status and deletion).
	Kubeconfig string
	// AgentKubeconfig is tessera-node's (default Kubeconfig).
	AgentKubeconfig string
	// StateDir holds everything of the node: agent log and state, NRI
	// socket, PodRecords, the control socket.
	StateDir string
	// AgentBinary is tessera-node.
	AgentBinary string
	// AgentArgs are added to the agent's command line.
	AgentArgs []string
	// TopologyPolicy of the topology manager (default best-effort).
	TopologyPolicy string
	// TopologyScope of the topology manager (default container).
	TopologyScope string
	// CPUManagerPolicy is "" (none) or "static": the kubelet's CPU manager
	// then gives Guaranteed pods' integer-CPU containers CPUs of their own
	// and hints the topology manager, keeping ReservedCPUs (default 1) out
	// of the node's allocatable CPU.
	CPUManagerPolicy string
	ReservedCPUs     int
	// Labels are added to the Node.
	Labels map[string]string
	// MaxPods is the node's pods capacity (default 256).
	MaxPods int64
	// StatusInterval is how often capacity is compared with the Node's
	// (default 1s); HeartbeatInterval how often the Ready condition and
	// the Lease are renewed regardless (default 10s).
	StatusInterval, HeartbeatInterval time.Duration
}

// ControlSocket is the node's control endpoint below its state directory:
// POST /restart-device-manager restarts the kubelet's device manager (like a
// kubelet restart); POST /restart-agent stops the node agent as the kubelet
// stops a DaemonSet's pod (SIGTERM: it drains and exits), and the node
// starts it again, like a DaemonSet.
func ControlSocket(stateDir string) string { return filepath.Join(stateDir, "control.sock") }

// Node is a running node simulator.
type Node struct {
	cfg     NodeConfig
	client  kubernetes.Interface
	dm      *kubelet.DeviceManager
	rt      *runtime
	machine *api.MockMachine
	cpus    cpuset.CPUSet
	mems    string

	agentMu  sync.Mutex
	agentCmd *exec.Cmd

	// pods the node runs, by UID; only the worker goroutine touches it.
	pods map[types.UID]*simPod
	// active are the admitted pods, for the PodResources API.
	active *activePods
	// wake syncs pod key again after a while (the work queue's AddAfter).
	wake func(key string, after time.Duration)
	// lastStatus is the resources last written to the Node.
	lastStatus v1.ResourceList
	lastBeat   time.Time
}

type simPod struct {
	pod        *v1.Pod
	key        string
	rec        *PodRecord
	sandbox    *adaptation.PodSandbox
	containers []*adaptation.Container // created and not removed
	failed     bool
	// endsAt is when its containers' sleeps end (PodRunsFor); zero: it
	// runs until deleted. ended: it has gone Succeeded.
	endsAt time.Time
	ended  bool
}

// RunNode runs a node simulator until ctx ends. The process must be in a
// private mount namespace with a tmpfs on the device-plugin directory
// (kubelet.RunMainInPrivateMountNamespace).
func RunNode(ctx context.Context, cfg NodeConfig) error {
	if cfg.TopologyPolicy == "" {
		cfg.TopologyPolicy = "best-effort"
	}
	if cfg.MaxPods == 0 {
		cfg.MaxPods = 256
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	logger := klog.FromContext(ctx).WithValues("node", cfg.Name)
	ctx = klog.NewContext(ctx, logger)
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.AgentBinary); err != nil {
		return fmt.Errorf("node agent binary: %w (run `make build`)", err)
	}
	n := &Node{cfg: cfg, pods: map[types.UID]*simPod{}, active: &activePods{pods: map[types.UID]*v1.Pod{}}}
	if err := n.writeMachine(); err != nil {
		return err
	}
	if err := fakeNVIDIADevices(cfg.StateDir); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "tessera-nodesim/" + cfg.Name
	rc.QPS, rc.Burst = 50, 100
	if n.client, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	var numa []int
	numaCPUs := map[int]cpuset.CPUSet{}
	for _, nn := range n.machine.NUMANodes {
		numa = append(numa, nn.ID)
		numaCPUs[nn.ID], _ = cpuset.Parse(nn.CPUs) // checked by writeMachine
	}
	if err := n.writeKubeletConfig(); err != nil {
		return err
	}
	if n.dm, err = kubelet.StartDeviceManager(kubelet.Options{NUMANodes: numa, TopologyPolicy: cfg.TopologyPolicy, TopologyScope: cfg.TopologyScope,
		CPUManagerPolicy: cfg.CPUManagerPolicy, NUMACPUs: numaCPUs, ReservedCPUs: n.reservedCPUs(), StateDir: cfg.StateDir}); err != nil {
		return err
	}
	defer n.dm.Stop() //nolint:errcheck // exiting
	if n.rt, err = startRuntime(cfg.StateDir); err != nil {
		return err
	}
	defer n.rt.Stop()
	if err := n.register(ctx); err != nil {
		return err
	}

	var wg sync.WaitGroup
	wg.Add(4)
	go func() {
		defer wg.Done()
		if err := servePodResources(ctx, PodResourcesSocket(cfg.StateDir), n.active, n.dm); err != nil && ctx.Err() == nil {
			logger.Error(err, "PodResources API")
		}
	}()
	go func() { defer wg.Done(); n.superviseAgent(ctx) }()
	go func() { defer wg.Done(); n.statusLoop(ctx) }()
	go func() { defer wg.Done(); n.serveControl(ctx) }()
	err = n.runPods(ctx)
	wg.Wait()
	return err
}

// writeMachine writes the profile as a mock machine file named after the
// node (its GPU UUIDs derive from the name).
func (n *Node) writeMachine() error {
	m, err := nvmlmock.Load(n.cfg.Profile)
	if err != nil {
		return err
	}
	m.Name = n.cfg.Name
	n.machine = m
	var ids []int
	for _, nn := range m.NUMANodes {
		s, err := cpuset.Parse(nn.CPUs)
		if err != nil {
			return fmt.Errorf("profile %s: NUMA node %d: %w", n.cfg.Profile, nn.ID, err)
		}
		n.cpus = n.cpus.Union(s)
		ids = append(ids, nn.ID)
	}
	n.mems = cpuset.New(ids...).String()
	b, err := yaml.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(n.machinePath(), b, 0o644)
}

// reservedCPUs is the kube-reserved CPU under the static CPU manager.
func (n *Node) reservedCPUs() int {
	if n.cfg.CPUManagerPolicy != "static" {
		return 0
	}
	return max(1, n.cfg.ReservedCPUs)
}

// kubeletConfigPath is the node's KubeletConfiguration, which the node agent
// reads as on a real node (--kubelet-config).
func (n *Node) kubeletConfigPath() string {
	return filepath.Join(n.cfg.StateDir, "kubelet-config.yaml")
}

// writeKubeletConfig writes the kubelet configuration the node runs with.
func (n *Node) writeKubeletConfig() error {
	cfg := map[string]any{
		"apiVersion":            "kubelet.config.k8s.io/v1beta1",
		"kind":                  "KubeletConfiguration",
		"topologyManagerPolicy": n.cfg.TopologyPolicy,
		"topologyManagerScope":  cmp.Or(n.cfg.TopologyScope, "container"),
		"cpuManagerPolicy":      cmp.Or(n.cfg.CPUManagerPolicy, "none"),
	}
	if r := n.reservedCPUs(); r > 0 {
		cfg["kubeReserved"] = map[string]string{"cpu": strconv.Itoa(r)}
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(n.kubeletConfigPath(), b, 0o644)
}

func (n *Node) agentKubeconfig() string {
	if n.cfg.AgentKubeconfig != "" {
		return n.cfg.AgentKubeconfig
	}
	return n.cfg.Kubeconfig
}

func (n *Node) machinePath() string { return filepath.Join(n.cfg.StateDir, "machine.yaml") }

// mockMIGStatePath is where the node agent keeps the mock machine's MIG
// layouts (tessera-node --mock-mig-state).
func (n *Node) mockMIGStatePath() string { return filepath.Join(n.cfg.StateDir, "mock-mig-state.json") }

// MachineUUIDs returns the GPU UUIDs of profile on a node called name, by
// index.
func MachineUUIDs(profile, name string) ([]string, error) {
	m, err := nvmlmock.Load(profile)
	if err != nil {
		return nil, err
	}
	m.Name = name
	return MachineUUIDsOf(m)
}

// MachineUUIDsOf returns the GPU UUIDs of the mock machine m, by index.
func MachineUUIDsOf(m *api.MockMachine) ([]string, error) {
	mm, err := nvmlmock.New(m)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(m.GPUs))
	for i := range out {
		out[i] = mm.UUID(i)
	}
	return out, nil
}

// fakeNVIDIADevices bind-mounts, in this process's private mount namespace,
// a copy of /proc/devices that also lists the NVIDIA character devices, so
// that the node agent (a child, same namespace) finds the nvidia-uvm major
// with --proc-root=/proc while every PID under /proc stays real (MPS
// daemons are adopted through /proc).
func fakeNVIDIADevices(stateDir string) error {
	b, err := os.ReadFile("/proc/devices")
	if err != nil {
		return err
	}
	s := string(b)
	if strings.Contains(s, "nvidia-uvm") {
		return nil
	}
	s = strings.Replace(s, "Character devices:\n", "Character devices:\n195 nvidia\n234 nvidia-uvm\n", 1)
	p := filepath.Join(stateDir, "proc-devices")
	if err := os.WriteFile(p, []byte(s), 0o444); err != nil {
		return err
	}
	if err := syscall.Mount(p, "/proc/devices", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on /proc/devices (private mount namespace): %w", p, err)
	}
	return nil
}

// --- the node agent ---

func (n *Node) agentArgs() ([]string, error) {
	mps := filepath.Join(n.cfg.StateDir, "fake-mps-control")
	if err := os.WriteFile(mps, fakeMPSControl, 0o755); err != nil {
		return nil, err
	}
	args := []string{
		"--nvml=mock:" + n.machinePath(),
		"--device-plugin-dir=" + kubelet.DevicePluginDir,
		"--pod-resources-socket=" + PodResourcesSocket(n.cfg.StateDir),
		"--kubeconfig=" + n.agentKubeconfig(),
		"--node-name=" + n.cfg.Name,
		"--nri-socket=" + n.rt.socket(n.cfg.StateDir),
		"--state-dir=" + filepath.Join(n.cfg.StateDir, "agent"),
		// The mock machine's MIG layouts outlive the agent, as a driver's.
		"--mock-mig-state=" + n.mockMIGStatePath(),
		"--mps-control=" + mps,
		"--proc-root=/proc",
		"--cpu-manager-state=" + filepath.Join(n.cfg.StateDir, "cpu_manager_state"),
		"--kubelet-config=" + n.kubeletConfigPath(),
		"--metrics-addr=",
		"--watchdog-action=none",
		"--memory-reserve-mib=1024",
		"--health-check-interval=5s",
		// No runtime resolves CDI names here (the real node does).
		"--cdi-spec-dirs=",
	}
	return append(args, n.cfg.AgentArgs...), nil
}

// superviseAgent runs tessera-node and starts it again whenever it exits,
// as a DaemonSet would.
func (n *Node) superviseAgent(ctx context.Context) {
	logger := klog.FromContext(ctx)
	args, err := n.agentArgs()
	if err != nil {
		logger.Error(err, "Node agent arguments")
		return
	}
	for starts := 1; ctx.Err() == nil; starts++ {
		logf, err := os.OpenFile(filepath.Join(n.cfg.StateDir, "agent.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			logger.Error(err, "Node agent log")
			return
		}
		fmt.Fprintf(logf, "==== start %d at %s: %s %s\n", starts, time.Now().Format(time.RFC3339Nano), n.cfg.AgentBinary, strings.Join(args, " "))
		cmd := exec.Command(n.cfg.AgentBinary, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			logger.Error(err, "Starting the node agent")
			time.Sleep(time.Second)
			continue
		}
		_ = os.WriteFile(filepath.Join(n.cfg.StateDir, "agent.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
		n.agentMu.Lock()
		n.agentCmd = cmd
		n.agentMu.Unlock()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			logger.Info("Node agent exited; starting it again", "err", err, "starts", starts)
			fmt.Fprintf(logf, "==== exited: %v\n", err)
			logf.Close()
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			logf.Close()
			return
		}
	}
}

func (n *Node) signalAgent(sig syscall.Signal) error {
	n.agentMu.Lock()
	cmd := n.agentCmd
	n.agentMu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New("no node agent running")
	}
	return cmd.Process.Signal(sig)
}

// serveControl serves the control socket (restarts for chaos tests).
func (n *Node) serveControl(ctx context.Context) {
	logger := klog.FromContext(ctx)
	sock := ControlSocket(n.cfg.StateDir)
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		logger.Error(err, "Control socket")
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /restart-device-manager", func(w http.ResponseWriter, _ *http.Request) {
		logger.Info("Restarting the device manager (as a kubelet restart)")
		if err := n.dm.Restart(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("POST /restart-agent", func(w http.ResponseWriter, _ *http.Request) {
		logger.Info("Stopping the node agent (SIGTERM)")
		if err := n.signalAgent(syscall.SIGTERM); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	_ = srv.Serve(l)
}

// Control sends a control request ("restart-device-manager",
// "restart-agent") to the node whose state directory is stateDir.
func Control(ctx context.Context, stateDir, what string) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", ControlSocket(stateDir))
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://node/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b [512]byte
		k, _ := resp.Body.Read(b[:])
		return fmt.Errorf("%s: %s: %s", what, resp.Status, strings.TrimSpace(string(b[:k])))
	}
	return nil
}

// --- the Node object ---

func (n *Node) baseResources() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    *resource.NewQuantity(int64(n.cpus.Size()), resource.DecimalSI),
		v1.ResourceMemory: resource.MustParse("1Ti"),
		v1.ResourcePods:   *resource.NewQuantity(n.cfg.MaxPods, resource.DecimalSI),
	}
}

// register creates the Node (or takes over an existing one) as a kubelet
// does, with a Ready status, and takes off the not-ready taint the API
// server's admission adds (there is no node lifecycle controller).
func (n *Node) register(ctx context.Context) error {
	labels := map[string]string{v1.LabelHostname: n.cfg.Name, LabelProfile: n.cfg.Profile, LabelGPU: "true",
		v1.LabelOSStable: "linux", v1.LabelArchStable: "amd64"}
	maps.Copy(labels, n.cfg.Labels)
	nodes := n.client.CoreV1().Nodes()
	_, err := nodes.Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", n.cfg.Name, err)
	}
	if err := n.updateStatus(ctx, true); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		maps.Copy(node.Labels, labels)
		node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t v1.Taint) bool {
			return t.Key == v1.TaintNodeNotReady || t.Key == v1.TaintNodeUnreachable
		})
		_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

// updateStatus writes capacity and allocatable (machine plus the device
// manager's) and the Ready condition when they changed or a heartbeat is
// due.
func (n *Node) updateStatus(ctx context.Context, force bool) error {
	capacity, allocatable := n.baseResources(), n.baseResources()
	allocatable[v1.ResourceCPU] = *resource.NewQuantity(int64(n.cpus.Size()-n.reservedCPUs()), resource.DecimalSI)
	dc, da, _ := n.dm.GetCapacity()
	maps.Copy(capacity, dc)
	maps.Copy(allocatable, da)
	sig := v1.ResourceList{}
	for k, v := range capacity {
		sig["c/"+k] = v
	}
	for k, v := range allocatable {
		sig["a/"+k] = v
	}
	if !force && time.Since(n.lastBeat) < n.cfg.HeartbeatInterval && equalResources(sig, n.lastStatus) {
		return nil
	}
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// Resources the device manager no longer serves disappear, as the
		// kubelet drops them.
		for k := range node.Status.Capacity {
			if _, ok := capacity[k]; !ok && strings.Contains(string(k), "/") {
				delete(node.Status.Capacity, k)
				delete(node.Status.Allocatable, k)
			}
		}
		if node.Status.Capacity == nil {
			node.Status.Capacity = v1.ResourceList{}
		}
		if node.Status.Allocatable == nil {
			node.Status.Allocatable = v1.ResourceList{}
		}
		maps.Copy(node.Status.Capacity, capacity)
		maps.Copy(node.Status.Allocatable, allocatable)
		setCondition(&node.Status, v1.NodeReady, v1.ConditionTrue, "KubeletReady", "simulated kubelet is posting ready status", now)
		for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
			setCondition(&node.Status, t, v1.ConditionFalse, "KubeletHas"+strings.TrimPrefix(string(t), "Node"), "", now)
		}
		node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: n.cfg.Name}}
		node.Status.NodeInfo.KubeletVersion = "v1.34.2-tessera-nodesim"
		node.Status.NodeInfo.ContainerRuntimeVersion = "containerd-nri://2.1.0 (simulated)"
		node.Status.NodeInfo.OperatingSystem, node.Status.NodeInfo.Architecture = "linux", "amd64"
		_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s status: %w", n.cfg.Name, err)
	}
	n.lastStatus, n.lastBeat = sig, time.Now()
	n.renewLease(ctx)
	return nil
}

func equalResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

func setCondition(s *v1.NodeStatus, t v1.NodeConditionType, status v1.ConditionStatus, reason, msg string, now metav1.Time) {
	for i := range s.Conditions {
		c := &s.Conditions[i]
		if c.Type == t {
			if c.Status != status {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason, c.Message, c.LastHeartbeatTime = status, reason, msg, now
			return
		}
	}
	s.Conditions = append(s.Conditions, v1.NodeCondition{Type: t, Status: status, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now})
}

// renewLease renews the node's Lease in kube-node-lease, as the kubelet
// does (best effort: nothing here reads it without a controller manager).
func (n *Node) renewLease(ctx context.Context) {
	leases := n.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, _ = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Namespace: v1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.cfg.Name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return
	}
	if err != nil {
		return
	}
	l.Spec.RenewTime = &now
	_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
}

func (n *Node) statusLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(n.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := n.updateStatus(ctx, false); err != nil && ctx.Err() == nil {
				logger.Error(err, "Node status")
			}
		}
	}
}

// --- pods ---

func (n *Node) runPods(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(n.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.cfg.Name).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	n.wake = func(key string, after time.Duration) { queue.AddAfter(key, after) }
	logger.Info("Node simulator ready", "profile", n.cfg.Profile, "cpus", n.cpus.Size(), "numa", n.mems)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, quit := queue.Get()
		if quit {
			break
		}
		err := n.syncPod(ctx, inf.GetStore(), key)
		if err != nil && ctx.Err() == nil {
			logger.Error(err, "Syncing pod; retrying", "pod", key)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
	// Stop what runs, as a node going away would not; keep it simple.
	return nil
}

func (n *Node) byKey(key string) *simPod {
	for _, sp := range n.pods {
		if sp.key == key {
			return sp
		}
	}
	return nil
}

func (n *Node) syncPod(ctx context.Context, store toolscache.Store, key string) error {
	obj, exists, err := store.GetByKey(key)
	if err != nil {
		return err
	}
	known := n.byKey(key)
	if !exists {
		if known != nil {
			n.teardown(ctx, known)
		}
		return nil
	}
	pod := obj.(*v1.Pod)
	if known != nil && known.pod.UID != pod.UID {
		n.teardown(ctx, known)
		known = nil
	}
	if pod.DeletionTimestamp != nil {
		if known != nil {
			n.teardown(ctx, known)
		}
		// The kubelet moves a pod it stopped to a terminal phase, then
		// confirms the deletion. A pod with a finalizer (a Job's
		// batch.kubernetes.io/job-tracking) stays until its controller
		// sees it terminal and removes the finalizer: without the phase,
		// an evicted Job pod stayed Terminating, holding its GPUs, for
		// ever.
		if err := n.terminalOnDeletion(ctx, pod); err != nil {
			return err
		}
		err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		return nil
	}
	if known != nil {
		known.pod = pod
		if !known.endsAt.IsZero() && !time.Now().Before(known.endsAt) && pod.Status.Phase != v1.PodSucceeded {
			return n.endPod(ctx, known) // again after a failed status write
		}
		return nil
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil
	}
	return n.startPod(ctx, pod)
}

// terminateContainers marks every container of status terminated at now
// with exitCode and reason.
func terminateContainers(status *v1.PodStatus, exitCode int32, reason string, now metav1.Time) {
	for i := range status.ContainerStatuses {
		cs := &status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, ptr.To(false)
		cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: exitCode, Reason: reason, StartedAt: started, FinishedAt: now,
			ContainerID: cs.ContainerID}}
	}
}

// terminalOnDeletion writes the Failed phase of a pod being deleted that
// is not terminal yet, its containers terminated as by SIGKILL (exit code
// 137), keeping its other conditions (the Eviction API's DisruptionTarget
// among them), as the kubelet does before it confirms the deletion.
func (n *Node) terminalOnDeletion(ctx context.Context, pod *v1.Pod) error {
	return n.writePodStatus(ctx, pod, func(cur *v1.Pod) bool {
		if cur.Status.Phase == v1.PodSucceeded || cur.Status.Phase == v1.PodFailed {
			return false
		}
		now := metav1.Now()
		cur.Status.Phase = v1.PodFailed
		for i := range cur.Status.Conditions {
			c := &cur.Status.Conditions[i]
			if c.Type == v1.PodReady || c.Type == v1.ContainersReady {
				c.Status, c.Reason, c.LastTransitionTime = v1.ConditionFalse, "PodFailed", now
			}
		}
		terminateContainers(&cur.Status, 137, "Error", now)
		return true
	})
}

// containerCPUs is the cpuset the kubelet gives a container: its exclusive
// CPUs under the static CPU manager, else every CPU (the shared pool as the
// simulator has it).
func (n *Node) containerCPUs(pod *v1.Pod, container string) string {
	if s := n.dm.ExclusiveCPUs(string(pod.UID), container); s.Size() > 0 {
		return s.String()
	}
	return n.cpus.String()
}

// startPod admits and runs a pod, or fails it as the kubelet would.
func (n *Node) startPod(ctx context.Context, pod *v1.Pod) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	rec := &PodRecord{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Node: n.cfg.Name}
	sp := &simPod{pod: pod, key: pod.Namespace + "/" + pod.Name, rec: rec}
	n.pods[pod.UID] = sp

	runOpts, err := n.dm.AdmitPod(pod)
	if err != nil {
		n.dm.RemovePod(pod.UID)
		reason, msg := "UnexpectedAdmissionError", err.Error()
		var ae *kubelet.AdmissionError
		if errors.As(err, &ae) {
			reason, msg = ae.Reason, ae.Message
		}
		logger.Info("Pod rejected at admission", "reason", reason, "message", msg)
		return n.failPod(ctx, sp, rec, reason, msg)
	}

	n.active.set(pod)
	sb := &adaptation.PodSandbox{
		Id: "sb-" + string(pod.UID), Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID),
		Labels: maps.Clone(pod.Labels), Annotations: maps.Clone(pod.Annotations),
		Linux: &adaptation.LinuxPodSandbox{CgroupParent: "/kubepods/pod" + string(pod.UID)},
	}
	n.rt.addSandbox(sb)
	if err := n.rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: sb}); err != nil {
		n.stopSandbox(ctx, sp)
		n.dm.RemovePod(pod.UID)
		return n.failPod(ctx, sp, rec, "CreatePodSandboxError", err.Error())
	}
	sp.sandbox = sb
	type cspec struct {
		c    v1.Container
		init bool
	}
	var all []cspec
	for _, c := range pod.Spec.InitContainers {
		all = append(all, cspec{c, true})
	}
	for _, c := range pod.Spec.Containers {
		all = append(all, cspec{c, false})
	}
	for _, cs := range all {
		cr, err := n.runContainer(ctx, sp, &cs.c, runOpts[cs.c.Name], cs.init)
		if err != nil {
			logger.Info("Container creation failed", "container", cs.c.Name, "err", err)
			n.stopSandbox(ctx, sp)
			n.dm.RemovePod(pod.UID)
			n.dm.Manager().UpdateAllocatedDevices()
			rec.Containers = append(rec.Containers, ContainerRecord{Name: cs.c.Name, Init: cs.init})
			reason := "CreateContainerError"
			if errors.As(err, new(*configError)) {
				reason = "CreateContainerConfigError"
			}
			return n.failPod(ctx, sp, rec, reason, err.Error())
		}
		rec.Containers = append(rec.Containers, *cr)
	}
	rec.Phase = string(v1.PodRunning)
	if err := writeRecord(n.cfg.StateDir, rec); err != nil {
		return err
	}
	logger.V(2).Info("Pod running")
	if err := n.setRunning(ctx, pod); err != nil {
		return err
	}
	if d, ok := PodRunsFor(pod); ok {
		sp.endsAt = time.Now().Add(d)
		n.wake(sp.key, d)
	}
	return nil
}

// endPod ends a pod whose containers' sleeps are over, as the kubelet
// would once they exit 0: the runtime stops the containers and the
// sandbox, the pod's devices are freed (a terminated pod is not active),
// and it goes Succeeded. It stays known until deleted. Called again when
// the status write failed, it only writes the status.
func (n *Node) endPod(ctx context.Context, sp *simPod) error {
	if !sp.ended {
		n.stopSandbox(ctx, sp)
		sp.ended = true
		n.freeDevices(sp)
		sp.rec.Phase = string(v1.PodSucceeded)
		if err := writeRecord(n.cfg.StateDir, sp.rec); err != nil {
			return err
		}
		klog.FromContext(ctx).V(2).Info("Pod succeeded", "pod", sp.key)
	}
	cur, err := n.client.CoreV1().Pods(sp.pod.Namespace).Get(ctx, sp.pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Status.Phase == v1.PodSucceeded {
		return nil // written already; the informer was behind
	}
	now := metav1.Now()
	status := *cur.Status.DeepCopy()
	status.Phase = v1.PodSucceeded
	status.Conditions = nil
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.ContainersReady, v1.PodReady} {
		status.Conditions = append(status.Conditions, v1.PodCondition{Type: t, Status: v1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now})
	}
	status.Conditions = append(status.Conditions, v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue, Reason: "PodCompleted", LastTransitionTime: now})
	terminateContainers(&status, 0, "Completed", now)
	return n.patchStatus(ctx, sp.pod, status)
}

// runContainer creates and starts one container through NRI (an init
// container is also stopped and removed: it ran to completion).
func (n *Node) runContainer(ctx context.Context, sp *simPod, c *v1.Container, o *devicemanager.DeviceRunContainerOptions, init bool) (*ContainerRecord, error) {
	env, err := containerEnv(ctx, n.client, sp.pod, c)
	if err != nil {
		return nil, &configError{err}
	}
	cr := &ContainerRecord{Name: c.Name, Init: init, ID: string(sp.pod.UID) + "-" + c.Name}
	ctr := &adaptation.Container{
		Id: cr.ID, PodSandboxId: sp.sandbox.Id, Name: c.Name, State: adaptation.ContainerState_CONTAINER_CREATED,
		Labels:      map[string]string{"io.kubernetes.container.name": c.Name, "io.kubernetes.pod.uid": string(sp.pod.UID)},
		Annotations: map[string]string{}, Args: append(slices.Clone(c.Command), c.Args...),
		Linux: &adaptation.LinuxContainer{Resources: &adaptation.LinuxResources{Cpu: &adaptation.LinuxCPU{
			Cpus: n.containerCPUs(sp.pod, c.Name), Mems: n.mems}}, CgroupsPath: sp.sandbox.Linux.CgroupParent + "/" + cr.ID},
	}
	if o != nil {
		for _, e := range o.Envs {
			env[e.Name] = e.Value
		}
		for _, a := range o.Annotations {
			ctr.Annotations[a.Name] = a.Value
		}
		for _, d := range o.CDIDevices {
			ctr.CDIDevices = append(ctr.CDIDevices, &adaptation.CDIDevice{Name: d.Name})
			cr.CDIDevices = append(cr.CDIDevices, d.Name)
		}
		for _, m := range o.Mounts {
			ctr.Mounts = append(ctr.Mounts, &adaptation.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: []string{"rbind"}})
		}
	}
	for _, k := range sortedKeys(env) {
		ctr.Env = append(ctr.Env, k+"="+env[k])
	}
	cr.Allocated = map[string][]string{}
	for res, ids := range n.dm.AllocatedDevices(sp.pod.UID, c.Name) {
		l := ids.UnsortedList()
		sort.Strings(l)
		cr.Allocated[res] = l
	}
	if len(cr.Allocated) == 0 {
		cr.Allocated = nil
	}

	var resp *adaptation.CreateContainerResponse
	for attempt := 1; ; attempt++ {
		// A container must not start unisolated while the node agent
		// restarts: wait for its NRI plugin (containerd's "required
		// plugins" does the same).
		if !n.rt.waitPlugin(ctx, 30*time.Second) {
			err = errors.New("the required NRI plugin tessera is not connected")
		} else {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err = n.rt.CreateContainer(cctx, &adaptation.CreateContainerRequest{Pod: sp.sandbox, Container: ctr})
			cancel()
		}
		if err == nil || attempt == 3 || ctx.Err() != nil {
			break
		}
		// The kubelet retries a failed creation with a back-off.
		time.Sleep(time.Duration(attempt) * time.Second)
	}
	if err != nil {
		return nil, err
	}
	n.rt.addContainer(ctr)
	sp.containers = append(sp.containers, ctr)
	applyAdjustment(cr, ctr, env, resp.GetAdjust())
	if err := n.rt.StartContainer(ctx, &adaptation.StartContainerRequest{Pod: sp.sandbox, Container: ctr}); err != nil {
		return nil, err
	}
	ctr.State = adaptation.ContainerState_CONTAINER_RUNNING
	if init {
		n.removeContainer(ctx, sp, ctr)
	}
	return cr, nil
}

// applyAdjustment records the NRI adjustment and applies it to the
// container as the runtime would.
func applyAdjustment(cr *ContainerRecord, ctr *adaptation.Container, env map[string]string, adj *adaptation.ContainerAdjustment) {
	cr.CPUs, cr.Mems = ctr.Linux.Resources.Cpu.Cpus, ctr.Linux.Resources.Cpu.Mems
	if adj != nil {
		cr.Adjusted = len(adj.GetEnv()) > 0 || len(adj.GetCDIDevices()) > 0 || len(adj.GetLinux().GetDevices()) > 0 ||
			len(adj.GetMounts()) > 0 || adj.GetLinux().GetResources() != nil
		for _, kv := range adj.GetEnv() {
			if k, ok := strings.CutPrefix(kv.GetKey(), "-"); ok {
				delete(env, k)
				continue
			}
			env[kv.GetKey()] = kv.GetValue()
		}
		for _, d := range adj.GetCDIDevices() {
			cr.CDIDevices = append(cr.CDIDevices, d.GetName())
		}
		for _, d := range adj.GetLinux().GetDevices() {
			if p, ok := strings.CutPrefix(d.GetPath(), "-"); ok {
				cr.RemovedDevices = append(cr.RemovedDevices, p)
				continue
			}
			cr.Devices = append(cr.Devices, d.GetPath())
		}
		for _, m := range adj.GetMounts() {
			cr.Mounts = append(cr.Mounts, m.GetSource()+" -> "+m.GetDestination())
		}
		res := adj.GetLinux().GetResources()
		for _, d := range res.GetDevices() {
			verb := "deny"
			if d.GetAllow() {
				verb = "allow"
			}
			major, minor := "*", "*"
			if d.GetMajor() != nil {
				major = strconv.FormatInt(d.GetMajor().GetValue(), 10)
			}
			if d.GetMinor() != nil {
				minor = strconv.FormatInt(d.GetMinor().GetValue(), 10)
			}
			cr.CgroupRules = append(cr.CgroupRules, fmt.Sprintf("%s %s %s:%s %s", verb, d.GetType(), major, minor, d.GetAccess()))
		}
		if c := res.GetCpu(); c != nil {
			if c.GetCpus() != "" {
				cr.CPUs = c.GetCpus()
				ctr.Linux.Resources.Cpu.Cpus = c.GetCpus()
			}
			if c.GetMems() != "" {
				cr.Mems = c.GetMems()
				ctr.Linux.Resources.Cpu.Mems = c.GetMems()
			}
		}
	}
	cr.Env = env
	ctr.Env = ctr.Env[:0]
	for _, k := range sortedKeys(env) {
		ctr.Env = append(ctr.Env, k+"="+env[k])
	}
}

func (n *Node) removeContainer(ctx context.Context, sp *simPod, ctr *adaptation.Container) {
	logger := klog.FromContext(ctx)
	if _, err := n.rt.StopContainer(ctx, &adaptation.StopContainerRequest{Pod: sp.sandbox, Container: ctr}); err != nil {
		logger.Error(err, "NRI StopContainer", "container", ctr.Id)
	}
	ctr.State = adaptation.ContainerState_CONTAINER_STOPPED
	if err := n.rt.RemoveContainer(ctx, &adaptation.RemoveContainerRequest{Pod: sp.sandbox, Container: ctr}); err != nil {
		logger.Error(err, "NRI RemoveContainer", "container", ctr.Id)
	}
	n.rt.removeContainer(ctr.Id)
	sp.containers = slices.DeleteFunc(sp.containers, func(c *adaptation.Container) bool { return c == ctr })
}

// stopSandbox stops and removes a pod's containers and sandbox.
func (n *Node) stopSandbox(ctx context.Context, sp *simPod) {
	logger := klog.FromContext(ctx)
	for _, c := range slices.Clone(sp.containers) {
		n.removeContainer(ctx, sp, c)
	}
	sb := sp.sandbox
	if sb == nil {
		sb = &adaptation.PodSandbox{Id: "sb-" + string(sp.pod.UID), Name: sp.pod.Name, Namespace: sp.pod.Namespace, Uid: string(sp.pod.UID)}
	}
	if err := n.rt.StopPodSandbox(ctx, &adaptation.StopPodSandboxRequest{Pod: sb}); err != nil {
		logger.Error(err, "NRI StopPodSandbox", "pod", sp.key)
	}
	if err := n.rt.RemovePodSandbox(ctx, &adaptation.RemovePodSandboxRequest{Pod: sb}); err != nil {
		logger.Error(err, "NRI RemovePodSandbox", "pod", sp.key)
	}
	n.rt.removeSandbox(sb.Id)
	sp.sandbox = nil
}

// freeDevices frees a stopped pod's devices as the kubelet does: it leaves
// the device and topology managers and the active pods.
func (n *Node) freeDevices(sp *simPod) {
	n.dm.RemovePod(sp.pod.UID)
	n.active.remove(sp.pod.UID)
	n.dm.Manager().UpdateAllocatedDevices()
}

// teardown stops a pod and frees its devices.
func (n *Node) teardown(ctx context.Context, sp *simPod) {
	if !sp.failed && !sp.ended {
		n.stopSandbox(ctx, sp)
	}
	n.freeDevices(sp)
	delete(n.pods, sp.pod.UID)
	if err := removeRecord(n.cfg.StateDir, string(sp.pod.UID)); err != nil {
		klog.FromContext(ctx).Error(err, "Removing pod record", "pod", sp.key)
	}
}

func (n *Node) failPod(ctx context.Context, sp *simPod, rec *PodRecord, reason, msg string) error {
	sp.failed = true
	n.active.remove(sp.pod.UID)
	rec.Phase, rec.Reason, rec.Message = string(v1.PodFailed), reason, msg
	if err := writeRecord(n.cfg.StateDir, rec); err != nil {
		return err
	}
	now := metav1.Now()
	status := v1.PodStatus{Phase: v1.PodFailed, Reason: reason, Message: msg, StartTime: &now, HostIP: "127.0.0.1",
		HostIPs: []v1.HostIP{{IP: "127.0.0.1"}}}
	return n.patchStatus(ctx, sp.pod, status)
}

func (n *Node) setRunning(ctx context.Context, pod *v1.Pod) error {
	now := metav1.Now()
	status := v1.PodStatus{Phase: v1.PodRunning, StartTime: &now, HostIP: "127.0.0.1", HostIPs: []v1.HostIP{{IP: "127.0.0.1"}},
		PodIP: "10.88.0.1", PodIPs: []v1.PodIP{{IP: "10.88.0.1"}}}
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		status.Conditions = append(status.Conditions, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
	}
	for _, c := range pod.Spec.InitContainers {
		status.InitContainerStatuses = append(status.InitContainerStatuses, v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			ContainerID: "nri://" + string(pod.UID) + "-" + c.Name, Ready: true,
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}})
	}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			ContainerID: "nri://" + string(pod.UID) + "-" + c.Name, Ready: true, Started: ptr.To(true),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}})
	}
	return n.patchStatus(ctx, pod, status)
}

// patchStatus replaces the pod's status (keeping its PodScheduled
// condition) through the status subresource, conditional on the UID; a
// pod being deleted is left alone.
func (n *Node) patchStatus(ctx context.Context, pod *v1.Pod, status v1.PodStatus) error {
	return n.writePodStatus(ctx, pod, func(cur *v1.Pod) bool {
		if cur.DeletionTimestamp != nil {
			return false
		}
		// A copy each try: a retry after a conflict must not prepend the
		// PodScheduled condition a second time.
		st := status
		st.Conditions = nil
		for _, c := range cur.Status.Conditions {
			if c.Type == v1.PodScheduled {
				st.Conditions = append(st.Conditions, c)
			}
		}
		st.Conditions = append(st.Conditions, status.Conditions...)
		st.QOSClass = cur.Status.QOSClass
		cur.Status = st
		return true
	})
}

// writePodStatus writes through the status subresource what set makes of
// the pod's current copy (read afresh, retried on conflicts), when it is
// still the pod of pod's UID and set returns true.
func (n *Node) writePodStatus(ctx context.Context, pod *v1.Pod, set func(cur *v1.Pod) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := n.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.UID != pod.UID || !set(cur) {
			return nil
		}
		_, err = n.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// RecordJSON renders a record for logs.
func RecordJSON(r *PodRecord) string {
	b, _ := json.MarshalIndent(r, "", "  ")
	return string(b)
}
