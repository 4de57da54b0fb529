package nodesim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

// NodeSpec is one simulated node of a cluster.
type NodeSpec struct {
	Name    string
	Profile string
	Labels  map[string]string
}

// DefaultNodes are two dgx-a100, one dgx-1v and one pcie-2numa.
func DefaultNodes() []NodeSpec {
	return []NodeSpec{
		{Name: "a100-1", Profile: "dgx-a100"},
		{Name: "a100-2", Profile: "dgx-a100"},
		{Name: "v100-1", Profile: "dgx-1v"},
		{Name: "l40s-1", Profile: "pcie-2numa"},
	}
}

// ParseNodes parses "name=profile,name=profile" (or just "profile,profile",
// named after the profile).
func ParseNodes(s string) ([]NodeSpec, error) {
	var out []NodeSpec
	count := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, profile, ok := strings.Cut(part, "=")
		if !ok {
			profile = part
			count[profile]++
			name = fmt.Sprintf("%s-%d", profile, count[profile])
		}
		out = append(out, NodeSpec{Name: name, Profile: profile})
	}
	if len(out) == 0 {
		return nil, errors.New("no nodes")
	}
	return out, nil
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Dir holds everything (default: a new temporary directory, removed by
	// Stop).
	Dir string
	// Nodes (default DefaultNodes).
	Nodes []NodeSpec
	// Binaries: the node simulator, tessera-node and tessera-extender.
	NodeSim, Agent, Extender string
	// RepoRoot is the repository (deploy/extender is read from it).
	RepoRoot string
	// ExtenderArgs are added to the extender's command line.
	ExtenderArgs []string
	// ControlPlane binaries (default controlplane.BinariesFromEnv()).
	ControlPlaneBinaries *controlplane.Binaries
	// Logf reports progress (optional).
	Logf func(format string, args ...any)
}

// Cluster is a control plane, tessera-extender and simulated nodes, each
// its own process.
type Cluster struct {
	opts      ClusterOptions
	CP        *controlplane.ControlPlane
	Dir       string
	ownsDir   bool
	extUser   *controlplane.User
	extAddr   string
	extKC     string
	agentUser *controlplane.User
	agentKC   string
	mu        sync.Mutex
	extender  *proc
	nodes     map[string]*proc
	specs     []NodeSpec
}

// ExtenderUser is the identity tessera-extender runs as, bound to the
// ClusterRole of deploy/extender/rbac.yaml.
const ExtenderUser = "tessera-extender"

// AgentUser is the identity every tessera-node runs as: the DaemonSet's
// ServiceAccount, so deploy/node/rbac.yaml's binding applies unchanged.
const AgentUser = "system:serviceaccount:tessera-system:tessera-node"

// deployURL is the urlPrefix of deploy/extender/scheduler-config.yaml.
const deployURL = "http://tessera-extender.kube-system.svc:8888"

// StartCluster starts everything and waits until every node advertises its
// GPUs with shared isolation.
func StartCluster(ctx context.Context, opts ClusterOptions) (c *Cluster, err error) {
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes()
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	for what, p := range map[string]string{"tessera-nodesim": opts.NodeSim, "tessera-node": opts.Agent, "tessera-extender": opts.Extender} {
		if p == "" {
			return nil, fmt.Errorf("no %s binary given", what)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s binary: %w", what, err)
		}
	}
	c = &Cluster{opts: opts, nodes: map[string]*proc{}, specs: opts.Nodes}
	if opts.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "tessera-cluster-"); err != nil {
			return nil, err
		}
		c.ownsDir = true
	} else {
		c.Dir = opts.Dir
		if err := os.MkdirAll(c.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}

	c.extUser = &controlplane.User{Name: ExtenderUser}
	c.agentUser = &controlplane.User{Name: AgentUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:tessera-system"}}
	cpOpts := controlplane.Options{BaseDir: c.Dir, Users: []*controlplane.User{c.extUser, c.agentUser}}
	if opts.ControlPlaneBinaries != nil {
		cpOpts.Binaries = *opts.ControlPlaneBinaries
	} else if cpOpts.Binaries, err = controlplane.BinariesFromEnv(); err != nil {
		return nil, err
	}
	opts.Logf("starting etcd and kube-apiserver")
	if c.CP, err = controlplane.Start(ctx, cpOpts); err != nil {
		return nil, err
	}
	client := c.CP.Client()
	if err := c.extenderRBAC(ctx, client); err != nil {
		return nil, err
	}
	if err := c.agentRBAC(ctx, client); err != nil {
		return nil, err
	}
	crds, err := c.installCRDs(ctx)
	if err != nil {
		return nil, err
	}
	if len(crds) > 0 {
		opts.Logf("installed the CRDs of deploy/crds: %s", strings.Join(crds, ", "))
	}
	opts.Logf("starting tessera-extender")
	if err := c.StartExtender(ctx); err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(opts.RepoRoot, "deploy", "extender", "scheduler-config.yaml"))
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(raw, []byte(deployURL)) {
		return nil, fmt.Errorf("deploy/extender/scheduler-config.yaml does not use %s", deployURL)
	}
	schedCfg := filepath.Join(c.Dir, "scheduler-config.yaml")
	if err := os.WriteFile(schedCfg, bytes.ReplaceAll(raw, []byte(deployURL), []byte("http://"+c.extAddr)), 0o600); err != nil {
		return nil, err
	}
	opts.Logf("starting kube-scheduler with deploy/extender/scheduler-config.yaml")
	if err := c.CP.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: schedCfg}); err != nil {
		return nil, err
	}
	for _, n := range c.specs {
		opts.Logf("starting node %s (%s)", n.Name, n.Profile)
		if err := c.startNode(n); err != nil {
			return nil, err
		}
	}
	if err := c.WaitNodesReady(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	return c, nil
}

