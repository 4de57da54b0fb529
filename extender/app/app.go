// Command tessera-extender is Tessera's kube-scheduler extender: an HTTP(S)
// webhook answering the filter, prioritize, bind and preempt verbs for pods
// that ask for tessera.dev/gpu, tessera.dev/gpu-memory or
// tessera.dev/gpu-core. See docs/extender.md.
//
//	tessera-extender [--kubeconfig FILE] [--listen :8888] [--policy binpack]
//	                 [--tls-cert FILE --tls-key FILE [--verbs-client-ca FILE]]
//	                 [--metrics-listen ADDR]
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/admission"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/extender/verbs"
	"github.com/tessera-gpu/tessera/internal/kubeclient"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/internal/sealkey"
)

// pathAdmissionGang is where the mutating webhook that gates gang members
// is served.
const pathAdmissionGang = "/admission/gang"

// pathAdmissionQueue is where the mutating webhook that gates the GPU pods
// of namespaces a Queue serves is served (deploy/extender/webhook.yaml).
const pathAdmissionQueue = "/admission/queue"

// pathAdmissionNVIDIAGPU is where the nvidia.com/gpu compatibility webhook
// is served (charts/tessera, compat.nvidiaGPU; off unless installed).
const pathAdmissionNVIDIAGPU = "/admission/nvidia-gpu"

// The verbs call the extender's Server and count with its Metrics.
var (
	_ verbs.Core    = (*extender.Server)(nil)
	_ verbs.Metrics = (*extender.Metrics)(nil)
)

// flagVerbsClientCA names the CA bundle of the clients the scheduler verbs
// answer (kube-scheduler's certificate).
const flagVerbsClientCA = "verbs-client-ca"

