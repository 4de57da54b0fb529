package main

// The trace replay of bench-peers (--peer-workloads=trace, issue 18): pods
// sampled from the Alibaba GPU trace (the FGD trace, ../shared/traces),
// created one after the other in the trace's creation order on a fake
// cluster shaped like the trace's nodes, through each system; then, from
// the API server's view (the pods bound and their requests), the pods
// placed and pending and the unallocated GPU % by the simulator's
// definition (package sim). Next to them, what tessera-sim's replay of the
// same sample on the same nodes predicts for the FGD and tessera policies.
// See docs/bench.md.
//
// The trace is read in place with package sim's loader; nothing of it is
// copied.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/sim"
)

const (
	wlTrace = "trace"

	// traceGPUMemMiB is the memory the fake trace nodes give every GPU,
	// whatever its model. The trace asks for a share of a GPU's compute
	// (gpu_milli) and no GPU memory, so tessera's slice is core-only (its
	// memory is its cores' percentage of the GPU's) and HAMi's asks the
	// same percentage of memory: with 25600 MiB (25 units of 1 GiB) c % is
	// exactly 256·c MiB for both, and slices adding up to 100 % fit one
	// GPU. With a GPU's real size (16 GiB for a T4) each slice's memory
	// would be rounded up to a whole MiB, and slices adding up to 100 %
	// of one GPU would not fit it: a rounding artefact the trace does not
	// ask for.
	traceGPUMemMiB = 25 * memUnitMiB

	// traceIndexAnnotation holds a replay pod's index in the sample.
	traceIndexAnnotation = "bench.tessera.dev/trace-index"
)

// traceConfig are the flags of the trace replay.
type traceConfig struct {
	dir         string
	nodes, pods string
	sample      int
	seed        int64
	quiet       time.Duration
	timeout     time.Duration
	// tesseraAgent runs tesseraNodeAgent for tessera and tessera-plugin.
	tesseraAgent bool
}

func addTraceFlags(fs *flag.FlagSet, tc *traceConfig) {
	fs.StringVar(&tc.dir, "trace-dir", "", "with --peer-workloads=trace: the Alibaba GPU trace's folder (default <repo>/../shared/traces/alibaba-gpu-v2023)")
	fs.StringVar(&tc.nodes, "trace-nodes", "openb_node_list_gpu_node.csv", "with --peer-workloads=trace: node list, in --trace-dir unless a path")
	fs.StringVar(&tc.pods, "trace-pods", "openb_pod_list_default.csv", "with --peer-workloads=trace: pod list, in --trace-dir unless a path")
	fs.IntVar(&tc.sample, "trace-sample", 2000, "with --peer-workloads=trace: pods sampled (without replacement) from the pod list")
	fs.Int64Var(&tc.seed, "trace-seed", 42, "with --peer-workloads=trace: seed of the sample")
	fs.DurationVar(&tc.quiet, "trace-quiet", time.Minute, "with --peer-workloads=trace: a replay ends when every pod is bound or was found unschedulable and no pod was bound for this long")
	fs.DurationVar(&tc.timeout, "trace-timeout", 30*time.Minute, "with --peer-workloads=trace: limit of one system's replay")
	fs.BoolVar(&tc.tesseraAgent, "trace-tessera-agent", true, "with --peer-workloads=trace: record the GPUs of tessera's and tessera-plugin's whole-GPU pods as its node agent would (false: never, as the other workloads)")
}

// tracePath is file in dir unless it is a path of its own.
func tracePath(dir, file string) string {
	if strings.ContainsRune(file, filepath.Separator) {
		return file
	}
	return filepath.Join(dir, file)
}

// traceSample is the replay's workload and cluster.
type traceSample struct {
	// trace is the whole trace (its pod list is FGD's target workload).
	trace *sim.Trace
	seed  int64
	// pods are the sampled pods in arrival order: the trace's order,
	// which is creation order (the pod lists are sorted by creation_time).
	pods []sim.PodSpec
	// nodes are the cluster, sorted by name.
	nodes []sim.NodeSpec
	// demandMilli is the sample's GPU request (sim's arrived workload
	// once every pod has arrived).
	demandMilli int64
}

