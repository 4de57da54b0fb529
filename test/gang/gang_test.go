// Package gang_test runs the gang planner of tessera-extender against the
// real kube-scheduler (see framework/extenderenv): gangs wait whole, bind
// together, never split room with another gang, land in one topology
// domain, and release their reservation when their plan expires.
package gang_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/nodepin"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

const ns = extenderenv.DefaultNamespace

// start runs the extender with the gang planner on a short resync (plan
// timeouts and freed room are noticed within half a second) and extra
// flags.
func start(t *testing.T, extra ...string) *extenderenv.Env {
	t.Helper()
	return extenderenv.Start(t, extenderenv.Options{
		ExtenderArgs: append([]string{"--gang-planner=true", "--gang-resync=500ms"}, extra...),
	})
}

// createMember creates member i of gang (named gang-i) asking for gpus
// whole GPUs, held by the gang gate.
func createMember(t testing.TB, e *extenderenv.Env, gang string, minMember, i int, gpus int64) {
	t.Helper()
	e.CreatePod(t, extenderenv.PodSpec{Name: fmt.Sprintf("%s-%d", gang, i), GPUs: gpus, Gang: gang, GangMinMember: minMember})
}

func h100Node(name string, labels map[string]string) extenderenv.NodeSpec {
	return extenderenv.NodeSpec{Name: name, GPUs: 8, Model: extenderenv.H100, Labels: labels}
}

// waitWhole waits until all n members of gang (gang-0 .. gang-n-1) are
// seen bound, and returns their bind times.
func waitWhole(t *testing.T, e *extenderenv.Env, w *extenderenv.PodWatch, gang string, n int, timeout time.Duration) map[string]time.Time {
	t.Helper()
	for i := range n {
		e.WaitBound(t, ns, fmt.Sprintf("%s-%d", gang, i), timeout)
	}
	// The watch may lag the reads above by a little.
	var times map[string]time.Time
	_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		times = w.BoundNow(ns, gang+"-")
		return len(times) == n, nil
	})
	if len(times) != n {
		t.Fatalf("the watch saw %d of %d members of %s bound", len(times), n, gang)
	}
	return times
}

// TestGangOfFourWaitsForRoomThenBindsTogether: 4 members of 8 GPUs on 24
// free GPUs stay gated with the planner's reason in an Event; a fourth
// node makes room and all four bind, on four nodes, each on its planned
// node, within a few seconds of each other.
func TestGangOfFourWaitsForRoomThenBindsTogether(t *testing.T) {
	e := start(t)
	w := e.WatchPods(t)
	for i := range 3 {
		e.CreateNode(t, h100Node(fmt.Sprintf("n%d", i), nil))
	}
	for i := range 4 {
		createMember(t, e, "g", 4, i, 8)
	}
	ev := e.WaitEvent(t, ns, "g-0", "GangWaiting", "no room for the whole group", 30*time.Second)
	t.Logf("waiting reason: %s", strings.TrimSpace(ev))
	time.Sleep(2 * time.Second) // several planner passes
	for i := range 4 {
		p := e.GetPod(t, ns, fmt.Sprintf("g-%d", i))
		if !api.HasGangGate(p) || p.Spec.NodeName != "" || p.Annotations[api.AnnotationGangPlan] != "" {
			t.Errorf("24 free GPUs: member %s gated=%v node=%q plan=%q; want it held whole", p.Name, api.HasGangGate(p), p.Spec.NodeName, p.Annotations[api.AnnotationGangPlan])
		}
	}
	if b := w.Binds(); len(b) != 0 {
		t.Fatalf("pods bound while the gang cannot fit: %+v", b)
	}
	roomAt := time.Now()
	e.CreateNode(t, h100Node("n3", nil))
	times := waitWhole(t, e, w, "g", 4, 60*time.Second)
	nodes := map[string]bool{}
	for i := range 4 {
		p := e.GetPod(t, ns, fmt.Sprintf("g-%d", i))
		plan, ok, err := api.GetGangPlan(p.Annotations)
		if !ok || err != nil || plan.Node != p.Spec.NodeName {
			t.Errorf("member %s bound to %s, plan %+v (ok %v, err %v)", p.Name, p.Spec.NodeName, plan, ok, err)
		}
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) != 4 {
		t.Errorf("members on %v, want 4 distinct nodes", nodes)
	}
	var last time.Time
	for _, at := range times {
		if at.After(last) {
			last = at
		}
	}
	spread := extenderenv.Spread(times)
	t.Logf("room made -> all 4 bound: %s; spread of the 4 bind times: %s", last.Sub(roomAt).Round(time.Millisecond), spread.Round(time.Millisecond))
	if spread > 5*time.Second {
		t.Errorf("the 4 members bound %s apart, want within 5s of each other", spread)
	}
}

