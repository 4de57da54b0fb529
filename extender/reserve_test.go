package extender

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
)

// A 2 x 8 GPU gang waits on two 8-GPU nodes that each run a 1-GPU pod.
// Once it has waited ReserveAfter, both nodes are reserved for it: a new
// 1-GPU pod fits neither (the filter's check), the room freed as the small
// pods end is the gang's, and the gang is planned when it fits. Without
// reservations the new pod would fit, and the gang wait on.
func TestReservationKeepsAStreamOfSmallPodsOff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     ReservationConfig
		reserve bool
	}{
		{name: "reservations", cfg: ReservationConfig{ReserveAfter: time.Minute}, reserve: true},
		{name: "none", cfg: ReservationConfig{}, reserve: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, eightGPUNodes(2)...)
			f.planner = NewGangPlanner(GangPlannerConfig{Cache: f.cache, Client: f.planner.client, Pods: f.list, Policy: testPolicy(t, PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Reservation: tc.cfg})
			var small []*corev1.Pod
			for i := range 2 {
				p := makePod(fmt.Sprintf("small-%d", i)).Whole(1).Node(fmt.Sprintf("n%d", i)).Holding(0).Obj()
				p.UID = types.UID(fmt.Sprintf("uid-small-%d", i))
				if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				f.cache.SetPod(p)
				small = append(small, p)
			}
			for i := range 2 {
				f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
			}
			f.sync()
			newcomer := makePod("newcomer").Whole(1).Obj()
			d, err := ParseDemand(newcomer)
			if err != nil {
				t.Fatal(err)
			}
			fits := 0
			for _, n := range []string{"n0", "n1"} {
				if Check(mustState(t, f.cache, n), &d) == Fits {
					fits++
				}
			}
			if tc.reserve && fits != 0 {
				t.Errorf("a new 1-GPU pod fits %d reserved nodes\nevents:\n%s", fits, strings.Join(f.events.events, "\n"))
			}
			if !tc.reserve && fits != 2 {
				t.Errorf("without reservations a new 1-GPU pod fits %d nodes, want 2", fits)
			}
			if got := f.planner.Reservations(); got != map[bool]int64{true: 1, false: 0}[tc.reserve] {
				t.Errorf("reservations gauge %d", got)
			}
			if tc.reserve && !strings.Contains(strings.Join(f.events.events, "\n"), api.EventReserved+": tessera: it waited longer than 1m0s: nodes n0, n1 are reserved") {
				t.Errorf("no Reserved Event naming the nodes:\n%s", strings.Join(f.events.events, "\n"))
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
	f := newGangFixture(t, eightGPUNodes(1)...)
	f.planner = NewGangPlanner(GangPlannerConfig{Cache: f.cache, Client: f.planner.client, Pods: f.list, Policy: testPolicy(t, PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}})
	p := makePod("small").Whole(1).Node("n0").Holding(0).Obj()
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
