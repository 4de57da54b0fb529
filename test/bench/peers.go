package main

// The side-by-side benchmark (`make bench-peers`, --peers): on the same
// control plane and fake nodes as the throughput benchmark, the same GPU
// pods through
//
//	kube-scheduler      kube-scheduler alone (deploy/'s configuration
//	                    without its extenders)
//	tessera             kube-scheduler + tessera-extender (deploy/'s)
//	tessera-plugin      tessera-scheduler: kube-scheduler with Tessera's
//	                    plugin, the extender in its process
//	                    (deploy/scheduler/'s configuration)
//	hami                kube-scheduler + HAMi's scheduler extender (its
//	                    chart's configuration)
//	scheduler-plugins   scheduler-plugins' kube-scheduler with
//	                    Coscheduling and CapacityScheduling
//
// and three workloads: whole GPUs (1, 1, 2, 4 GPUs), the throughput
// benchmark's mix of whole GPUs and shared slices (systems that share a
// GPU: tessera, tessera-plugin, hami), and gangs (M members x G GPUs, one
// after the other, earlier gangs staying bound); or, on a cluster of its
// own, the trace replay (trace.go). tessera-plugin runs what tessera runs
// (isTessera). See docs/bench.md.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

const (
	sysKube    = "kube-scheduler"
	sysTessera = "tessera"
	sysPlugin  = "tessera-plugin"
	sysHAMi    = "hami"
	sysSP      = "scheduler-plugins"

	wlWhole = "whole"
	wlMixed = "mixed"
	wlGang  = "gang"
)

var (
	allSystems   = []string{sysKube, sysTessera, sysPlugin, sysHAMi, sysSP}
	allWorkloads = []string{wlWhole, wlMixed, wlGang}
	// knownWorkloads are those --peer-workloads accepts: the defaults and
	// the trace replay, which runs alone on its own cluster.
	knownWorkloads = append(append([]string(nil), allWorkloads...), wlTrace)
)

// systemLabel is how the report names a system.
var systemLabel = map[string]string{
	sysKube:    "kube-scheduler",
	sysTessera: "kube-scheduler + tessera-extender",
	sysPlugin:  "tessera-scheduler (in-process plugin)",
	sysHAMi:    "kube-scheduler + HAMi extender",
	sysSP:      "scheduler-plugins (coscheduling, capacityscheduling)",
}

// peerConfig are the flags of --peers.
type peerConfig struct {
	enabled     bool
	systems     []string
	workloads   []string
	binDir      string
	gangs       int
	gangMembers []int // one gang workload per size
	gangGPUs    int
	svg         string
	// scorePercent, when not negative, is set as percentageOfNodesToScore
	// in every system's configuration (0: kube-scheduler's adaptive
	// default).
	scorePercent int
	// trace: the trace replay (trace.go).
	trace traceConfig
}

func addPeerFlags(fs *flag.FlagSet, pc *peerConfig) {
	fs.BoolVar(&pc.enabled, "peers", false, "run the side-by-side benchmark of kube-scheduler, tessera (extender and in-process plugin), HAMi and scheduler-plugins (make bench-peers) instead")
	list := func(dst *[]string, allowed []string) func(string) error {
		return func(v string) error {
			*dst = nil
			for _, f := range strings.Split(v, ",") {
				f = strings.TrimSpace(f)
				ok := false
				for _, a := range allowed {
					ok = ok || a == f
				}
				if !ok {
					return fmt.Errorf("%q is none of %s", f, strings.Join(allowed, ","))
				}
				*dst = append(*dst, f)
			}
			return nil
		}
	}
	fs.Func("peer-systems", "with --peers: systems to run, comma-separated (default "+strings.Join(allSystems, ",")+")", list(&pc.systems, allSystems))
	fs.Func("peer-workloads", "with --peers: workloads, comma-separated, of "+strings.Join(knownWorkloads, ",")+" (default "+strings.Join(allWorkloads, ",")+"); trace runs alone, on a cluster shaped like the trace's nodes (--trace-*)", list(&pc.workloads, knownWorkloads))
	fs.StringVar(&pc.binDir, "peer-bin-dir", "", "with --peers: where make peer-bins put the peers (default <repo>/bin/peers)")
	fs.IntVar(&pc.gangs, "gangs", 3, "with --peers: gangs per system and node count, one after the other")
	pc.gangMembers = []int{16}
	fs.Func("gang-members", "with --peers: members of each gang; several sizes, comma-separated, run one after the other (default 16)", func(v string) error {
		pc.gangMembers = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("%q is no positive member count", f)
			}
			pc.gangMembers = append(pc.gangMembers, n)
		}
		return nil
	})
	fs.IntVar(&pc.gangGPUs, "gang-gpus", 8, "with --peers: whole GPUs of each gang member")
	fs.StringVar(&pc.svg, "svg", "", "with --peers: write the plot (SVG) to this file")
	addTraceFlags(fs, &pc.trace)
	fs.IntVar(&pc.scorePercent, "peer-score-percent", -1, "with --peers: set percentageOfNodesToScore to this in every system's scheduler configuration (0: kube-scheduler's adaptive default; negative: each as its project configures it)")
}

