package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// Topology-aware reclaim (issue 16): queue team-b, guaranteed 4, runs
// 1-GPU pods on all 8 GPUs of v100-1 (a DGX-1 with two 4-GPU NVLink
// cliques), the newest of them alternating between the cliques. Queue
// team-a, guaranteed 4, then asks for a 4-GPU pod that requires one NVLink
// clique on that node. Taken newest first without regard to the cliques,
// the four victims would sit two in each clique: the freed GPUs could not
// serve it, and they would use up team-b's 4 GPUs above its guarantee, so
// nothing more could be reclaimed. The reclaim must evict the four pods of
// ONE clique, the pod must run on exactly those GPUs, the other clique's
// pods must be untouched, and the extender must count the evictions
// useful, none useless (tessera_extender_reclaim_evictions_total).
func TestReclaimFreesOneNVLinkClique(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	const node = "v100-1"
	nsA := namespace(t, c, "e2e-topo-a")
	nsB := namespace(t, c, "e2e-topo-b")
	waitReleased(t, c)
	inv := inventory(t, c, node)
	var cliques [][]int
	for _, cl := range inv.NVLinkCliques {
		if len(cl) == 4 {
			cliques = append(cliques, cl)
		}
	}
	if len(inv.GPUs) != 8 || len(cliques) != 2 || slices.ContainsFunc(cliques[0], func(i int) bool { return slices.Contains(cliques[1], i) }) {
		t.Fatalf("%s: want 8 GPUs in two disjoint 4-GPU NVLink cliques, got %d GPUs, cliques %v", node, len(inv.GPUs), inv.NVLinkCliques)
	}
	cliqueOf := func(idx int) int {
		if slices.Contains(cliques[0], idx) {
			return 0
		}
		if slices.Contains(cliques[1], idx) {
			return 1
		}
		return -1
	}
	base, hc := extenderEndpoint(t, c)
	usefulBefore, uselessBefore := reclaimResults(t, base, hc)

	createQueue(t, dyn, "e2e-topo-team-a", "", []string{nsA}, 4, 0)
	createQueue(t, dyn, "e2e-topo-team-b", "", []string{nsB}, 4, 0)
	waitQueuesSeen(t, c, nil, "e2e-topo-team-a", "e2e-topo-team-b")

	// team-b fills the node one pod at a time, a second apart (reclaim
	// takes the newest first; start times have seconds).
	gpuOf := map[string]int{} // team-b's pod -> GPU index
	uidOf := map[string]string{}
	start := func(name string) {
		create(t, client, nsB, podSpec{name: name, gpus: 1, node: node})
		waitRunning(t, c, nsB, name, 90*time.Second)
		p, gpus := waitWholeGPUs(t, c, nsB, name, "main", 1)
		gpuOf[name], uidOf[name] = gpus[0].Index, string(p.UID)
		time.Sleep(1100 * time.Millisecond)
	}
	for i := range 8 {
		start(fmt.Sprintf("b-%d", i))
	}
	// The clique of the newest pod is "late"; two pods of the other
	// clique are replaced, so that newest first reads: two of the
	// other clique, then the late one, then the rest.
	late := cliqueOf(gpuOf["b-7"])
	var replaced []string
	for i := range 8 {
		name := fmt.Sprintf("b-%d", i)
		if cliqueOf(gpuOf[name]) != late && len(replaced) < 2 {
			replaced = append(replaced, name)
		}
	}
	for _, name := range replaced {
		if err := client.CoreV1().Pods(nsB).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		delete(gpuOf, name)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods(nsB).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 6, nil
	})
	if err != nil {
		t.Fatalf("replaced pods %v not gone: %v", replaced, err)
	}
	waitReleased(t, c)
	start("b-8")
	start("b-9")
	for _, name := range []string{"b-8", "b-9"} {
		if cliqueOf(gpuOf[name]) == late {
			t.Fatalf("%s took GPU %d, in the clique of b-7; the set-up wants it in the other (GPUs %v)", name, gpuOf[name], gpuOf)
		}
	}
	t.Logf("team-b's pods by GPU: %v; cliques %v; newest first: b-9, b-8 (clique %d), b-7 (clique %d)", gpuOf, cliques, 1-late, late)

	created := time.Now()
	create(t, client, nsA, podSpec{name: "train4", gpus: 4, node: node, annotations: map[string]string{api.AnnotationNVLink: "required"}})
	waitRunning(t, c, nsA, "train4", 2*time.Minute)
	_, got := waitWholeGPUs(t, c, nsA, "train4", "main", 4)
	t.Logf("train4 Running %s after creation", time.Since(created).Round(time.Millisecond))
	t.Logf("train4's events:%s", events(t, client, nsA, "train4"))
	var askerGPUs []int
	for _, g := range got {
		askerGPUs = append(askerGPUs, g.Index)
	}
	slices.Sort(askerGPUs)
	time.Sleep(3 * time.Second) // a further eviction would show by now
	left := stillRunning(t, client, nsB, uidOf)
	var evicted []int // their GPUs
	evictedFrom := map[int]bool{}
	for name, g := range gpuOf {
		if !left[name] {
			evicted = append(evicted, g)
			evictedFrom[cliqueOf(g)] = true
		}
	}
	slices.Sort(evicted)
	t.Logf("evicted team-b's pods on GPUs %v; train4 runs on GPUs %v", evicted, askerGPUs)
	if len(evicted) != 4 || len(evictedFrom) != 1 {
		t.Errorf("evicted team-b's pods on GPUs %v (cliques %v), want the four pods of one clique", evicted, cliques)
	}
	if !slices.Equal(askerGPUs, evicted) {
		t.Errorf("train4 runs on GPUs %v, want the freed ones %v", askerGPUs, evicted)
	}
	if cliqueOf(askerGPUs[0]) < 0 || slices.ContainsFunc(askerGPUs, func(i int) bool { return cliqueOf(i) != cliqueOf(askerGPUs[0]) }) {
		t.Errorf("train4 runs on GPUs %v, not within one clique of %v", askerGPUs, cliques)
	}
	for name, g := range gpuOf {
		if !evictedFrom[cliqueOf(g)] && !left[name] {
			t.Errorf("%s on GPU %d, in the other clique, was evicted", name, g)
		}
	}

	// The evictions are counted useful once train4 holds their GPUs (the
	// extender checks every second), none useless.
	checkReclaimUseful(t, c, base, hc, usefulBefore, uselessBefore, len(evicted))
}

