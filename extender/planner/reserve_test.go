package planner_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// smallPodsOnEachNode runs a 1-GPU pod small-<i> on GPU 0 of node n<i>, of
// nodes n0..n<nodes-1>.
func (f *gangFixture) smallPodsOnEachNode(nodes int) []*corev1.Pod {
	f.t.Helper()
	var out []*corev1.Pod
	for i := range nodes {
		p := testbuild.Pod(fmt.Sprintf("small-%d", i)).Whole(1).Node(fmt.Sprintf("n%d", i)).Holding(0).Obj()
		p.UID = types.UID(fmt.Sprintf("uid-small-%d", i))
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			f.t.Fatal(err)
		}
		f.cache.SetPod(p)
		out = append(out, p)
	}
	return out
}

// A 2 x 8 GPU gang waits on two 8-GPU nodes that each run a 1-GPU pod.
// Once it has waited ReserveAfter, both nodes are reserved for it: a new
// 1-GPU pod fits neither (the filter's check), the room freed as the small
// pods end is the gang's, and the gang is planned when it fits. Without
// reservations the new pod would fit, and the gang wait on.
func TestReservationKeepsAStreamOfSmallPodsOff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     planner.ReservationConfig
		reserve bool
	}{
		{name: "reservations", cfg: planner.ReservationConfig{ReserveAfter: time.Minute}, reserve: true},
		{name: "none", cfg: planner.ReservationConfig{}, reserve: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Reservation: tc.cfg})
			small := f.smallPodsOnEachNode(2)
			for i := range 2 {
				f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
			}
			f.sync()
			newcomer := testbuild.Pod("newcomer").Whole(1).Obj()
			d, err := extender.ParseDemand(newcomer)
			if err != nil {
				t.Fatal(err)
			}
			fits := 0
			for _, n := range []string{"n0", "n1"} {
				if extender.Check(mustState(t, f.cache, n), &d) == extender.Fits {
					fits++
				}
			}
			if tc.reserve && fits != 0 {
				t.Errorf("a new 1-GPU pod fits %d reserved nodes\nevents:\n%s", fits, strings.Join(f.events.Events, "\n"))
			}
			if !tc.reserve && fits != 2 {
				t.Errorf("without reservations a new 1-GPU pod fits %d nodes, want 2", fits)
			}
			if got := f.planner.Reservations(); got != map[bool]int64{true: 1, false: 0}[tc.reserve] {
				t.Errorf("reservations gauge %d", got)
			}
			if tc.reserve && !strings.Contains(strings.Join(f.events.Events, "\n"), api.EventReserved+": tessera: it waited longer than 1m0s: nodes n0, n1 are reserved") {
				t.Errorf("no Reserved Event naming the nodes:\n%s", strings.Join(f.events.Events, "\n"))
			}
			// Passes that find the same reservation tell nobody again (on
			// make demo the Event was emitted on every pass: "(x12)").
			for range 3 {
				f.now = f.now.Add(2 * time.Second)
				f.sync()
			}
			reserved := 0
			for _, e := range f.events.Events {
				if strings.HasPrefix(e, api.EventReserved+": ") {
					reserved++
				}
			}
			if want := map[bool]int{true: 2, false: 0}[tc.reserve]; reserved != want {
				t.Errorf("%d Reserved Events after four passes, want %d (one per member)\nevents:\n%s", reserved, want, strings.Join(f.events.Events, "\n"))
			}
			// The small pods end: the gang is planned on the room.
			for _, p := range small {
				if err := f.client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				f.cache.DeletePod(p.UID)
			}
			f.sync()
			for name, s := range f.state("big-") {
				if !s.planned || s.gated {
					t.Errorf("member %s: planned %v gated %v once the room is free", name, s.planned, s.gated)
				}
			}
			if got := f.planner.Reservations(); got != 0 {
				t.Errorf("%d reservations once the gang is planned", got)
			}
		})
	}
}

