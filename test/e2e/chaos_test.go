package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// chaosShape draws a pod: mostly shared slices and small whole-GPU pods,
// some 4- and 8-GPU pods.
func chaosShape(r *rand.Rand, name string) podSpec {
	switch x := r.IntN(100); {
	case x < 50:
		return podSpec{name: name, memUnits: int64(2 + r.IntN(15)), cores: int64(10 + 5*r.IntN(9))}
	case x < 85:
		return podSpec{name: name, gpus: int64(1 + r.IntN(2))}
	case x < 95:
		return podSpec{name: name, gpus: 4}
	default:
		return podSpec{name: name, gpus: 8}
	}
}

// Chaos: 200 pod creations and deletions while the node agents of two
// nodes restart (SIGTERM, as their DaemonSet restarts them), the extender
// is killed (twice) and one node's kubelet device manager restarts. Afterwards no GPU is over-committed, every Running pod's
// containers hold exactly their assignment, and no pod is stuck: each is
// Running, or waiting unscheduled, or gone when deleted.
func TestChaos(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-chaos")
	client := c.Client()
	ctx := t.Context()
	r := rand.New(rand.NewPCG(7, 11))
	const creations = 200
	const maxLive = 30
	var live []string
	deleted := 0
	start := time.Now()
	chaos := map[int]func() error{
		40:  func() error { return c.RestartAgent(ctx, "a100-1") },
		80:  func() error { return c.RestartExtender(ctx) },
		120: func() error { return c.RestartDeviceManager(ctx, "a100-2") },
		150: func() error { return c.RestartAgent(ctx, "v100-1") },
		170: func() error { return c.RestartExtender(ctx) },
	}
	for i := range creations {
		if f := chaos[i]; f != nil {
			t.Logf("%s: chaos at creation %d", time.Since(start).Round(time.Millisecond), i)
			if err := f(); err != nil {
				t.Fatalf("chaos at creation %d: %v", i, err)
			}
		}
		for len(live) >= maxLive || (len(live) > 5 && r.IntN(3) == 0) {
			k := r.IntN(len(live))
			if err := client.CoreV1().Pods(ns).Delete(ctx, live[k], metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				t.Fatalf("delete %s: %v", live[k], err)
			}
			live = append(live[:k], live[k+1:]...)
			deleted++
		}
		name := fmt.Sprintf("p%03d", i)
		create(t, client, ns, chaosShape(r, name))
		live = append(live, name)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s: %d pods created, %d deleted, %d live", time.Since(start).Round(time.Millisecond), creations, deleted, len(live))

	// Settle: nothing bound is left starting, nothing deleted lingers.
	var stuck []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		stuck = stuck[:0]
		for _, p := range pods.Items {
			switch {
			case p.DeletionTimestamp != nil:
				stuck = append(stuck, p.Name+" (terminating)")
			case p.Spec.NodeName != "" && p.Status.Phase != v1.PodRunning && p.Status.Phase != v1.PodFailed:
				stuck = append(stuck, p.Name+" (bound to "+p.Spec.NodeName+", "+string(p.Status.Phase)+")")
			case p.Spec.NodeName == "" && !unschedulable(&p) && !gated(p):
				stuck = append(stuck, p.Name+" (not scheduled, no reason)")
			}
		}
		return len(stuck) == 0, nil
	})
	if err != nil {
		t.Errorf("pods stuck after the chaos: %v", stuck)
	}
	t.Logf("%s: settled", time.Since(start).Round(time.Millisecond))
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	running := checkRunningPods(t, c, pods)
	// Zero tolerance: any pod failed on its node fails the test. Those
	// the kubelet refused for devices its node's plugins did not offer
	// (freed GPUs still withheld, plugins restarting) included: the
	// extender binds only what the node's inventory offers, and the agent
	// withholds everything until the kubelet has its device lists
	// (docs/isolation.md, "No pod lost to a race").
	var failed []string
	pending := 0
	for _, p := range pods {
		if p.Namespace != ns {
			continue
		}
		switch {
		case p.Status.Phase == v1.PodFailed:
			failed = append(failed, fmt.Sprintf("%s on %s: %s: %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message))
		case p.Spec.NodeName == "":
			pending++
		}
	}
	sort.Strings(failed)
	t.Logf("after the chaos: %d Running, %d waiting unscheduled, %d Failed", running, pending, len(failed))
	if len(failed) > 0 {
		t.Errorf("%d pods failed on their node:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	if running == 0 {
		t.Errorf("no pod runs after the chaos")
	}
	if t.Failed() {
		t.Logf("occupancy:\n%s", occupancyTable(occ))
	}
}

func gated(p v1.Pod) bool { return len(p.Spec.SchedulingGates) > 0 }