// isTessera says whether system is Tessera's extender, as its own process
// (tessera) or in tessera-scheduler (tessera-plugin): its pods ask for
// Tessera's resources and carry what its webhooks would add, and it
// places, shares and gangs as the extender does.
func isTessera(system string) bool { return system == sysTessera || system == sysPlugin }

// supports says whether system runs workload: shared slices only where
// the system places them on a GPU (kube-scheduler and scheduler-plugins
// count extended resources per node, with no GPU to share).
func supports(system, workload string) bool {
	return workload != wlMixed || sharesGPU(system)
}

// allOrNothing says whether system binds a gang all or nothing.
func allOrNothing(system string) bool { return isTessera(system) || system == sysSP }

// peerResult is one system's run of one workload at one node count.
type peerResult struct {
	nodes            int
	system, workload string
	res              runResult       // whole, mixed
	gangMembers      int             // gang: members of each gang
	gangs            []time.Duration // gang: last member created -> all bound
	gangFirst        []time.Duration // gang: first create -> all bound
	latency          map[string]latencySummary
	// placements: tessera, tessera-plugin: pods the extender bound in
	// the run, by kind (its /metrics).
	placements map[string]float64
	trace      *traceRun // trace
	note       string
	err        error
}

// peerEnv is what every system's run shares.
type peerEnv struct {
	c                  *config
	dir                string
	cp                 *controlplane.ControlPlane
	client             kubernetes.Interface
	dyn                dynamic.Interface
	ns                 string
	logf               func(string, ...any)
	nodes              int
	bins               map[string]string
	withCfg            string // tessera: deploy's config pointed at the tessera proxy
	pluginCfg          string // tessera-plugin: deploy/scheduler's config
	pluginAddr         string // tessera-plugin: the extender's --listen
	without            string // kube-scheduler alone
	hamiCfg            string
	extKube            string // kubeconfigs
	hamiKube, spKube   string
	extAddr, hamiAddr  string
	tessProxy, hamiPrx *timingProxy
	// sample is the trace replay's sample and cluster; simulated what
	// tessera-sim's policies make of it.
	sample *traceSample
	// crds: scheduler-plugins' CRDs are installed (PodGroups to delete).
	crds bool
}

