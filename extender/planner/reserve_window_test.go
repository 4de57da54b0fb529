package planner_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// watchLedger is the extender's ledger that calls after once each of its
// reservations is released (ReleaseGang), while the pass goes on.
type watchLedger struct {
	planner.Ledger
	after func()
}

func (l *watchLedger) ReleaseGang(uids []types.UID) {
	l.Ledger.ReleaseGang(uids)
	if l.after != nil {
		l.after()
	}
}

// A reserved workload plans again on every pass, and its reservation is
// made again when it still does not fit. Its room must stay reserved in
// the ledger throughout: the filter and the bind, on other goroutines,
// admit pods by the ledger. When the pass first released the reservation
// and made it again at the end of the workload's turn, a pod kube-scheduler
// tried meanwhile (as it does at once when a pod leaves) was let into the
// reserved room: e2e TestReservationEvictsPreemptibleBackfill failed so
// when a trial made passes begin as pods with GPUs left.
func TestReservationRoomNeverFreeWhileMadeAgain(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	watch := &watchLedger{Ledger: extender.PlannerLedger{Cache: f.cache}}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: watch, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: planner.ReservationConfig{ReserveAfter: time.Minute}})
	f.smallPodsOnEachNode(2)
	for i := range 2 {
		f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
	}
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("no reservation made\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
	newcomer := testbuild.Pod("newcomer").Whole(1).Obj()
	d, err := extender.ParseDemand(newcomer)
	if err != nil {
		t.Fatal(err)
	}
	var free []string
	watch.after = func() {
		for _, n := range []string{"n0", "n1"} {
			if extender.Check(mustState(t, f.cache, n), &d) == extender.Fits {
				free = append(free, n)
			}
		}
	}
	for range 3 {
		f.now = f.now.Add(2 * time.Second)
		f.sync()
	}
	if len(free) > 0 {
		t.Errorf("a 1-GPU pod fitted reserved nodes %v during passes that kept the reservation", free)
	}
	if f.planner.Reservations() != 1 {
		t.Errorf("%d reservations after the passes, want 1", f.planner.Reservations())
	}
	for _, n := range []string{"n0", "n1"} {
		if extender.Check(mustState(t, f.cache, n), &d) == extender.Fits {
			t.Errorf("a 1-GPU pod fits reserved node %s after the passes", n)
		}
	}
}
