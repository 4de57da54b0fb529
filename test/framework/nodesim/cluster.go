package nodesim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/freeport"
	"github.com/tessera-gpu/tessera/test/framework/install"
	"github.com/tessera-gpu/tessera/test/framework/proc"
)

// NodeSpec is one simulated node of a cluster.
type NodeSpec struct {
	Name    string
	Profile string
	Labels  map[string]string
	// TopologyPolicy, TopologyScope and CPUManagerPolicy are the kubelet's
	// (NodeConfig); empty: best-effort, container, none.
	TopologyPolicy, TopologyScope, CPUManagerPolicy string
	// AgentArgs are added to the node's tessera-node command line.
	AgentArgs []string
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
	// Scheduler, when set, is tessera-scheduler (scheduler/): it runs with
	// deploy/scheduler/scheduler-config.yaml, the extender in its process,
	// in place of kube-scheduler and the tessera-extender process (then
	// Extender is not needed, and the extender's restarts are the
	// scheduler's).
	Scheduler string
	// RepoRoot is the repository (deploy/ is read from it).
	RepoRoot string
	// ExtenderArgs are added to the extender's command line (see
	// LocalExtenderArgs).
	ExtenderArgs []string
	// ControllerManager runs kube-controller-manager with
	// controlplane.LocalControllers (Deployments, Jobs, ServiceAccounts,
	// garbage collection, ...), as make demo does.
	ControllerManager bool
	// VolcanoCRD installs Volcano's PodGroup CRD (a minimal copy,
	// test/framework/crds), as on a cluster that runs Volcano, so that
	// Volcano manifests are accepted (Tessera reads their PodGroups).
	VolcanoCRD bool
	// ControlPlane binaries (default controlplane.BinariesFromEnv()).
	ControlPlaneBinaries *controlplane.Binaries
	// Logf reports progress (optional).
	Logf func(format string, args ...any)
}

// LocalExtenderArgs are the extender flags of the local clusters that
// `make demo` and the end-to-end suite's shared cluster start, before any
// of their own: workloads that have waited 10 s (not the product's
// 10 min) and fit nowhere get a reservation, so that reservations show
// within a demo or a test. Flags given after them override them.
func LocalExtenderArgs() []string {
	return []string{"--reservation-wait=10s"}
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
	tls       *install.TLS
	mu        sync.Mutex
	extender  *proc.Proc
	nodes     map[string]*proc.Proc
	specs     []NodeSpec
}

// ExtenderUser is the identity tessera-extender runs as: its
// Deployment's ServiceAccount, so deploy/extender/rbac.yaml's bindings and
// the admission policy's exemption apply unchanged.
const ExtenderUser = install.ExtenderUserName

// AgentUser is the identity every tessera-node runs as: the DaemonSet's
// ServiceAccount, so deploy/node/rbac.yaml's bindings apply unchanged.
const AgentUser = install.NodeUserName

