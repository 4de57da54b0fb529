package extender

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// spreadPod is a slice of memUnits memory units and cores percent spread
// over count GPUs (api.AnnotationGPUCount), pinned to node.
func spreadPod(name, node string, count int, memUnits, cores int64) *corev1.Pod {
	p := testbuild.Pod(name).Shared(memUnits, cores).Obj()
	p.UID = types.UID("uid-" + name)
	p.Annotations[api.AnnotationGPUCount] = fmt.Sprint(count)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// boundSpread is a pod bound to node with a slice of memUnits units and
// cores percent on each of the GPUs idx (its MPS set).
func boundSpread(name, node string, memUnits, cores int64, idx ...int) *corev1.Pod {
	b := testbuild.Pod(name).Shared(memUnits*int64(len(idx)), cores*int64(len(idx))).Node(node).On(idx[0], memUnits*1024, cores)
	for _, i := range idx[1:] {
		b.Assign.Containers[0].Shared.Spread = append(b.Assign.Containers[0].Shared.Spread, api.GPURef{UUID: testbuild.GPUUUID(node, i), Index: i})
	}
	p := b.Obj()
	p.Annotations[api.AnnotationGPUCount] = fmt.Sprint(len(idx))
	return p
}

// indices are the indices of gpus.
func indices(gpus []api.GPURef) []int {
	out := make([]int, len(gpus))
	for i, g := range gpus {
		out[i] = g.Index
	}
	return out
}

// A multi-GPU slice (tessera.dev/gpu-count) in a namespace a Queue serves
// is planned on all of its GPUs, as its bind places it, and binds there.
// Its plan named one GPU before: the ledger held 1/N of the slice, and the
// bind, forcing it onto that one GPU, failed every time ("its plan put it
// on GPU ..., which no longer has room", 31 FailedBinding Events in 5
// minutes on make demo's empty a100-1) while every whole-GPU bind of the
// node waited for it.
func TestQueuedMultiGPUSlicePlannedOnAllItsGPUs(t *testing.T) {
	for _, tc := range []struct {
		name string
		gpus int
		// bound are pods already on the node.
		bound          []*corev1.Pod
		count          int
		memUnits, core int64
		want           []int // the GPUs planned and bound
		perGPU         string
	}{
		{name: "8 GPUs of an empty node (the tester's pod)", gpus: 8, count: 8, memUnits: 8, core: 8,
			want: []int{0, 1, 2, 3, 4, 5, 6, 7}, perGPU: "1024 MiB 1%"},
		{name: "2 GPUs beside a single slice", gpus: 4, count: 2, memUnits: 4, core: 20,
			bound: []*corev1.Pod{testbuild.Pod("single").Shared(10, 50).Node("n").On(0, 10240, 50).Obj()},
			want:  []int{1, 2}, perGPU: "2048 MiB 10%"},
		{name: "2 GPUs: the MPS set of two with room", gpus: 4, count: 2, memUnits: 4, core: 20,
			bound: []*corev1.Pod{boundSpread("set", "n", 10, 50, 2, 3)},
			want:  []int{2, 3}, perGPU: "2048 MiB 10%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testbuild.Node("n").GPUs(tc.gpus, "A100", 40960).Obj()
			node.Labels = map[string]string{"kubernetes.io/hostname": "n"}
			pod := spreadPod("spread", "n", tc.count, tc.memUnits, tc.core)
			pod.Namespace = "team-a"
			pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
			f := newFixture(t, []*corev1.Node{node}, tc.bound)
			f.server.SetQueues(namespaces{"team-a": true})
			now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			pod.CreationTimestamp = metav1.NewTime(now)
			client := fake.NewClientset(pod)
			list := func() ([]*corev1.Pod, error) {
				l, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
				if err != nil {
					return nil, err
				}
				out := make([]*corev1.Pod, len(l.Items))
				for i := range l.Items {
					out[i] = &l.Items[i]
				}
				return append(out, tc.bound...), nil
			}
			q := &api.Queue{Name: "team-a", Namespaces: []string{"team-a"}, Resources: map[corev1.ResourceName]api.QueueResource{
				api.ResourceGPUMemory: {Guaranteed: 1000, Weight: 1}, api.ResourceGPUCore: {Guaranteed: 10000, Weight: 1},
			}}
			book := &planner.QueueBook{Queues: testbuild.Objects{q.Unstructured()}, Pods: list,
				Nodes: func() ([]*corev1.Node, error) { return []*corev1.Node{node}, nil }, Now: func() time.Time { return now }}
			p := planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: PlannerLedger{Cache: f.cache}, Client: &planner.KubeGang{Client: client, Sealer: testbuild.Sealer(t)},
				Pods: list, Policy: testPolicy(t, PolicyBinpack), Events: f.events, Now: func() time.Time { return now }, Queues: book})
			if err := p.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			planned, err := client.CoreV1().Pods("team-a").Get(context.Background(), "spread", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			plan, ok, err := api.GetGangPlan(planned.Annotations)
			if !ok || err != nil {
				t.Fatalf("no plan (%v); events:\n%s", err, strings.Join(f.events.Events, "\n"))
			}
			if got := indices(plan.SliceGPUs()); !slices.Equal(got, tc.want) {
				t.Fatalf("plan %+v names GPUs %v, want %v", plan, got, tc.want)
			}
			// The ledger holds its share of each planned GPU.
			f.cache.SetPod(planned)
			st := mustState(t, f.cache, "n")
			for _, i := range tc.want {
				if !slices.Contains(st.GPUs[i].Pods, planned.UID) {
					t.Errorf("GPU %d: pods %v, want the planned slice counted there", i, st.GPUs[i].Pods)
				}
			}
			f.pods.mu.Lock()
			f.pods.pods["team-a/spread"] = planned.DeepCopy()
			f.pods.mu.Unlock()
			var res extenderv1.ExtenderBindingResult
			f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "team-a", PodName: "spread", PodUID: planned.UID, Node: "n"}, &res)
			if res.Error != "" {
				t.Fatalf("bind: %s\nevents:\n%s", res.Error, strings.Join(f.events.Events, "\n"))
			}
			got, _ := f.pods.GetPod(context.Background(), "team-a", "spread")
			a, ok, err := api.GetAssignment(got.Annotations)
			if !ok || err != nil {
				t.Fatalf("assignment: %v %v", ok, err)
			}
			s := a.Container("main").Shared
			if s == nil || !slices.Equal(indices(s.GPUs()), tc.want) || fmt.Sprintf("%d MiB %d%%", s.MemoryMiB, s.Cores) != tc.perGPU {
				t.Errorf("assignment %+v, want GPUs %v with %s each", s, tc.want, tc.perGPU)
			}
		})
	}
}

// A plan that names fewer GPUs than its slice spans (one, as plans of
// multi-GPU slices did before) holds them by count, and the bind places
// the slice (it failed every time, bound to that one GPU).
func TestBindOfAMultiGPUSliceWhosePlanNamesOneGPU(t *testing.T) {
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
	pod := withPlan(t, spreadPod("spread", "n", 2, 4, 20), "n", 1)
	f := newFixture(t, []*corev1.Node{node}, []*corev1.Pod{pod}, pod)
	if st := mustState(t, f.cache, "n"); st.PendingWhole != 2 {
		t.Errorf("the plan holds %d GPUs by count, want 2", st.PendingWhole)
	}
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "spread", PodUID: pod.UID, Node: "n"}, &res)
	if res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	got, _ := f.pods.GetPod(context.Background(), "default", "spread")
	a, _, err := api.GetAssignment(got.Annotations)
	if err != nil || a == nil || a.Container("main").Shared == nil || len(a.Container("main").Shared.GPUs()) != 2 {
		t.Fatalf("assignment %+v (%v), want the slice on 2 GPUs", a, err)
	}
}
