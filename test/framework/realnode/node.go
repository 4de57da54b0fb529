// Package realnode runs a real Kubernetes node for the tests: kubelet,
// containerd (NRI and CDI on), runc and the CNI bridge plugin, and the
// node agent (tessera-node) against them exactly as its DaemonSet runs it:
// the kubelet's device-plugin directory, its PodResources socket, its
// configuration file and CPU manager state, containerd's NRI socket, and a
// CDI spec for the GPUs.
//
// Only the GPUs are mocked: the agent's NVML is a mock machine, and the
// GPUs' device nodes (/dev/nvidiaN, major 195) exist only in containers,
// where runc creates them from the CDI spec or the NRI adjustment and the
// device cgroup decides who may open them. Opening one that the cgroup
// allows fails with ENXIO (no driver behind it); one it denies fails with
// EPERM.
//
// The kubelet and the agent share a private mount namespace (a holder
// process made by unshare) in which /var/lib/kubelet/device-plugins is the
// node's own directory (the kubelet's device manager listens there,
// whatever its root directory) and /proc/devices lists the NVIDIA majors.
// containerd runs in the host's namespace, so pods must not use
// memory-backed volumes (service account tokens, secrets): the kubelet
// mounts those in its own namespace, where containerd does not see them.
//
// Everything it runs is built or installed by the project's own files:
// make test-node-deps (test/test.mk).
package realnode

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/freeport"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
	"github.com/tessera-gpu/tessera/test/framework/proc"
)

// DevicePluginDir is where the kubelet's device manager always listens.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// Bins are the programs a real node runs.
type Bins struct {
	Kubelet    string
	Containerd string
	Ctr        string
	// ShimDir holds containerd-shim-runc-v2; it is put first on
	// containerd's PATH.
	ShimDir   string
	Runc      string
	CNIBinDir string
	Busybox   string
	Agent     string
}

// EnvNodeBinDir names the directory of make node-bins' output.
const EnvNodeBinDir = "TESSERA_TEST_NODE_BIN_DIR"

// BinsFromEnv finds the node's programs: kubelet, containerd, ctr and the
// shim in $TESSERA_TEST_NODE_BIN_DIR, runc, busybox and the CNI plugins
// where Debian installs them; agent is tessera-node.
func BinsFromEnv(agent string) (Bins, error) {
	dir := os.Getenv(EnvNodeBinDir)
	if dir == "" {
		return Bins{}, fmt.Errorf("%s is not set: run make node-bins (test/test.mk) and point it at bin/node", EnvNodeBinDir)
	}
	b := Bins{
		Kubelet: filepath.Join(dir, "kubelet"), Containerd: filepath.Join(dir, "containerd"),
		Ctr: filepath.Join(dir, "ctr"), ShimDir: dir,
		CNIBinDir: "/usr/lib/cni", Agent: agent,
	}
	var err error
	if b.Runc, err = exec.LookPath("runc"); err != nil {
		return b, fmt.Errorf("runc (Debian's runc, make test-node-deps): %w", err)
	}
	if b.Busybox, err = exec.LookPath("busybox"); err != nil {
		return b, fmt.Errorf("busybox (Debian's busybox-static, make test-node-deps): %w", err)
	}
	for _, p := range []string{b.Kubelet, b.Containerd, b.Ctr, filepath.Join(dir, "containerd-shim-runc-v2"), filepath.Join(b.CNIBinDir, "bridge"), b.Agent} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("real node: %w (make test-node-deps)", err)
		}
	}
	return b, nil
}

// Options configure a node.
type Options struct {
	// Name is the node's name.
	Name string
	// Dir holds everything of the node (made when missing).
	Dir  string
	Bins Bins
	// Kubeconfig is the kubelet's; AgentKubeconfig the agent's (its
	// DaemonSet ServiceAccount's).
	Kubeconfig, AgentKubeconfig string
	// Bridge and PodCIDR name the CNI bridge and the pods' addresses
	// (default tessera-rn0, 10.231.0.0/24).
	Bridge, PodCIDR string
	// NoCDISpec leaves the node without a CDI spec for its GPUs (as a node
	// without the NVIDIA Container Toolkit's spec).
	NoCDISpec bool
	// AgentArgs are added to the agent's command line.
	AgentArgs []string
	// Logf reports progress (optional).
	Logf func(format string, args ...any)

	// KubeletPort and KubeletHealthzPort are picked when 0.
	KubeletPort, KubeletHealthzPort int
}