type options struct {
	kubeconfig      string
	listen          string
	metricsListen   string
	profilingListen string
	tlsCert         string
	tlsKey          string
	policy          string
	learnWindow     int
	seed            int64
	qps             float64
	burst           int
	shutdownGrace   time.Duration
	gangLevels      []api.TopologyLevel
	gangResync      time.Duration
	gangTimeoutMax  time.Duration
	gangPlanner     bool
	quota           bool
	quotaRetry      time.Duration
	// reclaimPastBudgets: reclaim may delete past PodDisruptionBudgets.
	reclaimPastBudgets bool
	// preemptionPastBudgets: tier preemption may delete past
	// PodDisruptionBudgets.
	preemptionPastBudgets bool
	quotaHold             time.Duration
	quotaResync           time.Duration
	shortlist             int
	sealKeyNamespace      string

	queues          bool
	queueHalfLife   time.Duration
	queueHistoryWt  float64
	queueStatusEach time.Duration

	reserveAfter       time.Duration
	numaFit            bool
	schedulers         []string
	reserveFor         time.Duration
	reserveBackfill    bool
	reservePreemptible bool
	reserveMinGPUs     int
	reservePerGPU      time.Duration
	reserveRelative    float64

	consolidation          bool
	consolidationPerMinute int

	preemption           bool
	preemptionMinRuntime time.Duration
	preemptionHold       time.Duration
	preemptionResync     time.Duration
	dynamicMIG           bool

	// verbsClientCA: the scheduler verbs answer only callers with a
	// client certificate this PEM bundle's CAs signed.
	verbsClientCA string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("tessera-extender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the in-cluster service account")
	fs.StringVar(&o.listen, "listen", ":8888", "address of the extender verbs, /healthz, /readyz (and /metrics unless --metrics-listen)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "separate plain-HTTP address for /metrics; empty: served on --listen")
	fs.StringVar(&o.profilingListen, "profiling-listen", "", "plain-HTTP address for Go's /debug/pprof (CPU and heap profiles, e.g. 127.0.0.1:6060); empty: off. Profiles show the process's internals: keep it on loopback")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (needs --tls-key)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "private key of --tls-cert")
	fs.StringVar(&o.verbsClientCA, flagVerbsClientCA, "", "PEM CA bundle: the HTTPS listener asks for client certificates (optional, for the webhooks, /status and /metrics) and the scheduler verbs (filter, prioritize, prioritize-cpu, bind, preempt) answer 403 to a caller without one these CAs signed (kube-scheduler's tlsConfig certFile/keyFile); needs --tls-cert. Empty: the verbs answer anyone who reaches the listener")
	fs.StringVar(&o.policy, "policy", extender.PolicyBinpack, "placement policy: "+strings.Join(extender.PolicyNames(), ", "))
	fs.Int64Var(&o.seed, "seed", 1, "seed of the random policy")
	fs.IntVar(&o.learnWindow, "learn-workload", extender.DefaultLearnWindow, "the fragmentation-aware policies (binpack, fgd) keep room for the shapes of the last this many GPU pods the cluster ran, learned as they come (rebuilt every 50 pods; the built-in default workload until 50 are seen); 0: always the built-in default workload")
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "API server queries per second (each bind of a shared pod makes two: the assignment patch and the Binding)")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "API server burst")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 10*time.Second, "how long in-flight requests may finish on SIGTERM")
	fs.BoolVar(&o.gangPlanner, "gang-planner", true, "plan gated gang members (see docs/gang-quota.md); the admission webhook is served at "+pathAdmissionGang+" either way")
	fs.Func("gang-levels", "topology levels of gang planning: node label keys, lowest first, each optionally :required, e.g. nvidia.com/gpu.clique,topology.kubernetes.io/rack:required", func(v string) error {
		levels, err := api.ParseTopologyLevels(v)
		if err != nil {
			return err
		}
		o.gangLevels = levels
		return nil
	})
	fs.DurationVar(&o.gangResync, "gang-resync", 2*time.Second, "how often the gang planner makes a pass besides pod changes (plan timeouts, room freed by nodes)")
	fs.DurationVar(&o.gangTimeoutMax, "gang-timeout-max", planner.DefaultGangTimeoutMax, "the longest a gang's plan holds the room planned for its members until they all bind (after which they are evicted with a GangTimeout Event): a gang's own timeout (tessera.dev/gang-timeout-seconds, its PodGroup's scheduleTimeoutSeconds, default "+api.DefaultGangTimeout.String()+") is cut to it, and its Events say so; below "+api.DefaultGangTimeout.String()+" it cuts the default too")
	fs.BoolVar(&o.quota, "quota", true, "enforce ElasticQuotas (scheduling.x-k8s.io/v1alpha1): admission at filter and gang planning, reclaim by eviction, quota-aware preemption; without the CRD installed nothing is enforced until it appears")
	fs.DurationVar(&o.quotaRetry, "quota-crd-retry", 30*time.Second, "how often to look again for an ElasticQuota CRD that is not installed")
	fs.DurationVar(&o.quotaHold, "quota-reclaim-hold", 2*time.Minute, "how long room reclaimed for a namespace is held for its waiting work (no other namespace may borrow it meanwhile)")
	fs.DurationVar(&o.quotaResync, "quota-resync", 2*time.Second, "how often pods kube-scheduler found unschedulable are checked for a reclaim within their namespace's min")
	fs.BoolVar(&o.queues, "queues", true, "admit the GPU workloads of namespaces a Queue (queues.tessera.dev) serves in queue order, by the Queues' guarantees, limits and fair share (docs/queues.md); without the CRD installed nothing is queued until it appears")
	fs.DurationVar(&o.queueHalfLife, "queue-half-life", 24*time.Hour, "half-life of the Queues' usage history (fair share by what a queue used lately)")
	fs.Float64Var(&o.queueHistoryWt, "queue-history-weight", queue.DefaultHistoryWeight, "how much a queue's recent borrowing lowers its part of what is lent beyond guarantees (time-based fair share; 0: by weight alone)")
	fs.DurationVar(&o.queueStatusEach, "queue-status-period", 10*time.Second, "how often each Queue's status (used, fair share, usage history) is written")
	fs.DurationVar(&o.reserveAfter, "reservation-wait", 10*time.Minute, "a whole-GPU gang or queued pod that has waited this long and fits nowhere gets the nodes that will hold it soonest reserved: nothing else starts on them until it fits (docs/queues.md); 0: no reservations")
	fs.DurationVar(&o.reserveFor, "reservation-max", time.Hour, "how long a reservation lasts at most; the workload then does not reserve again for as long")
	fs.IntVar(&o.reserveMinGPUs, "reservation-min-gpus", 1, "a workload of fewer whole GPUs never reserves (allocator/reserve's Due, as tessera-sim's --reserve-min-gpus)")
	fs.DurationVar(&o.reservePerGPU, "reservation-wait-per-gpu", 0, "added to --reservation-wait per whole GPU of the workload")
	fs.Float64Var(&o.reserveRelative, "reservation-relative", 0, "added to --reservation-wait: this many times the wait of the longest-waiting pending GPU pod outside a gang smaller than --reservation-min-gpus")
	fs.BoolVar(&o.reserveBackfill, "reservation-backfill", true, "a gang or queued pod whose members all declare tessera.dev/expected-runtime may be planned on reserved nodes when, by it, it ends before the reservation starts (by the expected run times of the pods there); evicted if it runs past it when the reservation could start")
	fs.BoolVar(&o.consolidation, "consolidation", false, "move single pods marked tessera.dev/preemptible=true and owned by a controller (evicted, PodDisruptionBudgets honoured; the controller recreates them elsewhere) so that a whole-GPU gang or queued pod due a reservation that fits nowhere gets whole nodes or NVLink cliques (docs/queues.md)")
	fs.IntVar(&o.consolidationPerMinute, "consolidation-moves-per-minute", 4, "with --consolidation, at most this many pods are moved in any minute; a workload that needs more is not consolidated for")
	fs.BoolVar(&o.reservePreemptible, "reservation-preemptible", true, "a gang or queued pod whose members are all marked tessera.dev/preemptible=true may be planned on reserved nodes; evicted when the reservation fills")
	o.schedulers = []string{corev1.DefaultSchedulerName, "tessera-scheduler"}
	fs.Func("scheduler-names", "comma-separated schedulerNames whose profiles call this extender (default default-scheduler,tessera-scheduler, the two profiles of deploy/extender/scheduler-config.yaml): the planner plans their ungated gang members and queued pods itself; a pod of another scheduler is planned only when the webhooks gated it", func(v string) error {
		o.schedulers = nil
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				o.schedulers = append(o.schedulers, n)
			}
		}
		if len(o.schedulers) == 0 {
			return errors.New("name at least one scheduler")
		}
		return nil
	})
	fs.BoolVar(&o.numaFit, "numa-fit", true, "place a GPU pod only where its GPUs and exclusive CPUs can meet on one NUMA node, on nodes whose kubelet topology manager policy (published by the node agent) is single-numa-node or restricted, and prefer such placements under best-effort (docs/numa.md); false ignores the nodes' NUMA reports")
	fs.BoolVar(&o.preemption, "preemption", true, "Tessera's priority preemption for GPU pods of every shape (whole GPUs and slices), which kube-scheduler cannot see (docs/extender.md)")
	fs.DurationVar(&o.preemptionMinRuntime, "preemption-min-runtime", 0, "a pod that started less than this long ago is not preempted")
	fs.BoolVar(&o.preemptionPastBudgets, "preemption-past-budgets", true, "tier preemption deletes, past its PodDisruptionBudget, a lower-tier victim every choice of victims needs, as kube-scheduler's preemption does (victims budgets protect are passed over while another choice makes room); false: such a preemption waits")
	fs.BoolVar(&o.reclaimPastBudgets, "reclaim-past-budgets", true, "quota and queue reclaim delete, past its PodDisruptionBudget, a borrowing workload every choice of victims needs (budgets are a preference, as in kube-scheduler's preemption: a tenant's budget does not keep what it borrows); false: such a reclaim waits")
	fs.DurationVar(&o.preemptionHold, "preemption-hold", 2*time.Minute, "how long the room preemption frees is held for the pod it was freed for")
	fs.DurationVar(&o.preemptionResync, "preemption-resync", time.Second, "how often pending pods kube-scheduler found unschedulable are checked for a preemption")
	fs.BoolVar(&o.dynamicMIG, "dynamic-mig", false, "dynamic MIG: when a pending pod's MIG instances are free on no node, ask a node (annotation "+api.AnnotationMIGLayoutRequest+") to repartition a GPU in MIG mode without a tenant; its node agent needs --dynamic-mig too (docs/mig.md)")
	fs.StringVar(&o.sealKeyNamespace, "seal-key-namespace", "kube-system", "namespace of the Secret "+api.SealKeySecretName+" holding the key that seals Tessera's decision annotations (created when missing); the extender's own namespace, which also holds its reservation records (ConfigMap "+api.ReservationsConfigMapName+")")
	fs.IntVar(&o.shortlist, "filter-shortlist", 100, "filter passes at most this many fitting nodes, those the policy scores best, so that kube-scheduler scores and prioritizes only nodes that can win (the extender's weight outweighs every other score); 0: every fitting node")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.quotaRetry <= 0 || o.quotaHold <= 0 || o.quotaResync <= 0 {
		return nil, fmt.Errorf("--quota-crd-retry, --quota-reclaim-hold and --quota-resync must be positive, got %s, %s and %s", o.quotaRetry, o.quotaHold, o.quotaResync)
	}
	if o.learnWindow < 0 {
		return nil, fmt.Errorf("--learn-workload must be 0 (off) or positive, got %d", o.learnWindow)
	}
	if o.shortlist < 0 {
		return nil, fmt.Errorf("--filter-shortlist must be 0 (off) or positive, got %d", o.shortlist)
	}
	if o.reserveMinGPUs < 0 || o.reservePerGPU < 0 || o.reserveRelative < 0 {
		return nil, fmt.Errorf("--reservation-min-gpus, --reservation-wait-per-gpu and --reservation-relative must be 0 or more, got %d, %s and %v", o.reserveMinGPUs, o.reservePerGPU, o.reserveRelative)
	}
	if !(o.queueHistoryWt >= 0) || math.IsInf(o.queueHistoryWt, 0) {
		return nil, fmt.Errorf("--queue-history-weight must be 0 (off) or a positive number, got %v", o.queueHistoryWt)
	}
	if o.consolidationPerMinute < 1 {
		return nil, fmt.Errorf("--consolidation-moves-per-minute must be 1 or more, got %d", o.consolidationPerMinute)
	}
	if o.gangResync <= 0 {
		return nil, fmt.Errorf("--gang-resync must be positive, got %s", o.gangResync)
	}
	if o.gangTimeoutMax < time.Second {
		return nil, fmt.Errorf("--gang-timeout-max must be positive, at least 1s (gang timeouts are whole seconds), got %s", o.gangTimeoutMax)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if o.verbsClientCA != "" && o.tlsCert == "" {
		return nil, fmt.Errorf("--%s needs --tls-cert and --tls-key: client certificates come only over HTTPS", flagVerbsClientCA)
	}
	return o, nil
}

