package planner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

const storeNS = "kube-system"

// restart replaces the fixture's planner by a new one (an extender
// restart) with the same ReservationStore: the fixture's API server's
// ConfigMap.
func (f *gangFixture) restart(cfg planner.ReservationConfig) {
	f.t.Helper()
	// A restarted extender's ledger knows no reservation.
	f.cache = extender.NewCache()
	f.cache.SetNode(testbuild.EightGPUNodes(1)[0])
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list,
		Policy: testPolicy(f.t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }, Reservation: cfg,
		Reservations: &planner.KubeReservations{Client: f.client, Namespace: storeNS}})
	pods, err := f.list()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, p := range pods {
		f.cache.SetPod(p)
	}
}

// stored reads the planner's records from the ConfigMap.
func (f *gangFixture) stored() []api.ReservationRecord {
	f.t.Helper()
	recs, err := (&planner.KubeReservations{Client: f.client, Namespace: storeNS}).Load(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return recs
}

func timePtr(t time.Time) *time.Time { return &t }

// A reservation outlives an extender restart: the restarted planner
// reserves the same node again, counting --reservation-max from the first
// reservation (not from the restart), and a workload whose reservation ran
// out does not reserve again before its cooldown ends, restart or not.
func TestReservationSurvivesARestart(t *testing.T) {
	cfg := planner.ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.restart(cfg)
	t0 := f.now
	f.running("small", "n0", 1, t0.Add(-time.Hour), nil)
	big := f.member("big", 1, 0, 8, t0.Add(-2*time.Minute))
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("no reservation\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
	want := []api.ReservationRecord{{Workload: "default/big", UIDs: []types.UID{big.UID}, Since: timePtr(t0), Nodes: []string{"n0"}}}
	if diff := cmp.Diff(want, f.stored()); diff != "" {
		t.Fatalf("records after the first reservation (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, f.planner.ReservationRecords()); diff != "" {
		t.Errorf("records published for the status page (-want +got):\n%s", diff)
	}

	// Restarted 8 minutes later: the node is reserved again, until t0+10m.
	f.now = t0.Add(8 * time.Minute)
	f.restart(cfg)
	f.events.Events = nil
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("not reserved again after the restart\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
	until := t0.Add(10 * time.Minute).Format(time.RFC3339)
	if ev := strings.Join(f.events.Events, "\n"); !strings.Contains(ev, "nodes n0 are reserved") || !strings.Contains(ev, "at most until "+until) {
		t.Errorf("the restarted reservation does not end at %s (ReserveFor from its first reservation):\n%s", until, ev)
	}

	// It runs out at t0+10m, not at restart+10m.
	f.now = t0.Add(11 * time.Minute)
	f.sync()
	if f.planner.Reservations() != 0 {
		t.Fatalf("the reservation outlived ReserveFor counted from before the restart")
	}
	notBefore := t0.Add(21 * time.Minute)
	want = []api.ReservationRecord{{Workload: "default/big", UIDs: []types.UID{big.UID}, Nodes: []string{"n0"}, NotBefore: &notBefore}}
	if diff := cmp.Diff(want, f.stored()); diff != "" {
		t.Fatalf("records after the reservation ran out (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, f.planner.ReservationRecords()); diff != "" {
		t.Errorf("records published for the status page after it ran out (-want +got):\n%s", diff)
	}

	// Restarted during the cooldown: no reservation until it ends.
	f.now = t0.Add(12 * time.Minute)
	f.restart(cfg)
	f.sync()
	if f.planner.Reservations() != 0 {
		t.Errorf("reserved again during the cooldown, after a restart")
	}
	f.now = t0.Add(22 * time.Minute)
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Errorf("not reserved again after the cooldown")
	}
	if got := f.stored(); len(got) != 1 || got[0].Since == nil || !got[0].Since.Equal(f.now) || got[0].NotBefore != nil {
		t.Errorf("records of the new reservation: %+v, want since %s and no cooldown", got, f.now)
	}
}

// A record names its workload's members: a gang deleted and made again
// under the same name (new pods, new UIDs) while the extender was down does
// not inherit the old one's reservation time or cooldown.
func TestReservationRecordsOfAnotherWorkloadAreIgnored(t *testing.T) {
	cfg := planner.ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	t0 := f.now
	old := t0.Add(-time.Hour)
	if err := (&planner.KubeReservations{Client: f.client, Namespace: storeNS}).Save(context.Background(), []api.ReservationRecord{
		{Workload: "default/big", UIDs: []types.UID{"uid-of-the-old-big-0"}, Since: &old, NotBefore: timePtr(t0.Add(time.Hour))},
	}); err != nil {
		t.Fatal(err)
	}
	f.restart(cfg)
	f.running("small", "n0", 1, t0.Add(-time.Hour), nil)
	f.member("big", 1, 0, 8, t0.Add(-2*time.Minute))
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("the new gang does not reserve: the old one's cooldown was applied\nevents:\n%s", strings.Join(f.events.Events, "\n"))
	}
	if got := f.stored(); len(got) != 1 || got[0].Since == nil || !got[0].Since.Equal(t0) {
		t.Errorf("records: %+v, want the new gang's, since %s", got, t0)
	}
}

// Records that do not parse (edited by hand) are reported and replaced:
// the planner reserves as if it had none, and writes its own.
func TestReservationRecordsMalformed(t *testing.T) {
	cfg := planner.ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: api.ReservationsConfigMapName, Namespace: storeNS},
		Data: map[string]string{api.ReservationsDataKey: `{"reservations": "garbage"`}}
	if _, err := f.client.CoreV1().ConfigMaps(storeNS).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := (&planner.KubeReservations{Client: f.client, Namespace: storeNS}).Load(context.Background()); err == nil ||
		!strings.Contains(err.Error(), api.ReservationsConfigMapName) {
		t.Fatalf("Load of garbage: %v, want an error naming the ConfigMap", err)
	}
	f.restart(cfg)
	f.running("small", "n0", 1, f.now.Add(-time.Hour), nil)
	f.member("big", 1, 0, 8, f.now.Add(-2*time.Minute))
	f.sync()
	if f.planner.Reservations() != 1 {
		t.Fatalf("no reservation")
	}
	if got := f.stored(); len(got) != 1 || got[0].Workload != "default/big" {
		t.Errorf("records: %+v, want the planner's own", got)
	}
}

// A workload's record leaves the store once it is planned: the ConfigMap
// holds only workloads that reserve, or wait after a reservation, not
// every gang that ever reserved while it runs.
func TestReservationRecordGoesWhenPlanned(t *testing.T) {
	cfg := planner.ReservationConfig{ReserveAfter: time.Minute, ReserveFor: 10 * time.Minute}
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.restart(cfg)
	small := f.running("small", "n0", 1, f.now.Add(-time.Hour), nil)
	f.member("big", 1, 0, 8, f.now.Add(-2*time.Minute))
	f.sync()
	if got := f.stored(); len(got) != 1 {
		t.Fatalf("records while big holds its reservation: %+v, want one", got)
	}
	if err := f.client.CoreV1().Pods(small.Namespace).Delete(context.Background(), small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.DeletePod(small.UID)
	f.now = f.now.Add(time.Minute)
	f.sync()
	if s := f.state("big-"); !s["big-0"].planned {
		t.Fatalf("big not planned once n0 is free: %+v\nevents:\n%s", s, strings.Join(f.events.Events, "\n"))
	}
	if got := f.stored(); len(got) != 0 {
		t.Errorf("records after big was planned: %+v, want none", got)
	}
}