// Node is a running real node.
type Node struct {
	cfg    Options
	uuids  []string
	nodeIP string
	lock   *os.File

	mu         sync.Mutex
	holder     *proc.Proc
	containerd *proc.Proc
	kubelet    *proc.Proc
	agent      *proc.Proc
}

// GPUs is the mock machine's GPU count: two L40S on NUMA node 0 (CPU 0);
// NUMA node 1 (CPU 1) has none, so a GPU container's cpuset is CPU 0.
const GPUs = 2

// machine is the node's mock machine, fitted to this 2-CPU host so that
// the cpusets the NRI plugin derives from it are real.
func machine(name string) (*api.MockMachine, error) {
	m, err := nvmlmock.Load(nvmlmock.PCIe2NUMAName)
	if err != nil {
		return nil, err
	}
	m.Name = name
	m.NUMANodes = []api.MockNUMANode{{ID: 0, CPUs: "0"}, {ID: 1, CPUs: "1"}}
	m.GPUs = m.GPUs[:GPUs]
	m.PCIe = [][]string{{api.PCIeSelf, api.PCIeSingleSwitch}, {api.PCIeSingleSwitch, api.PCIeSelf}}
	return m, nil
}

// Start starts the node and waits until the kubelet registered it Ready
// and it advertises its GPUs.
func Start(ctx context.Context, client kubernetes.Interface, o Options) (n *Node, err error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	o.Bridge = cmp.Or(o.Bridge, "tessera-rn0")
	o.PodCIDR = cmp.Or(o.PodCIDR, "10.231.0.0/24")
	for _, p := range []*int{&o.KubeletPort, &o.KubeletHealthzPort} {
		if *p == 0 {
			if *p, err = freeport.Port(); err != nil {
				return nil, err
			}
		}
	}
	n = &Node{cfg: o}
	if n.nodeIP, err = hostIP(); err != nil {
		return nil, err
	}
	// One real node per machine: kubelets share the machine's cgroup tree
	// (each removes pod cgroups it does not know) and the CNI bridge.
	if n.lock, err = lockMachine(ctx); err != nil {
		return nil, err
	}
	started := n
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	for _, d := range []string{"logs", "containerd", "nri/plugins", "nri/conf", "cni", "cni-ipam", "cdi", "kubelet", "pod-logs", "device-plugins", "agent"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	m, err := machine(o.Name)
	if err != nil {
		return nil, err
	}
	if n.uuids, err = nodesim.MachineUUIDsOf(m); err != nil {
		return nil, err
	}
	b, err := yaml.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.path("machine.yaml"), b, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.path("fake-mps-control"), nodesim.FakeMPSControl(), 0o755); err != nil {
		return nil, err
	}
	procDevices, err := fakeProcDevices()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.path("proc-devices"), []byte(procDevices), 0o444); err != nil {
		return nil, err
	}
	for _, w := range []func() error{n.writeContainerdConfig, n.writeCNIConfig, n.writeKubeletConfig} {
		if err := w(); err != nil {
			return nil, err
		}
	}
	if !o.NoCDISpec {
		if err := n.WriteCDISpec(); err != nil {
			return nil, err
		}
	}
	if err := writeImageArchive(n.path("image.tar"), o.Bins.Busybox, []string{TestImage, SandboxImage}); err != nil {
		return nil, err
	}
	if err := n.startHolder(ctx); err != nil {
		return nil, err
	}
	o.Logf("real node %s: starting containerd", o.Name)
	if err := n.StartContainerd(ctx); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, o.Bins.Ctr, "--address", n.ContainerdSocket(), "-n", "k8s.io", "images", "import", "--no-unpack=false", n.path("image.tar")).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ctr images import: %w: %s", err, out)
	}
	o.Logf("real node %s: imported %s and %s; starting the kubelet", o.Name, TestImage, SandboxImage)
	if err := n.StartKubelet(ctx); err != nil {
		return nil, err
	}
	o.Logf("real node %s: starting tessera-node", o.Name)
	if err := n.StartAgent(ctx); err != nil {
		return nil, err
	}
	want := int64(GPUs)
	if o.NoCDISpec {
		// No GPU is offered until a spec names it.
		want = 0
	}
	if err := n.WaitGPUs(ctx, client, want, 3*time.Minute); err != nil {
		return nil, err
	}
	if err := untaintReady(ctx, client, o.Name); err != nil {
		return nil, err
	}
	return n, nil
}

