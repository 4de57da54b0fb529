// Command tessera-localcluster runs a local Kubernetes GPU cluster without
// GPUs (what `make demo` starts): etcd, kube-apiserver and kube-scheduler
// configured with deploy/extender, tessera-extender, and simulated GPU
// nodes (tessera-nodesim: the kubelet's device manager, containerd's NRI
// runtime side and the real tessera-node on a mock machine, one process
// per node). It submits a sample workload and shows a live per-GPU
// occupancy table until interrupted; then it stops every process it
// started. Needs root (each node lives in its own mount namespace).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

func main() {
	os.Exit(run())
}

type options struct {
	repo, binDir, nodes, dir string
	scheduler                string
	extenderFlags            []string
	workload, once           bool
	refresh, timeout         time.Duration
}

func run() int {
	var o options
	fs := flag.NewFlagSet("tessera-localcluster", flag.ContinueOnError)
	fs.StringVar(&o.repo, "repo", "", "the Tessera repository (default: found above the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory of tessera-node, tessera-extender and tessera-nodesim (default <repo>/bin)")
	fs.StringVar(&o.nodes, "nodes", "a100-1=dgx-a100,a100-2=dgx-a100,v100-1=dgx-1v,l40s-1=pcie-2numa", "simulated nodes: name=profile,... (profiles: "+strings.Join(nvmlmock.ProfileNames(), ", ")+")")
	fs.StringVar(&o.dir, "dir", "", "directory for everything the cluster writes (default: a temporary one, removed at exit)")
	fs.StringVar(&o.scheduler, "scheduler", "extender", "extender: kube-scheduler calling the tessera-extender process (deploy/extender); plugin: tessera-scheduler, kube-scheduler with Tessera's plugin and the extender in its process (deploy/scheduler; needs bin/tessera-scheduler, make scheduler)")
	fs.Func("extender-flag", "a flag of the extender (tessera-extender, or the plugin's with --scheduler=plugin), e.g. --extender-flag=--consolidation; repeat for more. They come after the demo's own, "+strings.Join(nodesim.LocalExtenderArgs(), " ")+", and override them", func(f string) error {
		if !strings.HasPrefix(f, "-") {
			return fmt.Errorf("%q is not a flag: want --name or --name=value, e.g. --reservation-wait=1m", f)
		}
		o.extenderFlags = append(o.extenderFlags, f)
		return nil
	})
	fs.BoolVar(&o.workload, "workload", true, "submit the sample workload")
	fs.DurationVar(&o.refresh, "refresh", 2*time.Second, "refresh period of the occupancy table")
	fs.BoolVar(&o.once, "once", false, "wait until the sample workload runs, print the table once and exit (non-zero when it does not run in --timeout)")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "with --once: how long to wait for the workload")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", "0")
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if err := localCluster(o); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-localcluster: %v\n", err)
		return 1
	}
	return 0
}

func localCluster(o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: every simulated node runs in its own mount namespace")
	}
	var err error
	if o.repo == "" {
		if o.repo, err = controlplane.RepoRoot(); err != nil {
			return err
		}
	}
	if o.binDir == "" {
		o.binDir = filepath.Join(o.repo, "bin")
	}
	var schedBin string
	switch o.scheduler {
	case "extender":
	case "plugin":
		schedBin = filepath.Join(o.binDir, "tessera-scheduler")
	default:
		return fmt.Errorf("--scheduler %q: want extender or plugin", o.scheduler)
	}
	nodes, err := nodesim.ParseNodes(o.nodes)
	if err != nil {
		return fmt.Errorf("--nodes: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	say := func(f string, a ...any) {
		fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(f, a...))
	}
	extArgs := append(nodesim.LocalExtenderArgs(), o.extenderFlags...)
	c, err := nodesim.StartCluster(ctx, nodesim.ClusterOptions{
		Dir: o.dir, Nodes: nodes, RepoRoot: o.repo,
		NodeSim:      filepath.Join(o.binDir, "tessera-nodesim"),
		Agent:        filepath.Join(o.binDir, "tessera-node"),
		Extender:     filepath.Join(o.binDir, "tessera-extender"),
		Scheduler:    schedBin,
		ExtenderArgs: extArgs,
		// Users' manifests need their controllers: Deployments, Jobs,
		// a new namespace's default ServiceAccount.
		ControllerManager: true,
		VolcanoCRD:        true, // Volcano manifests run under Tessera
		Logf:              say,
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("\nstopping every process of the local cluster...")
		c.Stop()
		fmt.Println("stopped")
	}()
	say("cluster up: %d nodes with %s", len(nodes), describeNodes(nodes))
	say("extender flags beyond the product's defaults: %s", strings.Join(extArgs, " "))
	// The sample pods' lines only when the sample workload is submitted.
	samples := `  kubectl get pod -n inference llm-7b-0 -o jsonpath='{.metadata.annotations.tessera\.dev/assignment}'
  kubectl tessera status; kubectl tessera explain -n notebooks notebook-4   (make plugin; PATH=$PWD/bin:$PATH)
`
	if !o.workload {
		samples = `  kubectl tessera status; kubectl tessera explain -n <namespace> <pod>   (make plugin; PATH=$PWD/bin:$PATH)
`
	}
	fmt.Printf(`
  kubeconfig: %s
  logs:       %s

  export KUBECONFIG=%s %s=%s %s=%s
  kubectl get nodes,pods -A -o wide
%s  what a node's runtime gave each container (NRI adjustments): %s/<pod-uid>.json

`, c.Kubeconfig(), filepath.Join(c.Dir, "logs"), c.Kubeconfig(), api.EnvKubectlExtender, c.ExtenderURL(), api.EnvKubectlExtenderCA, c.ExtenderCAFile(),
		samples, nodesim.RecordDir(c.NodeStateDir(nodes[0].Name)))
	want := 0
	if o.workload {
		if want, err = submitWorkload(ctx, c, say); err != nil {
			return err
		}
	}
	client := c.Client()
	if o.once {
		deadline := time.Now().Add(o.timeout)
		for {
			occ, counts, err := nodesim.Occupancy(ctx, client)
			if err == nil && counts.Running >= want {
				nodesim.RenderOccupancy(os.Stdout, occ, counts)
				say("the sample workload runs: %d pods Running", counts.Running)
				return nil
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				if err == nil {
					nodesim.RenderOccupancy(os.Stdout, occ, counts)
				}
				return fmt.Errorf("the sample workload did not run within %s (%d of %d pods Running)", o.timeout, counts.Running, want)
			}
			time.Sleep(time.Second)
		}
	}
	fmt.Println("showing the occupancy table; Ctrl-C stops the cluster")
	time.Sleep(o.refresh)
	t := time.NewTicker(o.refresh)
	defer t.Stop()
	for {
		occ, counts, err := nodesim.Occupancy(ctx, client)
		var b bytes.Buffer
		b.WriteString("\033[H\033[2J")
		fmt.Fprintf(&b, "Tessera local cluster, up %s — KUBECONFIG=%s — Ctrl-C stops it\n\n", time.Since(start).Round(time.Second), c.Kubeconfig())
		if err != nil {
			fmt.Fprintf(&b, "reading the cluster: %v\n", err)
		} else {
			nodesim.RenderOccupancy(&b, occ, counts)
		}
		os.Stdout.Write(b.Bytes())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func describeNodes(nodes []nodesim.NodeSpec) string {
	var parts []string
	for _, n := range nodes {
		parts = append(parts, n.Name+" ("+n.Profile+")")
	}
	return strings.Join(parts, ", ")
}

func pod(ns, name string, limits v1.ResourceList, annotations map[string]string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m")}}}},
		},
	}
	return p
}

