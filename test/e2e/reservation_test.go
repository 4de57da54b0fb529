package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
)

// A stream of 1-GPU pods keeps every 8-GPU node busy (each node always
// runs one, replaced before it ends). A gang of 2 x 8 GPUs would wait for
// ever behind it; once it has waited the reservation wait (10 s here,
// --reservation-wait), two nodes are reserved for it, the stream's new
// pods stay off them, and the gang runs when their last small pods end.
func TestReservationStopsAStreamStarvingAGang(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ns := namespace(t, c, "e2e-reserve")
	waitReleased(t, c)
	nodes := []string{"a100-1", "a100-2", "v100-1"}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	// The stream: per node, a pod lives 4 s; its successor is created 2 s
	// into its life.
	for _, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("s-%s-%d", node, i)
				if _, err := client.CoreV1().Pods(ns).Create(ctx, podSpec{name: name, gpus: 1, node: node}.pod(ns), metav1.CreateOptions{}); err != nil {
					return
				}
				go func() {
					select {
					case <-ctx.Done():
					case <-time.After(4 * time.Second):
					}
					_ = client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
				}()
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Second):
				}
			}
		}()
	}
	time.Sleep(5 * time.Second) // the stream runs on every node
	start := time.Now()
	for i := range 2 {
		create(t, client, ns, podSpec{name: fmt.Sprintf("big-%d", i), gpus: 8,
			annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "2"}})
	}
	err := bigGangRunning(t, client, ns, 90*time.Second)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the 2 x 8 GPU gang did not run behind the stream: %v\nevents of big-0: %s", err, events(t, client, ns, "big-0"))
	}
	t.Logf("the gang ran %s after it was created (reservation wait 10 s)", took.Round(time.Millisecond))
	if ev, ok := waitEvent(t, client, ns, "big-0", api.EventReserved); !ok {
		t.Errorf("no %s Event on big-0: %s", api.EventReserved, ev)
	}
	if took > 40*time.Second {
		t.Errorf("the gang ran %s after creation: want within the reservation wait plus the stream's pod life and binding (40 s)", took)
	}
	stop()
	wg.Wait()
	// The stream's last pods go before the cluster-wide checks.
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		left := 0
		for _, p := range l.Items {
			if strings.HasPrefix(p.Name, "s-") {
				left++
				_ = client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
		}
		return left == 0, nil
	})
	if err != nil {
		t.Fatalf("the stream's pods are not gone: %v", err)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// Backfill into a reservation by expected run time (extender
// --reservation-backfill, on by default): the two dgx-a100 nodes each run
// a 1-GPU pod that expects to run 1 h, the other nodes are full with pods
// that declare nothing. A 2 x 8 GPU gang reserves the two a100 nodes (they
// drain first by the estimates). A one-pod gang of 4 GPUs that expects 5 m
// fits only there and ends before the reservation starts: it is planned
// and runs (Backfilled Event). One that expects 2 h would end after: it
// waits. Plain pods placed by kube-scheduler get the same terms.
func TestReservationBackfillByExpectedRuntime(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ns := namespace(t, c, "e2e-backfill")
	waitReleased(t, c)
	hour := map[string]string{api.AnnotationExpectedRuntime: "1h"}
	create(t, client, ns, podSpec{name: "fill-a100-1", gpus: 1, node: "a100-1", annotations: hour})
	create(t, client, ns, podSpec{name: "fill-a100-2", gpus: 1, node: "a100-2", annotations: hour})
	for _, node := range []string{"v100-1", "l40s-1"} {
		n, err := client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := n.Status.Allocatable[api.ResourceGPU]
		create(t, client, ns, podSpec{name: "fill-" + node, gpus: q.Value(), node: node})
	}
	for _, name := range []string{"fill-a100-1", "fill-a100-2", "fill-v100-1", "fill-l40s-1"} {
		waitRunning(t, c, ns, name, time.Minute)
	}
	for i := range 2 {
		create(t, client, ns, podSpec{name: fmt.Sprintf("big-%d", i), gpus: 8,
			annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "2"}})
	}
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(events(t, client, ns, "big-0"), api.EventReserved), nil
	})
	if err != nil {
		t.Fatalf("the gang did not reserve: %v\nevents of big-0: %s", err, events(t, client, ns, "big-0"))
	}
	one := func(name, runtime string) {
		create(t, client, ns, podSpec{name: name, gpus: 4,
			annotations: map[string]string{api.AnnotationGang: name, api.AnnotationGangMinMember: "1", api.AnnotationExpectedRuntime: runtime}})
	}
	one("short", "5m")
	one("long", "2h")
	short, _ := waitRunning(t, c, ns, "short", time.Minute)
	if n := short.Spec.NodeName; n != "a100-1" && n != "a100-2" {
		t.Errorf("the 5 m pod runs on %s, want a reserved a100 node", n)
	}
	if ev, ok := waitEvent(t, client, ns, "short", api.EventBackfilled); !ok {
		t.Errorf("no %s Event on the 5 m pod: %s", api.EventBackfilled, ev)
	}
	// The 2 h pod is still waiting a while later, and the gang still holds
	// its reservation.
	time.Sleep(5 * time.Second)
	long, err := client.CoreV1().Pods(ns).Get(t.Context(), "long", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if long.Spec.NodeName != "" || long.Status.Phase == v1.PodRunning {
		t.Errorf("the 2 h pod was placed on %s; it ends after the reservation starts", long.Spec.NodeName)
	}
	if ev := events(t, client, ns, "long"); strings.Contains(ev, api.EventBackfilled) {
		t.Errorf("the 2 h pod was backfilled: %s", ev)
	}
	// Plain pods (no gang, no queue: kube-scheduler places them) get the
	// same terms from the filter and the bind.
	create(t, client, ns, podSpec{name: "plain-short", gpus: 2, annotations: map[string]string{api.AnnotationExpectedRuntime: "5m"}})
	create(t, client, ns, podSpec{name: "plain-long", gpus: 2, annotations: map[string]string{api.AnnotationExpectedRuntime: "2h"}})
	plain, _ := waitRunning(t, c, ns, "plain-short", time.Minute)
	if n := plain.Spec.NodeName; n != "a100-1" && n != "a100-2" {
		t.Errorf("the plain 5 m pod runs on %s, want a reserved a100 node", n)
	}
	time.Sleep(3 * time.Second)
	if p, err := client.CoreV1().Pods(ns).Get(t.Context(), "plain-long", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" {
		t.Errorf("the plain 2 h pod was placed on %s; it ends after the reservation starts", p.Spec.NodeName)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// Preemptible backfill inside a reservation (--reservation-preemptible, on
// by default): a pod marked tessera.dev/preemptible starts on the room
// reserved for a 2 x 8 GPU gang and is evicted when the reservation fills
// (the other pods on its nodes have ended); the gang then runs there.
func TestReservationEvictsPreemptibleBackfill(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ns := namespace(t, c, "e2e-preemptible")
	waitReleased(t, c)
	create(t, client, ns, podSpec{name: "fill-a100-1", gpus: 1, node: "a100-1"})
	create(t, client, ns, podSpec{name: "fill-a100-2", gpus: 1, node: "a100-2"})
	for _, node := range []string{"v100-1", "l40s-1"} {
		n, err := client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := n.Status.Allocatable[api.ResourceGPU]
		create(t, client, ns, podSpec{name: "fill-" + node, gpus: q.Value(), node: node})
	}
	for _, name := range []string{"fill-a100-1", "fill-a100-2", "fill-v100-1", "fill-l40s-1"} {
		waitRunning(t, c, ns, name, time.Minute)
	}
	for i := range 2 {
		create(t, client, ns, podSpec{name: fmt.Sprintf("big-%d", i), gpus: 8,
			annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "2"}})
	}
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(events(t, client, ns, "big-0"), api.EventReserved), nil
	})
	if err != nil {
		t.Fatalf("the gang did not reserve: %v\nevents of big-0: %s", err, events(t, client, ns, "big-0"))
	}
	create(t, client, ns, podSpec{name: "pre", gpus: 4, annotations: map[string]string{api.AnnotationPreemptible: "true"}})
	create(t, client, ns, podSpec{name: "plain", gpus: 4})
	pre, _ := waitRunning(t, c, ns, "pre", time.Minute)
	if n := pre.Spec.NodeName; n != "a100-1" && n != "a100-2" {
		t.Errorf("the preemptible pod runs on %s, want a reserved a100 node", n)
	}
	time.Sleep(3 * time.Second)
	if p, err := client.CoreV1().Pods(ns).Get(t.Context(), "plain", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" {
		t.Errorf("a pod without hints was placed on reserved node %s", p.Spec.NodeName)
	}
	// The reservation fills: only the preemptible pod is left on its nodes.
	for _, name := range []string{"fill-a100-1", "fill-a100-2"} {
		if err := client.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	err = bigGangRunning(t, client, ns, 90*time.Second)
	if err != nil {
		t.Fatalf("the gang did not run once its nodes held only the preemptible pod: %v\nevents of big-0: %s\nevents of pre: %s", err, events(t, client, ns, "big-0"), events(t, client, ns, "pre"))
	}
	if _, err := client.CoreV1().Pods(ns).Get(t.Context(), "pre", metav1.GetOptions{}); err == nil {
		if ev, ok := waitEvent(t, client, ns, "pre", api.EventPreempted); !ok {
			t.Errorf("the preemptible pod is still there without a %s Event: %s", api.EventPreempted, ev)
		}
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// A reservation outlives an extender restart: a one-member gang of 8 GPUs
// waits behind a 1-GPU pod on each 8-GPU node, reserves a node after the
// reservation wait (Reserved Event "... at most until T"), and the
// extender is restarted. The restarted extender reserves the same room
// again until the same T (--reservation-max counted from the first
// reservation, read back from its ConfigMap through the RBAC deploy/
// grants), not for a fresh hour from the restart.
func TestReservationSurvivesExtenderRestart(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ns := namespace(t, c, "e2e-reserve-restart")
	waitReleased(t, c)
	for _, node := range []string{"a100-1", "a100-2", "v100-1"} {
		create(t, client, ns, podSpec{name: "fill-" + node, gpus: 1, node: node})
	}
	for _, node := range []string{"a100-1", "a100-2", "v100-1"} {
		waitRunning(t, c, ns, "fill-"+node, time.Minute)
	}
	create(t, client, ns, podSpec{name: "big-0", gpus: 8,
		annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "1"}})

	until := func(after time.Time) (string, bool) {
		l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=big-0"})
		if err != nil {
			return "", false
		}
		for _, e := range l.Items {
			if e.Reason != api.EventReserved || eventTime(e).Before(after) {
				continue
			}
			_, u, ok := strings.Cut(e.Message, "at most until ")
			if ok {
				u, _, _ = strings.Cut(u, ";")
				return u, true
			}
		}
		return "", false
	}
	var first string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var ok bool
		first, ok = until(time.Time{})
		return ok, nil
	})
	if err != nil {
		t.Fatalf("big-0 reserved nothing: %v\nevents of big-0: %s", err, events(t, client, ns, "big-0"))
	}
	// The planner writes its records at the end of the pass whose Event
	// was just seen.
	var recorded string
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, api.ReservationsConfigMapName, metav1.GetOptions{})
		if err != nil {
			recorded = err.Error()
			return false, nil
		}
		recorded = cm.Data[api.ReservationsDataKey]
		recs, err := api.ParseReservations(recorded)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(recs, func(r api.ReservationRecord) bool {
			return r.Workload == ns+"/big" && r.Since != nil && len(r.Nodes) == 1
		}), nil
	})
	if err != nil {
		t.Fatalf("no record of big's reservation in ConfigMap kube-system/%s: %v: %s", api.ReservationsConfigMapName, err, recorded)
	}

	// Event times have a resolution of one second.
	time.Sleep(1100 * time.Millisecond)
	restarted := time.Now().Truncate(time.Second)
	if err := c.RestartExtender(t.Context()); err != nil {
		t.Fatal(err)
	}
	var again string
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var ok bool
		again, ok = until(restarted)
		return ok, nil
	})
	if err != nil {
		t.Fatalf("no reservation for big-0 after the restart: %v\nevents of big-0: %s", err, events(t, client, ns, "big-0"))
	}
	if again != first {
		t.Errorf("after the restart the reservation lasts until %s, before it until %s: the restart gave it a fresh --reservation-max", again, first)
	}

	// The fill pods end: the gang runs on its reserved node.
	for _, node := range []string{"a100-1", "a100-2", "v100-1"} {
		if err := client.CoreV1().Pods(ns).Delete(t.Context(), "fill-"+node, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	waitRunning(t, c, ns, "big-0", time.Minute)
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// eventTime is when an Event was last seen.
func eventTime(e v1.Event) time.Time {
	out := e.LastTimestamp.Time
	for _, t := range []time.Time{e.FirstTimestamp.Time, e.EventTime.Time} {
		if t.After(out) {
			out = t
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(out) {
		out = e.Series.LastObservedTime.Time
	}
	return out
}

// A reservation drains nodes full of slices: a Deployment runs 32 slices
// on the two A100 nodes (two per GPU), one of them ends every half second
// (deleted; the Deployment replaces it), and a 2 x 8 GPU gang waits. Once
// both nodes are reserved for it, no replacement starts there, not even
// beside the other slice of its GPU, and the gang runs when the last
// slice is gone. Before, each replacement went back beside a slice still
// running and the nodes never emptied (make demo, 2026-11-28).
func TestReservationDrainsNodesOfSlices(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	waitReleased(t, c)
	ns := namespace(t, c, "e2e-reserve-slices")
	a100Deployment(t, client, ns, "slices", 32, "", podSpec{memUnits: 15, cores: 50})
	running := func(ctx context.Context) ([]string, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=slices"})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning {
				out = append(out, p.Name)
			}
		}
		return out, nil
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		names, err := running(ctx)
		return err == nil && len(names) == 32, nil
	}); err != nil {
		t.Fatalf("the Deployment's 32 slices do not all run on the A100s: %v", err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	defer func() { stop(); <-done }()
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			if names, err := running(ctx); err == nil && len(names) > 0 {
				_ = client.CoreV1().Pods(ns).Delete(ctx, names[i%len(names)], metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	for i := range 2 {
		p := podSpec{name: fmt.Sprintf("big-%d", i), gpus: 8,
			annotations: map[string]string{api.AnnotationGang: "big", api.AnnotationGangMinMember: "2"}}.pod(ns)
		onA100s(p)
		if _, err := client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err := bigGangRunning(t, client, ns, 90*time.Second)
	if err != nil {
		names, _ := running(t.Context())
		t.Fatalf("the 2 x 8 GPU gang did not run on the A100s as their slices ended: %v; %d slices still run there\nevents of big-0: %s", err, len(names), events(t, client, ns, "big-0"))
	}
	t.Logf("the gang ran %s after it was created (reservation wait 10 s, a slice ends every 0.5 s)", time.Since(start).Round(time.Millisecond))
	if ev, ok := waitEvent(t, client, ns, "big-0", api.EventReserved); !ok {
		t.Errorf("no %s Event on big-0: %s", api.EventReserved, ev)
	}
	stop()
	<-done
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// bigGangRunning waits up to timeout for the gang's members big-0 and
// big-1 to run; the error is the poll's.
func bigGangRunning(t *testing.T, client kubernetes.Interface, ns string, timeout time.Duration) error {
	t.Helper()
	return wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for i := range 2 {
			p, err := client.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("big-%d", i), metav1.GetOptions{})
			if err != nil || p.Status.Phase != v1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	})
}
