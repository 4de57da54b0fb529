// Command bench measures kube-scheduler's GPU pod throughput with and
// without tessera-extender on a local control plane (etcd, kube-apiserver,
// kube-scheduler as real processes) with fake 8-GPU nodes (Node objects
// only), and the extender's per-verb latency from its /metrics. See
// docs/bench.md; `make bench-scheduler` runs it.
//
// For each node count it creates the nodes, then runs the same pod mix
// three times: kube-scheduler with deploy/extender/scheduler-config.yaml
// minus its extenders ("without"), with that file as deployed (the
// extender running as its own process, "with"), and tessera-scheduler
// with deploy/scheduler/scheduler-config.yaml (the extender in the
// scheduler's process behind the Tessera plugin, "plugin"; --modes picks
// them). Rate is pods / (first create -> last pod seen bound by
// a watch). Pods are deleted between runs; each run gets a fresh
// kube-scheduler (and extender).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

type config struct {
	repo          string
	nodes         []int
	pods          int
	schedulerName string
	podWorkers    int
	nodeWorkers   int
	runTimeout    time.Duration
	settle        time.Duration
	keepLogs      string
	extenderFlags []string
	// modes are the runs of each node count, in order.
	modes []mode
	// peers: --peers runs the side-by-side benchmark (peers.go) instead.
	peers peerConfig
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.String("nodes", "1000,5000", "comma-separated node counts, ascending (nodes are added, never removed)")
	fs.StringVar(&c.repo, "repo", "", "repository root (default: the directory above that holds test/test.mk)")
	fs.IntVar(&c.pods, "pods", 1000, "GPU pods per run")
	fs.StringVar(&c.schedulerName, "scheduler-name", "tessera-scheduler", "profile the pods name in spec.schedulerName (deploy/'s config has default-scheduler and tessera-scheduler)")
	fs.IntVar(&c.podWorkers, "pod-workers", 16, "parallel pod creators")
	fs.IntVar(&c.nodeWorkers, "node-workers", 16, "parallel node creators")
	fs.DurationVar(&c.runTimeout, "run-timeout", 5*time.Minute, "limit of one run (create to last bound)")
	fs.DurationVar(&c.settle, "settle", 3*time.Second, "pause before each run, after the scheduler (and extender) are ready")
	fs.StringVar(&c.keepLogs, "logs", "", "copy the component logs into this directory at the end")
	fs.Func("extender-flag", "one more flag for tessera-extender, e.g. --extender-flag=--filter-shortlist=0 (repeatable)", func(v string) error {
		c.extenderFlags = append(c.extenderFlags, v)
		return nil
	})
	modes := fs.String("modes", "without,with,plugin", "the runs at each node count, in order: without (kube-scheduler alone), with (kube-scheduler + the tessera-extender process), plugin (tessera-scheduler: kube-scheduler with Tessera's plugin and the extender in its process, deploy/scheduler/scheduler-config.yaml); the ratios need without")
	addPeerFlags(fs, &c.peers)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(*modes, ",") {
		m := slices.IndexFunc([]mode{modeWithout, modeWith, modePlugin}, func(m mode) bool { return m.String() == strings.TrimSpace(f) })
		if m < 0 || slices.Contains(c.modes, mode(m)) {
			return nil, fmt.Errorf("--modes %q: want distinct modes among without, with, plugin", *modes)
		}
		c.modes = append(c.modes, mode(m))
	}
	prev := 0
	for _, f := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= prev {
			return nil, fmt.Errorf("--nodes %q: want ascending positive counts", *nodes)
		}
		c.nodes = append(c.nodes, n)
		prev = n
	}
	if c.pods <= 0 || c.podWorkers <= 0 || c.nodeWorkers <= 0 {
		return nil, errors.New("--pods, --pod-workers and --node-workers must be positive")
	}
	if c.repo == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, err
		}
		c.repo = root
	}
	return c, nil
}

// mode is how a run schedules.
type mode int

const (
	// modeWithout is kube-scheduler alone.
	modeWithout mode = iota
	// modeWith is kube-scheduler calling tessera-extender's verbs.
	modeWith
	// modePlugin is tessera-scheduler: the extender in process, behind
	// the Tessera plugin.
	modePlugin
)

func (m mode) String() string { return [...]string{"without", "with", "plugin"}[m] }

// runs reports whether the benchmark runs mode m.
func (c *config) runs(m mode) bool { return slices.Contains(c.modes, m) }

// of is the phase's run in mode m and kube-scheduler's histograms of it.
func (p *phase) of(m mode) (runResult, schedStats) {
	switch m {
	case modeWith:
		return p.with, p.schedWith
	case modePlugin:
		return p.plugin, p.schedPlugin
	}
	return p.without, p.schedWithout
}