// untaintReady removes the not-ready taint the kubelet registers its node
// with, as the node lifecycle controller (not run here) does once the node
// is Ready.
func untaintReady(ctx context.Context, client kubernetes.Interface, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != v1.TaintNodeNotReady {
				taints = append(taints, t)
			}
		}
		if len(taints) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = taints
		_, err = client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// UUIDs are the GPUs' UUIDs by index.
func (n *Node) UUIDs() []string { return n.uuids }

// Dir is the node's directory.
func (n *Node) Dir() string { return n.cfg.Dir }

func (n *Node) path(parts ...string) string {
	return filepath.Join(append([]string{n.cfg.Dir}, parts...)...)
}

// ContainerdSocket is containerd's gRPC socket.
func (n *Node) ContainerdSocket() string { return n.path("containerd.sock") }

// NRISocket is containerd's NRI socket.
func (n *Node) NRISocket() string { return n.path("nri.sock") }

// CDIDir is containerd's one CDI spec directory.
func (n *Node) CDIDir() string { return n.path("cdi") }

// KubeletRoot is the kubelet's --root-dir.
func (n *Node) KubeletRoot() string { return n.path("kubelet") }

// LogFiles names every process's log.
func (n *Node) LogFiles() map[string]string {
	out := map[string]string{}
	for _, p := range []string{"containerd", "kubelet", "tessera-node", "holder"} {
		out[n.cfg.Name+"-"+p] = n.path("logs", p+".log")
	}
	return out
}

// startHolder starts the process whose private mount namespace the kubelet
// and the agent enter: /var/lib/kubelet/device-plugins and /proc/devices
// are the node's own there.
func (n *Node) startHolder(ctx context.Context) error {
	if err := os.MkdirAll(DevicePluginDir, 0o755); err != nil {
		return err
	}
	ready := n.path("holder.ready")
	_ = os.Remove(ready)
	script := `set -e
mount --bind "$1" ` + DevicePluginDir + `
mount --bind "$2" /proc/devices
touch "$3"
exec sleep 2147483647`
	p, err := proc.Start("holder", "unshare", []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", n.path("device-plugins"), n.path("proc-devices"), ready}, n.path("logs", "holder.log"), nil)
	if err != nil {
		return err
	}
	n.holder = p
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("mount namespace holder exited: %s", proc.Tail(p.Log, 2000))
		}
		_, err := os.Stat(ready)
		return err == nil, nil
	})
}

// inNamespace runs bin in the holder's mount namespace.
func (n *Node) inNamespace(name, bin string, args []string, env []string) (*proc.Proc, error) {
	nsArgs := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--mount", "--", bin}, args...)
	return proc.Start(name, "nsenter", nsArgs, n.path("logs", name+".log"), env)
}

// StartContainerd starts containerd and waits for its socket.
func (n *Node) StartContainerd(ctx context.Context) error {
	env := append(os.Environ(), "PATH="+n.cfg.Bins.ShimDir+":"+os.Getenv("PATH"))
	p, err := proc.Start("containerd", n.cfg.Bins.Containerd, []string{"--config", n.path("containerd.toml")}, n.path("logs", "containerd.log"), env)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("containerd exited: %s", proc.Tail(p.Log, 3000))
		}
		err := exec.CommandContext(ctx, n.cfg.Bins.Ctr, "--address", n.ContainerdSocket(), "version").Run()
		return err == nil, nil
	})
}