// StartCluster starts everything, installed as deploy/ says
// (framework/install): the RBAC of deploy/extender and deploy/node, the
// CRDs of deploy/crds, the admission policy of deploy/admission, the
// extender serving HTTPS (a CA and certificate made here) as its
// ServiceAccount, the gang webhook of deploy/extender/webhook.yaml pointed
// at it, kube-scheduler calling it over HTTPS, and node agents as theirs.
// It waits until every node advertises its GPUs with shared isolation.
func StartCluster(ctx context.Context, opts ClusterOptions) (c *Cluster, err error) {
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes()
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	bins := map[string]string{"tessera-nodesim": opts.NodeSim, "tessera-node": opts.Agent, "tessera-extender": opts.Extender}
	if opts.Scheduler != "" {
		delete(bins, "tessera-extender")
		bins["tessera-scheduler"] = opts.Scheduler
	}
	for what, p := range bins {
		if p == "" {
			return nil, fmt.Errorf("no %s binary given", what)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s binary: %w", what, err)
		}
	}
	c = &Cluster{opts: opts, nodes: map[string]*proc.Proc{}, specs: opts.Nodes}
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
	// `return nil, err` clears c before deferred calls run: stop what was
	// started through a copy.
	started := c
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}

	c.extUser = install.ExtenderUser()
	c.agentUser = install.NodeUser()
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
	// Installed as deploy/ says: RBAC, the CRDs and the admission policy,
	// then the extender, serving HTTPS, its gang webhook, and kube-scheduler
	// calling it.
	admin := c.CP.RESTConfig()
	if err := install.RBAC(ctx, admin, opts.RepoRoot); err != nil {
		return nil, err
	}
	if err := c.writeKubeconfigs(); err != nil {
		return nil, err
	}
	crds, err := install.CRDs(ctx, admin, opts.RepoRoot)
	if err != nil {
		return nil, err
	}
	opts.Logf("installed RBAC (%s) and the CRDs of deploy/crds: %s", strings.Join(install.RBACFiles(), ", "), strings.Join(crds, ", "))
	if opts.VolcanoCRD {
		if err := installVolcanoCRD(ctx, admin, opts.RepoRoot); err != nil {
			return nil, err
		}
		opts.Logf("installed Volcano's PodGroup CRD (%s)", volcanoCRD)
	}
	if err := install.AdmissionPolicy(ctx, admin, opts.RepoRoot); err != nil {
		return nil, err
	}
	opts.Logf("installed deploy/admission: Tessera's pod annotations are written only by its service accounts")
	if opts.ControllerManager {
		opts.Logf("starting kube-controller-manager (%d controllers: Deployments, Jobs, ServiceAccounts, garbage collection, ...)", len(controlplane.LocalControllers()))
		if err := c.CP.StartControllerManager(ctx, controlplane.ControllerManagerOptions{}); err != nil {
			return nil, err
		}
	}
	if c.tls, err = install.ServingCert(c.Dir); err != nil {
		return nil, err
	}
	if opts.Scheduler != "" {
		opts.Logf("starting tessera-scheduler with deploy/scheduler/scheduler-config.yaml (its extender serving HTTPS, as %s)", ExtenderUser)
	} else {
		opts.Logf("starting tessera-extender (HTTPS, as %s; its verbs only for kube-scheduler's client certificate)", ExtenderUser)
	}
	if err := c.StartExtender(ctx); err != nil {
		return nil, err
	}
	if err := install.GangWebhook(ctx, admin, opts.RepoRoot, "https://"+c.extAddr, c.tls.CAPEM); err != nil {
		return nil, err
	}
	opts.Logf("installed the gang webhook of deploy/extender/webhook.yaml at https://%s", c.extAddr)
	if opts.Scheduler == "" {
		schedCfg := filepath.Join(c.Dir, "scheduler-config.yaml")
		if err := install.SchedulerConfig(opts.RepoRoot, schedCfg, "https://"+c.extAddr, c.tls); err != nil {
			return nil, err
		}
		opts.Logf("starting kube-scheduler with deploy/extender/scheduler-config.yaml (a client certificate for the extender's verbs)")
		if err := c.CP.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: schedCfg}); err != nil {
			return nil, err
		}
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

// AgentKubeconfig is the node agents' kubeconfig (the DaemonSet
// ServiceAccount's identity), for nodes started beside the simulated ones.
func (c *Cluster) AgentKubeconfig() string { return c.agentKC }

// ExtenderURL is the extender's base URL (HTTPS on loopback), and
// ExtenderCAFile the CA that signed its certificate: what kubectl tessera
// needs, as --extender and --extender-ca, on a cluster whose Service
// proxy does not reach the extender.
func (c *Cluster) ExtenderURL() string    { return "https://" + c.extAddr }
func (c *Cluster) ExtenderCAFile() string { return c.tls.CAFile }

// Client is an admin client.
func (c *Cluster) Client() kubernetes.Interface { return c.CP.Client() }

// Nodes are the node specs.
func (c *Cluster) Nodes() []NodeSpec { return c.specs }