// reclaimResults reads tessera_extender_reclaim_evictions_total from the
// extender's /metrics: useful and useless.
func reclaimResults(t *testing.T, base string, hc *http.Client) (useful, useless float64) {
	t.Helper()
	v := counterByResult(t, base, hc, "tessera_extender_reclaim_evictions_total", "useful", "useless")
	if len(v) != 2 {
		t.Fatalf("/metrics has %d of the two series of tessera_extender_reclaim_evictions_total", len(v))
	}
	return v["useful"], v["useless"]
}

// counterByResult reads the series {result="R"} of the extender's counter
// name from its /metrics, for each R of results that it exports.
func counterByResult(t *testing.T, base string, hc *http.Client, name string, results ...string) map[string]float64 {
	t.Helper()
	code, body, err := getBody(t.Context(), hc, base+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("the extender's /metrics: %d %v", code, err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, result := range results {
			if rest, ok := strings.CutPrefix(line, name+`{result="`+result+`"} `); ok {
				f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
				if err != nil {
					t.Fatalf("/metrics: %q: %v", line, err)
				}
				out[result] = f
			}
		}
	}
	return out
}

// gpuCliqueLabel is the node label of a multi-node NVLink domain, as
// NVIDIA's GPU feature discovery writes it.
const gpuCliqueLabel = "nvidia.com/gpu.clique"

// Topology-aware reclaim for a clique gang (issue 16): the four nodes are
// labelled as two multi-node NVLink cliques, X = {a100-1, v100-1} and Y =
// {a100-2, l40s-1}. Queue team-b, guaranteed 24, runs a 1-GPU pod on every
// one of the cluster's 28 GPUs, its four newest alternating between the
// cliques (a100-1, a100-2, v100-1, l40s-1). Queue team-a, guaranteed 4,
// then creates a gang of 4 x 1 GPU with `nvidia.com/gpu.clique:required`.
// Newest first, the four victims would sit two in each clique: GPUs the
// gang cannot use, and team-b's whole surplus. The reclaim must evict four
// pods of ONE clique, the gang must run there, and the extender must count
// the evictions useful, none useless.
func TestReclaimFreesOneCliqueForAGang(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	nsA := namespace(t, c, "e2e-cq-a")
	nsB := namespace(t, c, "e2e-cq-b")
	waitReleased(t, c)
	cliqueOf := map[string]string{"a100-1": "e2e-cq-x", "v100-1": "e2e-cq-x", "a100-2": "e2e-cq-y", "l40s-1": "e2e-cq-y"}
	for node, cq := range cliqueOf {
		labelNode(t, client, node, gpuCliqueLabel, cq)
	}
	base, hc := extenderEndpoint(t, c)
	usefulBefore, uselessBefore := reclaimResults(t, base, hc)
	createQueue(t, dyn, "e2e-cq-team-a", "", []string{nsA}, 4, 0)
	createQueue(t, dyn, "e2e-cq-team-b", "", []string{nsB}, 24, 0)
	waitQueuesSeen(t, c, nil, "e2e-cq-team-a", "e2e-cq-team-b")

	// 24 older pods leave one GPU free on each node; the four newest take
	// them a second apart (reclaim takes the newest first).
	nodeOf := map[string]string{}
	uidOf := map[string]string{}
	var old []string
	for node, n := range map[string]int{"a100-1": 7, "a100-2": 7, "v100-1": 7, "l40s-1": 3} {
		for i := range n {
			name := fmt.Sprintf("old-%s-%d", node, i)
			create(t, client, nsB, podSpec{name: name, gpus: 1, node: node})
			nodeOf[name] = node
			old = append(old, name)
		}
	}
	for _, name := range old {
		p, _ := waitRunning(t, c, nsB, name, 2*time.Minute)
		uidOf[name] = string(p.UID)
	}
	for _, node := range []string{"a100-1", "a100-2", "v100-1", "l40s-1"} {
		time.Sleep(1100 * time.Millisecond)
		name := "new-" + node
		create(t, client, nsB, podSpec{name: name, gpus: 1, node: node})
		p, _ := waitRunning(t, c, nsB, name, time.Minute)
		nodeOf[name], uidOf[name] = node, string(p.UID)
	}

	created := time.Now()
	members := []string{"cg-0", "cg-1", "cg-2", "cg-3"}
	for _, name := range members {
		create(t, client, nsA, podSpec{name: name, gpus: 1, annotations: map[string]string{api.AnnotationGang: "cg",
			api.AnnotationGangMinMember: "4", api.AnnotationGangTopology: gpuCliqueLabel + ":required"}})
	}
	ran := map[string]bool{} // the cliques the gang runs in
	for _, name := range members {
		p, _ := waitRunning(t, c, nsA, name, 2*time.Minute)
		ran[cliqueOf[p.Spec.NodeName]] = true
		t.Logf("%s Running on %s %s after the gang's creation", name, p.Spec.NodeName, time.Since(created).Round(time.Millisecond))
	}
	t.Logf("cg-0's events:%s", events(t, client, nsA, "cg-0"))
	if len(ran) != 1 {
		t.Errorf("the gang runs in cliques %v, want one", ran)
	}
	time.Sleep(3 * time.Second) // a further eviction would show by now
	left := stillRunning(t, client, nsB, uidOf)
	var evicted []string
	from := map[string]bool{}
	for name, node := range nodeOf {
		if !left[name] {
			evicted = append(evicted, name+"@"+node)
			from[cliqueOf[node]] = true
		}
	}
	slices.Sort(evicted)
	t.Logf("evicted team-b's %v", evicted)
	if len(evicted) != 4 || len(from) != 1 {
		t.Errorf("evicted team-b's %v (cliques %v), want four pods of one clique", evicted, from)
	}
	for cq := range from {
		if !ran[cq] {
			t.Errorf("evicted in clique %s, but the gang runs in %v", cq, ran)
		}
	}

	checkReclaimUseful(t, c, base, hc, usefulBefore, uselessBefore, len(evicted))
}

// stillRunning names the pods of ns that run, not leaving, with the UID
// uidOf gives them (not a replacement of the same name).
func stillRunning(t *testing.T, client kubernetes.Interface, ns string, uidOf map[string]string) map[string]bool {
	t.Helper()
	l, err := client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning && string(p.UID) == uidOf[p.Name] {
			left[p.Name] = true
		}
	}
	return left
}

