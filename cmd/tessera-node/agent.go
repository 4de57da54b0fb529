package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/cdispec"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/deviceplugin/numareport"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/kubeclient"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/internal/sealkey"
	"github.com/tessera-gpu/tessera/topology"
)

// agentCommandName starts the node agent. It is also the default command:
// a command line that starts with a flag runs the agent.
const agentCommandName = "agent"

// agentCommand returns arg when arg starts the agent ("agent", or a flag
// other than a help flag), and a string no argument equals otherwise, so
// that `case agentCommand(args[0]):` in run's switch selects the agent.
func agentCommand(arg string) string {
	switch {
	case arg == agentCommandName:
		return arg
	case strings.HasPrefix(arg, "-") && arg != "-h" && arg != "--help" && arg != "-help":
		return arg
	}
	return "\x00" + agentCommandName
}

// agentFlags are the agent's command-line settings.
type agentFlags struct {
	nvml               string
	sysfsRoot          string
	configFile         string
	pluginDir          string
	podResourcesSocket string
	kubeconfig         string
	kubeAPIQPS         float64
	kubeAPIBurst       int
	sealKeyNamespace   string
	nodeName           string
	metricsAddr        string
	dynamicMIG         bool
	mockMIGState       string
	nodeCheckPeriod    time.Duration

	// Overrides of the configuration file, applied when given.
	resources          string
	memoryUnitMiB      uint64
	memoryReserveMiB   uint64
	ignoreXIDs         string
	deviceListStrategy string
	cdiKind            string
	cdiSpecDirs        string
	healthInterval     time.Duration
	xidRecoveryDelay   time.Duration

	iso  isolationFlags
	numa numaFlags
}