func (s *traceSample) gpus() int {
	n := 0
	for _, x := range s.nodes {
		n += x.GPUs
	}
	return n
}

// sampleTrace draws n of t's pods without replacement with seed, keeps
// them in the trace's order, and shapes the cluster for them
// (shapeCluster).
func sampleTrace(t *sim.Trace, n int, seed int64) (*traceSample, error) {
	if n <= 0 || n > len(t.Pods) {
		return nil, fmt.Errorf("trace sample: %d pods asked, the pod list has %d", n, len(t.Pods))
	}
	idx := rand.New(rand.NewSource(seed)).Perm(len(t.Pods))[:n]
	sort.Ints(idx)
	s := &traceSample{trace: t, seed: seed, pods: make([]sim.PodSpec, n)}
	for i, j := range idx {
		s.pods[i] = t.Pods[j]
		s.demandMilli += t.Pods[j].Request.TotalGPUMilli()
	}
	if s.demandMilli == 0 {
		return nil, errors.New("trace sample: the sampled pods ask for no GPU")
	}
	var err error
	s.nodes, err = shapeCluster(t.Nodes, s.demandMilli)
	return s, err
}

// nodeType is a kind of node of the trace: the same CPU, memory, GPU count
// and model.
type nodeType struct {
	key   [2]string // model, cpu/mem/gpus
	gpus  int
	nodes []sim.NodeSpec // by name
}