// phase is one node count's runs.
type phase struct {
	nodes   int
	nodesIn time.Duration
	without runResult
	with    runResult
	plugin  runResult
	// kube-scheduler's own histograms, without and with the extender, and
	// tessera-scheduler's.
	schedWithout, schedWith, schedPlugin schedStats
	latency                              map[string]*histogram
	errors                               map[string]float64
	placements, pluginPlacements         float64
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.peers.enabled {
		return runPeers(ctx, c, stdout, stderr)
	}
	logf := stampedLogf(stderr)
	began := time.Now()
	load0 := loadavg()

	dir, err := os.MkdirTemp("", "tessera-bench-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)

	logf("building tessera-extender")
	bin, err := buildExtender(ctx, c.repo, dir)
	if err != nil {
		return err
	}
	bins, err := controlplane.BinariesFromEnv()
	if err != nil {
		return err
	}
	user := &controlplane.User{Name: extenderUser}
	logf("starting etcd and kube-apiserver")
	cp, err := controlplane.Start(ctx, controlplane.Options{Binaries: bins, BaseDir: dir, Users: []*controlplane.User{user}})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		if c.keepLogs != "" {
			copyLogs(cp, c.keepLogs, logf)
		}
		if err := cp.Stop(); err != nil {
			logf("stop control plane: %v", err)
		}
	}()
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	const ns = "bench"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	kubeconfig, err := setupExtenderAccess(ctx, cp, client, user, c.repo, dir)
	if err != nil {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	withCfg, withoutCfg, err := schedulerConfigs(c.repo, dir, addr)
	if err != nil {
		return err
	}
	var schedBin, pluginCfg string
	if c.runs(modePlugin) {
		logf("building tessera-scheduler")
		if schedBin, err = buildScheduler(ctx, c.repo, dir); err != nil {
			return err
		}
		// Not the extender's --v: its klog flags are the process's, and
		// tessera-scheduler logs at the harness's --v=2 like kube-scheduler.
		flags := slices.DeleteFunc(extenderArgs(kubeconfig, addr), func(f string) bool { return strings.HasPrefix(f, "--v=") })
		if pluginCfg, err = pluginConfig(c.repo, dir, append(flags, c.extenderFlags...)); err != nil {
			return err
		}
	}

	var phases []*phase
	have := 0
	for _, n := range c.nodes {
		ph := &phase{nodes: n}
		logf("creating nodes %d..%d", have, n-1)
		t0 := time.Now()
		if err := createNodes(ctx, client, have, n, c.nodeWorkers); err != nil {
			return err
		}
		ph.nodesIn = time.Since(t0)
		have = n
		logf("%d nodes (created in %s)", n, ph.nodesIn.Round(time.Millisecond))

		for _, m := range c.modes {
			var ext *extenderProc
			opts := controlplane.SchedulerOptions{ConfigFile: withoutCfg, Args: []string{schedulerMetricsArg}}
			switch m {
			case modeWith:
				opts.ConfigFile = withCfg
				ext, err = startExtender(ctx, bin, kubeconfig, addr, filepath.Join(dir, fmt.Sprintf("extender-%d.log", n)), c.extenderFlags, 2*time.Minute)
				if err != nil {
					return err
				}
			case modePlugin:
				opts.ConfigFile, opts.Binary = pluginCfg, schedBin
			}
			err := func() error {
				defer ext.stop()
				if err := cp.StartScheduler(ctx, opts); err != nil {
					return fmt.Errorf("start %s scheduler: %w", m, err)
				}
				defer func() {
					if err := cp.StopScheduler(); err != nil {
						logf("stop kube-scheduler: %v", err)
					}
				}()
				if m == modePlugin {
					// The extender in the scheduler's process serves its
					// /readyz on --listen once its caches are in.
					if err := waitReady(ctx, "http://"+addr+"/readyz", 2*time.Minute); err != nil {
						return fmt.Errorf("tessera-scheduler's extender: %w\nlog tail:\n%s", err, schedulerLogTail(cp))
					}
					ext = &extenderProc{addr: addr}
				}
				select {
				case <-time.After(c.settle):
				case <-ctx.Done():
					return ctx.Err()
				}
				logf("%d nodes, %s: creating %d pods", n, m, c.pods)
				res, err := measure(ctx, client, ns, c.schedulerName, fmt.Sprintf("n%d-%s", n, m), c.pods, c.podWorkers, c.runTimeout)
				if err != nil {
					return fmt.Errorf("%d nodes, %s: %w\nkube-scheduler log tail:\n%s", n, m, err, schedulerLogTail(cp))
				}
				logf("%d nodes, %s: %d pods bound in %s: %.1f pods/s", n, m, res.pods, res.boundIn.Round(time.Millisecond), res.podsPerSecond())
				sched, err := scrapeScheduler(ctx, cp)
				if err != nil {
					return err
				}
				switch m {
				case modeWithout:
					ph.without, ph.schedWithout = res, sched
					return nil
				case modePlugin:
					ph.plugin, ph.schedPlugin = res, sched
				default:
					ph.with, ph.schedWith = res, sched
				}
				// The informer can see the last Binding before the extender's
				// bind has counted it: wait (at most 10s) until every
				// placement is counted.
				var text []byte
				var placed float64
				for deadline := time.Now().Add(10 * time.Second); ; {
					if text, err = ext.metrics(ctx); err != nil {
						return err
					}
					placements, err := parseCounters(bytes.NewReader(text), "tessera_extender_placements_total", "")
					if err != nil {
						return err
					}
					placed = placements[""]
					if int(placed) >= c.pods || time.Now().After(deadline) {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if m == modePlugin {
					ph.pluginPlacements = placed
					return nil
				}
				ph.placements = placed
				if ph.latency, err = parseHistograms(bytes.NewReader(text), latencyMetric, "verb"); err != nil {
					return err
				}
				if ph.errors, err = parseCounters(bytes.NewReader(text), "tessera_extender_errors_total", "verb"); err != nil {
					return err
				}
				return nil
			}()
			if err != nil {
				return err
			}
			if err := deletePods(ctx, client, ns, 2*time.Minute); err != nil {
				return err
			}
		}
		phases = append(phases, ph)
	}
	report(stdout, c, phases, load0, loadavg(), time.Since(began))
	return nil
}

func report(w io.Writer, c *config, phases []*phase, load0, load1 string, took time.Duration) {
	fmt.Fprintf(w, "\nkube-scheduler GPU pod throughput: %d pods per run (mix: 1,1,2,4 whole GPUs and 4 shared slices), profile %s, %d CPUs\n",
		c.pods, c.schedulerName, runtime.NumCPU())
	if len(c.extenderFlags) > 0 {
		fmt.Fprintf(w, "extra tessera-extender flags: %s\n", strings.Join(c.extenderFlags, " "))
	}
	fmt.Fprintf(w, "load average at start: %s; at end: %s; total run time %s\n\n", load0, load1, took.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tnodes created in\twithout extender pods/s\twith extender pods/s\tratio\ttessera-scheduler pods/s\tratio\t")
	for _, p := range phases {
		rate := func(m mode) string {
			if !c.runs(m) {
				return "-"
			}
			r, _ := p.of(m)
			return fmt.Sprintf("%.1f", r.podsPerSecond())
		}
		ratio := func(m mode) string {
			if !c.runs(m) || !c.runs(modeWithout) {
				return "-"
			}
			r, _ := p.of(m)
			return fmt.Sprintf("%.2f", r.podsPerSecond()/p.without.podsPerSecond())
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.nodes, p.nodesIn.Round(100*time.Millisecond),
			rate(modeWithout), rate(modeWith), ratio(modeWith), rate(modePlugin), ratio(modePlugin))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\textender\tpods\tcreated in\tfirst bound\tlast bound\tpods/s\t")
	for _, p := range phases {
		for _, m := range c.modes {
			res, _ := p.of(m)
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%.1f\t\n", p.nodes, m, res.pods, res.createdIn.Round(time.Millisecond),
				res.firstBoundIn.Round(time.Millisecond), res.boundIn.Round(time.Millisecond), res.podsPerSecond())
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "extender per-verb latency (its tessera_extender_request_duration_seconds histogram; p50/p99 interpolated within buckets that double from 0.1ms)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tverb\tcalls\terrors\tmean\tp50\tp99\t")
	for _, p := range phases {
		verbs := make([]string, 0, len(p.latency))
		for v := range p.latency {
			verbs = append(verbs, v)
		}
		sort.Strings(verbs)
		for _, v := range verbs {
			h := p.latency[v]
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t\n", p.nodes, v, h.count, p.errors[v], ms(h.mean()), ms(h.quantile(0.5)), ms(h.quantile(0.99)))
		}
	}
	tw.Flush()
	for _, p := range phases {
		fmt.Fprintf(w, "extender placements at %d nodes: %.0f", p.nodes, p.placements)
		if c.runs(modePlugin) {
			fmt.Fprintf(w, "; in tessera-scheduler: %.0f", p.pluginPlacements)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "kube-scheduler per pod (its own histograms: algorithm = filter and score, extender calls included, one pod at a time; attempt = algorithm + binding; buckets double from 1ms)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\textender\talgorithm n\tmean\tp50\tp99\tattempts scheduled\tmean\tp50\tp99\t")
	for _, p := range phases {
		for _, m := range c.modes {
			_, st := p.of(m)
			a, t := st.algorithm, st.attempt
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t\n", p.nodes, m,
				a.count, ms(a.mean()), ms(a.quantile(0.5)), ms(a.quantile(0.99)),
				t.count, ms(t.mean()), ms(t.quantile(0.5)), ms(t.quantile(0.99)))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "kube-scheduler's algorithm per pod, mean, by the extension points it times (plugins only); rest = algorithm minus those: the Filter plugins on every node, the extender calls, the framework's own work")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\textender\talgorithm\t"+strings.Join(algorithmPoints, "\t")+"\trest\t")
	for _, p := range phases {
		for _, m := range c.modes {
			_, st := p.of(m)
			per := func(h histogram) float64 { return h.sum / st.algorithm.count }
			rest := per(st.algorithm)
			fmt.Fprintf(tw, "%d\t%s\t%s\t", p.nodes, m, ms(rest))
			for _, pt := range algorithmPoints {
				v := per(st.points[pt])
				rest -= v
				fmt.Fprintf(tw, "%s\t", ms(v))
			}
			fmt.Fprintf(tw, "%s\t\n", ms(rest))
		}
	}
	tw.Flush()
}

// schedulerMetricsArg lets the benchmark read kube-scheduler's /metrics
// without credentials (the default list has only the health paths).
const schedulerMetricsArg = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*"

// schedStats are kube-scheduler's per-pod histograms after one run.
type schedStats struct {
	algorithm, attempt histogram
	// points are the framework's extension points of the scheduling
	// cycle that kube-scheduler times (PreFilter, PreScore, Score:
	// plugins only). It does not time Filter, which runs per node.
	points map[string]histogram
}

// algorithmPoints are the timed extension points inside the scheduling
// algorithm.
var algorithmPoints = []string{"PreFilter", "PreScore", "Score"}

var servingRE = regexp.MustCompile(`Serving securely on (127\.0\.0\.1:[0-9]+)`)

// schedulerAddr finds the running kube-scheduler's address in its log.
func schedulerAddr(log string) (string, error) {
	m := servingRE.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return "", errors.New("no \"Serving securely on\" line in kube-scheduler's log")
	}
	return m[len(m)-1][1], nil
}

// scrapeScheduler reads the running kube-scheduler's histograms.
func scrapeScheduler(ctx context.Context, cp *controlplane.ControlPlane) (schedStats, error) {
	var path string
	for name, p := range cp.LogFiles() {
		if strings.HasPrefix(name, "kube-scheduler") {
			path = p
		}
	}
	if path == "" {
		return schedStats{}, errors.New("kube-scheduler metrics: no kube-scheduler running")
	}
	log, err := os.ReadFile(path)
	if err != nil {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: %w", err)
	}
	addr, err := schedulerAddr(string(log))
	if err != nil {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kube-scheduler's self-signed loopback certificate
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: GET /metrics: %s", resp.Status)
	}
	alg, err := parseHistograms(bytes.NewReader(body), schedulerAlgorithmMetric, "")
	if err != nil {
		return schedStats{}, err
	}
	att, err := parseHistograms(bytes.NewReader(body), schedulerAttemptMetric, "result")
	if err != nil {
		return schedStats{}, err
	}
	pts, err := parseHistograms(bytes.NewReader(body), schedulerExtensionPointMetric, "extension_point")
	if err != nil {
		return schedStats{}, err
	}
	s := schedStats{points: map[string]histogram{}}
	for _, pt := range algorithmPoints {
		if h := pts[pt]; h != nil {
			s.points[pt] = *h
		}
	}
	if h := alg[""]; h != nil {
		s.algorithm = *h
	}
	if h := att["scheduled"]; h != nil {
		s.attempt = *h
	}
	if s.algorithm.count == 0 {
		return schedStats{}, fmt.Errorf("kube-scheduler metrics: no %s samples", schedulerAlgorithmMetric)
	}
	return s, nil
}

func ms(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.2fms", s*1000)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func schedulerLogTail(cp *controlplane.ControlPlane) string {
	var names []string
	for name := range cp.LogFiles() {
		if strings.HasPrefix(name, "kube-scheduler") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "(no kube-scheduler log)"
	}
	return tail(cp.LogFiles()[names[len(names)-1]])
}

func copyLogs(cp *controlplane.ControlPlane, to string, logf func(string, ...any)) {
	if err := os.MkdirAll(to, 0o755); err != nil {
		logf("logs: %v", err)
		return
	}
	cpLogs, _ := filepath.Glob(filepath.Join(cp.Dir(), "*.log"))
	extLogs, _ := filepath.Glob(filepath.Join(filepath.Dir(cp.Dir()), "extender-*.log"))
	for _, path := range append(cpLogs, extLogs...) {
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

// stampedLogf returns a printf to w that starts each line with the UTC time.
func stampedLogf(w io.Writer) func(format string, a ...any) {
	return func(format string, a ...any) {
		fmt.Fprintf(w, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, a...)...)
	}
}