func q(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

// submitWorkload creates the sample workload and returns how many of its
// pods should end up Running.
func submitWorkload(ctx context.Context, c *nodesim.Cluster, say func(string, ...any)) (int, error) {
	client := c.Client()
	for _, ns := range []string{"inference", "training", "notebooks"} {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			return 0, err
		}
	}
	var pods []*v1.Pod
	running := 0
	// Fractional inference: slices of one GPU each.
	for i := range 6 {
		pods = append(pods, pod("inference", fmt.Sprintf("llm-7b-%d", i), v1.ResourceList{api.ResourceGPUMemory: q(16), api.ResourceGPUCore: q(30)}, nil))
	}
	for i := range 4 {
		pods = append(pods, pod("inference", fmt.Sprintf("embed-%d", i), v1.ResourceList{api.ResourceGPUMemory: q(4), api.ResourceGPUCore: q(10)}, nil))
	}
	running += 10
	// A gang-scheduled training job: two 8-GPU workers on NVLink, placed
	// all or nothing (the gang webhook of deploy/extender gates them at
	// creation); and a 4-GPU fine-tuning pod on one NVLink clique.
	for i := range 2 {
		pods = append(pods, pod("training", fmt.Sprintf("bert-large-worker-%d", i), v1.ResourceList{api.ResourceGPU: q(8)},
			map[string]string{api.AnnotationGang: "bert-large", api.AnnotationGangMinMember: "2", api.AnnotationNVLink: "required"}))
	}
	pods = append(pods, pod("training", "finetune", v1.ResourceList{api.ResourceGPU: q(4)}, map[string]string{api.AnnotationNVLink: "required"}))
	running += 3
	// Notebooks in a namespace whose ElasticQuota allows 24 GiB of GPU
	// memory: the fifth notebook waits.
	quota := false
	if dyn, err := c.Dynamic(); err == nil {
		eq := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
			"metadata": map[string]any{"name": "notebooks", "namespace": "notebooks"},
			"spec": map[string]any{
				"min": map[string]any{string(api.ResourceGPUMemory): "12"},
				"max": map[string]any{string(api.ResourceGPUMemory): "24"},
			},
		}}
		_, err := dyn.Resource(nodesim.ElasticQuotaGVR).Namespace("notebooks").Create(ctx, eq, metav1.CreateOptions{})
		switch {
		case err == nil || apierrors.IsAlreadyExists(err):
			quota = true
			say("ElasticQuota notebooks/notebooks: min 12, max 24 GiB of tessera.dev/gpu-memory")
		default:
			say("no ElasticQuota (%v): notebooks run in a plain namespace", err)
		}
	}
	for i := range 5 {
		pods = append(pods, pod("notebooks", fmt.Sprintf("notebook-%d", i), v1.ResourceList{api.ResourceGPUMemory: q(6), api.ResourceGPUCore: q(10)}, nil))
	}
	if quota {
		running += 4
	} else {
		running += 5
	}
	for _, p := range pods {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	say("submitted %d pods: 10 fractional inference pods, a 2 x 8-GPU gang and a 4-GPU NVLink pod, 5 notebooks", len(pods))
	return running, nil
}