// shapeCluster picks from nodes a cluster whose GPU capacity is the
// closest to demandMilli (the sample's GPU request, so that all pods
// arrived is sim's 100 % arrived), with the trace's mix of node types:
// for each node count it apportions the count over the types in
// proportion to the trace's (largest remainders), and takes the first
// nodes of each type by name. Ties go to the smaller cluster.
func shapeCluster(nodes []sim.NodeSpec, demandMilli int64) ([]sim.NodeSpec, error) {
	sorted := append([]sim.NodeSpec(nil), nodes...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var types []*nodeType
	byKey := map[[2]string]*nodeType{}
	for _, n := range sorted {
		k := [2]string{n.Model, fmt.Sprintf("%d/%d/%d", n.CPUMilli, n.MemMiB, n.GPUs)}
		t := byKey[k]
		if t == nil {
			t = &nodeType{key: k, gpus: n.GPUs}
			byKey[k] = t
			types = append(types, t)
		}
		t.nodes = append(t.nodes, n)
	}
	counts := make([]int, len(types))
	for i, t := range types {
		counts[i] = len(t.nodes)
	}
	var best []int
	var bestDiff int64 = -1
	for total := 1; total <= len(sorted); total++ {
		take := apportion(counts, total)
		var capMilli int64
		for i, k := range take {
			capMilli += int64(k*types[i].gpus) * allocator.MilliPerGPU
		}
		diff := capMilli - demandMilli
		if diff < 0 {
			diff = -diff
		}
		if bestDiff < 0 || diff < bestDiff {
			best, bestDiff = take, diff
		}
	}
	if best == nil {
		return nil, errors.New("trace cluster: the node list is empty")
	}
	var out []sim.NodeSpec
	for i, k := range best {
		out = append(out, types[i].nodes[:k]...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// apportion divides total seats over groups in proportion to counts by
// largest remainders (Hamilton's method); equal remainders go to the
// larger group, then the earlier one. No group gets more than its count.
func apportion(counts []int, total int) []int {
	sum := 0
	for _, c := range counts {
		sum += c
	}
	out := make([]int, len(counts))
	if sum == 0 || total <= 0 {
		return out
	}
	total = min(total, sum)
	rem := make([]int, len(counts)) // remainder numerators over sum
	given := 0
	for i, c := range counts {
		out[i] = c * total / sum
		rem[i] = c * total % sum
		given += out[i]
	}
	order := make([]int, len(counts))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if rem[i] != rem[j] {
			return rem[i] > rem[j]
		}
		return counts[i] > counts[j]
	})
	for _, i := range order {
		if given == total {
			break
		}
		if out[i] < counts[i] {
			out[i]++
			given++
		}
	}
	return out
}

// traceNodeShape is the fake node of a trace node: its CPU, memory, GPU
// count and model, traceGPUMemMiB per GPU, no NVLink (the trace has no
// topology; its pods ask for none).
func traceNodeShape(n sim.NodeSpec) nodeShape {
	return nodeShape{cpuMilli: n.CPUMilli, memMiB: n.MemMiB, gpus: n.GPUs, model: "NVIDIA-" + n.Model, gpuMemMiB: traceGPUMemMiB}
}

// createTraceNodes creates the sample's cluster, each node as peerNode
// would make it (Tessera's inventory and HAMi's register annotation).
func createTraceNodes(ctx context.Context, client kubernetes.Interface, nodes []sim.NodeSpec, workers int) error {
	return parallel(ctx, 0, len(nodes), workers, func(ctx context.Context, i int) error {
		n, err := peerNodeOf(nodes[i].Name, traceNodeShape(nodes[i]))
		if err != nil {
			return err
		}
		return createNode(ctx, client, n)
	})
}

// sharesGPU says whether system can place a slice of a GPU; the others
// are given a whole GPU for every sharing pod.
func sharesGPU(system string) bool { return isTessera(system) || system == sysHAMi }

// traceGPULimits is the GPU request of r in system's resource names, and a
// short name of its shape:
//
//   - tessera, tessera-plugin: tessera.dev/gpu N for N whole GPUs; a
//     share of g milli is a core-only slice, tessera.dev/gpu-core g/10 (its
//     memory is then the same percentage of the GPU's);
//   - hami: nvidia.com/gpu N; a share is nvidia.com/gpu 1 with
//     nvidia.com/gpucores and nvidia.com/gpumem-percentage g/10;
//   - kube-scheduler, scheduler-plugins: tessera.dev/gpu N, counted per
//     node, and a share, which they cannot express, as one whole GPU.
func traceGPULimits(system string, r allocator.Request) (v1.ResourceList, string) {
	limits := v1.ResourceList{}
	q := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	whole := api.ResourceGPU
	if system == sysHAMi {
		whole = hamiResourceGPU
	}
	switch r.Kind() {
	case allocator.Whole:
		limits[whole] = q(int64(r.GPUs))
		return limits, fmt.Sprintf("%dgpu", r.GPUs)
	case allocator.Shared:
		pct := (r.GPUMilli*api.CoresPerGPU + allocator.MilliPerGPU - 1) / allocator.MilliPerGPU
		name := fmt.Sprintf("share%d", r.GPUMilli)
		switch {
		case isTessera(system):
			limits[api.ResourceGPUCore] = q(pct)
		case system == sysHAMi:
			limits[hamiResourceGPU] = q(1)
			limits[hamiResourceCores] = q(pct)
			limits[hamiResourceMemPercent] = q(pct)
		default:
			limits[whole] = q(1)
			name += "-as-1gpu"
		}
		return limits, name
	}
	return limits, "cpu"
}

// tracePod is sample pod i (p) of run for system: p's CPU and memory
// requests and its GPU request as traceGPULimits gives it.
func tracePod(system, ns, schedulerName, run string, i int, p sim.PodSpec) *v1.Pod {
	limits, name := traceGPULimits(system, p.Request)
	pod := podWithLimits(ns, schedulerName, run, i, name, limits)
	req := v1.ResourceList{}
	if p.Request.CPUMilli > 0 {
		req[v1.ResourceCPU] = *resource.NewMilliQuantity(p.Request.CPUMilli, resource.DecimalSI)
	}
	if p.Request.MemMiB > 0 {
		req[v1.ResourceMemory] = *resource.NewQuantity(p.Request.MemMiB<<20, resource.BinarySI)
	}
	pod.Spec.Containers[0].Resources.Requests = req
	pod.Annotations = map[string]string{traceIndexAnnotation: strconv.Itoa(i)}
	return pod
}

// allocatedMilli is the GPU compute, in thousandths of a GPU, that pod's
// requests take in the system whose resource names it uses: 1000 for each
// whole GPU (tessera.dev/gpu, or nvidia.com/gpu without a core share), a
// Tessera slice's tessera.dev/gpu-core x 10, a HAMi slice's
// nvidia.com/gpucores (below 100) x 10 on each of its nvidia.com/gpu.
func allocatedMilli(pod *v1.Pod) int64 {
	var total int64
	// Tessera's resources, as its request model reads them.
	if d, err := gpureq.ParsePod(pod); err == nil {
		total += d.Peak.Whole*allocator.MilliPerGPU + gpureq.UsedCoresToMilli(d.Peak.Cores)
	}
	// HAMi's, as HAMi reads them.
	for _, c := range pod.Spec.Containers {
		get := func(r v1.ResourceName) int64 {
			q, ok := c.Resources.Limits[r]
			if !ok {
				q = c.Resources.Requests[r]
			}
			return q.Value()
		}
		if n := get(hamiResourceGPU); n > 0 {
			if cores := get(hamiResourceCores); cores > 0 && cores < api.CoresPerGPU {
				total += n * gpureq.UsedCoresToMilli(cores)
			} else {
				total += n * allocator.MilliPerGPU
			}
		}
	}
	return total
}

// traceOutcome is a replay's result after every pod arrived.
type traceOutcome struct {
	pods, placed int
	// placedBy and pendingBy count pods by the kind of their trace
	// request (allocator.CPUOnly, Shared, Whole).
	placedBy, pendingBy [3]int
	// allocMilli is the GPU compute the placed pods take as the system
	// was asked (a whole GPU for a share in kube-scheduler and
	// scheduler-plugins); demandMilli their trace request.
	allocMilli, demandMilli int64
	// point is sim's curve point of the final state: arrived = the
	// sample's trace GPU request, allocated = allocMilli.
	point sim.Point
	// assignments checks Tessera's assignment annotations of the bound
	// pods (tessera and tessera-plugin only).
	assignments *assignmentCheck
}

// assignmentCheck is what the bound pods' Tessera assignments say: GPUs
// given to more than one whole-GPU pod, to a whole-GPU pod and slices, or
// to slices of more than 100 cores; bound pods without an assignment.
type assignmentCheck struct {
	gpus, overcommitted            int
	wholeUnrecorded, sliceUnplaced int
	// overcommit names the pods of the first over-committed GPUs (by
	// UUID) and what each was given of it.
	overcommit string
}

// overcommitShown is how many over-committed GPUs the check names.
const overcommitShown = 5

func (a *assignmentCheck) String() string {
	s := fmt.Sprintf("%d GPUs assigned, %d of them over-committed; %d bound whole-GPU pods and %d slices without an assignment",
		a.gpus, a.overcommitted, a.wholeUnrecorded, a.sliceUnplaced)
	if a.overcommit != "" {
		s += "; over-committed: " + a.overcommit
	}
	return s
}

// checkAssignments reads the assignment annotations of the bound pods.
func checkAssignments(pods []v1.Pod) (*assignmentCheck, error) {
	c := &assignmentCheck{}
	whole := map[string]int{}
	cores := map[string]int64{}
	holders := map[string][]string{} // GPU -> "pod (whole|N cores)"

	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			continue
		}
		a, ok, err := api.GetAssignment(p.Annotations)
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		var hasWhole, hasShared bool
		if ok {
			for _, ct := range a.Containers {
				for _, g := range ct.GPUs {
					whole[g.UUID]++
					holders[g.UUID] = append(holders[g.UUID], p.Name+" (whole)")
					hasWhole = true
				}
				if ct.Shared != nil {
					for _, u := range ct.Shared.UUIDs() {
						cores[u] += ct.Shared.Cores
						holders[u] = append(holders[u], fmt.Sprintf("%s (%d cores)", p.Name, ct.Shared.Cores))
					}
					hasShared = true
				}
			}
		}
		if wholeGPUs(p) > 0 && !hasWhole {
			c.wholeUnrecorded++
		}
		if wholeGPUs(p) == 0 && allocatedMilli(p) > 0 && !hasShared {
			c.sliceUnplaced++
		}
	}
	seen := map[string]bool{}
	var over []string
	for u, n := range whole {
		seen[u] = true
		if n > 1 || cores[u] > 0 {
			over = append(over, u)
		}
	}
	for u, n := range cores {
		if !seen[u] && n > api.CoresPerGPU {
			over = append(over, u)
		}
		seen[u] = true
	}
	c.gpus, c.overcommitted = len(seen), len(over)
	sort.Strings(over)
	var shown []string
	for _, u := range over[:min(len(over), overcommitShown)] {
		shown = append(shown, fmt.Sprintf("%s: %s", u, strings.Join(holders[u], ", ")))
	}
	c.overcommit = strings.Join(shown, "; ")
	return c, nil
}

