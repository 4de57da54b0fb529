package planner_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// staleLedger is the extender's ledger whose reservations of a plan (a
// use with an expiry: not a hold or a reservation) find the snapshot
// stale the first stale times, as when the informer changes the planned
// nodes while the pass goes on; staled counts the stale answers, the
// ledger's own included.
type staleLedger struct {
	planner.Ledger
	stale, staled int
}

func (l *staleLedger) ReserveGang(snap planner.Snapshot, uses []*planner.Use) error {
	if len(uses) > 0 && !uses[0].Plan.Expires.IsZero() && l.stale > 0 {
		l.stale--
		l.staled++
		return fmt.Errorf("%w: %s", planner.ErrStaleSnapshot, uses[0].Node)
	}
	err := l.Ledger.ReserveGang(snap, uses)
	if errors.Is(err, planner.ErrStaleSnapshot) {
		l.staled++
	}
	return err
}

// The flake of e2e TestConsolidationMovesPreemptiblePodsForAGang, step by
// step. A 2 x 8 GPU gang waits on four 8-GPU nodes (n0: two movable pods,
// n1: one, n2: three, n3: four that may not move); consolidation moves
// n0's and n1's pods. Their controller recreates each at once, and
// kube-scheduler places the replacement (preemptible, of the same
// ReplicaSet) where the extender's filter lets it in, the node its
// predecessor left first. The planner's reservation of the gang's plan
// finds the snapshot stale (the pods leaving changed n0 and n1), so the
// pass plans again on the nodes as they are now. The room the moves freed
// must stay the gang's meanwhile: the replacements go to n2 and n3, the
// gang is planned on n0 and n1, and no pass moves anything more (the
// budget is full again a minute later).
//
//   - the pods leave at once and the replacements come during the pass:
//     the plan made again in the same pass must still find n0 and n1
//     free;
//   - the pods leave slowly (graceful termination) and every reservation
//     of the plan in the first pass is stale: the gang waits a pass, and
//     the replacements, created after it, ask for n0 and n1 with
//     reservations and preemptible backfill on.
func TestConsolidationHoldsTheRoomItFrees(t *testing.T) {
	for _, tc := range []struct {
		name string
		// slow: the pods evicted stay, leaving, and the replacements come
		// after the first pass; stale: the plan's reservations made stale
		// in the first pass; reservations: reservations and preemptible
		// backfill on.
		slow, reservations bool
		stale              int
	}{
		{name: "replacements arrive while the pass plans again"},
		{name: "the plan waits a pass and replacements ask for the freed nodes", slow: true, reservations: true, stale: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, clk, ledger := newHoldFixture(t, tc.reservations, tc.stale)
			var left []*corev1.Pod // evicted, in order
			replaced := map[string]string{}
			f.evictWith(func(pod *corev1.Pod) error {
				left = append(left, pod)
				if tc.slow {
					f.leaving(pod)
					return nil
				}
				f.gone(pod)
				replaced[pod.Name] = f.replace(pod)
				return nil
			})

			// The first pass: consolidation moves, the plan is made again.
			err := f.planner.Sync(t.Context())
			if tc.stale == 0 && err != nil {
				t.Fatalf("Sync: %v", err)
			}
			f.informer()
			if ledger.staled == 0 {
				t.Errorf("no reservation of the plan found the snapshot stale: the pass did not plan again")
			}
			if tc.slow {
				// The replacements come now, asking for the node their
				// predecessor left first, through the filter's view.
				for _, p := range left {
					replaced[p.Name] = f.replace(p)
				}
			}
			// A minute later (the budget full again), another pass.
			clk.SetTime(clk.Now().Add(time.Minute))
			f.sync()

			f.mu.Lock()
			evicted := slices.Clone(f.evicted)
			f.mu.Unlock()
			slices.Sort(evicted)
			events := strings.Join(f.events.Events, "\n")
			if want := []string{"n0-a", "n0-b", "n1-a"}; !slices.Equal(evicted, want) {
				t.Errorf("evicted %v, want %v (one round)\nevents:\n%s", evicted, want, events)
			}
			for old, node := range replaced {
				if node == "n0" || node == "n1" {
					t.Errorf("%s's replacement was placed on %s, the room freed for the gang", old, node)
				}
			}
			if len(replaced) != 3 {
				t.Errorf("replacements %v, want 3", replaced)
			}
			if nodes := f.plannedOn("big-"); !slices.Equal(nodes, []string{"n0", "n1"}) {
				t.Errorf("gang planned on %v, want n0 and n1\nevents:\n%s", nodes, events)
			}
		})
	}
}