func runPeers(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	pc := &c.peers
	if len(pc.systems) == 0 {
		pc.systems = allSystems
	}
	if len(pc.workloads) == 0 {
		pc.workloads = allWorkloads
	}
	if pc.gangGPUs <= 0 || pc.gangGPUs > gpusPerNode || pc.gangs < 0 {
		return fmt.Errorf("--gang-gpus must be within 1..%d, --gangs not negative", gpusPerNode)
	}
	if pc.binDir == "" {
		pc.binDir = filepath.Join(c.repo, "bin", "peers")
	}
	logf := stampedLogf(stderr)
	began := time.Now()
	load0 := loadavg()
	var (
		sample    *traceSample
		simulated []simOutcome
	)
	nodeCounts := c.nodes
	if contains(pc.workloads, wlTrace) {
		if len(pc.workloads) > 1 {
			return fmt.Errorf("--peer-workloads: %s runs alone (on a cluster of its own), not with %s", wlTrace, strings.Join(pc.workloads, ","))
		}
		var err error
		if sample, err = loadTraceSample(c); err != nil {
			return err
		}
		nodeCounts = []int{len(sample.nodes)}
		logf("trace replay: %d of %d pods of %s (seed %d), %d of %d nodes, %d GPUs; --nodes is not used",
			len(sample.pods), len(sample.trace.Pods), sample.trace.Workload, pc.trace.seed, len(sample.nodes), len(sample.trace.Nodes), sample.gpus())
		if simulated, err = simulateAll(sample, logf); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "tessera-bench-peers-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)

	e := &peerEnv{c: c, dir: dir, ns: "bench", logf: logf, bins: map[string]string{}, sample: sample}
	has := func(s string) bool {
		for _, x := range pc.systems {
			if x == s {
				return true
			}
		}
		return false
	}
	needCRDs := has(sysSP) || contains(pc.workloads, wlGang)
	for _, b := range []struct {
		system, name string
		need         bool
	}{
		{sysHAMi, "hami-scheduler", has(sysHAMi)},
		{sysSP, "scheduler-plugins-scheduler", has(sysSP)},
		{"crds", "scheduler-plugins-crds/podgroups.yaml", needCRDs},
	} {
		p := filepath.Join(pc.binDir, b.name)
		if _, err := os.Stat(p); err != nil {
			if b.need {
				return fmt.Errorf("%w: %s (run `make peer-bins`; docs/bench.md): %w", errNoBinary, p, err)
			}
			continue
		}
		e.bins[b.system] = p
	}
	if has(sysTessera) {
		logf("building tessera-extender")
		if e.bins[sysTessera], err = buildExtender(ctx, c.repo, dir); err != nil {
			return err
		}
	}
	if has(sysPlugin) {
		logf("building tessera-scheduler")
		if e.bins[sysPlugin], err = buildScheduler(ctx, c.repo, dir); err != nil {
			return err
		}
	}
	bins, err := controlplane.BinariesFromEnv()
	if err != nil {
		return err
	}
	extUser := &controlplane.User{Name: extenderUser}
	hUser := &controlplane.User{Name: hamiUser}
	// scheduler-plugins' kube-scheduler runs as kube-scheduler's own
	// identity (a second token), so it gets the same bootstrap roles.
	spUser := &controlplane.User{Name: controlplane.SchedulerUser}
	users := map[string]*controlplane.User{extUser.Name: extUser, hUser.Name: hUser, spUser.Name: spUser}
	logf("starting etcd and kube-apiserver")
	cp, err := controlplane.Start(ctx, controlplane.Options{Binaries: bins, BaseDir: dir, Users: []*controlplane.User{extUser, hUser, spUser}})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	e.cp = cp
	defer func() {
		if c.keepLogs != "" {
			copyLogs(cp, c.keepLogs, logf)
			copyPeerLogs(dir, c.keepLogs, logf)
		}
		if err := cp.Stop(); err != nil {
			logf("stop control plane: %v", err)
		}
	}()
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	if e.client, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if e.dyn, err = dynamic.NewForConfig(rc); err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if err := cp.EnsureNamespace(ctx, e.ns); err != nil {
		return err
	}
	kubeconfigFor := func(user, file string) (string, error) {
		path := filepath.Join(dir, file)
		kc := clientcmdapi.NewConfig()
		kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.CAFile()}
		kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: users[user].Token}
		kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: user}
		kc.CurrentContext = "bench"
		if err := clientcmd.WriteToFile(*kc, path); err != nil {
			return "", fmt.Errorf("write kubeconfig %s: %w", file, err)
		}
		return path, nil
	}
	if needCRDs {
		logf("installing scheduler-plugins' CRDs (PodGroup, ElasticQuota)")
		if err := installSPCRDs(ctx, rc, filepath.Dir(e.bins["crds"])); err != nil {
			return err
		}
		e.crds = true
	}
	if e.extKube, err = setupExtenderAccess(ctx, cp, e.client, extUser, c.repo, dir); err != nil {
		return err
	}
	if e.hamiKube, err = setupHAMiAccess(ctx, e.client, kubeconfigFor); err != nil {
		return err
	}
	if has(sysSP) {
		if e.spKube, err = setupSPAccess(ctx, e.client, kubeconfigFor, spUser.Name); err != nil {
			return err
		}
	}
	if e.extAddr, err = freeAddr(); err != nil {
		return err
	}
	if e.hamiAddr, err = freeAddr(); err != nil {
		return err
	}
	if e.tessProxy, err = startTimingProxy("http://" + e.extAddr); err != nil {
		return err
	}
	defer e.tessProxy.close()
	if e.hamiPrx, err = startTimingProxy("http://" + e.hamiAddr); err != nil {
		return err
	}
	defer e.hamiPrx.close()
	if e.withCfg, e.without, err = schedulerConfigs(c.repo, dir, e.tessProxy.addr()); err != nil {
		return err
	}
	cfgs := []string{e.withCfg, e.without}
	if has(sysPlugin) {
		if e.pluginAddr, err = freeAddr(); err != nil {
			return err
		}
		if e.pluginCfg, err = pluginConfig(c.repo, dir, pluginFlags(e.extKube, e.pluginAddr, c.extenderFlags)); err != nil {
			return err
		}
		cfgs = append(cfgs, e.pluginCfg)
	}
	e.hamiCfg = filepath.Join(dir, "scheduler-hami.yaml")
	if err := os.WriteFile(e.hamiCfg, []byte(hamiSchedulerConfig("http://"+e.hamiPrx.addr(), "hami-scheduler")), 0o600); err != nil {
		return fmt.Errorf("write HAMi scheduler config: %w", err)
	}
	if pc.scorePercent >= 0 {
		for _, f := range append(cfgs, e.hamiCfg) {
			if err := setScorePercent(f, pc.scorePercent); err != nil {
				return err
			}
		}
	}

	var (
		results     []peerResult
		interrupted error
	)