// traceOutcomeOf computes the outcome from the sample and the replay's
// pods as the API server has them (bound = spec.nodeName set).
func traceOutcomeOf(s *traceSample, pods []v1.Pod) (traceOutcome, error) {
	o := traceOutcome{pods: len(s.pods)}
	seen := make([]bool, len(s.pods))
	for i := range pods {
		p := &pods[i]
		idx, err := strconv.Atoi(p.Annotations[traceIndexAnnotation])
		if err != nil || idx < 0 || idx >= len(s.pods) || seen[idx] {
			return o, fmt.Errorf("pod %s: bad or repeated %s %q", p.Name, traceIndexAnnotation, p.Annotations[traceIndexAnnotation])
		}
		seen[idx] = true
		if p.Spec.NodeName == "" {
			continue
		}
		r := s.pods[idx].Request
		o.placed++
		o.placedBy[r.Kind()]++
		o.allocMilli += allocatedMilli(p)
		o.demandMilli += r.TotalGPUMilli()
	}
	for i, ok := range seen {
		if !ok {
			return o, fmt.Errorf("sample pod %d (%s) is missing", i, s.pods[i].Name)
		}
	}
	return o, o.finish(s)
}

// finish counts the pending pods and computes the point.
func (o *traceOutcome) finish(s *traceSample) error {
	var all [3]int
	for _, p := range s.pods {
		all[p.Request.Kind()]++
	}
	for k := range all {
		o.pendingBy[k] = all[k] - o.placedBy[k]
	}
	// One event, the final state. BinEvents puts it at its arrived
	// percentage and lends it to the percentages on either side, which
	// have none: the middle point is its own.
	curve := sim.BinEvents([]sim.Event{{ArrivedMilli: s.demandMilli, UsedMilli: o.allocMilli}}, s.gpus())
	pct := int(math.RoundToEven(float64(s.demandMilli) / float64(s.gpus()) / 10))
	p, ok := sim.At(curve, pct)
	if !ok {
		return fmt.Errorf("the sample's GPU request is %.1f%% of the cluster's GPUs, beyond sim's curve (0..%d%%)",
			float64(s.demandMilli)/float64(s.gpus())/10, sim.MaxArrivedPct)
	}
	o.point = p
	return nil
}