// The room consolidation holds is released when the hold has lasted its
// time (the gang's plan never made it into the ledger here) or when an
// eviction fails (the next pass decides again); until then the gang's
// members are counted on it.
func TestConsolidationHoldEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failAt: the real eviction (1 first) the API server refuses, 0
		// none; stale: the plan's reservations made stale.
		failAt, stale int
		// held: whether the members are counted in the ledger after the
		// first pass; reason: in the waiting reason then.
		held   bool
		reason string
	}{
		{name: "past its time", stale: 1000, held: true},
		{name: "an eviction fails", failAt: 2, reason: "consolidation: evicting default/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, _ := newHoldFixture(t, false, tc.stale)
			n := 0
			f.evictWith(func(pod *corev1.Pod) error {
				if n++; n == tc.failAt {
					return apierrors.NewInternalError(errors.New("etcd is away"))
				}
				f.gone(pod)
				return nil
			})
			counted := func() bool {
				_, a := f.cache.Reservation("uid-big-0")
				_, b := f.cache.Reservation("uid-big-1")
				return a || b
			}
			_ = f.planner.Sync(t.Context())
			f.informer()
			if got := counted(); got != tc.held {
				t.Errorf("after the moves the members are counted in the ledger: %v, want %v", got, tc.held)
			}
			if ev := strings.Join(f.events.Events, "\n"); tc.reason != "" && !strings.Contains(ev, tc.reason) {
				t.Errorf("no waiting reason %q:\n%s", tc.reason, ev)
			}
			if !tc.held {
				return
			}
			f.now = f.now.Add(time.Minute)
			_ = f.planner.Sync(t.Context())
			if !counted() {
				t.Errorf("a minute after the moves the hold is gone")
			}
			f.now = f.now.Add(time.Minute)
			_ = f.planner.Sync(t.Context())
			if counted() {
				t.Errorf("two minutes after the moves, with no plan reserved, the members are still counted")
			}
			for _, node := range []string{"n0", "n1"} {
				if free := mustState(t, f.cache, node).FreeGPUs(); free != 8 {
					t.Errorf("%s has %d free GPUs once the hold is gone, want 8", node, free)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.evicted) != 3 {
				t.Errorf("evicted %v, want 3 pods", f.evicted)
			}
		})
	}
}

// newHoldFixture is the layout of TestConsolidation (a 2 x 8 GPU gang
// waiting; n0: two movable pods, n1: one, n2: three, n3: four that may not
// move) with a consolidator of 4 moves a minute past its first minute, on
// a staleLedger making the plan's first stale reservations stale;
// reservations: reservations (due after a minute) and backfill,
// preemptible too, on.
func newHoldFixture(t *testing.T, reservations bool, stale int) (*gangFixture, *clocktesting.FakePassiveClock, *staleLedger) {
	t.Helper()
	f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
	clk := clocktesting.NewFakePassiveClock(f.now)
	c, err := planner.NewConsolidator(&extender.KubeEvicter{Client: f.client}, f.events, clk, 4)
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(f.now.Add(2 * time.Minute)) // past its first minute
	cfg := planner.ReservationConfig{}
	if reservations {
		cfg = planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}
	}
	ledger := &staleLedger{Ledger: extender.PlannerLedger{Cache: f.cache}, stale: stale}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: ledger, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: cfg, Consolidation: c})
	for n, count := range map[string]int{"n0": 2, "n1": 1, "n2": 3, "n3": 4} {
		for k := range count {
			f.placed(fmt.Sprintf("%s-%c", n, 'a'+k), n, k, n != "n3")
		}
	}
	for i := range 2 {
		f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
	}
	return f, clk, ledger
}

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// evictWith answers evictions: dry runs pass; a real one is recorded and
// handed to evict (the pod as the API server has it), whose error is the
// API server's answer. The fake's lock is held meanwhile: evict writes the
// tracker and the ledger directly.
func (f *gangFixture) evictWith(evict func(*corev1.Pod) error) {
	f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		if ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0 {
			return true, nil, nil
		}
		obj, err := f.client.Tracker().Get(podsResource, ev.Namespace, ev.Name)
		if err != nil {
			return true, nil, err
		}
		if err := evict(obj.(*corev1.Pod).DeepCopy()); err != nil {
			return true, nil, err
		}
		f.mu.Lock()
		f.evicted = append(f.evicted, ev.Name)
		f.mu.Unlock()
		return true, nil, nil
	})
}

