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
	"github.com/tessera-gpu/tessera/gpureq"
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
	// Which extra is the newest, by the rule the extender applies (start
	// times have seconds: ties go by creation, then name)?
	var all []*v1.Pod
	for _, m := range members {
		all = append(all, getPod(t, client, ns, m))
	}
	newest := (&api.Gang{MinMember: 2}).Extras(all, gpureq.StartedAt)[0].Name
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

// Under pressure an elastic gang spread over nodes gives back its extra
// member before any whole workload goes, wherever that workload runs:
// kube-scheduler's preemption (the extender's preempt verb) takes the
// gang's newest member on one node rather than a notebook on another,
// though the notebooks there started later (kube-scheduler alone prefers
// the latest-started victims).
func TestElasticGangGivesBackBeforeWholePodsElsewhere(t *testing.T) {
	// declared by annotations, or by a scheduler-plugins PodGroup whose
	// minMember its members do not repeat: the preempt verb knew only the
	// annotations' (make demo: kube-scheduler preempted three one-GPU
	// pods for a 4-GPU pod while a PodGroup gang ran a member beyond its
	// minimum).
	for _, decl := range []string{"annotations", "podgroup"} {
		t.Run(decl, func(t *testing.T) { elasticGivesBack(t, decl) })
	}
}

