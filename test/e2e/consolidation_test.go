package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// Consolidation (issue 16; extender --consolidation, off by default): four
// dgx-a100 nodes of 8 GPUs hold 1-GPU pods scattered so that 26 GPUs are
// free but no node is empty:
//
//	a100-1: guarded-0 (ReplicaSet "guarded", a PodDisruptionBudget: minAvailable 1)
//	a100-2: web-0 (ReplicaSet "web")
//	a100-3: web-1, web-2
//	a100-4: four plain pods (no controller, not preemptible)
//
// Every ReplicaSet pod is marked tessera.dev/preemptible. A gang of 2 x 8
// GPUs fits nowhere. With consolidation the fewest moves would free a100-1
// and a100-2 (two pods), but the budget refuses guarded-0's eviction (429,
// a dry run): it stays, and the choice made again frees a100-2 and a100-3
// (three pods, within the 4 moves per minute). Their "controller"
// recreates them; they run elsewhere and the gang runs on a100-2 and
// a100-3. Without consolidation nothing is evicted and the gang waits.
//
// The local cluster runs kube-controller-manager (as make demo's does):
// its ReplicaSet controller adopts the initial pods (the template's,
// placed while the other nodes were cordoned) and recreates the moved
// ones; its disruption controller keeps the budget's status (with one pod
// and minAvailable 1 no disruption is allowed, so the API server refuses
// the eviction).
// Reservations are off (--reservation-wait=0) in both clusters: a
// reservation evicts preemptible pods on its own nodes, which would blur
// the comparison.
func TestConsolidationMovesPreemptiblePodsForAGang(t *testing.T) {
	nodes := []nodesim.NodeSpec{
		{Name: "a100-1", Profile: "dgx-a100"}, {Name: "a100-2", Profile: "dgx-a100"},
		{Name: "a100-3", Profile: "dgx-a100"}, {Name: "a100-4", Profile: "dgx-a100"},
	}
	for _, on := range []bool{true, false} {
		name := map[bool]string{true: "on", false: "off"}[on]
		t.Run(name, func(t *testing.T) {
			const ns = "e2e-consolidate"
			args := []string{"--reservation-wait=0s"}
			if on {
				args = append(args, "--consolidation", "--consolidation-moves-per-minute=4")
			}
			c := ownCluster(t.Context(), t, ns, nodes, args...)
			started := time.Now() // the extender's start is a little earlier
			client := c.Client()

			pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns},
				Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(1)),
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}}}
			if _, err := client.PolicyV1().PodDisruptionBudgets(ns).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			replicaSet(t, client, ns, "web", map[string]string{"a100-2": "web-0", "a100-3": "web-1,web-2"})
			replicaSet(t, client, ns, "guarded", map[string]string{"a100-1": "guarded-0"})
			for i := range 4 {
				create(t, client, ns, podSpec{name: fmt.Sprintf("plain-%d", i), gpus: 1, node: "a100-4"})
			}
			initial := map[string]string{} // name -> UID
			for _, n := range []string{"web-0", "web-1", "web-2", "guarded-0", "plain-0", "plain-1", "plain-2", "plain-3"} {
				p, _ := waitRunning(t, c, ns, n, 2*time.Minute)
				initial[n] = string(p.UID)
			}
			base, hc := extenderEndpoint(t, c)
			evictedBefore, blockedBefore := consolidationMoves(t, base, hc, on)

			created := time.Now()
			for i := range 2 {
				create(t, client, ns, podSpec{name: fmt.Sprintf("big-%d", i), gpus: 8,
					annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "2"}})
			}
			running := func(ctx context.Context) (bool, error) {
				for i := range 2 {
					p, err := client.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("big-%d", i), metav1.GetOptions{})
					if err != nil || p.Status.Phase != v1.PodRunning {
						return false, nil
					}
				}
				return true, nil
			}
			if !on {
				// Longer than the run with consolidation took (the
				// extender moves nothing in its first minute, so that
				// one waited up to that minute).
				err := wait.PollUntilContextTimeout(t.Context(), time.Second, 90*time.Second, true, running)
				if err == nil {
					t.Fatalf("the gang ran without consolidation (%s after creation)", time.Since(created))
				}
				if moved := movedOff(t, client, ns, initial); len(moved) > 0 {
					t.Errorf("without consolidation pods were evicted or replaced: %v", moved)
				}
				if ev := events(t, client, ns, "big-0"); strings.Contains(ev, planner.EventConsolidating) {
					t.Errorf("a %s Event without consolidation: %s", planner.EventConsolidating, ev)
				}
				t.Logf("without consolidation: the gang waited %s with nothing evicted; big-0's events:%s", time.Since(created).Round(time.Second), events(t, client, ns, "big-0"))
				return
			}
			if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 3*time.Minute, true, running); err != nil {
				t.Fatalf("the 2 x 8 GPU gang did not run with consolidation: %v\n%s", err, describe(t, c, getPod(t, client, ns, "big-0")))
			}
			t.Logf("the gang ran %s after creation (%s after the cluster was up; the extender moves nothing in its first minute)",
				time.Since(created).Round(time.Millisecond), time.Since(started).Round(time.Second))
			t.Logf("big-0's events:%s", events(t, client, ns, "big-0"))
			var bigNodes []string
			for i := range 2 {
				bigNodes = append(bigNodes, getPod(t, client, ns, fmt.Sprintf("big-%d", i)).Spec.NodeName)
			}
			slices.Sort(bigNodes)
			if !slices.Equal(bigNodes, []string{"a100-2", "a100-3"}) {
				t.Errorf("the gang runs on %v, want a100-2 and a100-3 (a100-1's pod is guarded by its budget)", bigNodes)
			}
			moved := movedOff(t, client, ns, initial)
			slices.Sort(moved)
			if !slices.Equal(moved, []string{"web-0", "web-1", "web-2"}) {
				t.Errorf("moved %v, want web-0, web-1, web-2", moved)
			}
			for _, n := range []string{"web-0", "web-1", "web-2"} {
				if ev, ok := waitEvent(t, client, ns, n, planner.EventConsolidated); !ok {
					t.Errorf("no %s Event on %s: %s", planner.EventConsolidated, n, ev)
				}
			}
			// The replacements run, elsewhere.
			err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
				l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
				if err != nil {
					return false, nil
				}
				n := 0
				for _, p := range l.Items {
					if p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning {
						n++
						if p.Spec.NodeName == "a100-2" || p.Spec.NodeName == "a100-3" {
							return false, fmt.Errorf("replacement %s runs on the gang's node %s", p.Name, p.Spec.NodeName)
						}
					}
				}
				return n == 3, nil
			})
			if err != nil {
				t.Errorf("web's three replacements do not run elsewhere: %v", err)
			}
			evicted, blocked := consolidationMoves(t, base, hc, true)
			t.Logf("tessera_extender_consolidation_moves_total: evicted +%v, blocked +%v", evicted-evictedBefore, blocked-blockedBefore)
			if evicted-evictedBefore != 3 || blocked-blockedBefore < 1 {
				t.Errorf("consolidation moves: evicted +%v, blocked +%v; want +3 and at least +1", evicted-evictedBefore, blocked-blockedBefore)
			}
			time.Sleep(3 * time.Second) // a further move would show by now
			if again := movedOff(t, client, ns, initial); len(again) != 3 {
				t.Errorf("after the gang runs, pods moved: %v", again)
			}
			occ, all := occupancy(t, c)
			checkNoOvercommit(t, occ)
			checkRunningPods(t, c, all)
		})
	}
}

