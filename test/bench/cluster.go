package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/api"
)

const (
	gpusPerNode = 8
	gpuModel    = "NVIDIA H100 80GB HBM3"
	gpuMemMiB   = 81920
	memUnitMiB  = 1024
)

// gpuUUID is GPU i of node.
func gpuUUID(node string, i int) string {
	h := uint32(2166136261)
	for _, c := range []byte(node) {
		h = (h ^ uint32(c)) * 16777619
	}
	return fmt.Sprintf("GPU-%08x-%04x", h, i)
}

// nodeShape is what a fake node has: CPU, memory, and GPUs of one model
// with gpuMemMiB each, all on one NVSwitch or none.
type nodeShape struct {
	cpuMilli, memMiB int64
	gpus             int
	model            string
	gpuMemMiB        int
	nvswitch         bool
}

// benchShape is the fake node of the throughput benchmarks.
var benchShape = nodeShape{cpuMilli: 256000, memMiB: 2048 * 1024, gpus: gpusPerNode, model: gpuModel, gpuMemMiB: gpuMemMiB, nvswitch: true}

// inventoryOf is what the node agent would publish for a node of shape s:
// every GPU NVSwitch-connected (one clique) when s.nvswitch (the 8-GPU
// node of benchShape), else over the host bridge (no clique).
func inventoryOf(node string, s nodeShape) *api.GPUInventory {
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: memUnitMiB, SharedIsolation: true,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}}
	all := make([]int, s.gpus)
	for i := range all {
		all[i] = i
	}
	link := "PHB"
	if s.nvswitch {
		link = "NVS18"
	}
	for i := 0; i < s.gpus; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: gpuUUID(node, i), Model: s.model,
			MemoryMiB: uint64(s.gpuMemMiB), MemoryUnits: s.gpuMemMiB / memUnitMiB, NUMANode: i * 2 / s.gpus, Healthy: true})
		row := make([]string, s.gpus)
		for j := range row {
			if i == j {
				row[j] = "X"
			} else {
				row[j] = link
			}
		}
		inv.Links = append(inv.Links, row)
	}
	if s.nvswitch && s.gpus > 1 {
		inv.NVLinkCliques = [][]int{all}
	}
	return inv
}

// fakeNode is a Node as a kubelet with the node agent would leave it:
// capacities including Tessera's extended resources, Ready, loopback
// address, the inventory annotation.
func fakeNode(name string) (*v1.Node, error) {
	return fakeNodeOf(name, benchShape)
}

// fakeNodeOf is fakeNode for a node of shape s (no GPU resources nor
// inventory without GPUs).
func fakeNodeOf(name string, s nodeShape) (*v1.Node, error) {
	ann := map[string]string{}
	q := func(n int) resource.Quantity { return *resource.NewQuantity(int64(n), resource.DecimalSI) }
	capacity := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(s.cpuMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(s.memMiB<<20, resource.BinarySI),
		v1.ResourcePods:   resource.MustParse("250"),
	}
	if s.gpus > 0 {
		if err := api.SetGPUInventory(ann, inventoryOf(name, s)); err != nil {
			return nil, fmt.Errorf("inventory of %s: %w", name, err)
		}
		capacity[api.ResourceGPU] = q(s.gpus)
		capacity[api.ResourceGPUMemory] = q(s.gpus * (s.gpuMemMiB / memUnitMiB))
		capacity[api.ResourceGPUCore] = q(s.gpus * api.CoresPerGPU)
	}
	now := metav1.Now()
	cond := func(t v1.NodeConditionType, st v1.ConditionStatus, reason string) v1.NodeCondition {
		return v1.NodeCondition{Type: t, Status: st, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann,
			Labels: map[string]string{v1.LabelHostname: name, "bench.tessera.dev/fake": "true"}},
		Status: v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Conditions: []v1.NodeCondition{
				cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady"),
				cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory"),
				cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure"),
				cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: name}},
		},
	}, nil
}