// simPolicy is a policy the report simulates on the sample.
type simPolicy struct {
	name string
	make func(s *traceSample) (allocator.Policy, error)
}

// simPolicies are tessera-sim's bestfit, fgd and tessera, built as
// tessera-sim builds them (sim.Run: FGD's target workload from the whole
// pod list with sim's default popularity, every shape for tessera, the
// GPUs of each model), and tessera as tessera-extender builds it
// (extender.NewPolicy with extender.DefaultWorkload: the extender is not
// told the trace's shapes).
func simPolicies() []simPolicy {
	asSim := func(name string) func(s *traceSample) (allocator.Policy, error) {
		return func(s *traceSample) (allocator.Policy, error) {
			pop := 0.0
			if name == allocator.PolicyTessera {
				pop = 1
			}
			w, err := sim.TargetWorkload(s.trace, pop)
			if err != nil {
				return nil, err
			}
			return allocator.NewPolicy(name, allocator.WithWorkload(w), allocator.WithModelCapacity(sim.ModelCapacity(s.nodes)))
		}
	}
	return []simPolicy{
		{allocator.PolicyBestFit, asSim(allocator.PolicyBestFit)},
		{allocator.PolicyFGD, asSim(allocator.PolicyFGD)},
		{allocator.PolicyTessera, asSim(allocator.PolicyTessera)},
		{"tessera, extender's fixed workload", func(*traceSample) (allocator.Policy, error) {
			return extender.NewPolicy(extender.PolicyBinpack, extender.DefaultWorkload(), 1)
		}},
		{"tessera, extender's learned workload", func(*traceSample) (allocator.Policy, error) {
			return extender.NewLearnedPolicy(extender.PolicyBinpack, 1, extender.DefaultLearnWindow, extender.DefaultLearnEvery, extender.DefaultLearnEvery)
		}},
	}
}

