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

// Chaos: 200 pod creations and deletions while the node agent of one node
// is killed, the extender is killed (twice) and one node's kubelet device
// manager restarts. Afterwards no GPU is over-committed, every Running pod's
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
	// When each node's device plugins restarted (agent or device manager).
	restarted := map[string][]time.Time{}
	chaos := map[int]func() error{
		40: func() error {
			restarted["a100-1"] = append(restarted["a100-1"], time.Now())
			return c.RestartAgent(ctx, "a100-1")
		},
		80: func() error { return c.RestartExtender(ctx) },
		120: func() error {
			restarted["a100-2"] = append(restarted["a100-2"], time.Now())
			return c.RestartDeviceManager(ctx, "a100-2")
		},
		150: func() error {
			restarted["v100-1"] = append(restarted["v100-1"], time.Now())
			return c.RestartAgent(ctx, "v100-1")
		},
		170: func() error { return c.RestartExtender(ctx) },
	}
	// duringRestart: the pod was bound to its node within a few seconds of a
	// restart of that node's device plugins.
	duringRestart := func(p v1.Pod) bool {
		var bound time.Time
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionTrue {
				bound = cond.LastTransitionTime.Time
			}
		}
		for _, at := range restarted[p.Spec.NodeName] {
			// Conditions have second granularity.
			if !bound.Before(at.Add(-2*time.Second)) && bound.Before(at.Add(10*time.Second)) {
				return true
			}
		}
		return false
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
	var failed, restartWindow, releaseLag []string
	pending := 0
	for _, p := range pods {
		if p.Namespace != ns {
			continue
		}
		admission := p.Status.Phase == v1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError"
		switch {
		case admission && strings.Contains(p.Status.Message, "no healthy devices present") && duringRestart(p):
			// The kubelet's own behaviour while a device plugin restarts:
			// its devices are unhealthy until it registers again, and a pod
			// bound meanwhile is rejected (the scheduler saw the node's
			// last status). Its controller would create it again.
			restartWindow = append(restartWindow, fmt.Sprintf("%s on %s", p.Name, p.Spec.NodeName))
		case admission && (strings.Contains(p.Status.Message, "requested number of devices unavailable") ||
			strings.Contains(p.Status.Message, "no healthy devices present")):
			// The node agent still withholds units of a GPU the extender
			// already sees free (docs/demo.md, "a freed GPU stays withheld"):
			// a known race, refused by the kubelet before anything runs.
			releaseLag = append(releaseLag, fmt.Sprintf("%s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Message))
		case p.Status.Phase == v1.PodFailed:
			failed = append(failed, fmt.Sprintf("%s on %s: %s: %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message))
		case p.Spec.NodeName == "":
			pending++
		}
	}
	sort.Strings(failed)
	t.Logf("after the chaos: %d Running, %d waiting unscheduled, %d rejected by a kubelet while a device plugin restarted %v, %d rejected by a kubelet for devices its agent still withheld, %d Failed otherwise",
		running, pending, len(restartWindow), restartWindow, len(releaseLag), len(failed))
	for _, l := range releaseLag {
		t.Logf("known race (withheld devices): %s", l)
	}
	// Any other refusal by a node (above all the NRI plugin refusing a
	// container: the assignment and the node disagree) fails the test, and
	// so does the known race when it is more than occasional.
	if len(failed) > 0 {
		t.Errorf("%d pods failed on their node:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	if len(releaseLag) > creations/20 {
		t.Errorf("%d of %d pods were refused by the kubelet for devices their node agent still withheld (more than 5%%)", len(releaseLag), creations)
	}
	if running == 0 {
		t.Errorf("no pod runs after the chaos")
	}
	if t.Failed() {
		t.Logf("occupancy:\n%s", occupancyTable(occ))
	}
}

func gated(p v1.Pod) bool { return len(p.Spec.SchedulingGates) > 0 }