// A reservation lasts ReserveFor at most; then it is released and the
// workload does not reserve again for as long.
func TestReservationExpires(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: planner.ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}})
	p := testbuild.Pod("small").Whole(1).Node("n0").Holding(0).Obj()
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(p)
	f.member("big", 1, 0, 8, f.now.Add(-2*time.Minute))
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatal("no reservation")
	}
	f.now = f.now.Add(11 * time.Minute)
	f.sync()
	if f.planner.Reservations() != 0 {
		t.Errorf("the reservation outlived ReserveFor")
	}
	f.now = f.now.Add(5 * time.Minute)
	f.sync()
	if f.planner.Reservations() != 0 {
		t.Errorf("reserved again during the cooldown")
	}
	f.now = f.now.Add(6 * time.Minute)
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Errorf("not reserved again after the cooldown")
	}
}

// reservationFixture is two 8-GPU nodes, each running a 1-GPU pod started
// a minute ago (annotations ann), and a 2 x 8 GPU gang that has waited 2
// minutes: it reserves both nodes.
func reservationFixture(t *testing.T, cfg planner.ReservationConfig, ann map[string]string) (*gangFixture, []*corev1.Pod) {
	t.Helper()
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: cfg})
	var small []*corev1.Pod
	for i := range 2 {
		p := f.running(fmt.Sprintf("small-%d", i), fmt.Sprintf("n%d", i), 1, f.now.Add(-time.Minute), ann)
		small = append(small, p)
	}
	for i := range 2 {
		f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
	}
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("no reservation\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
	return f, small
}

// running creates a pod bound to node holding its first gpus GPUs, started
// at started.
func (f *gangFixture) running(name, node string, gpus int, started time.Time, ann map[string]string) *corev1.Pod {
	f.t.Helper()
	idx := make([]int, gpus)
	for i := range idx {
		idx[i] = i
	}
	p := testbuild.Pod(name).Whole(int64(gpus)).Node(node).Holding(idx...).Obj()
	p.UID = types.UID("uid-" + name)
	for k, v := range ann {
		p.Annotations[k] = v
	}
	p.Status.StartTime = &metav1.Time{Time: started}
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
	return p
}

// Backfill into a reservation: the small pods end, by their expected run
// time (10m), in 9 minutes. A workload that ends before that is planned on
// the reserved room; one that would end after, or declares nothing, waits;
// a preemptible one is planned when the configuration allows it.
func TestReservationBackfill(t *testing.T) {
	tenMinutes := map[string]string{api.AnnotationExpectedRuntime: "10m"}
	for _, tc := range []struct {
		name    string
		cfg     planner.ReservationConfig
		smalls  map[string]string
		ann     map[string]string
		planned bool
		event   string
	}{
		{"ends before", planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}, tenMinutes, map[string]string{api.AnnotationExpectedRuntime: "8m"}, true, "by its expected run time (8m0s) it ends before that reservation starts (at 2026-01-01T00:09:00Z)"},
		{"ends after", planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}, tenMinutes, map[string]string{api.AnnotationExpectedRuntime: "10m"}, false, ""},
		{"no estimate", planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}, tenMinutes, nil, false, ""},
		{"the reservation's start is unknown", planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}, nil, map[string]string{api.AnnotationExpectedRuntime: "1m"}, false, ""},
		{"backfill off", planner.ReservationConfig{ReserveAfter: time.Minute}, tenMinutes, map[string]string{api.AnnotationExpectedRuntime: "1m"}, false, ""},
		{"preemptible", planner.ReservationConfig{ReserveAfter: time.Minute, Preemptible: true}, nil, map[string]string{api.AnnotationPreemptible: "true"}, true, "as a preemptible workload"},
		{"preemptible, not allowed", planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}, nil, map[string]string{api.AnnotationPreemptible: "true"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := reservationFixture(t, tc.cfg, tc.smalls)
			p := f.member("bf", 1, 0, 4, f.now.Add(-time.Second))
			for k, v := range tc.ann {
				p.Annotations[k] = v
			}
			if _, err := f.client.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.sync()
			s := f.state("bf-")["bf-0"]
			if s.planned != tc.planned {
				t.Errorf("backfill planned %v, want %v\nevents:\n%s", s.planned, tc.planned, strings.Join(f.events.Events, "\n"))
			}
			if got := f.planner.Reservations(); got != 1 {
				t.Errorf("%d reservations after the backfill, want the gang's still", got)
			}
			all := strings.Join(f.events.Events, "\n")
			if tc.event != "" && (!strings.Contains(all, api.EventBackfilled+": tessera: planned on room reserved for default/big") || !strings.Contains(all, tc.event)) {
				t.Errorf("no %s Event with %q:\n%s", api.EventBackfilled, tc.event, strings.Join(f.events.Events, "\n"))
			}
			// The bind sees room for the backfill on the node it was
			// planned on (its own planned use left out, as Cache.Reserve
			// does), with or without the planner's view.
			if s.planned {
				pods, _ := f.list()
				var pod *corev1.Pod
				for _, q := range pods {
					if q.Name == "bf-0" {
						pod = q
					}
				}
				st := mustState(t, f.cache, s.node)
				var uses []*extender.PodUse
				for uid, u := range st.Pods {
					if uid != pod.UID {
						uses = append(uses, u)
					}
				}
				d, err := extender.ParseDemand(pod)
				if err != nil {
					t.Fatal(err)
				}
				own := extender.BuildNodeState(st.Info, uses)
				view := extender.NewServer(f.cache, testPolicy(t, extender.PolicyBinpack), nil, nil, nil)
				view.SetBackfill(f.planner)
				if extender.Check(own, &d) != extender.Fits || extender.Check(view.ViewFor(pod, own), &d) != extender.Fits {
					t.Errorf("node %s: the backfill does not fit where it was planned: it could not bind", s.node)
				}
				// Nor does the ledger count more GPUs there than the node
				// has (the bind waits for pending GPUs to be offered).
				used := 0
				for _, u := range st.Pods {
					used += u.WholeGPUs()
				}
				if used > len(st.Info.GPUs) {
					t.Errorf("node %s: %d GPUs counted, it has %d", s.node, used, len(st.Info.GPUs))
				}
			}
			// The reservation still holds its nodes for the gang: a new
			// 1-GPU pod fits neither.
			newcomer := testbuild.Pod("newcomer").Whole(1).Obj()
			d, err := extender.ParseDemand(newcomer)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"n0", "n1"} {
				if extender.Check(mustState(t, f.cache, n), &d) == extender.Fits {
					t.Errorf("a new 1-GPU pod fits reserved node %s", n)
				}
			}
		})
	}
}

