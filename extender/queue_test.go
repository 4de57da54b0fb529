package extender

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
)

// staticObjects is a fixed ObjectSource.
type staticObjects []*unstructured.Unstructured

func (q staticObjects) Objects() []*unstructured.Unstructured { return q }

// queueObj is a Queue object with a guarantee of GPUs and, when usage >
// 0, a usage history of that many GPU-seconds written at updated.
func queueObj(t *testing.T, name, parent string, namespaces []string, guaranteed int64, usage float64, updated time.Time) *unstructured.Unstructured {
	t.Helper()
	q := &api.Queue{Name: name, Parent: parent, Namespaces: namespaces, Resources: map[corev1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: guaranteed, Weight: 1},
	}}
	u := q.Unstructured()
	if usage > 0 {
		st := api.QueueStatus{Usage: map[corev1.ResourceName]float64{api.ResourceGPU: usage}, UsageUpdated: updated}
		u.Object["status"] = st.Object()
	}
	if _, err := api.QueueFromUnstructured(u); err != nil {
		t.Fatal(err)
	}
	return u
}

// queued creates a 1-GPU pod held by the queue gate.
func (f *gangFixture) queued(ns, name string, created time.Time) {
	f.t.Helper()
	p := makePod(name).Whole(1).Obj()
	p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-"+name)
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	p.CreationTimestamp = metav1.NewTime(created)
	if _, err := f.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// admitted counts a namespace's pods planned with their gate lifted.
func (f *gangFixture) admitted(ns string) (admitted, gated int) {
	f.t.Helper()
	pods, _ := f.list()
	for _, p := range pods {
		if p.Namespace != ns {
			continue
		}
		_, planned := p.Annotations[api.AnnotationGangPlan]
		switch {
		case planned && !api.HasQueueGate(p):
			admitted++
		case api.HasQueueGate(p):
			gated++
		}
	}
	return admitted, gated
}

func withGPUCapacity(nodes []*corev1.Node) []*corev1.Node {
	for _, n := range nodes {
		n.Status.Capacity = corev1.ResourceList{api.ResourceGPU: resource.MustParse("8")}
	}
	return nodes
}

// Two teams with equal guarantees submit at once on an 8-GPU cluster: the
// one without usage history goes first and takes all that is left after
// the other's guarantee; the other gets its guarantee. Swapping the
// history swaps the outcome.
func TestQueuesFairShareByHistory(t *testing.T) {
	for _, tc := range []struct {
		historyOf      string
		wantA, wantB   int
		firstEventTeam string
	}{
		{historyOf: "team-a", wantA: 2, wantB: 6},
		{historyOf: "team-b", wantA: 6, wantB: 2},
	} {
		t.Run("history on "+tc.historyOf, func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{makeNode("n0").GPUs(8, "H100", 81920).Obj()})
			f := newGangFixture(t, nodes...)
			hist := map[string]float64{tc.historyOf: 2 * 3600 * 8}
			book := &QueueBook{
				Queues: staticObjects{
					queueObj(t, "team-a", "", []string{"ns-a"}, 2, hist["team-a"], f.now),
					queueObj(t, "team-b", "", []string{"ns-b"}, 2, hist["team-b"], f.now),
				},
				Pods:     f.list,
				Nodes:    func() ([]*corev1.Node, error) { return nodes, nil },
				HalfLife: time.Hour, Now: func() time.Time { return f.now },
			}
			f.planner = NewGangPlanner(GangPlannerConfig{Cache: f.cache, Client: f.planner.client, Pods: f.list, Policy: testPolicy(t, PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
			for i := range 8 {
				f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now)
				f.queued("ns-b", fmt.Sprintf("b-%d", i), f.now)
			}
			f.sync()
			f.sync()
			a, ga := f.admitted("ns-a")
			b, gb := f.admitted("ns-b")
			if a != tc.wantA || b != tc.wantB {
				t.Errorf("admitted team-a %d (gated %d), team-b %d (gated %d); want %d and %d\nevents: %s", a, ga, b, gb, tc.wantA, tc.wantB, strings.Join(f.events.events, "\n"))
			}
			if !strings.Contains(strings.Join(f.events.events, "\n"), api.EventQueueWaiting) {
				t.Errorf("no %s Event for the pods left waiting", api.EventQueueWaiting)
			}
		})
	}
}

// A queue's limit holds: what would pass it waits, with the reason.
func TestQueueLimitHolds(t *testing.T) {
	nodes := withGPUCapacity([]*corev1.Node{makeNode("n0").GPUs(8, "H100", 81920).Obj()})
	f := newGangFixture(t, nodes...)
	q := &api.Queue{Name: "team-a", Namespaces: []string{"ns-a"}, Resources: map[corev1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: 1, Limit: 3, Limited: true, Weight: 1},
	}}
	book := &QueueBook{Queues: staticObjects{q.Unstructured()}, Pods: f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }}
	f.planner = NewGangPlanner(GangPlannerConfig{Cache: f.cache, Client: f.planner.client, Pods: f.list, Policy: testPolicy(t, PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Queues: book})
	for i := range 5 {
		f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now.Add(time.Duration(i)*time.Second))
	}
	f.sync()
	f.sync()
	if a, g := f.admitted("ns-a"); a != 3 || g != 2 {
		t.Errorf("admitted %d, gated %d; want 3 and 2 (limit 3)", a, g)
	}
	if ev := strings.Join(f.events.events, "\n"); !strings.Contains(ev, "limit 3") {
		t.Errorf("no Event naming the limit: %s", ev)
	}
}