// TestTwoGangsForRoomOfOne: two gangs of 4 x 8 GPUs on 32 GPUs. Exactly one
// runs; no member of the other is ever bound; when the first goes, the
// second runs whole.
func TestTwoGangsForRoomOfOne(t *testing.T) {
	e := start(t)
	w := e.WatchPods(t)
	for i := range 4 {
		e.CreateNode(t, h100Node(fmt.Sprintf("n%d", i), nil))
	}
	for i := range 4 {
		createMember(t, e, "a", 4, i, 8)
		createMember(t, e, "b", 4, i, 8)
	}
	var winner, loser string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		a, b := len(w.BoundNow(ns, "a-")), len(w.BoundNow(ns, "b-"))
		switch {
		case a == 4:
			winner, loser = "a", "b"
		case b == 4:
			winner, loser = "b", "a"
		}
		return winner != "", nil
	})
	if err != nil {
		t.Fatalf("no gang bound whole: a %d, b %d bound", len(w.BoundNow(ns, "a-")), len(w.BoundNow(ns, "b-")))
	}
	time.Sleep(3 * time.Second) // several planner passes and scheduling cycles
	if n := len(w.BindsOf(ns, loser+"-")); n != 0 {
		t.Fatalf("gang %s has had %d members bound while %s runs: a partial gang", loser, n, winner)
	}
	for i := range 4 {
		p := e.GetPod(t, ns, fmt.Sprintf("%s-%d", loser, i))
		if !api.HasGangGate(p) || p.Annotations[api.AnnotationGangPlan] != "" {
			t.Errorf("waiting gang member %s: gated=%v plan=%q", p.Name, api.HasGangGate(p), p.Annotations[api.AnnotationGangPlan])
		}
	}
	t.Logf("gang %s runs, gang %s waits whole; waiting reason: %s", winner, loser, strings.TrimSpace(e.Events(t, ns, loser+"-0")))
	for i := range 4 {
		e.DeletePod(t, ns, fmt.Sprintf("%s-%d", winner, i))
	}
	times := waitWhole(t, e, w, loser, 4, 60*time.Second)
	t.Logf("gang %s bound after %s left; spread %s", loser, winner, extenderenv.Spread(times).Round(time.Millisecond))
	// Every bind of the whole test: 4 of the winner, then 4 of the loser,
	// never a mix before the winner left.
	binds := w.Binds()
	if len(binds) != 8 {
		t.Errorf("%d binds, want 8: %+v", len(binds), binds)
	}
	for i, b := range binds {
		want := winner
		if i >= 4 {
			want = loser
		}
		if !strings.HasPrefix(b.Name, want+"-") {
			t.Errorf("bind %d is %s, want a member of %s", i, b.Name, want)
		}
	}
}