nodeCounts:
	for _, n := range nodeCounts {
		t0 := time.Now()
		gpus := n * gpusPerNode
		if sample != nil {
			logf("creating the trace's %d nodes", n)
			if err := createTraceNodes(ctx, e.client, sample.nodes, c.nodeWorkers); err != nil {
				return err
			}
			gpus = sample.gpus()
		} else {
			logf("creating nodes %d..%d", e.nodes, n-1)
			if err := createNodesWith(ctx, e.client, e.nodes, n, c.nodeWorkers, peerNode); err != nil {
				return err
			}
		}
		e.nodes = n
		logf("%d nodes (created in %s)", n, time.Since(t0).Round(time.Millisecond))
		if needCRDs {
			if err := createElasticQuota(ctx, e.dyn, e.ns, gpus); err != nil {
				return err
			}
		}
		for _, s := range pc.systems {
			rs, err := e.runSystem(ctx, s)
			results = append(results, rs...)
			if err != nil {
				if ctx.Err() != nil {
					// Interrupted: report what was measured.
					interrupted = err
					break nodeCounts
				}
				logf("%s at %d nodes: %v", s, n, err)
				results = append(results, peerResult{nodes: n, system: s, err: err})
			}
			if err := e.cleanup(ctx); err != nil {
				return err
			}
		}
	}
	if interrupted != nil {
		fmt.Fprintf(stdout, "\ninterrupted (%v): the report has the runs finished before\n", interrupted)
	}
	reportPeers(stdout, c, e, results, load0, loadavg(), time.Since(began))
	reportTrace(stdout, c, sample, results, simulated)
	if pc.svg != "" {
		if err := os.WriteFile(pc.svg, []byte(peersSVG(c, results)), 0o644); err != nil {
			return fmt.Errorf("write plot: %w", err)
		}
		logf("plot written to %s", pc.svg)
	}
	if interrupted != nil {
		return interrupted
	}
	for _, r := range results {
		if r.err != nil {
			return errors.New("some runs failed (see the report)")
		}
	}
	return nil
}

// setupSealKeyAccess creates deploy/extender's Role for the seal key
// (tessera-extender reads, or creates, the Secret tessera-seal-key in
// kube-system before it serves) and binds it to user.
func setupSealKeyAccess(ctx context.Context, client kubernetes.Interface, repo, user string) error {
	var role rbacv1.Role
	if err := readDeploy(repo, "rbac.yaml", "Role", &role); err != nil {
		return err
	}
	if _, err := client.RbacV1().Roles(role.Namespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Role %s: %w", role.Name, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-bench", Namespace: role.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	if _, err := client.RbacV1().RoleBindings(role.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create RoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// setScorePercent sets percentageOfNodesToScore in the
// KubeSchedulerConfiguration file path.
func setScorePercent(path string, pct int) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read scheduler config: %w", err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("parse scheduler config %s: %w", path, err)
	}
	cfg["percentageOfNodesToScore"] = pct
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("marshal scheduler config: %w", err)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		return fmt.Errorf("write scheduler config: %w", err)
	}
	return nil
}