// NodeStateDir is a node's state directory (PodRecords, agent log).
func (c *Cluster) NodeStateDir(name string) string { return filepath.Join(c.Dir, "nodes", name) }

// LogFiles lists every process's log.
func (c *Cluster) LogFiles() map[string]string {
	out := c.CP.LogFiles()
	if c.opts.Scheduler == "" {
		out["tessera-extender"] = filepath.Join(c.Dir, "logs", "tessera-extender.log")
	}
	for _, n := range c.specs {
		out["nodesim-"+n.Name] = filepath.Join(c.Dir, "logs", "nodesim-"+n.Name+".log")
		out["tessera-node-"+n.Name] = filepath.Join(c.NodeStateDir(n.Name), "agent.log")
	}
	return out
}

// writeKubeconfigs writes the kubeconfigs of the extender and of the node
// agents, each with its ServiceAccount's identity.
func (c *Cluster) writeKubeconfigs() error {
	for _, k := range []struct {
		path *string
		file string
		user *controlplane.User
	}{
		{&c.extKC, "extender.kubeconfig", c.extUser},
		{&c.agentKC, "tessera-node.kubeconfig", c.agentUser},
	} {
		*k.path = filepath.Join(c.Dir, k.file)
		kc := clientcmdapi.NewConfig()
		kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.CP.APIServerURL, CertificateAuthority: c.CP.CAFile()}
		kc.AuthInfos["tessera"] = &clientcmdapi.AuthInfo{Token: k.user.Token}
		kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "tessera"}
		kc.CurrentContext = "local"
		if err := clientcmd.WriteToFile(*kc, *k.path); err != nil {
			return fmt.Errorf("write %s: %w", k.file, err)
		}
	}
	return nil
}