func elasticGivesBack(t *testing.T, decl string) {
	c := getCluster(t)
	client := c.Client()
	priorityClasses(t, client)
	ns := namespace(t, c, "e2e-elastic-spread-"+decl)
	waitReleased(t, c)
	const nodeA, nodeB, nodeV = "a100-1", "a100-2", "v100-1"
	fill := func(node string, names ...string) {
		for _, n := range names {
			createTier(t, client, ns, tierNotebook, podSpec{name: n, gpus: 2, node: node})
		}
		for _, n := range names {
			waitRunning(t, c, ns, n, 90*time.Second)
		}
	}
	fill(nodeA, "fill-a0", "fill-a1", "fill-a2", "fill-a3")
	fill(nodeB, "fill-b0", "fill-b1")
	member := func(name, node string) podSpec {
		if decl == "podgroup" {
			return podSpec{name: name, gpus: 2, node: node, labels: map[string]string{api.LabelPodGroup: "el"}}
		}
		return podSpec{name: name, gpus: 2, node: node, annotations: map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "2"}}
	}
	if decl == "podgroup" {
		podGroup(t, c, api.PodGroupGVR, ns, "el", map[string]any{"minMember": int64(2)})
	}
	createTier(t, client, ns, tierNotebook, member("el-0", nodeB))
	createTier(t, client, ns, tierNotebook, member("el-1", nodeB))
	createTier(t, client, ns, tierNotebook, member("el-2", nodeA))
	waitRunning(t, c, ns, "el-0", 60*time.Second)
	waitRunning(t, c, ns, "el-1", 60*time.Second)
	// StartTime has second granularity: el-2, the extra member, starts
	// strictly later than the two members of the minimum.
	time.Sleep(1100 * time.Millisecond)
	deleteNow(t, ns, "fill-a3", client)
	waitRunning(t, c, ns, "el-2", 60*time.Second)
	time.Sleep(1100 * time.Millisecond)
	fill(nodeV, "fill-v0", "fill-v1", "fill-v2", "fill-v3")

	// A 2-GPU inference pod that may run on nodeA or nodeV, both full.
	inf := podSpec{name: "inf", gpus: 2}.pod(ns)
	inf.Spec.PriorityClassName = tierInference
	inf.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
		NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
			Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{nodeA, nodeV},
		}}}},
	}}}
	if _, err := client.CoreV1().Pods(ns).Create(t.Context(), inf, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, _ := waitRunning(t, c, ns, "inf", 90*time.Second)
	if p.Spec.NodeName != nodeA {
		t.Errorf("the inference pod runs on %s, want %s (where the gang's extra member was)", p.Spec.NodeName, nodeA)
	}
	if g := gone(t, client, ns, []string{"el-2"}); len(g) != 1 {
		t.Errorf("the gang's extra member el-2 still runs")
	}
	if g := gone(t, client, ns, []string{"el-0", "el-1", "fill-a0", "fill-a1", "fill-a2", "fill-v0", "fill-v1", "fill-v2", "fill-v3", "fill-b0", "fill-b1"}); len(g) > 0 {
		t.Errorf("preempted %v: only the gang's extra member should go", g)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// TestElasticGangGivesBackBeforeWholePodsBesideIt: on the one node a
// higher-tier pod may use, the gang's extra member started before the
// notebooks beside it, so kube-scheduler's own victims there are a
// notebook (it spares the pods that started first); the preempt verb
// offers the extra member and takes it instead (make demo: a 4-GPU
// inference pod evicted four 1-GPU pods of the gang's priority beside a
// 4-GPU extra member).
func TestElasticGangGivesBackBeforeWholePodsBesideIt(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	priorityClasses(t, client)
	ns := namespace(t, c, "e2e-elastic-beside")
	waitReleased(t, c)
	const nodeA, nodeB = "a100-1", "a100-2"
	member := func(name, node string) podSpec {
		return podSpec{name: name, gpus: 2, node: node, annotations: map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "2"}}
	}
	for _, m := range []podSpec{member("el-0", nodeB), member("el-1", nodeB)} {
		createTier(t, client, ns, tierNotebook, m)
	}
	for _, n := range []string{"el-0", "el-1"} {
		waitRunning(t, c, ns, n, 60*time.Second)
	}
	// StartTime has second granularity, and the extra member is the one
	// that started last (api.Gang.Extras): el-2 joins the running gang a
	// second later, so that it, on nodeA, is the extra (created with the
	// others, it started in the same second as el-1 once, and el-1, on
	// nodeB, was the extra). The notebooks start strictly after it.
	time.Sleep(1100 * time.Millisecond)
	createTier(t, client, ns, tierNotebook, member("el-2", nodeA))
	waitRunning(t, c, ns, "el-2", 60*time.Second)
	time.Sleep(1100 * time.Millisecond)
	fills := []string{"fill-a0", "fill-a1", "fill-a2", "fill-b0", "fill-b1"}
	for _, n := range fills {
		node := nodeA
		if n[len("fill-")] == 'b' {
			node = nodeB
		}
		createTier(t, client, ns, tierNotebook, podSpec{name: n, gpus: 2, node: node})
	}
	for _, n := range fills {
		waitRunning(t, c, ns, n, 90*time.Second)
	}

	// A 2-GPU inference pod that may run on nodeA only, which is full.
	createTier(t, client, ns, tierInference, podSpec{name: "inf", gpus: 2, node: nodeA})
	waitRunning(t, c, ns, "inf", 90*time.Second)
	if g := gone(t, client, ns, []string{"el-2"}); len(g) != 1 {
		t.Errorf("the gang's extra member el-2 still runs")
	}
	if g := gone(t, client, ns, append([]string{"el-0", "el-1"}, fills...)); len(g) > 0 {
		t.Errorf("preempted %v: only the gang's extra member should go", g)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// Queue reclaim takes an elastic gang's extra member that straddles its
// queue's guarantee when the asking queue is further below its own
// (docs/queues.md, "An extra member straddling a guarantee"): under a
// department guaranteed 28, queue qa (guaranteed 14) runs a gang of 4 x 4
// GPUs with minMember 2 on the A100 nodes (16: it borrows 2), queue qb
// (guaranteed 14) ten 1-GPU pods on the other nodes, two GPUs stay idle;
// qb's 4-GPU pod (qb 4 short of its guarantee, qa then 2 short) must get
// the room of one of qa's extra members, whose Reclaimed Event says what
// it is, and nothing else may go.
func TestQueueReclaimsAnExtraMemberStraddlingItsGuarantee(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	nsA := namespace(t, c, "e2e-straddle-a")
	nsB := namespace(t, c, "e2e-straddle-b")
	waitReleased(t, c)
	createQueue(t, dyn, "e2e-straddle-dept", "", nil, 28, 0)
	createQueue(t, dyn, "e2e-straddle-qa", "e2e-straddle-dept", []string{nsA}, 14, 0)
	createQueue(t, dyn, "e2e-straddle-qb", "e2e-straddle-dept", []string{nsB}, 14, 0)
	waitQueuesSeen(t, c, nil, "e2e-straddle-dept", "e2e-straddle-qa", "e2e-straddle-qb")

	members := []string{"el-0", "el-1", "el-2", "el-3"}
	for i, m := range members {
		create(t, client, nsA, podSpec{name: m, gpus: 4, node: []string{"a100-1", "a100-2"}[i/2],
			annotations: map[string]string{api.AnnotationGang: "el", api.AnnotationGangMinMember: "2"}})
	}
	uid := map[string]string{}
	for _, m := range members {
		p, _ := waitRunning(t, c, nsA, m, 90*time.Second)
		uid[m] = string(p.UID)
	}
	var small []string
	for i := range 10 {
		name := fmt.Sprintf("b-%d", i)
		node := "v100-1"
		if i >= 8 {
			node = "l40s-1"
		}
		create(t, client, nsB, podSpec{name: name, gpus: 1, node: node})
		small = append(small, name)
	}
	for _, name := range small {
		p, _ := waitRunning(t, c, nsB, name, 90*time.Second)
		uid[name] = string(p.UID)
	}
	// The gang's extra members, by the rule the extender applies (the
	// two that started last).
	var running []*v1.Pod
	for _, m := range members {
		running = append(running, getPod(t, client, nsA, m))
	}
	extras := map[string]bool{}
	for _, p := range (&api.Gang{MinMember: 2}).Extras(running, gpureq.StartedAt) {
		extras[p.Name] = true
	}

	created := time.Now()
	create(t, client, nsB, podSpec{name: "four", gpus: 4})
	waitRunning(t, c, nsB, "four", 90*time.Second)
	t.Logf("four Running %s after creation; its events:%s", time.Since(created).Round(time.Millisecond), events(t, client, nsB, "four"))
	time.Sleep(3 * time.Second) // a further eviction would show by now

	leftA := stillRunning(t, client, nsA, uid)
	var gone []string
	for _, m := range members {
		if !leftA[m] {
			gone = append(gone, m)
		}
	}
	if len(gone) != 1 || !extras[gone[0]] {
		t.Fatalf("qa's members gone: %v, want one of its extra members %v", gone, extras)
	}
	msg := waitEventMessage(t, c, nsA, gone[0], api.EventReclaimed, api.ExtraMemberEvicted)
	t.Logf("%s: %s", gone[0], msg)
	leftB := stillRunning(t, client, nsB, uid)
	for _, name := range small {
		if !leftB[name] {
			t.Errorf("qb's %s was evicted", name)
		}
	}
	occ, all := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, all)
}