// Kubeconfig is the admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.CP.KubeconfigPath() }

// Client is an admin client.
func (c *Cluster) Client() kubernetes.Interface { return c.CP.Client() }

// Nodes are the node specs.
func (c *Cluster) Nodes() []NodeSpec { return c.specs }

// NodeStateDir is a node's state directory (PodRecords, agent log).
func (c *Cluster) NodeStateDir(name string) string { return filepath.Join(c.Dir, "nodes", name) }

// LogFiles lists every process's log.
func (c *Cluster) LogFiles() map[string]string {
	out := c.CP.LogFiles()
	out["tessera-extender"] = filepath.Join(c.Dir, "logs", "tessera-extender.log")
	for _, n := range c.specs {
		out["nodesim-"+n.Name] = filepath.Join(c.Dir, "logs", "nodesim-"+n.Name+".log")
		out["tessera-node-"+n.Name] = filepath.Join(c.NodeStateDir(n.Name), "agent.log")
	}
	return out
}

func (c *Cluster) extenderRBAC(ctx context.Context, client kubernetes.Interface) error {
	raw, err := os.ReadFile(filepath.Join(c.opts.RepoRoot, "deploy", "extender", "rbac.yaml"))
	if err != nil {
		return err
	}
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("rbac.yaml: %w", err)
		}
		if meta.Kind == "ClusterRole" {
			role = &rbacv1.ClusterRole{}
			if err := yaml.Unmarshal([]byte(doc), role); err != nil {
				return fmt.Errorf("rbac.yaml: %w", err)
			}
			break
		}
	}
	if role == nil {
		return errors.New("deploy/extender/rbac.yaml has no ClusterRole")
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-extender-local"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: ExtenderUser}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	c.extKC = filepath.Join(c.Dir, "extender.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.CP.APIServerURL, CertificateAuthority: c.CP.CAFile()}
	kc.AuthInfos[ExtenderUser] = &clientcmdapi.AuthInfo{Token: c.extUser.Token}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: ExtenderUser}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, c.extKC)
}

// agentRBAC applies deploy/node/rbac.yaml (ClusterRole and its binding to
// the tessera-node ServiceAccount) and writes the agents' kubeconfig.
func (c *Cluster) agentRBAC(ctx context.Context, client kubernetes.Interface) error {
	raw, err := os.ReadFile(filepath.Join(c.opts.RepoRoot, "deploy", "node", "rbac.yaml"))
	if err != nil {
		return err
	}
	var roles, bindings int
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("deploy/node/rbac.yaml: %w", err)
		}
		switch meta.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
				return err
			}
			if _, err := client.RbacV1().ClusterRoles().Create(ctx, &r, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			roles++
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
				return err
			}
			if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			bindings++
		}
	}
	if roles == 0 || bindings == 0 {
		return errors.New("deploy/node/rbac.yaml: want a ClusterRole and a ClusterRoleBinding")
	}
	c.agentKC = filepath.Join(c.Dir, "tessera-node.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.CP.APIServerURL, CertificateAuthority: c.CP.CAFile()}
	kc.AuthInfos["tessera-node"] = &clientcmdapi.AuthInfo{Token: c.agentUser.Token}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "tessera-node"}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, c.agentKC)
}