// StartKubelet starts the kubelet in the node's mount namespace.
func (n *Node) StartKubelet(context.Context) error {
	args := []string{
		"--config=" + n.KubeletConfigPath(),
		"--kubeconfig=" + n.cfg.Kubeconfig,
		"--root-dir=" + n.KubeletRoot(),
		"--hostname-override=" + n.cfg.Name,
		"--node-ip=" + n.nodeIP,
		"--v=2",
	}
	p, err := n.inNamespace("kubelet", n.cfg.Bins.Kubelet, args, nil)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	return nil
}

// PodResourcesSocket is the kubelet's PodResources API socket.
func (n *Node) PodResourcesSocket() string {
	return filepath.Join(n.KubeletRoot(), "pod-resources", "kubelet.sock")
}

// StartAgent starts tessera-node in the node's mount namespace, with the
// paths its DaemonSet gives it.
func (n *Node) StartAgent(context.Context) error {
	args := append([]string{
		"--nvml=mock:" + n.path("machine.yaml"),
		"--device-plugin-dir=" + DevicePluginDir,
		"--pod-resources-socket=" + n.PodResourcesSocket(),
		"--kubeconfig=" + n.cfg.AgentKubeconfig,
		"--node-name=" + n.cfg.Name,
		"--nri-socket=" + n.NRISocket(),
		"--state-dir=" + n.path("agent"),
		"--mps-control=" + n.path("fake-mps-control"),
		"--proc-root=/proc",
		"--cpu-manager-state=" + filepath.Join(n.KubeletRoot(), "cpu_manager_state"),
		"--kubelet-config=" + n.KubeletConfigPath(),
		"--metrics-addr=",
		"--watchdog-action=none",
		"--memory-reserve-mib=1024",
		"--health-check-interval=5s",
		"--cdi-spec-dirs=" + n.CDIDir(),
		"--v=2",
	}, n.cfg.AgentArgs...)
	p, err := n.inNamespace("tessera-node", n.cfg.Bins.Agent, args, nil)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.agent = p
	n.mu.Unlock()
	return nil
}

// StopKubelet stops the kubelet: SIGTERM, then SIGKILL after grace.
func (n *Node) StopKubelet(grace time.Duration) { n.stop(&n.kubelet, grace) }

// StopContainerd stops containerd (its shims and containers go on
// running, as on a real node).
func (n *Node) StopContainerd(grace time.Duration) { n.stop(&n.containerd, grace) }

// StopAgent stops tessera-node: SIGTERM, then SIGKILL after grace (0:
// SIGKILL at once).
func (n *Node) StopAgent(grace time.Duration) { n.stop(&n.agent, grace) }

func (n *Node) stop(pp **proc.Proc, grace time.Duration) {
	n.mu.Lock()
	p := *pp
	*pp = nil
	n.mu.Unlock()
	if p != nil {
		p.Stop(grace)
	}
}