// checkReclaimUseful waits until tessera_extender_reclaim_evictions_total
// counts n more useful evictions than usefulBefore, checks that it counts
// no more useless ones than uselessBefore, and checks the cluster's
// invariants.
func checkReclaimUseful(t *testing.T, c *nodesim.Cluster, base string, hc *http.Client, usefulBefore, uselessBefore float64, n int) {
	t.Helper()
	var useful, useless float64
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		useful, useless = reclaimResults(t, base, hc)
		return useful-usefulBefore >= float64(n), nil
	})
	t.Logf("tessera_extender_reclaim_evictions_total: useful +%v, useless +%v", useful-usefulBefore, useless-uselessBefore)
	if err != nil {
		t.Errorf("useful reclaim evictions went up by %v, want %d: %v", useful-usefulBefore, n, err)
	}
	if useless != uselessBefore {
		t.Errorf("useless reclaim evictions went from %v to %v, want none", uselessBefore, useless)
	}
	occ, all := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, all)
}

// labelNode sets label key on node to value until the test ends.
func labelNode(t *testing.T, client kubernetes.Interface, node, key, value string) {
	t.Helper()
	patch := func(ctx context.Context, v any) error {
		b, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
		if err != nil {
			return err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	if err := patch(t.Context(), value); err != nil {
		t.Fatalf("label node %s: %v", node, err)
	}
	t.Cleanup(func() {
		if err := patch(context.Background(), nil); err != nil {
			t.Errorf("unlabel node %s: %v", node, err)
		}
	})
}