// learnedShape is the shape tessera-extender learns from a trace pod (its
// CPU, whole GPUs or slice compute; extender.LearnedPolicy).
func learnedShape(r allocator.Request) allocator.Request {
	return allocator.Request{CPUMilli: r.CPUMilli, GPUs: r.GPUs, GPUMilli: r.GPUMilli}
}

// simulateSample replays the sample on its cluster with policy as
// tessera-sim does (allocator's Fit, Select and Apply, pods in arrival
// order, one that fits nowhere dropped, ties to the smallest node name):
// what the simulator predicts.
func simulateSample(s *traceSample, policy allocator.Policy) (traceOutcome, error) {
	nodes := sim.NewNodes(s.nodes)
	o := traceOutcome{pods: len(s.pods)}
	learned, _ := policy.(*extender.LearnedPolicy)
	for _, pod := range s.pods {
		if learned != nil && pod.Request.Kind() != allocator.CPUOnly {
			// The extender sees each GPU pod as it arrives.
			if _, err := learned.Observe(types.UID(pod.Name), learnedShape(pod.Request)); err != nil {
				return o, err
			}
		}
		sel, err := allocator.Select(policy, nodes, pod.Request, nil)
		if err != nil {
			return o, err
		}
		if sel.Node < 0 {
			continue
		}
		if err := allocator.Apply(nodes[sel.Node], pod.Request, sel.Evaluation.GPUs); err != nil {
			return o, fmt.Errorf("%s: pod %s: %w", policy.Name(), pod.Name, err)
		}
		o.placed++
		o.placedBy[pod.Request.Kind()]++
		o.allocMilli += pod.Request.TotalGPUMilli()
		o.demandMilli += pod.Request.TotalGPUMilli()
	}
	return o, o.finish(s)
}

// simOutcome is a simulated policy's outcome.
type simOutcome struct {
	name string
	traceOutcome
}

// simulate builds sp's policy for s and replays s with it
// (simulateSample).
func (sp simPolicy) simulate(s *traceSample) (traceOutcome, error) {
	p, err := sp.make(s)
	if err != nil {
		return traceOutcome{}, fmt.Errorf("policy %s: %w", sp.name, err)
	}
	o, err := simulateSample(s, p)
	if err != nil {
		return o, fmt.Errorf("simulate the sample with %s: %w", sp.name, err)
	}
	return o, nil
}