// clientCAs reads the PEM CA bundle of --verbs-client-ca.
func clientCAs(file string) (*x509.CertPool, error) {
	pemBytes, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagVerbsClientCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--%s: no PEM certificate in %s", flagVerbsClientCA, file)
	}
	return pool, nil
}

func restConfig(o *options) (*rest.Config, error) {
	cfg, err := kubeclient.Config(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "tessera-extender"
	return cfg, nil
}

// Embedded is what a process that runs the extender in itself
// (tessera-scheduler) calls instead of the HTTP verbs.
type Embedded struct {
	// Server decides as the verbs do.
	Server *extender.Server
	// Trust removes from a scheduler's pod what a tenant wrote in
	// Tessera's name, as the verbs do before calling Server; it changes
	// the pod, so give it a copy.
	Trust *podtrust.Filter
	// Ready reports whether the caches have synced (the verbs answer 503
	// before).
	Ready func() bool
}

// Run runs the extender with the command-line flags args until ctx ends.
// embed, when not nil, is called once with the Server before anything is
// served, and the HTTP verbs are not served (their one caller is in the
// process).
func Run(ctx context.Context, args []string, stderr io.Writer, embed func(Embedded)) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var verbCAs *x509.CertPool
	if o.verbsClientCA != "" {
		if verbCAs, err = clientCAs(o.verbsClientCA); err != nil {
			return err
		}
	}
	logger := klog.Background().WithName("tessera-extender")
	ctx = klog.NewContext(ctx, logger)
	defer klog.Flush()

	var policy allocator.Policy
	if o.learnWindow > 0 {
		policy, err = extender.NewLearnedPolicy(o.policy, o.seed, o.learnWindow, extender.DefaultLearnEvery, extender.DefaultLearnEvery)
	} else {
		policy, err = extender.NewPolicy(o.policy, extender.DefaultWorkload(), o.seed)
	}
	if err != nil {
		return err
	}
	cfg, err := restConfig(o)
	if err != nil {
		return fmt.Errorf("client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: extender.FieldManager})

	// Tessera's decisions on pods are taken only with a valid seal
	// (docs/isolation.md, threat model). The key is read (made on first
	// start) before the informers start; until then the filters trust
	// nothing and the verbs answer 503.
	trust := &podtrust.Filter{Events: recorder, Component: extender.FieldManager}
	argsTrust := &podtrust.Filter{}
	gangClient := &planner.KubeGang{Client: client}

	cache := extender.NewCache()
	if !o.numaFit {
		cache.IgnoreNUMA()
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	nodeInf := factory.Core().V1().Nodes().Informer()
	podInf := factory.Core().V1().Pods().Informer()
	if err := podInf.SetTransform(trust.Transform); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	if err := extender.Watch(ctx, cache, nodeInf, podInf, recorder); err != nil {
		return err
	}
	if l, ok := policy.(*extender.LearnedPolicy); ok {
		if err := l.Learn(ctx, podInf, cache); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "reservations",
		Help: "Placements the extender counts ahead of the informers: binds in flight, and gang members (or queued pods) planned, or holding nodes a workload reserved, until they are seen bound.",
	}, func() float64 { return float64(cache.Reservations()) }))
	metrics := extender.NewMetrics(reg)
	podLister := factory.Core().V1().Pods().Lister()
	// The scheduler's arguments are filtered without Events: the
	// informer's transform already reported each pod.
	srv := extender.NewServer(cache, policy, &extender.KubePods{Client: client, Lister: podLister, Trust: trust}, recorder, metrics)
	srv.SetShortlist(o.shortlist)

	var dyn dynamic.Interface
	if o.gangPlanner || o.quota || o.queues {
		if dyn, err = dynamic.NewForConfig(cfg); err != nil {
			return fmt.Errorf("dynamic client: %w", err)
		}
	}
	gangClient.Dynamic = dyn
	var quotaWatcher *extender.CRDWatcher
	trigger := make(chan struct{}, 1)
	quotaChanged := make(chan struct{}, 1)
	// Without --quota the ledger reads no ElasticQuota, as with the CRD
	// not installed: nothing is enforced, but the gang rules of
	// kube-scheduler's preemption (the preempt verb keeps a gang whole
	// but for its extra members) still read the pods through it.
	var quotas equota.Source = equota.NoQuotas{}
	if o.quota {
		quotaWatcher = &extender.CRDWatcher{Dynamic: dyn, Discovery: client.Discovery(), Retry: o.quotaRetry, Resource: api.ElasticQuotaGVR, Kind: "ElasticQuota", OnChange: func() {
			select { // quotas changed: a waiting gang may now be admitted
			case trigger <- struct{}{}:
			default:
			}
			select { // and so may pods kube-scheduler parked as unschedulable
			case quotaChanged <- struct{}{}:
			default:
			}
		}}
		quotas = &equota.Watcher{Store: quotaWatcher}
	}
	nodeLister := factory.Core().V1().Nodes().Lister()
	index := &equota.Index{}
	if _, err := podInf.AddEventHandler(index.Handler()); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	ledger := &equota.Ledger{
		Quotas: quotas,
		Index:  index,
		Pods:   func(ns string) ([]*corev1.Pod, error) { return podLister.Pods(ns).List(labels.Everything()) },
		Nodes:  func() ([]*corev1.Node, error) { return nodeLister.List(labels.Everything()) },
		// The GPU ledger holds the pod: a bind's reservation, or the pod
		// bound (its informer handler may be ahead of the quota index's,
		// which would count the pod as unbound meanwhile).
		Reserved: func(uid types.UID) bool {
			_, ok := cache.PodUse(uid)
			return ok
		},
	}
	nodes := extender.QuotaNodes{Cache: cache}
	// The gangs as the planner completed them (a PodGroup's minMember),
	// for the victims' extra members in preemption and reclaim.
	gangBook := &planner.GangBook{}
	// Reclaimed room is held by a plan for the pod it was freed for; the
	// preemptor (with --preemption=false, one that only does this)
	// releases the plans that expire unused.
	reclaimNodes := extender.QuotaRoom{QuotaNodes: nodes, Policy: policy, Plans: gangClient}
	enforcer := &equota.Enforcer{
		GangOf: gangBook.GangOf,
		Ledger: ledger, Nodes: reclaimNodes, Evicter: &extender.KubeEvicter{Client: client, REST: client.CoreV1().RESTClient()},
		Pod:    func(ns, name string) (*corev1.Pod, error) { return podLister.Pods(ns).Get(name) },
		Events: recorder, Metrics: metrics, HoldFor: o.quotaHold,
	}
	if o.reclaimPastBudgets {
		enforcer.PastBudgets = &extender.KubeEvicter{Client: client}
	}
	quotaHooks := &extender.Quota{Enforcer: enforcer, Nodes: nodes}
	srv.SetQuota(quotaHooks)
	reg.MustRegister(&extender.QuotaCollector{State: func() (*quota.State, error) {
		v, err := ledger.View("", nil)
		if err != nil {
			return nil, err
		}
		return v.State, nil
	}})

	var queues *planner.QueueBook
	var queueWatcher *extender.CRDWatcher
	if o.queues && o.gangPlanner { // the planner lifts the queue gate
		nodeLister := factory.Core().V1().Nodes().Lister()
		queueWatcher = &extender.CRDWatcher{Dynamic: dyn, Discovery: client.Discovery(), Retry: o.quotaRetry, Resource: api.QueueGVR, Kind: api.QueueKind, OnChange: func() {
			select { // queues changed: a waiting workload may now be admitted
			case trigger <- struct{}{}:
			default:
			}
		}}
		queues = &planner.QueueBook{
			Queues:   queueWatcher,
			Pods:     func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) },
			Nodes:    func() ([]*corev1.Node, error) { return nodeLister.List(labels.Everything()) },
			HalfLife: o.queueHalfLife, HistoryWeight: o.queueHistoryWt, Dynamic: dyn,
		}
	}

	if queues != nil {
		srv.SetQueues(queues)
	}

	var ready atomic.Bool
	mux := http.NewServeMux()
	if embed != nil {
		// The plugin calls the Server in the process: over HTTP the verbs
		// would have no legitimate caller, only tenants that reach the
		// listener.
		embed(Embedded{Server: srv, Trust: argsTrust, Ready: ready.Load})
	} else {
		verbMux := http.NewServeMux()
		(&verbs.Handler{Core: srv, Trust: argsTrust, Metrics: metrics}).Register(verbMux)
		var h http.Handler = verbs.UntilReady(ready.Load, verbMux)
		if verbCAs != nil {
			h = verbs.RequireClientCert(h)
		}
		mux.Handle("/", h)
	}
	// The gang webhook needs no cache: it only looks at the pod under
	// review. The queue webhook asks the Queues which namespaces they
	// serve (none until they are read: pods are then not gated, as with
	// the webhook down).
	webhook := admission.Handler{}
	if queues != nil {
		webhook.Queued = queues.Queued
	}
	mux.Handle("POST "+pathAdmissionGang, webhook)
	mux.Handle("POST "+pathAdmissionQueue, webhook)
	mux.Handle("POST "+pathAdmissionNVIDIAGPU, admission.Handler{Review: admission.ReviewNVIDIAGPU})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "informer caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	// Read-only views: GET /status (HTML), /status/{occupancy,queues,pending,pods/NS/NAME} (JSON).
	status := extender.NewStatus(cache, queues, enforcer, func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) })
	status.Register(mux, ready.Load)
	reg.MustRegister(status.Collector())
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	var servers []*http.Server
	if o.metricsListen == "" {
		mux.Handle("GET /metrics", metricsHandler)
	} else {
		mm := http.NewServeMux()
		mm.Handle("GET /metrics", metricsHandler)
		servers = append(servers, &http.Server{Addr: o.metricsListen, Handler: mm, ReadHeaderTimeout: 10 * time.Second})
	}
	if o.profilingListen != "" {
		pm := http.NewServeMux()
		pm.HandleFunc("GET /debug/pprof/", pprof.Index)
		pm.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		pm.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		pm.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		pm.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		servers = append(servers, &http.Server{Addr: o.profilingListen, Handler: pm, ReadHeaderTimeout: 10 * time.Second})
	}
	apiSrv := &http.Server{Addr: o.listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	if verbCAs != nil {
		// Asked for, not required: the API server calls the webhooks, and
		// scrapers and the API server's service proxy read /metrics and
		// /status, without one. The verbs check that one was verified.
		apiSrv.TLSConfig = &tls.Config{ClientCAs: verbCAs, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	}
	servers = append([]*http.Server{apiSrv}, servers...)

	preemptor := &extender.Preemptor{
		Cache:  cache,
		Client: &extender.KubePreempt{Evicter: &extender.KubeEvicter{Client: client, REST: client.CoreV1().RESTClient()}, Gang: gangClient},
		Pods:   func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) },
		Policy: policy, Events: recorder, Metrics: metrics, Quota: enforcer, HoldsOnly: !o.preemption,
		MinRuntime: o.preemptionMinRuntime, HoldFor: o.preemptionHold, Queues: queues, Gangs: gangBook,
	}
	if o.preemptionPastBudgets {
		preemptor.PastBudgets = &extender.KubeEvicter{Client: client}
	}
	var gangs *planner.GangPlanner
	if o.gangPlanner {
		pcfg := planner.GangPlannerConfig{
			Ledger: extender.PlannerLedger{Cache: cache}, Client: gangClient,
			Pods:   func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) },
			Policy: policy, Levels: o.gangLevels, Events: recorder,
			SchedulerNames: o.schedulers, Gangs: gangBook, GangTimeoutMax: o.gangTimeoutMax,
		}
		pcfg.Quota = quotaHooks
		pcfg.Queues = queues
		if o.preemption {
			pcfg.Preempt = preemptor
		}
		pcfg.Reservation = planner.ReservationConfig{ReserveAfter: o.reserveAfter, ReserveFor: o.reserveFor, Backfill: o.reserveBackfill, Preemptible: o.reservePreemptible,
			MinGPUs: o.reserveMinGPUs, WaitPerGPU: o.reservePerGPU, Relative: o.reserveRelative,
			PastBudgets: &extender.KubeEvicter{Client: client}}
		if o.reserveAfter > 0 {
			// In the extender's own namespace (the seal key's), which
			// tenants cannot write.
			pcfg.Reservations = &planner.KubeReservations{Client: client, Namespace: o.sealKeyNamespace}
		}
		if queues != nil {
			qr := &planner.QueueReclaimer{
				Ledger: extender.PlannerLedger{Cache: cache}, Evicter: &extender.KubeEvicter{Client: client, REST: client.CoreV1().RESTClient()},
				Pods:   func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) },
				Events: recorder, Metrics: metrics, MinRuntime: o.preemptionMinRuntime, Gangs: gangBook,
			}
			if o.reclaimPastBudgets {
				qr.PastBudgets = &extender.KubeEvicter{Client: client}
			}
			pcfg.QueueReclaim = qr
		}
		if o.consolidation {
			c, err := planner.NewConsolidator(&extender.KubeEvicter{Client: client, REST: client.CoreV1().RESTClient()}, recorder, clock.RealClock{}, o.consolidationPerMinute)
			if err != nil {
				return err
			}
			reg.MustRegister(c.Collector())
			pcfg.Consolidation = c
		}
		gangs = planner.NewGangPlanner(pcfg)
		status.SetReservations(gangs.ReservationRecords)
		if o.reserveAfter > 0 && (o.reserveBackfill || o.reservePreemptible) {
			// Pods kube-scheduler places see reserved room on the
			// planner's terms.
			srv.SetBackfill(gangs)
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "extender", Name: "workload_reservations",
			Help: "Workloads (gangs, queued pods) that hold a reservation of nodes after waiting --reservation-wait.",
		}, func() float64 { return float64(gangs.Reservations()) }))
		if _, err := podInf.AddEventHandler(planner.GangTrigger(trigger)); err != nil {
			return fmt.Errorf("pod informer: %w", err)
		}
	}
	defer factory.Shutdown()
	go func() {
		var sealer *api.Sealer
		err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			if sealer, err = sealkey.GetOrCreate(ctx, sealkey.In(client, o.sealKeyNamespace)); err != nil {
				logger.Info("Reading the seal key", "namespace", o.sealKeyNamespace, "err", err)
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return
		}
		// Set before anything that reads them starts (the informers'
		// goroutines, the planner, and the verbs once ready).
		trust.Sealer, argsTrust.Sealer, gangClient.Sealer = sealer, sealer, sealer
		factory.Start(ctx.Done())
		if quotaWatcher != nil {
			go quotaWatcher.Run(ctx)
		}
		if queues != nil {
			go queueWatcher.Run(ctx)
		}
		for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				logger.Info("Informer cache did not sync", "type", typ)
				return
			}
		}
		// Not ready before the quotas and Queues in force are known (or
		// known to be none): admitting meanwhile could pass a max or a
		// limit.
		decided := func(w interface{ Decided() bool }) bool {
			return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) { return w.Decided(), nil }) == nil
		}
		if quotaWatcher != nil {
			if !decided(quotaWatcher) {
				return
			}
			go enforcer.Run(ctx, o.quotaResync)
			// An ElasticQuota change is no event kube-scheduler reacts
			// to: the pods it may now admit are requeued by a write of
			// their metadata, and quotas not enforced as written are
			// told on with Events.
			requeuer := &equota.Requeuer{
				Store: quotaWatcher,
				Pods:  func(ns string) ([]*corev1.Pod, error) { return podLister.Pods(ns).List(labels.Everything()) },
				Patch: func(ctx context.Context, ns, name string, patch []byte) error {
					_, err := client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: extender.FieldManager})
					return err
				},
				Events: recorder,
			}
			go requeuer.Run(ctx, quotaChanged)
		}
		if queues != nil {
			if !decided(queueWatcher) {
				return
			}
			go queues.Run(ctx, o.queueStatusEach)
		}
		// Not ready before the target workload is learned from the
		// pods that exist.
		if l, ok := policy.(*extender.LearnedPolicy); ok && !decided(l) {
			return
		}
		go preemptor.Run(ctx, o.preemptionResync)
		if o.dynamicMIG {
			nodes, pods := factory.Core().V1().Nodes().Lister(), podLister
			go (&extender.MIGDynamic{Cache: cache, Client: client, Events: recorder,
				Pods:  func() ([]*corev1.Pod, error) { return pods.List(labels.Everything()) },
				Nodes: func() ([]*corev1.Node, error) { return nodes.List(labels.Everything()) }}).Run(ctx, 2*time.Second)
		}
		ready.Store(true)
		logger.Info("Caches synced; ready")
		if gangs != nil {
			gangs.Run(ctx, trigger, o.gangResync)
		}
	}()

	errc := make(chan error, len(servers))
	for i, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", s.Addr, err)
		}
		https := i == 0 && o.tlsCert != ""
		logger.Info("Serving", "address", ln.Addr().String(), "tls", https, "verbs", embed == nil, "verbClientCerts", https && verbCAs != nil, "policy", policy.Name())
		go func() {
			var err error
			if https {
				err = s.ServeTLS(ln, o.tlsCert, o.tlsKey)
			} else {
				err = s.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s: %w", s.Addr, err)
			}
		}()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	logger.Info("Shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown %s: %w", s.Addr, err))
		}
	}
	return errors.Join(errs...)
}