// replicaSet creates ReplicaSet name's first pods, named by node
// ("web-1,web-2"), each on its node, then the ReplicaSet, and waits until
// its controller has adopted them.
func replicaSet(t *testing.T, client kubernetes.Interface, ns, name string, on map[string]string) {
	t.Helper()
	var names []string
	for _, ps := range on {
		names = append(names, strings.Split(ps, ",")...)
	}
	labels := map[string]string{"app": name}
	tmpl := podSpec{gpus: 1, labels: labels, annotations: map[string]string{api.AnnotationPreemptible: "true"}}.pod(ns)
	// Where churn left them: each node's pods are created while every
	// other node is cordoned, so that they are the template's pods (a
	// node selector of their own would follow them: consolidation moves
	// a pod only where it may run again).
	for node, ps := range on {
		cordonAllBut(t, client, node)
		podNamed := func(name string) *v1.Pod {
			pod := &v1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
			pod.Name = name
			return pod
		}
		for _, p := range strings.Split(ps, ",") {
			if _, err := client.CoreV1().Pods(ns).Create(t.Context(), podNamed(p), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range strings.Split(ps, ",") {
			if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				got, err := client.CoreV1().Pods(ns).Get(ctx, p, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					_, err = client.CoreV1().Pods(ns).Create(ctx, podNamed(p), metav1.CreateOptions{})
					return false, err
				case err != nil:
					return false, nil
				case got.Spec.NodeName != "" && got.Spec.NodeName != node:
					// kube-scheduler bound it before its cache saw
					// the cordons: once more.
					t.Logf("pod %s bound to %s before the cordons were seen; creating it again", p, got.Spec.NodeName)
					if err := client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
						return false, err
					}
					return false, nil
				}
				return got.Spec.NodeName == node, nil
			}); err != nil {
				t.Fatalf("pod %s was not bound to %s: %v", p, node, err)
			}
		}
	}
	cordonAllBut(t, client, "")
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: new(int32(len(names))), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}},
	}
	rs, err := client.AppsV1().ReplicaSets(ns).Create(t.Context(), rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range names {
		if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := client.CoreV1().Pods(ns).Get(ctx, p, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			ref := metav1.GetControllerOf(got)
			return ref != nil && ref.UID == rs.UID, nil
		}); err != nil {
			t.Fatalf("ReplicaSet %s did not adopt pod %s: %v", name, p, err)
		}
	}
}

// cordonAllBut cordons every node but keep and uncordons keep ("": none
// cordoned).
func cordonAllBut(t *testing.T, client kubernetes.Interface, keep string) {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if cordon := keep != "" && n.Name != keep; n.Spec.Unschedulable != cordon {
			setUnschedulable(t, client, n.Name, cordon)
		}
	}
}

// movedOff are the pods of initial (name -> UID) no longer there, or leaving.
func movedOff(t *testing.T, client kubernetes.Interface, ns string, initial map[string]string) []string {
	t.Helper()
	var out []string
	for n, uid := range initial {
		p := getPod(t, client, ns, n)
		if p == nil || p.Name == "" || string(p.UID) != uid || p.DeletionTimestamp != nil {
			out = append(out, n)
		}
	}
	return out
}

// consolidationMoves reads tessera_extender_consolidation_moves_total
// from the extender's /metrics: evicted and blocked (zeros, and none
// required, when consolidation is off).
func consolidationMoves(t *testing.T, base string, hc *http.Client, on bool) (evicted, blocked float64) {
	t.Helper()
	v := counterByResult(t, base, hc, "tessera_extender_consolidation_moves_total", "evicted", "blocked")
	if on && len(v) != 2 {
		t.Fatalf("/metrics has %d of the two series of tessera_extender_consolidation_moves_total", len(v))
	}
	if !on && len(v) != 0 {
		t.Errorf("/metrics has tessera_extender_consolidation_moves_total without --consolidation")
	}
	return v["evicted"], v["blocked"]
}