// pluginFlags are the Tessera plugin's args in tessera-scheduler: the
// flags the tessera system's extender process runs with (extenderArgs and
// --extender-flag), but for its --v: klog's flags are the process's, and
// tessera-scheduler logs at the harness's verbosity like kube-scheduler.
func pluginFlags(kubeconfig, addr string, extra []string) []string {
	var out []string
	for _, f := range extenderArgs(kubeconfig, addr) {
		if !strings.HasPrefix(f, "--v=") {
			out = append(out, f)
		}
	}
	return append(out, extra...)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// cleanup deletes the pods and PodGroups of a run.
func (e *peerEnv) cleanup(ctx context.Context) error {
	if err := deletePods(ctx, e.client, e.ns, 2*time.Minute); err != nil {
		return err
	}
	if e.crds {
		return deletePodGroups(ctx, e.dyn, e.ns)
	}
	return nil
}

// runSystem starts system, runs every workload it supports, and stops it.
func (e *peerEnv) runSystem(ctx context.Context, system string) ([]peerResult, error) {
	c, pc := e.c, &e.c.peers
	var (
		proxy  *timingProxy
		procs  []*extenderProc
		ext    *extenderProc // tessera, tessera-plugin: its /metrics
		agent  *hamiNodeAgent
		tAgent *tesseraNodeAgent
		note   string
	)
	stopAll := func() {
		agent.stop()
		tAgent.stop()
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}
	defer stopAll()
	schedName := "tessera-scheduler"
	startKube := func(cfg string) error {
		if err := e.cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: cfg, Args: []string{schedulerMetricsArg}}); err != nil {
			return fmt.Errorf("start kube-scheduler: %w", err)
		}
		return nil
	}
	// startAgent starts tessera's node-agent stand-in for the trace
	// replay (the seal key exists once the extender is ready).
	startAgent := func() error {
		if e.sample == nil || !pc.trace.tesseraAgent {
			return nil
		}
		gpus := map[string]int{}
		for _, n := range e.sample.nodes {
			gpus[n.Name] = n.GPUs
		}
		var err error
		tAgent, err = startTesseraNodeAgent(ctx, e.client, e.ns, "kube-system", func(n string) int { return gpus[n] }, 4)
		return err
	}
	kubeRunning := false
	defer func() {
		if kubeRunning {
			if err := e.cp.StopScheduler(); err != nil {
				e.logf("stop kube-scheduler: %v", err)
			}
		}
	}()
	e.logf("%s: starting at %d nodes", system, e.nodes)
	switch system {
	case sysKube:
		if err := startKube(e.without); err != nil {
			return nil, err
		}
		kubeRunning = true
	case sysTessera:
		var err error
		ext, err = startExtender(ctx, e.bins[sysTessera], e.extKube, e.extAddr, filepath.Join(e.dir, fmt.Sprintf("extender-%d.log", e.nodes)), c.extenderFlags, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		procs = append(procs, ext)
		proxy = e.tessProxy
		if err := startAgent(); err != nil {
			return nil, err
		}
		if err := startKube(e.withCfg); err != nil {
			return nil, err
		}
		kubeRunning = true
	case sysPlugin:
		if err := e.cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: e.pluginCfg, Binary: e.bins[sysPlugin], Args: []string{schedulerMetricsArg}}); err != nil {
			return nil, fmt.Errorf("start tessera-scheduler: %w", err)
		}
		kubeRunning = true
		// The extender in the scheduler's process serves its /readyz on
		// its --listen once its caches are in.
		if err := waitReady(ctx, "http://"+e.pluginAddr+"/readyz", 2*time.Minute); err != nil {
			return nil, fmt.Errorf("tessera-scheduler's extender: %w\nlog tail:\n%s", err, schedulerLogTail(e.cp))
		}
		ext = &extenderProc{addr: e.pluginAddr} // its /metrics only
		if err := startAgent(); err != nil {
			return nil, err
		}
	case sysHAMi:
		h, err := startHAMi(ctx, e.bins[sysHAMi], e.hamiKube, e.hamiAddr, e.dir, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		procs = append(procs, h)
		t0 := time.Now()
		if err := waitHAMiRegistered(ctx, e.client, e.nodes, 20*time.Minute); err != nil {
			return nil, fmt.Errorf("%w; HAMi log:\n%s", err, tail(h.logPath))
		}
		e.logf("hami: every node handshaken in %s", time.Since(t0).Round(time.Millisecond))
		if agent, err = startHAMiNodeAgent(ctx, e.client, e.ns, 4); err != nil {
			return nil, err
		}
		proxy = e.hamiPrx
		schedName = "hami-scheduler"
		if err := startKube(e.hamiCfg); err != nil {
			return nil, err
		}
		kubeRunning = true
	case sysSP:
		p, _, err := startSPScheduler(ctx, e.bins[sysSP], e.spKube, e.dir, pc.scorePercent, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		schedName = spProfile
	}
	select {
	case <-time.After(c.settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if proxy != nil {
		proxy.take() // calls before the run (none expected)
	}
	// placed0 is the extender's placements counter before each run.
	var placed0 map[string]float64
	if ext != nil {
		var err error
		if placed0, err = extenderPlacements(ctx, ext); err != nil {
			return nil, err
		}
	}

	type job struct {
		workload string
		members  int
	}
	var jobs []job
	for _, wl := range pc.workloads {
		switch {
		case !supports(system, wl):
		case wl == wlGang:
			for _, m := range pc.gangMembers {
				jobs = append(jobs, job{wl, m})
			}
		default:
			jobs = append(jobs, job{workload: wl})
		}
	}
	var out []peerResult
	for _, j := range jobs {
		wl := j.workload
		r := peerResult{nodes: e.nodes, system: system, workload: wl, gangMembers: j.members, note: note}
		run := fmt.Sprintf("n%d-%s-%s", e.nodes, shortName(system), wl)
		if wl == wlGang {
			run = fmt.Sprintf("%s%d", run, j.members)
		}
		switch wl {
		case wlWhole, wlMixed:
			e.logf("%s: %s: creating %d pods", system, wl, c.pods)
			res, err := measureWith(ctx, e.client, e.ns, run, c.pods, c.podWorkers, c.runTimeout, func(i int) *v1.Pod {
				return peerPod(system, e.ns, schedName, run, i, shapeOf(wl, i))
			})
			if err != nil {
				r.err = fmt.Errorf("%s %s: %w", system, wl, err)
			} else {
				r.res = res
				e.logf("%s: %s: %d pods bound in %s: %.1f pods/s", system, wl, res.pods, res.boundIn.Round(time.Millisecond), res.podsPerSecond())
			}
		case wlTrace:
			e.logf("%s: trace: creating %d pods one after the other", system, len(e.sample.pods))
			tr, err := e.runTrace(ctx, system, schedName, run)
			if err != nil {
				r.err = fmt.Errorf("%s trace: %w", system, err)
			}
			if tr.settledIn > 0 {
				r.trace = &tr
				o := tr.outcome
				e.logf("%s: trace: %d of %d pods placed, unallocated GPU %.2f%%, last bound after %s", system, o.placed, o.pods, o.point.UnallocatedPct, tr.lastBound.Round(time.Millisecond))
			}
		case wlGang:
			for g := range pc.gangs {
				name := fmt.Sprintf("%s-%d", run, g)
				if err := createPodGroup(ctx, e.dyn, e.ns, name, j.members); err != nil {
					return out, err
				}
				s := shape{name: fmt.Sprintf("gang%dx%d", j.members, pc.gangGPUs), gpus: int64(pc.gangGPUs)}
				res, err := measureWith(ctx, e.client, e.ns, name, j.members, c.podWorkers, c.runTimeout, func(i int) *v1.Pod {
					p := peerPod(system, e.ns, schedName, name, i, s)
					p.Labels[api.LabelPodGroup] = name
					if isTessera(system) {
						// What Tessera's gang webhook adds to a member.
						p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
					}
					return p
				})
				if err != nil {
					r.err = fmt.Errorf("%s gang %d: %w", system, g, err)
					break
				}
				r.gangs = append(r.gangs, res.boundIn-res.createdIn)
				r.gangFirst = append(r.gangFirst, res.boundIn)
				e.logf("%s: gang %d (%d x %d GPUs): last member created -> all bound %s", system, g, j.members, pc.gangGPUs, (res.boundIn - res.createdIn).Round(time.Millisecond))
			}
		}
		if proxy != nil || ext != nil {
			// The informer can see the last Binding before the bind call
			// has returned to kube-scheduler through the proxy, or before
			// the extender has counted it.
			time.Sleep(time.Second)
		}
		if proxy != nil {
			r.latency = proxy.take()
		}
		if ext != nil {
			placed, err := extenderPlacements(ctx, ext)
			if err != nil {
				return out, err
			}
			r.placements = map[string]float64{}
			for k, v := range placed {
				r.placements[k] = v - placed0[k]
			}
			placed0 = placed
		}
		if tAgent != nil {
			records, failures, lastErr := tAgent.counts()
			r.note = fmt.Sprintf("stand-in node agent: the GPUs of %d whole-GPU pods recorded, %d failures", records, failures)
			if lastErr != nil {
				r.note += fmt.Sprintf(" (last: %v)", lastErr)
			}
		}
		if agent != nil {
			released, failures, lastErr := agent.counts()
			r.note = fmt.Sprintf("stand-in device plugin: %d node locks released, %d failures", released, failures)
			if lastErr != nil {
				r.note += fmt.Sprintf(" (last: %v)", lastErr)
			}
		}
		out = append(out, r)
		if err := e.cleanup(ctx); err != nil {
			return out, err
		}
	}
	return out, nil
}

func shortName(system string) string {
	switch system {
	case sysKube:
		return "kube"
	case sysTessera:
		return "tessera"
	case sysPlugin:
		return "plugin"
	case sysHAMi:
		return "hami"
	default:
		return "sp"
	}
}

// wholeCycle are the whole-GPU shapes, in order (the whole-GPU part of
// podMix).
var wholeCycle = []shape{{name: "1gpu", gpus: 1}, {name: "1gpu", gpus: 1}, {name: "2gpu", gpus: 2}, {name: "4gpu", gpus: 4}}

func shapeOf(workload string, i int) shape {
	if workload == wlMixed {
		mix := podMix()
		return mix[i%len(mix)]
	}
	return wholeCycle[i%len(wholeCycle)]
}

// peerPod is pod i of run with shape s in system's resource names: HAMi's
// for hami, Tessera's otherwise (kube-scheduler and scheduler-plugins count
// tessera.dev/gpu as any extended resource, as they would nvidia.com/gpu
// of NVIDIA's device plugin).
func peerPod(system, ns, schedulerName, run string, i int, s shape) *v1.Pod {
	if system == sysHAMi {
		return hamiPod(ns, schedulerName, run, i, s)
	}
	limits := v1.ResourceList{}
	set := func(r v1.ResourceName, v int64) {
		if v > 0 {
			limits[r] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	set(api.ResourceGPU, s.gpus)
	set(api.ResourceGPUMemory, s.memUnits)
	set(api.ResourceGPUCore, s.cores)
	return podWithLimits(ns, schedulerName, run, i, s.name, limits)
}

func copyPeerLogs(dir, to string, logf func(string, ...any)) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, path := range logs {
		if strings.HasPrefix(filepath.Base(path), "extender-") {
			continue // copyLogs has them
		}
		b, err := os.ReadFile(path)
		if err != nil {
			logf("logs: %v", err)
			continue
		}
		if err := os.WriteFile(filepath.Join(to, filepath.Base(path)), b, 0o644); err != nil {
			logf("logs: %v", err)
		}
	}
}

// peerVersions reads the stamps build-peer-bins.sh leaves next to the
// binaries.
func peerVersions(binDir string) []string {
	var out []string
	for _, name := range []string{"hami-scheduler", "scheduler-plugins-scheduler"} {
		b, err := os.ReadFile(filepath.Join(binDir, "."+name+".stamp"))
		if err != nil {
			continue
		}
		out = append(out, name+": "+strings.TrimSpace(string(b)))
	}
	return out
}

func reportPeers(w io.Writer, c *config, e *peerEnv, results []peerResult, load0, load1 string, took time.Duration) {
	pc := &c.peers
	traceOnly := e.sample != nil
	if traceOnly {
		fmt.Fprintf(w, "\nside by side, trace replay (pods created one after the other): %d CPUs; load average at start %s, at end %s; total %s\n",
			runtime.NumCPU(), load0, load1, took.Round(time.Second))
	} else {
		fmt.Fprintf(w, "\nside by side: %d pods per run, %d pod creators, %d CPUs; load average at start %s, at end %s; total %s\n",
			c.pods, c.podWorkers, runtime.NumCPU(), load0, load1, took.Round(time.Second))
	}
	if pc.scorePercent >= 0 {
		fmt.Fprintf(w, "percentageOfNodesToScore set to %d in every system's configuration\n", pc.scorePercent)
	}
	for _, v := range peerVersions(pc.binDir) {
		fmt.Fprintf(w, "  %s\n", v)
	}
	if !traceOnly {
		reportRates(w, c, results)
	}
	reportLatency(w, c, results)
}

// reportRates prints the throughput and gang tables.
func reportRates(w io.Writer, c *config, results []peerResult) {
	pc := &c.peers
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tsystem\tworkload\tpods\tcreated in\tfirst bound\tlast bound\tpods/s\t")
	for _, r := range results {
		if r.workload == wlGang || r.workload == wlTrace || r.workload == "" {
			continue
		}
		if r.err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%s\t-\t-\t-\t-\tfailed\t\n", r.nodes, r.system, r.workload)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%.1f\t\n", r.nodes, r.system, r.workload, r.res.pods, r.res.createdIn.Round(time.Millisecond),
			r.res.firstBoundIn.Round(time.Millisecond), r.res.boundIn.Round(time.Millisecond), r.res.podsPerSecond())
	}
	tw.Flush()
	fmt.Fprintf(w, "\ngangs of N pods x %d GPUs, %d per system and size, one after the other (earlier gangs stay bound): last member created -> all bound (first create -> all bound)\n",
		pc.gangGPUs, pc.gangs)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tsystem\tN\tall or nothing\tper gang\tmean\t")
	for _, r := range results {
		if r.workload != wlGang {
			continue
		}
		aon := "no"
		if allOrNothing(r.system) {
			aon = "yes"
		}
		var parts []string
		var sum time.Duration
		for i, d := range r.gangs {
			parts = append(parts, fmt.Sprintf("%s (%s)", d.Round(time.Millisecond), r.gangFirst[i].Round(time.Millisecond)))
			sum += d
		}
		mean := "-"
		if len(r.gangs) > 0 {
			mean = (sum / time.Duration(len(r.gangs))).Round(time.Millisecond).String()
		}
		if r.err != nil {
			parts = append(parts, "failed")
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t\n", r.nodes, r.system, r.gangMembers, aon, strings.Join(parts, ", "), mean)
	}
	tw.Flush()
}

// reportLatency prints the extenders' latency per verb, the placements
// Tessera's extender counted, and the notes and failures of every run.
func reportLatency(w io.Writer, c *config, results []peerResult) {
	pc := &c.peers
	fmt.Fprintln(w, "\nextender latency per verb, timed at a proxy between kube-scheduler and the extender (the extender's time plus one loopback hop; exact quantiles); "+
		sysPlugin+" calls the extender in its process, without verbs: -")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tsystem\tworkload\tverb\tcalls\terrors\tmean\tp50\tp99\tmax\t")
	wlName := func(r peerResult) string {
		if r.workload == wlGang {
			return fmt.Sprintf("gang %dx%d", r.gangMembers, pc.gangGPUs)
		}
		return r.workload
	}
	for _, r := range results {
		if r.system == sysPlugin && r.workload != "" {
			fmt.Fprintf(tw, "%d\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t\n", r.nodes, r.system, wlName(r))
			continue
		}
		verbs := make([]string, 0, len(r.latency))
		for v := range r.latency {
			verbs = append(verbs, v)
		}
		sort.Strings(verbs)
		for _, v := range verbs {
			l := r.latency[v]
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", r.nodes, r.system, wlName(r), v, l.calls, l.errors,
				msD(l.mean), msD(l.p50), msD(l.p99), msD(l.max))
		}
	}
	tw.Flush()
	reportPlacements(w, results, wlName)
	fmt.Fprintln(w)
	for _, r := range results {
		for v, l := range r.latency {
			if l.errors > 0 {
				fmt.Fprintf(w, "%d nodes, %s, %s: %d %s calls failed, the last: %s\n", r.nodes, r.system, wlName(r), l.errors, v, l.lastErr)
			}
		}
		if r.note != "" {
			fmt.Fprintf(w, "%d nodes, %s, %s: %s\n", r.nodes, r.system, wlName(r), r.note)
		}
		if r.err != nil {
			fmt.Fprintf(w, "%d nodes, %s, %s: FAILED: %v\n", r.nodes, r.system, wlName(r), r.err)
		}
	}
}

func msD(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// reportPlacements prints the pods Tessera's extender bound in each run of
// tessera and tessera-plugin, by kind, from its /metrics
// (tessera_extender_placements_total; pods that ask for no Tessera
// resource are bound by kube-scheduler, not counted).
func reportPlacements(w io.Writer, results []peerResult, wlName func(peerResult) string) {
	kinds := map[string]bool{}
	have := false
	for _, r := range results {
		for k := range r.placements {
			kinds[k] = true
		}
		have = have || r.placements != nil
	}
	if !have {
		return
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "\npods bound by Tessera's extender, from its /metrics (tessera_extender_placements_total during the run), by kind")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "nodes\tsystem\tworkload\tplacements\t%s\t\n", strings.Join(names, "\t"))
	for _, r := range results {
		if r.placements == nil {
			continue
		}
		var total float64
		cols := make([]string, len(names))
		for i, k := range names {
			total += r.placements[k]
			cols[i] = strconv.FormatFloat(r.placements[k], 'f', -1, 64)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", r.nodes, r.system, wlName(r), strconv.FormatFloat(total, 'f', -1, 64), strings.Join(cols, "\t"))
	}
	tw.Flush()
}

// extenderPlacements reads the placements counter of Tessera's extender,
// by kind, from its /metrics.
func extenderPlacements(ctx context.Context, ext *extenderProc) (map[string]float64, error) {
	text, err := ext.metrics(ctx)
	if err != nil {
		return nil, fmt.Errorf("extender metrics: %w", err)
	}
	return parseCounters(bytes.NewReader(text), placementsMetric, "kind")
}