// simulateAll simulates every policy of simPolicies on s.
func simulateAll(s *traceSample, logf func(string, ...any)) ([]simOutcome, error) {
	var out []simOutcome
	for _, sp := range simPolicies() {
		t0 := time.Now()
		o, err := sp.simulate(s)
		if err != nil {
			return nil, err
		}
		out = append(out, simOutcome{sp.name, o})
		logf("trace replay: sim %s: %d placed, unallocated GPU %.2f%% (simulated in %s)", sp.name, o.placed, o.point.UnallocatedPct, time.Since(t0).Round(time.Millisecond))
	}
	return out, nil
}

// loadTraceSample reads the trace and draws the sample.
func loadTraceSample(c *config) (*traceSample, error) {
	tc := &c.peers.trace
	dir := tc.dir
	if dir == "" {
		dir = filepath.Join(c.repo, "..", "shared", "traces", "alibaba-gpu-v2023")
	}
	t, err := sim.LoadTrace(tracePath(dir, tc.nodes), tracePath(dir, tc.pods))
	if err != nil {
		return nil, fmt.Errorf("trace replay: %w (the trace is read from --trace-dir, default ../shared/traces/alibaba-gpu-v2023 next to the repository)", err)
	}
	return sampleTrace(t, tc.sample, tc.seed)
}

// traceRun is one system's replay.
type traceRun struct {
	outcome   traceOutcome
	createdIn time.Duration // first create -> last create returned
	lastBound time.Duration // first create -> last pod seen bound
	settledIn time.Duration // first create -> the end of the replay
	timedOut  bool
}

// runTrace creates the sample's pods for system one after the other (so
// that they reach the scheduling queue in the trace's order) and waits
// until every pod is bound or was found unschedulable and no pod was bound
// for the quiet period; then it reads the pods from the API server.
func (e *peerEnv) runTrace(ctx context.Context, system, schedName, run string) (traceRun, error) {
	s, tc := e.sample, &e.c.peers.trace
	var (
		mu        sync.Mutex
		start     time.Time
		lastEvent time.Time
		lastBound time.Duration
		bound     = map[string]bool{}
		unsched   = map[string]bool{}
	)
	seen := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if start.IsZero() {
			return
		}
		if p.Spec.NodeName != "" {
			if !bound[p.Name] {
				bound[p.Name] = true
				lastEvent = time.Now()
				lastBound = lastEvent.Sub(start)
			}
			return
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				unsched[p.Name] = true
			}
		}
	}
	stopWatch, err := watchRunPods(ctx, e.client, e.ns, run, seen)
	if err != nil {
		return traceRun{}, err
	}
	defer stopWatch()

	var r traceRun
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	deadline := start.Add(tc.timeout)
	for i, p := range s.pods {
		if _, err := e.client.CoreV1().Pods(e.ns).Create(ctx, tracePod(system, e.ns, schedName, run, i, p), metav1.CreateOptions{}); err != nil {
			return r, fmt.Errorf("create pod %d: %w", i, err)
		}
	}
	r.createdIn = time.Since(start)
	mu.Lock()
	if lastEvent.Before(start.Add(r.createdIn)) {
		lastEvent = start.Add(r.createdIn)
	}
	mu.Unlock()
	e.logf("%s: trace: %d pods created in %s", system, len(s.pods), r.createdIn.Round(time.Millisecond))
	for next := time.Now().Add(30 * time.Second); ; {
		mu.Lock()
		nb, nu := len(bound), 0
		for name := range unsched {
			if !bound[name] {
				nu++
			}
		}
		quiet := time.Since(lastEvent)
		r.lastBound = lastBound
		mu.Unlock()
		if nb+nu >= len(s.pods) && quiet >= tc.quiet {
			break
		}
		if time.Now().After(deadline) {
			r.timedOut = true
			break
		}
		if time.Now().After(next) {
			e.logf("%s: trace: %d bound, %d found unschedulable, %d not tried yet", system, nb, nu, len(s.pods)-nb-nu)
			next = time.Now().Add(30 * time.Second)
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	r.settledIn = time.Since(start)
	list, err := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: runLabel + "=" + run})
	if err != nil {
		return r, fmt.Errorf("list the replay's pods: %w", err)
	}
	if r.outcome, err = traceOutcomeOf(s, list.Items); err != nil {
		return r, err
	}
	if isTessera(system) {
		if r.outcome.assignments, err = checkAssignments(list.Items); err != nil {
			return r, err
		}
	}
	if r.timedOut {
		return r, fmt.Errorf("trace replay not settled after %s (%s)", tc.timeout, pendingReasons(ctx, e.client, e.ns))
	}
	return r, nil
}