// Once nothing else drains on its nodes, the reservation evicts the pods
// marked preemptible there and the backfill that ran past its expected run
// time; backfill within its estimate is waited for.
func TestReservationEvictsVictims(t *testing.T) {
	cfg := planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}
	for _, tc := range []struct {
		name string
		// the pod left on n1 once the small pods are gone: started after
		// the reservation with these annotations, this long ago
		ann     map[string]string
		age     time.Duration
		evicted bool
	}{
		{"preemptible", map[string]string{api.AnnotationPreemptible: "true"}, time.Second, true},
		{"past its estimate", map[string]string{api.AnnotationExpectedRuntime: "5m"}, 6 * time.Minute, true},
		{"within its estimate", map[string]string{api.AnnotationExpectedRuntime: "5m"}, 4 * time.Minute, false},
		{"no hints", nil, 10 * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, small := reservationFixture(t, cfg, map[string]string{api.AnnotationExpectedRuntime: "30m"})
			f.now = f.now.Add(10 * time.Minute)
			f.running("late", "n1", 2, f.now.Add(-tc.age), tc.ann)
			for _, p := range small {
				if err := f.client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				f.cache.DeletePod(p.UID)
			}
			f.sync()
			f.mu.Lock()
			evicted := strings.Join(f.evicted, ",")
			f.mu.Unlock()
			if got := evicted == "late"; got != tc.evicted {
				t.Errorf("evicted %q, want the late pod evicted: %v\nevents:\n%s", evicted, tc.evicted, strings.Join(f.events.Events, "\n"))
			}
			// Once its victims are leaving, the reservation holds its whole
			// member on their node, so that their GPUs go to no one else.
			if tc.evicted {
				held := 0
				for _, u := range mustState(t, f.cache, "n1").Pods {
					if u.Planned && strings.HasPrefix(u.Name, "big-") {
						held += u.WholePending
					}
				}
				if held != 8 {
					t.Errorf("the reservation holds %d GPUs on n1 while its victim leaves, want 8", held)
				}
			}
		})
	}
}