// StartExtender starts tessera-extender (again), or tessera-scheduler with
// ClusterOptions.Scheduler, and waits for the extender's /readyz.
func (c *Cluster) StartExtender(ctx context.Context) error {
	if c.extAddr == "" {
		addr, err := freeport.Addr()
		if err != nil {
			return err
		}
		c.extAddr = addr
	}
	pool, err := c.tls.CertPool()
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	c.mu.Lock()
	extra := slices.Clone(c.opts.ExtenderArgs)
	c.mu.Unlock()
	args := []string{"--kubeconfig=" + c.extKC, "--listen=" + c.extAddr, "--tls-cert=" + c.tls.CertFile, "--tls-key=" + c.tls.KeyFile, "--v=2"}
	if c.opts.Scheduler == "" {
		// The verbs answer only kube-scheduler (its client certificate,
		// install.SchedulerConfig), not every process that reaches the
		// port. tessera-scheduler serves no verbs.
		args = append(args, "--verbs-client-ca="+c.tls.CAFile)
	}
	args = append(args, extra...)
	exited := func() (bool, string) { return false, "" }
	if c.opts.Scheduler != "" {
		// The extender's flags are the plugin's; klog's --v is the
		// process's, the harness's.
		cfg := filepath.Join(c.Dir, "scheduler-config.yaml")
		if err := install.PluginSchedulerConfig(c.opts.RepoRoot, cfg, slices.DeleteFunc(args, func(a string) bool { return a == "--v=2" })); err != nil {
			return err
		}
		if err := c.CP.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: cfg, Binary: c.opts.Scheduler}); err != nil {
			return fmt.Errorf("tessera-scheduler: %w", err)
		}
	} else {
		p, err := proc.Start("tessera-extender", c.opts.Extender, args, filepath.Join(c.Dir, "logs", "tessera-extender.log"), nil)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.extender = p
		c.mu.Unlock()
		exited = func() (bool, string) { return p.Exited(), p.Log }
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if gone, log := exited(); gone {
			return false, fmt.Errorf("tessera-extender exited; see %s, which ends:\n%s", log, lastLines(proc.Tail(log, 4096), 5))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.extAddr+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// KillExtender kills tessera-extender (SIGKILL: what it had in memory is
// lost); with ClusterOptions.Scheduler it stops tessera-scheduler.
func (c *Cluster) KillExtender() {
	if c.opts.Scheduler != "" {
		_ = c.CP.StopScheduler()
		return
	}
	c.mu.Lock()
	p := c.extender
	c.extender = nil
	c.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// RestartExtenderWith kills tessera-extender and starts it again on the
// same address with args (replacing ClusterOptions.ExtenderArgs).
func (c *Cluster) RestartExtenderWith(ctx context.Context, args []string) error {
	c.KillExtender()
	c.mu.Lock()
	c.opts.ExtenderArgs = args
	c.mu.Unlock()
	return c.StartExtender(ctx)
}

// RestartExtender kills tessera-extender and starts it again on the same
// address.
func (c *Cluster) RestartExtender(ctx context.Context) error {
	c.KillExtender()
	return c.StartExtender(ctx)
}

// RestartAgent stops a node's tessera-node as the kubelet stops a
// DaemonSet's pod (SIGTERM); the node starts it again.
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
	for flag, v := range map[string]string{"topology-policy": n.TopologyPolicy, "topology-scope": n.TopologyScope, "cpu-manager-policy": n.CPUManagerPolicy} {
		if v != "" {
			args = append(args, "--"+flag+"="+v)
		}
	}
	if len(n.AgentArgs) > 0 {
		args = append(args, "--agent-args="+strings.Join(n.AgentArgs, " "))
	}
	if len(n.Labels) > 0 {
		var kv []string
		for _, k := range sortedKeys(n.Labels) {
			kv = append(kv, k+"="+n.Labels[k])
		}
		args = append(args, "--labels="+strings.Join(kv, ","))
	}
	p, err := proc.Start("nodesim-"+n.Name, c.opts.NodeSim, args, filepath.Join(c.Dir, "logs", "nodesim-"+n.Name+".log"), nil)
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
			if p != nil && p.Exited() {
				return false, fmt.Errorf("node simulator %s exited:\n%s", n.Name, proc.Tail(p.Log, 4096))
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
			// Every GPU is offered whole, but those in MIG mode: each of
			// their instances is offered as its profile's resource.
			whole, mig := int64(0), map[v1.ResourceName]int64{}
			for _, g := range inv.GPUs {
				if g.MIG == nil {
					whole++
					continue
				}
				for _, in := range g.MIG.Instances {
					mig[api.MIGResource(in.Profile)]++
				}
			}
			q := node.Status.Allocatable[api.ResourceGPU]
			if q.Value() != whole {
				last = fmt.Sprintf("node %s: allocatable %s = %s, want %d", n.Name, api.ResourceGPU, q.String(), whole)
				return false, nil
			}
			for r, want := range mig {
				if q := node.Status.Allocatable[r]; q.Value() != want {
					last = fmt.Sprintf("node %s: allocatable %s = %s, want %d", n.Name, r, q.String(), want)
					return false, nil
				}
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
	c.nodes = map[string]*proc.Proc{}
	ext := c.extender
	c.extender = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop(20 * time.Second) }()
	}
	wg.Wait()
	if ext != nil {
		ext.Stop(10 * time.Second)
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

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// volcanoCRD is a minimal copy of Volcano's PodGroup CRD.
const volcanoCRD = "test/framework/crds/volcano-podgroups.yaml"

// installVolcanoCRD creates volcanoCRD as the admin and waits until
// Volcano PodGroups are served.
func installVolcanoCRD(ctx context.Context, admin *rest.Config, repo string) error {
	a, err := install.NewApplier(admin)
	if err != nil {
		return err
	}
	if _, err := a.ApplyFiles(ctx, repo, volcanoCRD); err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = a.Dynamic().Resource(api.VolcanoPodGroupGVR).List(ctx, metav1.ListOptions{Limit: 1})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s is not served: %w (last list: %v)", volcanoCRD, err, last)
	}
	return nil
}
