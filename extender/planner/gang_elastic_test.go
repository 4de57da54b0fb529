package planner_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// An elastic gang (4 members of 4 GPUs, minMember 2) on a cluster with
// room for 2 starts with 2, then grows by one member each time room for
// one appears, and never plans a member without room.
func TestElasticGangStartsAtMinAndGrows(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	// Node n1 is full; n0 has room for two 4-GPU members.
	var fillers []*corev1.Pod
	for i := range 2 {
		p := testbuild.Pod(fmt.Sprintf("fill-%d", i)).Whole(4).Node("n1").Holding(4*i, 4*i+1, 4*i+2, 4*i+3).Obj()
		p.UID = types.UID(fmt.Sprintf("uid-fill-%d", i))
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.SetPod(p)
		fillers = append(fillers, p)
	}
	for i := range 4 {
		f.member("el", 2, i, 4, f.now)
	}
	planned := func() int {
		n := 0
		for _, s := range f.state("el-") {
			if s.planned && !s.gated {
				n++
			}
		}
		return n
	}
	f.sync()
	f.sync()
	if n := planned(); n != 2 {
		t.Fatalf("planned %d members with room for 2, want 2 (minMember): %v", n, f.state("el-"))
	}
	for i, want := range []int{3, 4} {
		if err := f.client.CoreV1().Pods(fillers[i].Namespace).Delete(context.Background(), fillers[i].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.DeletePod(fillers[i].UID)
		f.sync()
		f.sync()
		if n := planned(); n != want {
			t.Fatalf("after room for one more: planned %d, want %d: %v", n, want, f.state("el-"))
		}
	}
}

// An elastic gang's extra member takes free room only, and room on a node
// kube-scheduler's preemption nominated for a pending pod is that pod's:
// the extra waits there, and joins once the nomination is gone.
func TestElasticExtraLeavesNominatedRoom(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	// n1 is full; n0 has room for two 4-GPU members, then for one more
	// when its filler leaves, the room kube-scheduler nominated for "hi".
	for i, node := range []string{"n1", "n1", "n0"} {
		p := testbuild.Pod(fmt.Sprintf("fill-%d", i)).Whole(4).Node(node).Holding(4*(i%2), 4*(i%2)+1, 4*(i%2)+2, 4*(i%2)+3).Obj()
		p.UID = types.UID(fmt.Sprintf("uid-fill-%d", i))
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.SetPod(p)
	}
	for i := range 3 {
		f.member("el", 2, i, 4, f.now)
	}
	planned := func() int {
		n := 0
		for _, s := range f.state("el-") {
			if s.planned && !s.gated {
				n++
			}
		}
		return n
	}
	f.sync()
	f.sync()
	if n := planned(); n != 0 {
		t.Fatalf("planned %d members with room for 1", n)
	}
	hi := testbuild.Pod("hi").Whole(4).Obj()
	hi.UID = "uid-hi"
	hi.Status.NominatedNodeName = "n0"
	if _, err := f.client.CoreV1().Pods(hi.Namespace).Create(context.Background(), hi, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Room for the minimum of 2 on n0 (the filler there left): the gang
	// starts (a gang's minimum is not held back by a nomination: the
	// filter and kube-scheduler decide that).
	if err := f.client.CoreV1().Pods("default").Delete(context.Background(), "fill-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.DeletePod("uid-fill-2")
	f.sync()
	f.sync()
	if n := planned(); n != 2 {
		t.Fatalf("planned %d members with room for 2, want 2: %v", n, f.state("el-"))
	}
	// Room for the extra appears on n1, which is nominated too.
	hi.Status.NominatedNodeName = "n1"
	if _, err := f.client.CoreV1().Pods(hi.Namespace).UpdateStatus(context.Background(), hi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.client.CoreV1().Pods("default").Delete(context.Background(), "fill-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.DeletePod("uid-fill-0")
	f.sync()
	f.sync()
	if n := planned(); n != 2 {
		t.Fatalf("the extra member took room kube-scheduler nominated for another pod: planned %d, want 2: %v", n, f.state("el-"))
	}
	hi.Status.NominatedNodeName = ""
	if _, err := f.client.CoreV1().Pods(hi.Namespace).UpdateStatus(context.Background(), hi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	f.sync()
	if n := planned(); n != 3 {
		t.Fatalf("planned %d once the nomination is gone, want 3: %v", n, f.state("el-"))
	}
}

// A gang capped by tessera.dev/gang-max-member (4 members, min 2, max 3)
// on a cluster with room for all four runs three; the fourth is told why
// once, however many passes it waits, and joins when a running member
// ends. A cap below the minimum keeps the gang from starting, with the
// reason.
func TestElasticGangCappedByMaxMember(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	var members []*corev1.Pod
	for i := range 4 {
		m := f.member("cap", 2, i, 4, f.now)
		m.Annotations[api.AnnotationGangMaxMember] = "3"
		if _, err := f.client.CoreV1().Pods(m.Namespace).Update(context.Background(), m, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	planned := func() []string {
		var out []string
		for name, s := range f.state("cap-") {
			if s.planned && !s.gated {
				out = append(out, name)
			}
		}
		sort.Strings(out)
		return out
	}
	for range 4 {
		f.sync()
	}
	if got, want := planned(), []string{"cap-0", "cap-1", "cap-2"}; !slices.Equal(got, want) {
		t.Fatalf("planned %v with room for all four and a cap of 3, want %v: %v", got, want, f.state("cap-"))
	}
	capEvents := func() int {
		f.events.Mu.Lock()
		defer f.events.Mu.Unlock()
		n := 0
		for _, e := range f.events.Events {
			if strings.Contains(e, "at most 3 members run at once ("+api.AnnotationGangMaxMember+")") {
				n++
			}
		}
		return n
	}
	if n := capEvents(); n != 1 {
		t.Errorf("%d Events on the capped member over 4 passes, want 1: %v", n, f.events.Events)
	}
	// cap-1 ends: cap-3 joins.
	if err := f.client.CoreV1().Pods(members[1].Namespace).Delete(context.Background(), members[1].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.DeletePod(members[1].UID)
	f.sync()
	f.sync()
	if got, want := planned(), []string{"cap-0", "cap-2", "cap-3"}; !slices.Equal(got, want) {
		t.Fatalf("after cap-1 ended: planned %v, want %v", got, want)
	}

	// A cap below the minimum: nothing starts, and the members say why.
	for i := range 2 {
		m := f.member("low", 2, i, 1, f.now)
		m.Annotations[api.AnnotationGangMaxMember] = "1"
		if _, err := f.client.CoreV1().Pods(m.Namespace).Update(context.Background(), m, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.sync()
	for name, s := range f.state("low-") {
		if s.planned {
			t.Errorf("%s planned with a cap below the gang's minimum", name)
		}
	}
	if !f.hasEvent("gang-max-member") {
		t.Errorf("no GangWaiting Event naming the cap: %v", f.events.Events)
	}
}

// An elastic gang's extra member takes free room only: on a cluster where
// it fits nowhere, long past the reservation wait, no nodes are reserved
// for it and its Event says why it waits.
func TestElasticExtraMemberReservesNothing(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Reservation: planner.ReservationConfig{ReserveAfter: time.Minute}})
	// n1 runs a 1-GPU pod: the second 8-GPU member fits nowhere.
	p := testbuild.Pod("small").Whole(1).Node("n1").Holding(0).Obj()
	p.UID = "uid-small"
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(p)
	for i := range 2 {
		f.member("el", 1, i, 8, f.now.Add(-time.Hour))
	}
	for range 3 {
		f.sync()
		f.now = f.now.Add(10 * time.Second) // within the plan's 60 s timeout
	}
	st := f.state("el-")
	if !st["el-0"].planned || st["el-1"].planned {
		t.Fatalf("want el-0 planned (the minimum) and el-1 waiting: %v", st)
	}
	if got := f.planner.Reservations(); got != 0 {
		t.Errorf("%d reservations for an extra member, want 0:\n%s", got, strings.Join(f.events.Events, "\n"))
	}
	newcomer := testbuild.Pod("newcomer").Whole(1).Obj()
	d, err := extender.ParseDemand(newcomer)
	if err != nil {
		t.Fatal(err)
	}
	if extender.Check(mustState(t, f.cache, "n1"), &d) != extender.Fits {
		t.Errorf("a new 1-GPU pod does not fit n1: held for the extra member")
	}
	if !f.hasEvent("member el-1, beyond the gang's minimum of 1, joins when room for it is free") {
		t.Errorf("no GangWaiting Event saying why the extra member waits:\n%s", strings.Join(f.events.Events, "\n"))
	}
}

// While an elastic gang waits to start, its members beyond the minimum are
// told why, once each (they had no Event at all; the reasons went to the
// first minMember members only).
func TestElasticGangExtrasToldWhileItWaits(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	p := testbuild.Pod("fill").Whole(8).Node("n0").Holding(0, 1, 2, 3, 4, 5, 6, 7).Obj()
	p.UID = "uid-fill"
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.SetPod(p)
	for i := range 4 {
		f.member("el", 2, i, 4, f.now)
	}
	f.sync()
	f.sync()
	extras, firsts := 0, 0
	for _, e := range f.events.Events {
		switch {
		case strings.Contains(e, "this member is beyond its minimum and joins once the gang runs"):
			extras++
		case strings.Contains(e, "no room for the whole group: 2 members need 8 whole GPUs"):
			firsts++
		}
	}
	// Two passes: each of the two extras told once, each of the first two
	// told its reason once.
	if extras != 2 || firsts != 2 {
		t.Errorf("%d Events to the extras, %d with the reason; want 2 and 2\nevents:\n%s", extras, firsts, strings.Join(f.events.Events, "\n"))
	}
}