// WaitGPUs waits until the Node is Ready, the agent's inventory is
// published, and its allocatable holds want whole GPUs and all of their
// memory units with the inventory withholding none (for want 0: none of
// either).
func (n *Node) WaitGPUs(ctx context.Context, client kubernetes.Interface, want int64, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for what, p := range map[string]*proc.Proc{"kubelet": n.kubelet, "containerd": n.containerd, "tessera-node": n.agent} {
			if p != nil && p.Exited() {
				return false, fmt.Errorf("%s exited: %s", what, proc.Tail(p.Log, 3000))
			}
		}
		node, err := client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady {
				ready = c.Status == v1.ConditionTrue
				last = "Ready=" + string(c.Status) + ": " + c.Message
			}
		}
		if !ready {
			return false, nil
		}
		gpus := node.Status.Allocatable[api.ResourceGPU]
		mem, memCap := node.Status.Allocatable[api.ResourceGPUMemory], node.Status.Capacity[api.ResourceGPUMemory]
		last = fmt.Sprintf("allocatable %s=%s %s=%s of %s", api.ResourceGPU, gpus.String(), api.ResourceGPUMemory, mem.String(), memCap.String())
		inv, published, err := api.GetGPUInventory(node.Annotations)
		if err != nil {
			return false, fmt.Errorf("real node %s: %w", n.cfg.Name, err)
		}
		if !published {
			last += ", no GPU inventory published"
			return false, nil
		}
		if want == 0 {
			return gpus.Value() == 0 && mem.Value() == 0, nil
		}
		// The extender places pods by the inventory: until it offers every
		// GPU, a pod for the node is refused (and, on a quiet cluster,
		// retried only when something changes).
		if len(inv.WithheldFromWhole)+len(inv.WithheldFromShared) > 0 {
			last += fmt.Sprintf(", inventory withholds %v from whole and %v from shared use", inv.WithheldFromWhole, inv.WithheldFromShared)
			return false, nil
		}
		return gpus.Value() == want && mem.Value() > 0 && mem.Cmp(memCap) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("real node %s: %w (last: %s)", n.cfg.Name, err, last)
	}
	return nil
}

// Stop stops everything and removes what the node's pods left: the
// kubelet, the agent, every container (through the kubelet's runtime:
// containerd), containerd, the mount namespace, the CNI bridge.
func (n *Node) Stop() {
	n.StopAgent(5 * time.Second)
	n.StopKubelet(5 * time.Second)
	n.mu.Lock()
	ctrd := n.containerd
	n.mu.Unlock()
	if ctrd != nil && !ctrd.Exited() {
		n.removeContainers()
	}
	n.StopContainerd(5 * time.Second)
	if n.holder != nil {
		n.holder.Stop(time.Second)
	}
	n.killShims()
	if n.lock != nil {
		n.lock.Close() // releases the flock
	}
	_ = exec.Command("ip", "link", "delete", n.cfg.Bridge).Run()
}

// removeContainers kills and removes every task (pod sandboxes and
// containers) and container of the node's containerd, so that no shim or
// container outlives the node.
func (n *Node) removeContainers() {
	ctr := func(args ...string) string {
		out, _ := exec.Command(n.cfg.Bins.Ctr, append([]string{"--address", n.ContainerdSocket(), "-n", "k8s.io"}, args...)...).Output()
		return string(out)
	}
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		ids := strings.Fields(ctr("tasks", "list", "-q"))
		for _, id := range ids {
			ctr("tasks", "kill", "--all", "--signal", "SIGKILL", id)
			ctr("tasks", "delete", "--force", id)
		}
		return len(ids) == 0, nil
	})
	for _, id := range strings.Fields(ctr("containers", "list", "-q")) {
		ctr("containers", "delete", id)
	}
}

// killShims kills what is left of the node's shims, and their children:
// a shim outlives containerd, and its containers outlive it.
func (n *Node) killShims() {
	out, _ := exec.Command("pgrep", "-f", "containerd-shim-runc-v2 .*-address "+n.ContainerdSocket()).Output()
	for _, pid := range strings.Fields(string(out)) {
		_ = exec.Command("pkill", "-KILL", "-P", pid).Run()
		_ = exec.Command("kill", "-KILL", pid).Run()
	}
}

// machineLock is the file whose flock a running real node holds.
const machineLock = "/run/tessera-test-realnode.lock"

// lockMachine waits until no other real node runs on this machine (another
// test process's) and takes the lock.
func lockMachine(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile(machineLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		return err == nil, nil
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("another real node runs on this machine (%s stays locked): %w", machineLock, err)
	}
	return f, nil
}

// hostIP is the host's first global IPv4 address: the kubelet refuses a
// loopback node IP, and the API server reaches the kubelet (logs, exec) at
// the node's InternalIP.
func hostIP() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && ip.IP.IsGlobalUnicast() {
			return ip.IP.String(), nil
		}
	}
	return "", fmt.Errorf("no global IPv4 address for the kubelet's node IP (have %v)", addrs)
}
