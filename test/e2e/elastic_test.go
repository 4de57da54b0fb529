package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
)

// An elastic gang (4 members of 2 GPUs, minMember 2) on a full node starts
// when room for 2 members appears, grows to 3 and 4 one member at a time
// as room appears, and when a higher tier needs room gives back its
// newest extra member first, staying above its minimum.
func TestElasticGangStartsGrowsShrinks(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	priorityClasses(t, client)
	ns := namespace(t, c, "e2e-elastic")
	waitReleased(t, c)
	const node = "a100-2"
	// The node is full: four 2-GPU notebooks.
	for i := range 4 {
		createTier(t, client, ns, tierNotebook, podSpec{name: fmt.Sprintf("fill-%d", i), gpus: 2, node: node})
	}
	for i := range 4 {
		waitRunning(t, c, ns, fmt.Sprintf("fill-%d", i), 90*time.Second)
	}
	members := []string{"el-0", "el-1", "el-2", "el-3"}
	for _, m := range members {
		createTier(t, client, ns, tierNotebook, podSpec{name: m, gpus: 2, node: node,
			annotations: map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "2"}})
	}
	running := func() int {
		n := 0
		for _, m := range members {
			p, err := client.CoreV1().Pods(ns).Get(t.Context(), m, metav1.GetOptions{})
			if err == nil && p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
				n++
			}
		}
		return n
	}
	waitCount := func(want int, what string) {
		t.Helper()
		var got int
		err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			got = running()
			return got == want, nil
		})
		if err != nil {
			t.Fatalf("%s: %d members Running, want %d", what, got, want)
		}
	}
	time.Sleep(3 * time.Second)
	if n := running(); n != 0 {
		t.Fatalf("%d members Running on a full node", n)
	}
	deleteNow(t, ns, "fill-0", client)
	deleteNow(t, ns, "fill-1", client)
	waitCount(2, "room for 2 members")
	deleteNow(t, ns, "fill-2", client)
	waitCount(3, "room for 1 more")
	deleteNow(t, ns, "fill-3", client)
	waitCount(4, "room for the last")
	// Which extra is the newest (the last to start)?
	var newest string
	var newestAt time.Time
	for _, m := range members {
		p := getPod(t, client, ns, m)
		if p.Status.StartTime != nil && p.Status.StartTime.After(newestAt) {
			newest, newestAt = m, p.Status.StartTime.Time
		}
	}
	createTier(t, client, ns, tierInference, podSpec{name: "inf", gpus: 2, node: node})
	waitRunning(t, c, ns, "inf", 60*time.Second)
	if n := running(); n != 3 {
		t.Errorf("%d members Running after the inference pod took its room, want 3 (one extra given back)", n)
	}
	if p, err := client.CoreV1().Pods(ns).Get(t.Context(), newest, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("the newest member %s still runs: the newest extra goes first", newest)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