// Who is due a reservation follows allocator/reserve's Due, the
// simulator's rule: MinGPUs, and Relative to the longest-waiting smaller
// pending pod. The 2 x 8 GPU gang has waited 2 minutes; ReserveAfter is 1
// minute.
func TestReservationDue(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        planner.ReservationConfig
		smallAge   time.Duration // a pending 1-GPU pod created this long ago (0: none)
		wantReserv bool
	}{
		{"due", planner.ReservationConfig{ReserveAfter: time.Minute, MinGPUs: 16}, 0, true},
		{"too small", planner.ReservationConfig{ReserveAfter: time.Minute, MinGPUs: 32}, 0, false},
		{"per GPU", planner.ReservationConfig{ReserveAfter: time.Minute, WaitPerGPU: 4 * time.Second}, 0, false},
		{"relative: the small pod waited longer", planner.ReservationConfig{ReserveAfter: time.Minute, MinGPUs: 16, Relative: 1}, 90 * time.Second, false},
		{"relative: the small pod waited less", planner.ReservationConfig{ReserveAfter: time.Minute, MinGPUs: 16, Relative: 1}, 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Reservation: tc.cfg})
			for i := range 2 {
				f.running(fmt.Sprintf("small-%d", i), fmt.Sprintf("n%d", i), 1, f.now.Add(-time.Minute), nil)
			}
			if tc.smallAge > 0 {
				p := testbuild.Pod("pending").Whole(1).Obj()
				p.CreationTimestamp = metav1.NewTime(f.now.Add(-tc.smallAge))
				if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 2 {
				f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
			}
			f.sync()
			if got := f.planner.Reservations() == 1; got != tc.wantReserv {
				t.Errorf("reserved %v, want %v\nevents:\n%s", got, tc.wantReserv, strings.Join(f.events.Events, "\n"))
			}
		})
	}
}

// A pod that kube-scheduler places sees a reservation's room on the same
// terms (BackfillView): the small pods end, by their expected run time, in
// 9 minutes; the filter and the bind see the reserved nodes free for a pod
// that expects 8 minutes or is marked preemptible, full for the others.
func TestReservationBackfillView(t *testing.T) {
	f, _ := reservationFixture(t, planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}, map[string]string{api.AnnotationExpectedRuntime: "10m"})
	s := extender.NewServer(f.cache, testPolicy(t, extender.PolicyBinpack), nil, nil, nil)
	for _, tc := range []struct {
		name string
		ann  map[string]string
		fits bool
	}{
		{"ends before", map[string]string{api.AnnotationExpectedRuntime: "8m"}, true},
		{"ends after", map[string]string{api.AnnotationExpectedRuntime: "10m"}, false},
		{"no hints", nil, false},
		{"preemptible", map[string]string{api.AnnotationPreemptible: "true"}, true},
		{"malformed", map[string]string{api.AnnotationExpectedRuntime: "8 minutes"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testbuild.Pod("plain").Whole(4).Obj()
			for k, v := range tc.ann {
				pod.Annotations[k] = v
			}
			d, err := extender.ParseDemand(pod)
			if err != nil {
				t.Fatal(err)
			}
			for _, set := range []bool{false, true} {
				if set {
					s.SetBackfill(f.planner)
				} else {
					s.SetBackfill(nil)
				}
				for _, n := range []string{"n0", "n1"} {
					got := extender.Check(s.ViewFor(pod, mustState(t, f.cache, n)), &d) == extender.Fits
					if want := set && tc.fits; got != want {
						t.Errorf("view set %v: node %s fits %v, want %v", set, n, got, want)
					}
				}
			}
			// Two minutes later the reservation starts in 7: the 8-minute
			// pod no longer ends before it.
			if tc.name == "ends before" {
				f.now = f.now.Add(2 * time.Minute)
				defer func() { f.now = f.now.Add(-2 * time.Minute) }()
				if extender.Check(s.ViewFor(pod, mustState(t, f.cache, "n0")), &d) == extender.Fits {
					t.Error("the 8-minute pod fits a reservation that starts in 7")
				}
			}
		})
	}
}

