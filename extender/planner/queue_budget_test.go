package planner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// A tenant's PodDisruptionBudget does not keep what its queue borrows:
// team-b runs 8 GPUs beyond its guarantee of 8, some under a budget that
// refuses every eviction. The unprotected go first; when every choice
// needs a protected one, it is deleted past its budget (PastBudgets set),
// or the reclaim waits (PastBudgets nil: team-a never got its guarantee on
// make demo while a budget covered the borrower).
func TestQueueReclaimPastBudgets(t *testing.T) {
	for _, tc := range []struct {
		name       string
		protected  int // team-b's newest pods under a budget
		past       bool
		want       int // team-a admitted
		wantPast   int // deleted past their budgets
		wantEvents string
	}{
		{name: "the unprotected go first", protected: 4, past: true, want: 8, wantPast: 0},
		{name: "every choice needs protected pods", protected: 16, past: true, want: 8, wantPast: 8, wantEvents: "deleted past its PodDisruptionBudget to reclaim for queue team-a"},
		{name: "budgets honoured: the reclaim waits", protected: 16, past: false, want: 0, wantEvents: "cannot be evicted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := withGPUCapacity([]*corev1.Node{testbuild.Node("n0").GPUs(8, "H100", 81920).Obj(), testbuild.Node("n1").GPUs(8, "H100", 81920).Obj()})
			f := newGangFixture(t, nodes...)
			book := &planner.QueueBook{
				Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 8, 0, f.now), testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 8, 0, f.now)},
				Pods:   f.list, Nodes: func() ([]*corev1.Node, error) { return nodes, nil }, HalfLife: time.Hour, Now: func() time.Time { return f.now },
			}
			evicter := &testbuild.PreemptClient{PDB: map[string]bool{}}
			reclaim := &planner.QueueReclaimer{Ledger: extender.PlannerLedger{Cache: f.cache}, Evicter: evicter, Pods: f.list, Events: f.events, Now: func() time.Time { return f.now }}
			if tc.past {
				reclaim.PastBudgets = evicter
			}
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Queues: book, QueueReclaim: reclaim})
			for i := range 16 {
				name := fmt.Sprintf("b-%d", i)
				p := testbuild.Pod(name).Whole(1).Node(fmt.Sprintf("n%d", i/8)).Holding(i % 8).Obj()
				p.Namespace, p.UID = "ns-b", types.UID("uid-"+name)
				// b-15 is the newest: reclaim's order comes to it first.
				p.CreationTimestamp = metav1.NewTime(f.now.Add(-time.Hour + time.Duration(i)*time.Minute))
				evicter.PDB[name] = i >= 16-tc.protected
				if _, err := f.client.CoreV1().Pods("ns-b").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 8 {
				f.queued("ns-a", fmt.Sprintf("a-%d", i), f.now)
			}
			pods, _ := f.list()
			for _, p := range pods {
				f.cache.SetPod(p)
			}
			f.passesEvicting(evicter, "ns-b", 6)
			events := strings.Join(f.events.Events, "\n")
			if a, _ := f.admitted("ns-a"); a != tc.want {
				t.Errorf("team-a admitted %d, want %d\nevicted %v\nevents:\n%s", a, tc.want, evicter.Evicted, events)
			}
			if len(evicter.PastBudget) != tc.wantPast {
				t.Errorf("deleted past budgets %v, want %d", evicter.PastBudget, tc.wantPast)
			}
			for _, name := range evicter.Evicted {
				if evicter.PDB[name] && !tc.past {
					t.Errorf("%s evicted though its budget refuses", name)
				}
			}
			if tc.wantEvents != "" && !strings.Contains(events, tc.wantEvents) {
				t.Errorf("events do not say %q:\n%s", tc.wantEvents, events)
			}
		})
	}
}
