package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// podGroup creates a PodGroup of the kind gvr names (scheduler-plugins'
// api.PodGroupGVR or Volcano's api.VolcanoPodGroupGVR) with spec, deleted
// at the end of the test.
func podGroup(t *testing.T, c *nodesim.Cluster, gvr schema.GroupVersionResource, ns, name string, spec map[string]any) {
	t.Helper()
	dyn := dynamicClient(t, c)
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(t.Context(), pg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("PodGroup %s %s/%s: %v", gvr.Group, ns, name, err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(gvr).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// volcanoMember is a pod of a Volcano user's manifest with only
// schedulerName changed: the group-name annotation, no gate (the gang
// webhook adds it), schedulerName default-scheduler.
func volcanoMember(t *testing.T, c *nodesim.Cluster, ns, group, name string, gpus int64) *v1.Pod {
	t.Helper()
	p := podSpec{name: name, gpus: gpus, annotations: map[string]string{api.AnnotationVolcanoGroupName: group}}.pod(ns)
	p.Spec.SchedulerName = v1.DefaultSchedulerName
	created, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	if !api.HasGangGate(created) {
		t.Fatalf("Volcano gang member %s created without the %s gate: the gang webhook did not take the %s annotation (gates %v)",
			name, api.SchedulingGateGang, api.AnnotationVolcanoGroupName, created.Spec.SchedulingGates)
	}
	return created
}

// bindWatch records, for every pod of ns bound while it watches, which
// pods of ns carried a gang plan at that moment, as a pod informer saw
// them (its events come in resourceVersion order, so a plan written before
// a bind is seen before it).
type bindWatch struct {
	mu      sync.Mutex
	planned map[string]bool
	bound   map[string][]string // pod -> the planned pods when it was bound
	order   []string
}

func watchBinds(t *testing.T, c *nodesim.Cluster, ns string) *bindWatch {
	t.Helper()
	b := &bindWatch{planned: map[string]bool{}, bound: map[string][]string{}}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client(), 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	record := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, has := p.Annotations[api.AnnotationGangPlan]; has {
			b.planned[p.Name] = true
		}
		if _, seen := b.bound[p.Name]; p.Spec.NodeName != "" && !seen {
			var planned []string
			for n := range b.planned {
				planned = append(planned, n)
			}
			sort.Strings(planned)
			b.bound[p.Name] = planned
			b.order = append(b.order, p.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return b
}

// binds waits until the watch has seen n pods bound and returns, for each
// in the order bound, the pods planned at that moment.
func (b *bindWatch) binds(t *testing.T, n int) (order []string, planned map[string][]string) {
	t.Helper()
	_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.order) >= n, nil
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	planned = map[string][]string{}
	for k, v := range b.bound {
		planned[k] = v
	}
	return append([]string(nil), b.order...), planned
}

// TestVolcanoPodGroup: a Volcano user's manifest (a PodGroup with
// minMember 3 and three GPU pods annotated scheduling.k8s.io/group-name)
// with only schedulerName changed to default-scheduler runs as one gang:
// the webhook gates every member, two of three wait, and once the third
// exists all three are planned before any is bound, and all run.
func TestVolcanoPodGroup(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-volcano")
	client := c.Client()
	binds := watchBinds(t, c, ns)
	podGroup(t, c, api.VolcanoPodGroupGVR, ns, "train", map[string]any{
		"minMember": int64(3), "queue": "research", "priorityClassName": "",
		"minResources": map[string]any{api.ResourceGPU.String(): "6"},
	})
	volcanoMember(t, c, ns, "train", "train-0", 2)
	volcanoMember(t, c, ns, "train", "train-1", 2)
	// Two of three: the planner waits and says so; nothing is bound.
	waitGangEvent(t, c, ns, "train-0", "2 of 3")
	time.Sleep(3 * time.Second)
	for _, name := range []string{"train-0", "train-1"} {
		p := getPod(t, client, ns, name)
		if p.Spec.NodeName != "" || !api.HasGangGate(p) {
			t.Fatalf("member %s of an incomplete Volcano gang: node=%q gated=%v; want it held\n%s", name, p.Spec.NodeName, api.HasGangGate(p), describe(t, c, p))
		}
	}
	volcanoMember(t, c, ns, "train", "train-2", 2)
	nodes := map[string]string{}
	for i := range 3 {
		name := fmt.Sprintf("train-%d", i)
		p, _ := waitRunning(t, c, ns, name, 90*time.Second)
		plan, ok, err := api.GetGangPlan(p.Annotations)
		if !ok || err != nil || plan.Gang != "train" || plan.Node != p.Spec.NodeName {
			t.Errorf("member %s on %s: gang plan %+v, %v, %v; want gang train on its node", name, p.Spec.NodeName, plan, ok, err)
		}
		nodes[name] = p.Spec.NodeName
	}
	order, planned := binds.binds(t, 3)
	for _, name := range order {
		if got := len(planned[name]); got != 3 {
			t.Errorf("member %s was bound while %d of 3 members were planned (%v): bound before the whole gang was planned", name, got, planned[name])
		}
	}
	if len(order) != 3 {
		t.Errorf("binds seen: %v; want the three members", order)
	}
	t.Logf("Volcano gang train: members on %v, bound in order %v", nodes, order)
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// TestVolcanoPodGroupMalformed: a Volcano PodGroup with minMember 0 (which
// Volcano's schema stores) holds its members, each with an Event naming
// spec.minMember, and binds none of them.
func TestVolcanoPodGroupMalformed(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-volcano-bad")
	client := c.Client()
	podGroup(t, c, api.VolcanoPodGroupGVR, ns, "bad", map[string]any{"minMember": int64(0)})
	for i := range 2 {
		volcanoMember(t, c, ns, "bad", fmt.Sprintf("bad-%d", i), 1)
	}
	for i := range 2 {
		waitGangEvent(t, c, ns, fmt.Sprintf("bad-%d", i), "spec.minMember")
	}
	// More planner passes: still nothing bound, every member gated.
	time.Sleep(4 * time.Second)
	for i := range 2 {
		p := getPod(t, client, ns, fmt.Sprintf("bad-%d", i))
		if p.Spec.NodeName != "" || !api.HasGangGate(p) {
			t.Errorf("member %s of a malformed Volcano PodGroup: node=%q gated=%v; want it held\n%s", p.Name, p.Spec.NodeName, api.HasGangGate(p), describe(t, c, p))
		}
		if _, planned := p.Annotations[api.AnnotationGangPlan]; planned {
			t.Errorf("member %s of a malformed Volcano PodGroup has a gang plan", p.Name)
		}
	}
}

// waitGangEvent waits for a GangWaiting Event on the pod whose message
// contains want.
func waitGangEvent(t *testing.T, c *nodesim.Cluster, ns, pod, want string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == "GangWaiting" && strings.Contains(e.Message, want) {
				t.Logf("pod %s: %s %s: %s", pod, e.Type, e.Reason, e.Message)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: no GangWaiting Event containing %q (events %q)", ns, pod, want, seen)
	}
}