// A reservation made on a node where a pod is planned but not bound yet
// does not hold that pod's GPU: the pod binds where it was planned. (On
// make demo a stream of 1-GPU queued pods reserved an L40S node each in
// turn, each reservation holding one GPU beyond what was free: the pods
// planned there before it failed their binds for 52 s.)
func TestReservationLeavesPlannedPodsTheirGPUs(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  planner.ReservationConfig
	}{
		{name: "reservations", cfg: planner.ReservationConfig{ReserveAfter: time.Minute}},
		{name: "with backfill and preemptible pods", cfg: planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.Node("n0").GPUs(4, "NVIDIA L40S", 46068).Obj())
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Reservation: tc.cfg})
			create := func(p *corev1.Pod) {
				t.Helper()
				if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				f.cache.SetPod(p)
			}
			for i := 1; i < 4; i++ {
				p := testbuild.Pod(fmt.Sprintf("run-%d", i)).Whole(1).Node("n0").Holding(i).Obj()
				p.UID = types.UID(fmt.Sprintf("uid-run-%d", i))
				p.Status.StartTime = &metav1.Time{Time: f.now.Add(-time.Minute)}
				create(p)
			}
			// planned: a gang member planned on GPU 0, its gate lifted,
			// not bound yet.
			planned := testbuild.Pod("p-0").Whole(1).Obj()
			planned.UID = "uid-p-0"
			planned.Annotations[api.AnnotationGang] = "p"
			planned.Annotations[api.AnnotationGangMinMember] = "1"
			ref := mustState(t, f.cache, "n0").GPURef(0)
			if err := api.SetGangPlan(planned.Annotations, api.GangPlan{Gang: "p", Node: "n0", GPUs: []api.GPURef{ref}, Expires: f.now.Add(10 * time.Minute)}); err != nil {
				t.Fatal(err)
			}
			create(planned)
			// A 1-GPU gang that has waited past ReserveAfter.
			f.member("w", 1, 0, 1, f.now.Add(-2*time.Minute))
			f.sync()
			if !strings.Contains(strings.Join(f.events.Events, "\n"), api.EventReserved+": tessera: it waited longer than 1m0s: nodes n0 are reserved") {
				t.Fatalf("no reservation for w on n0:\n%s", strings.Join(f.events.Events, "\n"))
			}
			d, err := extender.ParseDemand(planned)
			if err != nil {
				t.Fatal(err)
			}
			st := mustState(t, f.cache, "n0")
			without := st.Without(map[types.UID]bool{planned.UID: true}).(*extender.NodeState)
			if got := extender.Check(without, &d); got != extender.Fits {
				t.Errorf("the planned pod does not fit its node once reserved for w: %v (pending whole GPUs %d)", got, st.PendingWhole)
			}
		})
	}
}

// Four nodes whose pods started in the same second with the same expected
// run time drain at the same moment: the reservation keeps the nodes it
// chose, pass after pass, and tells its members once. On make demo it
// hopped between such nodes on every pass (a clock read per node made
// whichever node was read later drain microseconds sooner), and the
// Event's count down ("starts in 1h59m33s") made a new Event every pass.
func TestReservationStaysOnNodesThatDrainTogether(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
	var ticks atomic.Int64 // a clock that moves on every read, as a real one does
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now.Add(time.Duration(ticks.Add(1)) * time.Microsecond) },
		Reservation: planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true}})
	for i := range 4 {
		f.running(fmt.Sprintf("small-%d", i), fmt.Sprintf("n%d", i), 1, f.now.Add(-time.Minute), map[string]string{api.AnnotationExpectedRuntime: "2h"})
	}
	for i := range 2 {
		f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
	}
	for range 10 {
		f.sync()
		f.now = f.now.Add(2 * time.Second)
	}
	var reserved, waiting []string
	for _, e := range f.events.Events {
		switch {
		case strings.HasPrefix(e, api.EventReserved+": "):
			reserved = append(reserved, e)
		case strings.HasPrefix(e, "GangWaiting: "):
			waiting = append(waiting, e)
		}
	}
	if len(waiting) != 2 {
		t.Errorf("%d GangWaiting Events after ten passes, want 2 (one per member):\n%s", len(waiting), strings.Join(waiting, "\n"))
	}
	if len(reserved) != 2 {
		t.Fatalf("%d Reserved Events after ten passes, want 2 (one per member):\n%s", len(reserved), strings.Join(reserved, "\n"))
	}
	if want := "nodes n0, n1 are reserved"; !strings.Contains(reserved[0], want) || !strings.Contains(reserved[0], "it starts at 2026-01-01T01:59:00Z") {
		t.Errorf("Reserved Event %q: want %q (ties go by name) and the start by the pods' hints", reserved[0], want)
	}
}