// createNodes creates nodes bench-node-<from> .. bench-node-<to-1> with
// workers in parallel. Each node is created with its status (the API
// server keeps a new Node's status, as kubelet registration relies on)
// and then has the node.kubernetes.io/not-ready taint, which the
// TaintNodesByCondition admission plugin puts on every new Node, taken off
// as the node lifecycle controller would.
func createNodes(ctx context.Context, client kubernetes.Interface, from, to, workers int) error {
	return createNodesWith(ctx, client, from, to, workers, fakeNode)
}

// createNodesWith is createNodes with the Node objects made by mk.
func createNodesWith(ctx context.Context, client kubernetes.Interface, from, to, workers int, mk func(name string) (*v1.Node, error)) error {
	return parallel(ctx, from, to, workers, func(ctx context.Context, i int) error {
		n, err := mk(fmt.Sprintf("bench-node-%05d", i))
		if err != nil {
			return err
		}
		return createNode(ctx, client, n)
	})
}

// createNode creates n with its status and takes off the not-ready taint
// (see createNodes).
func createNode(ctx context.Context, client kubernetes.Interface, n *v1.Node) error {
	out, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	if len(out.Spec.Taints) == 0 {
		return nil
	}
	var keep []v1.Taint
	for _, t := range out.Spec.Taints {
		if t.Key != v1.TaintNodeNotReady && t.Key != v1.TaintNodeUnreachable {
			keep = append(keep, t)
		}
	}
	patch := fmt.Appendf(nil, `[{"op":"test","path":"/metadata/resourceVersion","value":%q},{"op":"replace","path":"/spec/taints","value":%s}]`,
		out.ResourceVersion, mustJSON(keep))
	if _, err := client.CoreV1().Nodes().Patch(ctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("remove not-ready taint from %s: %w", n.Name, err)
	}
	return nil
}

// shape is one kind of GPU pod of the mix.
type shape struct {
	name     string
	gpus     int64 // whole GPUs
	memUnits int64 // shared slice: memory units
	cores    int64 // shared slice: cores (percent of one GPU)
}

// podMix is the cycle of shapes the benchmark creates, in order: half
// whole-GPU pods, half shared slices.
func podMix() []shape {
	return []shape{
		{name: "1gpu", gpus: 1},
		{name: "slice-10g-25", memUnits: 10, cores: 25},
		{name: "2gpu", gpus: 2},
		{name: "slice-20g-50", memUnits: 20, cores: 50},
		{name: "1gpu", gpus: 1},
		{name: "slice-5g-10", memUnits: 5, cores: 10},
		{name: "4gpu", gpus: 4},
		{name: "slice-40g-0", memUnits: 40},
	}
}