// TestGang64GPUsOn1000Nodes measures, on 1000 fake 8-GPU nodes (Node
// objects with the inventory annotation), the time from the creation of
// the last member of a 64-GPU gang (8 members of 8 GPUs, minMember 8) to
// all 8 members seen bound: three gangs on the empty cluster, then three
// after 600 of the nodes got a bound 4-GPU pod (so whole free nodes are
// the minority the planner must find). It fails when a gang does not bind
// whole within 30s, lands on fewer than 8 nodes or a half-used one, or its
// members bind more than 5s apart.
func TestGang64GPUsOn1000Nodes(t *testing.T) {
	const (
		nodes   = 1000
		loaded  = 600
		members = 8
		runs    = 3
	)
	e := start(t)
	w := e.WatchPods(t)
	specs := make([]extenderenv.NodeSpec, nodes)
	for i := range specs {
		specs[i] = h100Node(fmt.Sprintf("sim-%04d", i), nil)
	}
	began := time.Now()
	e.CreateNodes(t, specs, 16)
	t.Logf("%d nodes created in %s", nodes, time.Since(began).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // the scheduler's and the extender's informers catch up

	busy := map[string]bool{}
	var took []string
	measure := func(phase string, r int) {
		gang := fmt.Sprintf("big%d", r)
		for i := range members - 1 {
			createMember(t, e, gang, members, i, 8)
		}
		e.WaitEvent(t, ns, gang+"-0", "GangWaiting", fmt.Sprintf("%d of %d members exist", members-1, members), 30*time.Second)
		created := time.Now()
		createMember(t, e, gang, members, members-1, 8)
		times := waitWhole(t, e, w, gang, members, 30*time.Second)
		var last time.Time
		for _, at := range times {
			if at.After(last) {
				last = at
			}
		}
		d := last.Sub(created)
		took = append(took, fmt.Sprintf("%s %s", phase, d.Round(time.Millisecond)))
		spread := extenderenv.Spread(times)
		onNodes := map[string]bool{}
		for _, b := range w.BindsOf(ns, gang+"-") {
			onNodes[b.Node] = true
			if busy[b.Node] {
				t.Errorf("gang %s: member %s on %s, which runs a 4-GPU pod", gang, b.Name, b.Node)
			}
		}
		t.Logf("%d nodes (%s), gang %s (%d x 8 GPUs): last member created -> all %d bound: %s (bind spread %s, %d nodes)",
			nodes, phase, gang, members, members, d.Round(time.Millisecond), spread.Round(time.Millisecond), len(onNodes))
		if len(onNodes) != members {
			t.Errorf("gang %s on %d nodes, want %d", gang, len(onNodes), members)
		}
		if spread > 5*time.Second {
			t.Errorf("gang %s: members bound %s apart, want within 5s", gang, spread)
		}
	}
	for r := range runs {
		measure("empty", r)
	}

	// Load: a bound 4-GPU pod on each of 600 nodes the gangs left free.
	var pods []extenderenv.PodSpec
	for i := 0; len(pods) < loaded && i < nodes; i++ {
		n := specs[i].Name
		if nodeUsed(w, n) {
			continue
		}
		busy[n] = true
		pods = append(pods, extenderenv.PodSpec{Name: "load-" + n, GPUs: 4, Node: n, Assign: extenderenv.WholeAssignment(n, 4, 5, 6, 7)})
	}
	began = time.Now()
	e.CreatePods(t, pods, 16)
	t.Logf("%d bound 4-GPU pods created in %s", len(pods), time.Since(began).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	for r := runs; r < 2*runs; r++ {
		measure(fmt.Sprintf("%d half-used", loaded), r)
	}
	t.Logf("summary: %d nodes, 64-GPU gang, last member created -> all bound: %s", nodes, strings.Join(took, ", "))
}

// nodeUsed reports whether any pod the watch saw bound is on node.
func nodeUsed(w *extenderenv.PodWatch, node string) bool {
	for _, b := range w.Binds() {
		if b.Node == node {
			return true
		}
	}
	return false
}

// TestGangPlannedOnlyWhereMembersMayRun: members select pool=a by
// nodeSelector; pool b has the tightest fit (a node with exactly the 6
// free GPUs a member asks for), which a binpacking planner that ignores
// the selector picks, and kube-scheduler then never binds that member.
// The gang must be planned on pool a and bind whole.
func TestGangPlannedOnlyWhereMembersMayRun(t *testing.T) {
	e := start(t)
	w := e.WatchPods(t)
	for _, n := range []string{"a0", "a1", "b0"} {
		e.CreateNode(t, h100Node(n, map[string]string{"pool": n[:1]}))
	}
	e.CreatePod(t, extenderenv.PodSpec{Name: "busy-b0", GPUs: 2, Node: "b0", Assign: extenderenv.WholeAssignment("b0", 6, 7)})
	for i := range 2 {
		e.CreatePod(t, extenderenv.PodSpec{Name: fmt.Sprintf("sel-%d", i), GPUs: 6, Gang: "sel", GangMinMember: 2,
			Selector: map[string]string{"pool": "a"}})
	}
	times := waitWhole(t, e, w, "sel", 2, 30*time.Second)
	for i := range 2 {
		if p := e.GetPod(t, ns, fmt.Sprintf("sel-%d", i)); !strings.HasPrefix(p.Spec.NodeName, "a") {
			t.Errorf("member %s bound to %s, outside pool a", p.Name, p.Spec.NodeName)
		}
	}
	t.Logf("spread %s", extenderenv.Spread(times).Round(time.Millisecond))
}

// Planned members are pinned to their nodes as the API server allows it
// for gated pods: a member whose creator required a node affinity keeps
// it and gains the pin in each term; one without gets a term of its own.
func TestGangMembersArePinnedToTheirNodes(t *testing.T) {
	e := start(t)
	w := e.WatchPods(t)
	for _, n := range []string{"a0", "a1", "b0"} {
		e.CreateNode(t, h100Node(n, map[string]string{"pool": n[:1]}))
	}
	poolA := v1.NodeSelectorRequirement{Key: "pool", Operator: v1.NodeSelectorOpIn, Values: []string{"a"}}
	for i := range 2 {
		p := extenderenv.PodSpec{Name: fmt.Sprintf("aff-%d", i), GPUs: 8, Gang: "aff", GangMinMember: 2}.Pod()
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{poolA}}}}}}
		if _, err := e.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitWhole(t, e, w, "aff", 2, 30*time.Second)
	e.CreatePod(t, extenderenv.PodSpec{Name: "bare-0", GPUs: 8, Gang: "bare", GangMinMember: 1})
	waitWhole(t, e, w, "bare", 1, 30*time.Second)
	for _, name := range []string{"aff-0", "aff-1", "bare-0"} {
		p := e.GetPod(t, ns, name)
		if !nodepin.Pinned(p, p.Spec.NodeName) {
			t.Errorf("pod %s bound to %s is not pinned to it: %+v", name, p.Spec.NodeName, p.Spec.Affinity)
			continue
		}
		if !strings.HasPrefix(name, "aff") {
			continue
		}
		terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "pool" || !strings.HasPrefix(p.Spec.NodeName, "a") {
			t.Errorf("pod %s on %s: its creator's affinity changed: %+v", name, p.Spec.NodeName, terms)
		}
	}
}