// StartExtender starts tessera-extender (again) and waits for /readyz.
func (c *Cluster) StartExtender(ctx context.Context) error {
	if c.extAddr == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		c.extAddr = l.Addr().String()
		l.Close()
	}
	args := append([]string{"--kubeconfig=" + c.extKC, "--listen=" + c.extAddr, "--v=2"}, c.opts.ExtenderArgs...)
	p, err := startProc("tessera-extender", c.opts.Extender, args, filepath.Join(c.Dir, "logs", "tessera-extender.log"), false)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.extender = p
	c.mu.Unlock()
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("tessera-extender exited; see %s", p.log)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.extAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// KillExtender kills tessera-extender (SIGKILL: what it had in memory is
// lost).
func (c *Cluster) KillExtender() {
	c.mu.Lock()
	p := c.extender
	c.extender = nil
	c.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// RestartExtender kills tessera-extender and starts it again on the same
// address.
func (c *Cluster) RestartExtender(ctx context.Context) error {
	c.KillExtender()
	return c.StartExtender(ctx)
}

// RestartAgent kills a node's tessera-node; the node starts it again.
func (c *Cluster) RestartAgent(ctx context.Context, node string) error {
	return Control(ctx, c.NodeStateDir(node), "restart-agent")
}

// RestartDeviceManager restarts a node's kubelet device manager (a kubelet
// restart: checkpoint kept, plugins register again).
func (c *Cluster) RestartDeviceManager(ctx context.Context, node string) error {
	return Control(ctx, c.NodeStateDir(node), "restart-device-manager")
}

func (c *Cluster) startNode(n NodeSpec) error {
	args := []string{"--name=" + n.Name, "--profile=" + n.Profile, "--kubeconfig=" + c.CP.KubeconfigPath(), "--agent-kubeconfig=" + c.agentKC,
		"--state-dir=" + c.NodeStateDir(n.Name), "--agent=" + c.opts.Agent, "--v=2"}
	if len(n.Labels) > 0 {
		var kv []string
		for _, k := range sortedKeys(n.Labels) {
			kv = append(kv, k+"="+n.Labels[k])
		}
		args = append(args, "--labels="+strings.Join(kv, ","))
	}
	p, err := startProc("nodesim-"+n.Name, c.opts.NodeSim, args, filepath.Join(c.Dir, "logs", "nodesim-"+n.Name+".log"), true)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nodes[n.Name] = p
	c.mu.Unlock()
	return nil
}

// WaitNodesReady waits until every node's agent has published its GPU
// inventory with shared isolation available and the node advertises its
// GPUs as allocatable.
func (c *Cluster) WaitNodesReady(ctx context.Context, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range c.specs {
			c.mu.Lock()
			p := c.nodes[n.Name]
			c.mu.Unlock()
			if p != nil && p.exited() {
				return false, fmt.Errorf("node simulator %s exited:\n%s", n.Name, fileTail(p.log, 4096))
			}
			node, err := c.CP.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				last = fmt.Sprintf("node %s: %v", n.Name, err)
				return false, nil
			}
			inv, ok, err := api.GetGPUInventory(node.Annotations)
			if !ok || err != nil || !inv.SharedIsolation {
				last = fmt.Sprintf("node %s: no GPU inventory with shared isolation yet (%v)", n.Name, err)
				return false, nil
			}
			q := node.Status.Allocatable[api.ResourceGPU]
			if q.Value() != int64(len(inv.GPUs)) {
				last = fmt.Sprintf("node %s: allocatable %s = %s, want %d", n.Name, api.ResourceGPU, q.String(), len(inv.GPUs))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the nodes: %w (last: %s)", err, last)
	}
	return nil
}

// EnsureNamespace creates a namespace and its default ServiceAccount.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	return c.CP.EnsureNamespace(ctx, ns)
}

// Stop stops every process and removes the directory when it made it.
func (c *Cluster) Stop() {
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = map[string]*proc{}
	ext := c.extender
	c.extender = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(20 * time.Second) }()
	}
	wg.Wait()
	if ext != nil {
		ext.stop(10 * time.Second)
	}
	if c.CP != nil {
		_ = c.CP.Stop()
	}
	if c.ownsDir {
		_ = os.RemoveAll(c.Dir)
	}
}

// NodeOf returns the node of a pod and its PodRecord (nil when the node
// has none).
func (c *Cluster) Record(p *v1.Pod) (*PodRecord, error) {
	if p.Spec.NodeName == "" {
		return nil, nil
	}
	return ReadRecord(c.NodeStateDir(p.Spec.NodeName), string(p.UID))
}

// --- processes ---

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(name, bin string, args []string, logPath string, group bool) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s %s at %s\n", bin, strings.Join(args, " "), time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM, waits up to grace, then kills the whole process
// group (the node simulator's agent and MPS daemons are in it).
func (p *proc) stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