func benchPod(ns, schedulerName, run string, i int) *v1.Pod {
	mix := podMix()
	s := mix[i%len(mix)]
	limits := v1.ResourceList{}
	set := func(r v1.ResourceName, v int64) {
		if v > 0 {
			limits[r] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	set(api.ResourceGPU, s.gpus)
	set(api.ResourceGPUMemory, s.memUnits)
	set(api.ResourceGPUCore, s.cores)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d-%s", run, i, s.name), Namespace: ns,
			Labels: map[string]string{runLabel: run, "bench.tessera.dev/shape": s.name}},
		Spec: v1.PodSpec{
			SchedulerName: schedulerName,
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits, Requests: v1.ResourceList{
					v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")}}}},
		},
	}
}

// runResult is one measured scheduling run.
type runResult struct {
	pods         int
	createdIn    time.Duration // first create to last create returned
	boundIn      time.Duration // first create to last pod bound
	firstBoundIn time.Duration
}

func (r runResult) podsPerSecond() float64 { return float64(r.pods) / r.boundIn.Seconds() }

// runLabel tells the pods of one run from those of another.
const runLabel = "bench.tessera.dev/run"

// measure creates pods 0..n-1 of run in ns with workers in parallel and
// waits (at most timeout) until an informer has seen every one of them
// with a node.
//
// An informer rather than a bare watch: the API server closes a watch
// whose reader falls behind a burst ("Forcing pods watcher close due to
// unresponsiveness", which happens here on a loaded machine), and a watch
// at the latest resourceVersion fails after 3s when the pods watch cache
// has seen no event since etcd moved on; the informer's reflector lists
// and watches again in both cases. Its list starts from the watch cache,
// which can still hold pods of an earlier run whose deletion it has not
// seen yet; the run label keeps them out.
func measure(ctx context.Context, client kubernetes.Interface, ns, schedulerName, run string, n, workers int, timeout time.Duration) (runResult, error) {
	return measureWith(ctx, client, ns, run, n, workers, timeout, func(i int) *v1.Pod { return benchPod(ns, schedulerName, run, i) })
}

// measureWith is measure with pod i made by mk (which must give it the
// label runLabel=run).
func measureWith(ctx context.Context, client kubernetes.Interface, ns, run string, n, workers int, timeout time.Duration, mk func(i int) *v1.Pod) (runResult, error) {
	var (
		mu      sync.Mutex
		start   time.Time
		first   time.Duration
		last    time.Duration
		bound   = map[string]bool{}
		allDone = make(chan struct{})
	)
	seen := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if bound[p.Name] || start.IsZero() {
			return
		}
		bound[p.Name] = true
		if len(bound) == 1 {
			first = time.Since(start)
		}
		if len(bound) == n {
			last = time.Since(start)
			close(allDone)
		}
	}
	stopWatch, err := watchRunPods(ctx, client, ns, run, seen)
	if err != nil {
		return runResult{}, err
	}
	defer stopWatch()

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	createErr := make(chan error, 1)
	var createdIn time.Duration
	go func() {
		err := parallel(ctx, 0, n, workers, func(ctx context.Context, i int) error {
			if _, err := client.CoreV1().Pods(ns).Create(ctx, mk(i), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create pod %d: %w", i, err)
			}
			return nil
		})
		createdIn = time.Since(start)
		createErr <- err
	}()
	if err := <-createErr; err != nil {
		return runResult{}, err
	}
	select {
	case <-allDone:
	case <-ctx.Done():
		mu.Lock()
		got := len(bound)
		mu.Unlock()
		return runResult{}, fmt.Errorf("after %s: %d of %d pods bound: %w; %s", timeout, got, n, ctx.Err(),
			pendingReasons(context.Background(), client, ns))
	}
	mu.Lock()
	defer mu.Unlock()
	return runResult{pods: n, createdIn: createdIn, boundIn: last, firstBoundIn: first}, nil
}

// pendingReasons summarises why pods in ns are not bound, for errors.
func pendingReasons(ctx context.Context, client kubernetes.Interface, ns string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "list pods: " + err.Error()
	}
	reasons := map[string]int{}
	for _, p := range list.Items {
		if p.Spec.NodeName != "" {
			continue
		}
		r := "no PodScheduled condition yet"
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				r = c.Message
			}
		}
		reasons[r]++
	}
	var parts []string
	for r, c := range reasons {
		parts = append(parts, fmt.Sprintf("%d pending: %s", c, r))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// deletePods force-deletes every pod in ns (nothing runs them: no kubelet)
// and waits (at most timeout) until none is left.
func deletePods(ctx context.Context, client kubernetes.Interface, ns string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods in %s: %w", ns, err)
	}
	for {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil && len(list.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for pods in %s to be deleted: %w", ns, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// parallel calls f for i in [from, to) on workers goroutines and returns
// the first error (which cancels the rest).
func parallel(ctx context.Context, from, to, workers int, f func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
feed:
	for i := from; i < to; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with taints, which always marshal
	}
	return b
}

// watchRunPods calls seen with every pod of run (label runLabel) in ns
// that an informer adds or updates, once the informer has synced (within a
// minute); stop ends the watch.
func watchRunPods(ctx context.Context, client kubernetes.Interface, ns, run string, seen func(obj any)) (stop func(), err error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = runLabel + "=" + run }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	stopCh := make(chan struct{})
	factory.Start(stopCh)
	stop = func() {
		close(stopCh)
		factory.Shutdown()
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		stop()
		return nil, errors.New("pod informer did not sync within 1m")
	}
	return stop, nil
}