// reportTrace prints the replay's table: the sample, then one row per
// system run and per simulated policy.
func reportTrace(w io.Writer, c *config, s *traceSample, results []peerResult, simulated []simOutcome) {
	if s == nil {
		return
	}
	tc := &c.peers.trace
	var all [3]int
	for _, p := range s.pods {
		all[p.Request.Kind()]++
	}
	fmt.Fprintf(w, "\ntrace replay: %s, %d of its %d pods sampled with seed %d, in creation order (%d whole-GPU, %d sharing, %d CPU-only); GPU request %.1f GPUs\n",
		s.trace.Workload, len(s.pods), len(s.trace.Pods), tc.seed, all[allocator.Whole], all[allocator.Shared], all[allocator.CPUOnly], float64(s.demandMilli)/1000)
	models := map[string]int{}
	for _, n := range s.nodes {
		models[n.Model] += n.GPUs
	}
	var mix []string
	for m, g := range models {
		mix = append(mix, fmt.Sprintf("%s %d", m, g))
	}
	sort.Strings(mix)
	fmt.Fprintf(w, "cluster: %d of the trace's %d nodes, %d GPUs (%s), the trace's node types in proportion, sized so that the sample's GPU request is %.1f%% of its GPUs\n",
		len(s.nodes), len(s.trace.Nodes), s.gpus(), strings.Join(mix, ", "), float64(s.demandMilli)/float64(s.gpus())/10)
	fmt.Fprintln(w, "unallocated GPU % = 100 - GPU allocation ratio once every pod has arrived, as tessera-sim defines it (sim.BinEvents); allocated = the GPU requests of the bound pods, as each system was asked")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tshares a GPU\tplaced\tpending\tpending whole/shared/cpu\tGPU allocated %\tunallocated GPU %\ttrace GPU demand placed %\tcreated in\tlast bound\tsettled\t")
	row := func(name, shares string, o traceOutcome, times string) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d/%d\t%.2f\t%.2f\t%.2f\t%s\t\n", name, shares, o.placed, o.pods-o.placed,
			o.pendingBy[allocator.Whole], o.pendingBy[allocator.Shared], o.pendingBy[allocator.CPUOnly],
			o.point.AllocPct, o.point.UnallocatedPct, float64(o.demandMilli)/float64(s.gpus())/10, times)
	}
	for _, r := range results {
		if r.workload != wlTrace && (r.workload != "" || r.err == nil) {
			continue // not a replay, nor a system that failed to start
		}
		shares := "yes"
		if !sharesGPU(r.system) {
			shares = "no: 1 GPU"
		}
		if r.trace == nil {
			fmt.Fprintf(tw, "%s\t%s\tfailed\t\t\t\t\t\t\t\t\t\n", r.system, shares)
			continue
		}
		t := r.trace
		times := fmt.Sprintf("%s\t%s\t%s", t.createdIn.Round(100*time.Millisecond), t.lastBound.Round(100*time.Millisecond), t.settledIn.Round(100*time.Millisecond))
		name := r.system
		if t.timedOut {
			name += " (timed out)"
		}
		row(name, shares, t.outcome, times)
	}
	for _, o := range simulated {
		row("sim "+o.name, "yes", o.traceOutcome, "-\t-\t-")
	}
	tw.Flush()
	for _, r := range results {
		if r.trace != nil && r.trace.outcome.assignments != nil {
			fmt.Fprintf(w, "%s's assignment annotations: %s\n", r.system, r.trace.outcome.assignments)
		}
	}
}