// gone deletes an evicted pod at once, as the informer then shows it.
func (f *gangFixture) gone(pod *corev1.Pod) {
	f.t.Helper()
	if err := f.client.Tracker().Delete(podsResource, pod.Namespace, pod.Name); err != nil {
		f.t.Fatal(err)
	}
	f.cache.DeletePod(pod.UID)
}

// leaving marks an evicted pod terminating (a graceful deletion), as the
// informer then shows it.
func (f *gangFixture) leaving(pod *corev1.Pod) {
	f.t.Helper()
	pod.DeletionTimestamp = &metav1.Time{Time: f.now}
	if err := f.client.Tracker().Update(podsResource, pod, pod.Namespace); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(pod)
}

// informer feeds the ledger every pod, as the informer would.
func (f *gangFixture) informer() {
	all, _ := f.list()
	for _, p := range all {
		f.cache.SetPod(p)
	}
}

// plannedOn are the nodes of the plans of the pods named prefix..., sorted.
func (f *gangFixture) plannedOn(prefix string) []string {
	var nodes []string
	for _, s := range f.state(prefix) {
		if s.planned {
			nodes = append(nodes, s.node)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// replace recreates the pod moved off old's node as its ReplicaSet would
// (a new pod, preemptible) and binds it as kube-scheduler would: on the
// first node the extender's filter lets it in (its view of the node,
// without the holds Lifted lifts for it, has a GPU free), old's node
// first, then by name. It returns the node ("" for none). It writes the
// tracker and the ledger directly (the fake's lock may be held).
func (f *gangFixture) replace(old *corev1.Pod) string {
	f.t.Helper()
	name := old.Name + "-r"
	order := []string{old.Spec.NodeName}
	for i := range 4 {
		if n := fmt.Sprintf("n%d", i); n != old.Spec.NodeName {
			order = append(order, n)
		}
	}
	probe := testbuild.Pod(name).Whole(1).Obj()
	probe.Annotations[api.AnnotationPreemptible] = "true"
	probe.OwnerReferences = old.OwnerReferences
	for _, n := range order {
		st, ok := f.cache.Node(n)
		if !ok {
			continue
		}
		view := st.Without(f.planner.Lifted(probe, n))
		if view.FreeGPUs() < 1 {
			continue
		}
		for pos := range view.GPUCount() {
			if len(view.GPUPods(pos)) > 0 || !view.Healthy(pos) {
				continue
			}
			p := testbuild.Pod(name).Whole(1).Node(n).Holding(pos).Obj()
			p.UID = types.UID("uid-" + name)
			p.Annotations[api.AnnotationPreemptible] = "true"
			p.OwnerReferences = old.OwnerReferences
			p.Status.StartTime = &metav1.Time{Time: f.now}
			if err := f.client.Tracker().Create(podsResource, p, p.Namespace); err != nil {
				f.t.Fatal(err)
			}
			f.cache.SetPod(p)
			return n
		}
	}
	return ""
}