// newAgentFlagSet declares the agent's flags (klog's -v among them).
func newAgentFlagSet(stderr io.Writer) (*flag.FlagSet, *agentFlags) {
	fs := flag.NewFlagSet(agentCommandName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &agentFlags{}
	fs.StringVar(&f.nvml, "nvml", gpu.SpecReal, `GPU backend: "real" (libnvidia-ml.so.1), "mock:NAME" (a built-in mock machine) or "mock:PATH" (a mock machine file)`)
	fs.StringVar(&f.mockMIGState, "mock-mig-state", "", "with a mock backend (--nvml=mock:...), keep its MIG layouts in this file across restarts of the agent, as the driver keeps them (node simulator, demo); empty: in memory only")
	fs.StringVar(&f.sysfsRoot, "sysfs-root", "", "sysfs root to read NUMA facts from (default /sys, or the mock machine's own for a mock backend)")
	fs.StringVar(&f.configFile, "config", "", "NodeAgentConfig file (YAML or JSON); the flags below override it")
	fs.StringVar(&f.pluginDir, "device-plugin-dir", deviceplugin.DefaultPluginDir, "the kubelet's device-plugin directory (its kubelet.sock and the plugins' sockets)")
	fs.StringVar(&f.podResourcesSocket, "pod-resources-socket", kubeletstate.DefaultPodResourcesSocket, "the kubelet's PodResources API socket; the device manager's checkpoint is read where it cannot be reached")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server; in a pod the in-cluster configuration is used. With neither, or without --node-name, the agent runs without an API server")
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", 50, "API server queries per second (the kubelet's default): reads of the node's pods when whole GPUs are allocated, and records of pods' GPUs")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", 100, "API server burst")
	fs.StringVar(&f.sealKeyNamespace, "seal-key-namespace", "kube-system", "namespace of the Secret "+api.SealKeySecretName+" (made by tessera-extender) whose key seals Tessera's decision annotations; the agent waits for it")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", ":9402", `address of the Prometheus /metrics and /healthz endpoint; "" turns it off`)
	fs.StringVar(&f.resources, "resources", "", "comma-separated resources to advertise (overrides the config's resources)")
	fs.Uint64Var(&f.memoryUnitMiB, "memory-unit-mib", 0, "size of one "+string(api.ResourceGPUMemory)+" device in MiB (overrides memoryUnitMiB)")
	fs.Uint64Var(&f.memoryReserveMiB, "memory-reserve-mib", 0, "GPU memory per GPU not advertised, in MiB (overrides memoryReserveMiB)")
	fs.StringVar(&f.ignoreXIDs, "ignore-xids", "", `comma-separated XIDs that do not make a GPU unhealthy (overrides ignoredXIDs; "none" ignores none)`)
	fs.StringVar(&f.deviceListStrategy, "device-list-strategy", "", "comma-separated: cdi-cri, cdi-annotations, envvar, volume-mounts (overrides deviceListStrategy)")
	fs.StringVar(&f.cdiKind, "cdi-kind", "", "vendor/class of CDI device names (overrides cdiKind)")
	fs.StringVar(&f.cdiSpecDirs, "cdi-spec-dirs", strings.Join(cdispec.DefaultDirs, ","), `comma-separated directories of the runtime's CDI specs: with a CDI device list strategy, a GPU that no spec there names is unhealthy (not offered) until one does; "" skips the check`)
	fs.DurationVar(&f.healthInterval, "health-check-interval", 0, "period of the NVML health check (overrides healthCheckInterval)")
	fs.DurationVar(&f.xidRecoveryDelay, "xid-recovery-delay", 0, "how long a GPU stays unhealthy after a critical XID (overrides xidRecoveryDelay)")
	fs.DurationVar(&f.nodeCheckPeriod, "node-check-period", kube.DefaultNodeCheckPeriod, "how often the agent reads its Node and publishes again the annotations ("+api.AnnotationGPUInventory+", "+api.AnnotationNUMATopology+") and the "+string(api.ConditionSharedGPUIsolation)+" condition the Node lacks or holds otherwise than last published (a Node deleted and re-created, as a kubelet re-registration does); 0 turns the check off")
	fs.BoolVar(&f.dynamicMIG, "dynamic-mig", false, "serve the extender's MIG layout requests (the Node annotation "+api.AnnotationMIGLayoutRequest+"): repartition a GPU in MIG mode that no container or process uses, then serve its new instances (docs/mig.md, Dynamic MIG)")
	f.iso.register(fs)
	f.numa.register(fs)
	klog.InitFlags(fs)
	return fs, f
}

// parseAgentArgs parses the agent's command line (without the command name)
// and returns the flags and the resolved configuration.
func parseAgentArgs(args []string, stderr io.Writer) (*agentFlags, *api.NodeAgentConfig, error) {
	fs, f := newAgentFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("%s: unexpected arguments %q", agentCommandName, fs.Args())
	}
	cfg := api.NewNodeAgentConfig()
	if f.configFile != "" {
		data, err := os.ReadFile(f.configFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading --config: %w", err)
		}
		if cfg, err = api.LoadNodeAgentConfig(data, f.configFile); err != nil {
			return nil, nil, err
		}
	}
	var errs []error
	fs.Visit(func(fl *flag.Flag) {
		if err := f.override(cfg, fl.Name); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", fl.Name, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("configuration after flags: %w", err)
	}
	return f, cfg, nil
}

// override applies the flag called name to cfg.
func (f *agentFlags) override(cfg *api.NodeAgentConfig, name string) error {
	switch name {
	case "resources":
		cfg.Resources = nil
		for _, s := range splitList(f.resources) {
			cfg.Resources = append(cfg.Resources, corev1.ResourceName(s))
		}
		if len(cfg.Resources) == 0 {
			return errors.New("must name at least one resource")
		}
	case "memory-unit-mib":
		cfg.MemoryUnitMiB = f.memoryUnitMiB
	case "memory-reserve-mib":
		cfg.MemoryReserveMiB = f.memoryReserveMiB
	case "ignore-xids":
		cfg.IgnoredXIDs = []uint64{}
		if strings.TrimSpace(f.ignoreXIDs) == "none" {
			return nil
		}
		for _, s := range splitList(f.ignoreXIDs) {
			x, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return fmt.Errorf("%q is not an XID number", s)
			}
			cfg.IgnoredXIDs = append(cfg.IgnoredXIDs, x)
		}
	case "device-list-strategy":
		cfg.DeviceListStrategy = splitList(f.deviceListStrategy)
	case "cdi-kind":
		cfg.CDIKind = f.cdiKind
	case "health-check-interval":
		cfg.HealthCheckInterval.Duration = f.healthInterval
	case "xid-recovery-delay":
		cfg.XIDRecoveryDelay.Duration = f.xidRecoveryDelay
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// runAgent runs the node agent until ctx ends.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == agentCommandName {
		args = args[1:]
	}
	f, cfg, err := parseAgentArgs(args, stderr)
	if err != nil {
		return err
	}
	logger := klog.Background().WithName("tessera-node")
	ctx = klog.NewContext(ctx, logger)

	backend, err := gpu.Open(f.nvml)
	if err != nil {
		return err
	}
	if err := persistMockMIG(backend, f.mockMIGState); err != nil {
		return err
	}
	if err := backend.Init(); err != nil {
		return fmt.Errorf("no GPU backend: %w", err)
	}
	defer backend.Shutdown() //nolint:errcheck // nothing to do about it on exit
	root, cleanup, err := sysfsRootFor(backend, f.sysfsRoot)
	if err != nil {
		return err
	}
	defer cleanup()
	failed := &migFailure{}
	for {
		err := serveAgent(ctx, f, cfg, backend, root, stdout, failed)
		if !errors.Is(err, errMIGRestart) {
			return err
		}
		logger.Info("Serving again: a MIG layout request was served")
	}
}

// serveAgent serves until ctx ends or, with --dynamic-mig, until a MIG
// layout request was served (errMIGRestart): the topology, device plugins,
// inventory and NRI plugin are then built again from the driver.
func serveAgent(ctx context.Context, f *agentFlags, cfg *api.NodeAgentConfig, backend *gpu.Backend, root string, stdout io.Writer, failed *migFailure) error {
	logger := klog.FromContext(ctx)
	parent := ctx
	topo, err := topology.Build(backend, topology.Sysfs{Root: root})
	if err != nil {
		return fmt.Errorf("reading the GPU topology: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := deviceplugin.NewMetrics(reg)
	if err != nil {
		return err
	}
	checkpoint := &kubeletstate.Checkpoint{Path: filepath.Join(f.pluginDir, kubeletstate.CheckpointFile)}
	podResources := &kubeletstate.PodResources{Socket: f.podResourcesSocket}
	kubelet := kubeletstate.First{podResources, checkpoint}
	opts := deviceplugin.Options{
		Config:    cfg,
		NodeName:  f.nodeName,
		PluginDir: f.pluginDir,
		Topology:  topo,
		GPU:       backend,
		Kubelet:   kubelet,
		Metrics:   metrics,
	}
	if cfg.UsesCDI() && f.cdiSpecDirs != "" {
		// Without a spec naming its GPUs the runtime cannot create a GPU
		// container: keep such GPUs unoffered rather than fail pods.
		opts.GPU = cdispec.Checker{Checker: backend, Dirs: strings.Split(f.cdiSpecDirs, ","), Names: func(i int) []string {
			for _, g := range topo.GPUs {
				if g.Index == i {
					return []string{api.CDIName(cfg.CDIKind, cfg.CDIDeviceName, g.UUID, g.Index)}
				}
			}
			return nil
		}}
	}
	if f.nodeCheckPeriod < 0 {
		return fmt.Errorf("--node-check-period must not be negative, got %v", f.nodeCheckPeriod)
	}
	if f.kubeAPIQPS <= 0 || f.kubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-qps must be above 0 and --kube-api-burst at least 1, got %g and %d", f.kubeAPIQPS, f.kubeAPIBurst)
	}
	restCfg, err := apiServerConfig(f.kubeconfig, f.nodeName)
	if err != nil {
		return err
	}
	var cs kubernetes.Interface
	if restCfg != nil {
		restCfg.UserAgent = "tessera-node"
		restCfg.QPS, restCfg.Burst = float32(f.kubeAPIQPS), f.kubeAPIBurst
		if cs, err = kubernetes.NewForConfig(restCfg); err != nil {
			return fmt.Errorf("API server client: %w", err)
		}
	}
	events, stopEvents := eventRecorder(ctx, cs, f.nodeName)
	defer stopEvents()
	// GPU health Events: on the Node, and on the pods that hold a GPU
	// when it turns unhealthy.
	opts.Events = events
	// trust keeps only the pod decisions Tessera sealed (docs/isolation.md,
	// threat model); without an API server there are none to read.
	var trust *podtrust.Filter
	var numa *numareport.Reporter
	var nodeClient *kube.Client
	if cs != nil {
		logger.Info("Reading the seal key", "secret", klog.KRef(f.sealKeyNamespace, api.SealKeySecretName))
		sealer, err := sealkey.Wait(ctx, sealkey.In(cs, f.sealKeyNamespace), 2*time.Second)
		if err != nil {
			return err
		}
		trust = &podtrust.Filter{Sealer: sealer, Events: events, Component: "tessera-node"}
		client := kube.New(cs, f.nodeName, trust, nil)
		opts.Publisher = client
		if f.dynamicMIG {
			// The inventory says this agent serves MIG layout requests.
			opts.Publisher = servesMIGLayouts{client}
		}
		if numa, err = numaReporter(ctx, &f.numa, f.iso.cpuManagerState, podResources, topo, client); err != nil {
			return err
		}
		opts.Pods = kube.NewPodWatch(cs, f.nodeName, trust)
		nodeClient = client
		logger.Info("Publishing to the API server", "node", klog.KRef("", f.nodeName), "server", restCfg.Host)
	} else {
		logger.Info("Running without an API server (give --kubeconfig or run in a pod, and --node-name, to publish the GPU inventory and pods' GPUs)")
	}

	// The agent is built after the NRI plugin it is given; the plugin reads
	// GPU health from the agent's inventory once both run.
	var agent *deviceplugin.Agent
	var iso *nodeIsolation
	if f.iso.nriSocket != "" {
		iso, err = newIsolation(isolationDeps{
			flags: &f.iso, cfg: cfg, backend: backend, topo: topo, kubelet: kubelet, checkpoint: checkpoint,
			client: cs, trust: trust, events: events, reg: reg,
			inventory: func() *api.GPUInventory { return agent.Inventory() },
		})
		if err != nil {
			return fmt.Errorf("isolation: %w", err)
		}
		opts.NRI = iso.plugin
		opts.Runtime = iso.plugin.Ledger()
		// The sentinel mount (api.NRISentinelPath) needs a host file: the
		// state directory is the same path on the host (deploy/node).
		opts.NRISentinel = filepath.Join(f.iso.stateDir, "nri-sentinel")
		if err := touch(opts.NRISentinel); err != nil {
			return fmt.Errorf("the NRI sentinel file: %w", err)
		}
	} else {
		logger.Info("WARNING: --nri-socket is empty: no NRI plugin, so shared GPU units are refused (isolated sharing requires NRI)")
	}
	agent, err = deviceplugin.New(opts)
	if err != nil {
		return err
	}
	if iso != nil {
		iso.plugin.Ledger().OnChange(agent.RuntimeChanged)
	}
	logger.Info("Starting the node agent", "gpus", len(topo.GPUs), "resources", agent.Resources(), "deviceListStrategy", cfg.DeviceListStrategy, "devicePluginDir", f.pluginDir)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	if f.metricsAddr != "" {
		srv, lis, err := metricsServer(f.metricsAddr, reg)
		if err != nil {
			return err
		}
		logger.Info("Serving metrics", "addr", lis.Addr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics server: %w", err)
				cancel()
			}
		}()
		defer func() {
			shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			srv.Shutdown(shutdown) //nolint:errcheck // exiting anyway
			wg.Wait()
		}()
	}
	if iso != nil {
		// The NRI plugin outlives the device plugins' drain (Agent.Run
		// returns after it): the kubelet may still admit a slice then, and
		// its Allocate needs the plugin connected.
		isoCtx, stopIso := context.WithCancel(context.WithoutCancel(ctx))
		isoDone := make(chan struct{})
		go func() {
			defer close(isoDone)
			iso.run(isoCtx)
		}()
		// The NRI plugin and watchdog stop, and the MPS daemons with them,
		// before the agent returns.
		defer func() {
			stopIso()
			<-isoDone
		}()
	}
	if numa != nil {
		numaDone := make(chan struct{})
		go func() {
			defer close(numaDone)
			numa.Run(ctx)
		}()
		defer func() {
			cancel()
			<-numaDone
		}()
	}
	if nodeClient != nil && f.nodeCheckPeriod > 0 {
		nodeDone := make(chan struct{})
		go func() {
			defer close(nodeDone)
			nodeClient.WatchNode(ctx, f.nodeCheckPeriod)
		}()
		defer func() {
			cancel()
			<-nodeDone
		}()
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	var dyn *migWatch
	dynDone := make(chan struct{})
	if f.dynamicMIG && cs != nil {
		dyn = newMIGWatch(cs, f.nodeName, topo, backend, kubelet, events, failed)
		go func() { defer close(dynDone); dyn.run(agentCtx, stopAgent) }()
		defer func() { stopAgent(); <-dynDone }()
		logger.Info("Dynamic MIG: serving the extender's MIG layout requests", "annotation", api.AnnotationMIGLayoutRequest)
	}
	if err := agent.Run(agentCtx); err != nil {
		return err
	}
	stopAgent()
	if dyn != nil {
		<-dynDone
	}
	if dyn != nil && dyn.pending != nil && parent.Err() == nil {
		dyn.apply(parent)
		return errMIGRestart
	}
	select {
	case err := <-errc:
		return err
	default:
	}
	fmt.Fprintln(stdout, "tessera-node: stopped")
	return nil
}

// sysfsRootFor returns the sysfs root to read: the flag's, /sys, or for a
// mock backend its own machine's sysfs written to a temporary directory.
func sysfsRootFor(backend *gpu.Backend, flagValue string) (string, func(), error) {
	if flagValue != "" {
		return flagValue, func() {}, nil
	}
	if backend.Mock == nil {
		return topology.DefaultSysfsRoot, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "tessera-mock-sysfs-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := backend.Mock.WriteSysfs(dir); err != nil {
		cleanup()
		return "", nil, err
	}
	return dir, cleanup, nil
}

// apiServerConfig returns the API server's configuration, or nil to run
// without one: with --kubeconfig, that file; in a pod, the in-cluster
// configuration. Either needs a node name.
func apiServerConfig(kubeconfig, nodeName string) (*rest.Config, error) {
	if kubeconfig != "" && nodeName == "" {
		return nil, errors.New("--kubeconfig needs --node-name (or $NODE_NAME)")
	}
	if kubeconfig == "" && nodeName == "" {
		return nil, nil
	}
	cfg, err := kubeclient.Config(kubeconfig)
	if errors.Is(err, kubeclient.ErrNotInCluster) {
		return nil, nil
	}
	return cfg, err
}

func metricsServer(addr string, reg *prometheus.Registry) (*http.Server, net.Listener, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, lis, nil
}

// touch creates the empty file path (and its directory) unless it exists.
func touch(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	return f.Close()
}