// A reservation that can start now (only preemptible backfill is left on
// its nodes, being evicted) lets no new preemptible pod in: it would be
// evicted as soon as it started. On make demo's cluster a Deployment's
// preemptible replacements were sent to such a node, evicted there and
// replaced, 29 times in a minute, while the gang waited. A reservation
// that starts later still lets one in.
func TestReadyReservationAdmitsNoNewPreemptible(t *testing.T) {
	preemptible := map[string]string{api.AnnotationPreemptible: "true"}
	for _, tc := range []struct {
		name  string
		small map[string]string // the occupants of the reserved nodes
		fits  bool
	}{
		{"the occupants are preemptible: it starts now", preemptible, false},
		{"the occupants end in 10m", map[string]string{api.AnnotationExpectedRuntime: "10m"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := reservationFixture(t, planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}, tc.small)
			s := extender.NewServer(f.cache, testPolicy(t, extender.PolicyBinpack), nil, nil, nil)
			s.SetBackfill(f.planner)
			pod := testbuild.Pod("replacement").Whole(1).Obj()
			pod.Annotations[api.AnnotationPreemptible] = "true"
			d, err := extender.ParseDemand(pod)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"n0", "n1"} {
				if got := extender.Check(s.ViewFor(pod, mustState(t, f.cache, n)), &d) == extender.Fits; got != tc.fits {
					t.Errorf("node %s: a new preemptible pod fits %v, want %v\nevents:\n%s", n, got, tc.fits, strings.Join(f.events.Events, "\n"))
				}
			}
		})
	}
}

// pastBudgets records the pods DeletePastBudget ended.
type pastBudgets struct {
	mu      sync.Mutex
	deleted []string
}

func (p *pastBudgets) DeletePastBudget(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deleted = append(p.deleted, pod.Name)
	return nil
}

// A pod on a reservation's node by its own promise (marked preemptible)
// under a PodDisruptionBudget that refuses its eviction is deleted past
// the budget with PastBudgets, and says so; without it the reservation
// waits, and the pod is told why (the tester's 8 preemptible squatters
// under maxUnavailable 0 held a reserved gang off for good, the refusals
// only in the extender's log).
func TestReservationEvictsAPromisePastItsBudget(t *testing.T) {
	for _, withPast := range []bool{true, false} {
		t.Run(fmt.Sprintf("past budgets %v", withPast), func(t *testing.T) {
			over := &pastBudgets{}
			cfg := planner.ReservationConfig{ReserveAfter: time.Minute, Backfill: true, Preemptible: true}
			if withPast {
				cfg.PastBudgets = over
			}
			f, small := reservationFixture(t, cfg, map[string]string{api.AnnotationExpectedRuntime: "30m"})
			f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
			})
			f.now = f.now.Add(10 * time.Minute)
			f.running("squat", "n1", 2, f.now.Add(-time.Second), map[string]string{api.AnnotationPreemptible: "true"})
			for _, p := range small {
				if err := f.client.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				f.cache.DeletePod(p.UID)
			}
			f.sync()
			over.mu.Lock()
			deleted := strings.Join(over.deleted, ",")
			over.mu.Unlock()
			events := strings.Join(f.events.Events, "\n")
			if withPast {
				if deleted != "squat" {
					t.Errorf("deleted past budgets %q, want squat\nevents:\n%s", deleted, events)
				}
				if !strings.Contains(events, api.EventPreempted) || !strings.Contains(events, "past its PodDisruptionBudget") {
					t.Errorf("no Preempted Event saying it went past its budget:\n%s", events)
				}
				return
			}
			if deleted != "" {
				t.Errorf("deleted %q without PastBudgets", deleted)
			}
			if !strings.Contains(events, api.EventPreemptionBlocked) || !strings.Contains(events, "disruption budget") {
				t.Errorf("no PreemptionBlocked Event naming the budget:\n%s", events)
			}
		})
	}
}
