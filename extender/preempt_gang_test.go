package extender

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// nodesFree is a toy gang fit: members members of need whole GPUs each,
// one per node (on nodes whose names pass allowed, when set), or all on
// one node when oneNode.
func nodesFree(members, need int, oneNode bool) func(planner.Snapshot) bool {
	return func(s planner.Snapshot) bool {
		n := 0
		for _, st := range s {
			switch {
			case oneNode && st.FreeGPUs() >= members*need:
				return true
			case !oneNode && st.FreeGPUs() >= need:
				n++
			}
		}
		return !oneNode && n >= members
	}
}

// notebooks fills node with n 1-GPU notebooks named <node>-nb-<i>,
// started minutesAgo(i) minutes ago.
func notebooks(node string, n int, minutesAgo func(i int) int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		out = append(out, running(testbuild.Pod(fmt.Sprintf("%s-nb-%d", node, i)).Whole(1).Priority(notebook).Node(node).Holding(i), minutesAgo(i)))
	}
	return out
}

// gangMembers are the gated members of gang name: n pods of gpus GPUs.
func gangMembers(name string, n int, gpus int64, prio int32) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		p := gangPod(asking(testbuild.Pod(fmt.Sprintf("%s-%d", name, i)).Whole(gpus).Priority(prio)), name, n)
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
		out = append(out, p)
	}
	return out
}

func TestPreemptorForGang(t *testing.T) {
	never := corev1.PreemptNever
	eight := func(name string) *corev1.Node { return testbuild.Node(name).GPUs(8, "A100", 40960).Obj() }
	// n1's notebooks are the oldest, n3's the newest; their starts
	// interleave, so the cheapest first spread over all three nodes.
	full := func() []*corev1.Pod {
		var out []*corev1.Pod
		for k, n := range []string{"n1", "n2", "n3"} {
			out = append(out, notebooks(n, 8, func(i int) int { return 60 - 3*i - k })...)
		}
		return out
	}
	onNodes := func(nodes ...string) []string {
		var out []string
		for _, n := range nodes {
			for i := range 8 {
				out = append(out, fmt.Sprintf("%s-nb-%d", n, i))
			}
		}
		sort.Strings(out)
		return out
	}
	tests := []struct {
		name     string
		nodes    []*corev1.Node
		pods     []*corev1.Pod
		members  []*corev1.Pod
		fits     func(planner.Snapshot) bool
		pdb      []string
		want     []string // evicted, sorted
		wantGone []string // the pods gone, sorted (evicted or leaving)
		wantMsg  string   // a part of the message
	}{
		{
			name:  "a 2 x 8 GPU gang on full nodes evicts the notebooks of two nodes, nothing else",
			nodes: []*corev1.Node{eight("n1"), eight("n2"), eight("n3"), eight("n4")},
			pods: append(full(),
				// A lower tier too, but above the notebooks, and the
				// newest: it stays.
				running(testbuild.Pod("train").Whole(8).Priority(training).Node("n4").Holding(0, 1, 2, 3, 4, 5, 6, 7), 1)),
			members: gangMembers("inf", 2, 8, inference),
			fits:    nodesFree(2, 8, false),
			// The message names the first eight victims.
			want: onNodes("n2", "n3"), wantGone: onNodes("n2", "n3"), wantMsg: "(priority 1000) and 8 more",
		},
		{
			name:    "a gang that needs one node evicts only within one",
			nodes:   []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods:    full(),
			members: gangMembers("inf", 2, 4, inference),
			fits:    nodesFree(2, 4, true),
			want:    onNodes("n3"), wantGone: onNodes("n3"),
		},
		{
			name:  "the nodes the members may not use are no source of victims",
			nodes: []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods:  full(),
			members: func() []*corev1.Pod {
				ms := gangMembers("inf", 2, 8, inference)
				for _, m := range ms {
					m.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1", "n2"}}}}}}}}
				}
				return ms
			}(),
			fits: nodesFree(2, 8, false),
			want: onNodes("n1", "n2"), wantGone: onNodes("n1", "n2"),
		},
		{
			name:  "the extra members of a lower-tier elastic gang go before any whole workload",
			nodes: []*corev1.Node{eight("n1"), eight("n2")},
			pods: []*corev1.Pod{
				gangPod(running(testbuild.Pod("el-0").Whole(2).Priority(notebook).Node("n1").Holding(0, 1), 40), "el", 2),
				gangPod(running(testbuild.Pod("el-1").Whole(2).Priority(notebook).Node("n1").Holding(2, 3), 40), "el", 2),
				gangPod(running(testbuild.Pod("el-2").Whole(2).Priority(notebook).Node("n1").Holding(4, 5), 30), "el", 2),
				gangPod(running(testbuild.Pod("el-3").Whole(2).Priority(notebook).Node("n1").Holding(6, 7), 20), "el", 2),
				// Newer, one pod: still whole, it stays.
				running(testbuild.Pod("solo").Whole(8).Priority(notebook).Node("n2").Holding(0, 1, 2, 3, 4, 5, 6, 7), 5),
			},
			members: gangMembers("inf", 2, 2, inference),
			fits:    nodesFree(2, 2, true),
			want:    []string{"el-2", "el-3"}, wantGone: []string{"el-2", "el-3"},
		},
		{
			name:    "a budget that refuses passes the workload over",
			nodes:   []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods:    full(),
			pdb:     []string{"n3-nb-5"},
			members: gangMembers("inf", 2, 8, inference),
			fits:    nodesFree(2, 8, false),
			want:    onNodes("n1", "n2"), wantGone: onNodes("n1", "n2"),
		},
		{
			name:  "a member with preemptionPolicy Never: nothing is evicted",
			nodes: []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods:  full(),
			members: func() []*corev1.Pod {
				ms := gangMembers("inf", 2, 8, inference)
				ms[1].Spec.PreemptionPolicy = &never
				return ms
			}(),
			fits: nodesFree(2, 8, false),
		},
		{
			name:  "the lowest member priority decides: nothing of it or above is taken",
			nodes: []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods:  full(),
			members: func() []*corev1.Pod {
				ms := gangMembers("inf", 2, 8, inference)
				p := int32(notebook)
				ms[0].Spec.Priority = &p
				return ms
			}(),
			fits:    nodesFree(2, 8, false),
			wantMsg: "no lower-tier workload",
		},
		{
			name:  "room being freed by pods leaving: nothing more is evicted",
			nodes: []*corev1.Node{eight("n1"), eight("n2"), eight("n3")},
			pods: func() []*corev1.Pod {
				pods := full()
				for _, p := range pods {
					if strings.HasPrefix(p.Name, "n1-") || strings.HasPrefix(p.Name, "n2-") {
						p.DeletionTimestamp = &metav1.Time{Time: preemptNow}
					}
				}
				return pods
			}(),
			members:  gangMembers("inf", 2, 8, inference),
			fits:     nodesFree(2, 8, false),
			wantGone: onNodes("n1", "n2"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range tc.nodes {
				if n.Labels == nil {
					n.Labels = map[string]string{}
				}
				n.Labels["kubernetes.io/hostname"] = n.Name
			}
			pods := append(append([]*corev1.Pod(nil), tc.pods...), tc.members...)
			cache := newTestCache(t, tc.nodes, pods)
			client := &testbuild.PreemptClient{PDB: map[string]bool{}}
			for _, n := range tc.pdb {
				client.PDB[n] = true
			}
			events := &testbuild.Recorder{}
			p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
				Policy: testPolicy(t, PolicyBinpack), Events: events, Now: func() time.Time { return preemptNow }}
			msg, gone, err := forGang(p, context.Background(), tc.members, tc.fits)
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(client.Evicted)
			if diff := cmp.Diff(tc.want, client.Evicted); diff != "" {
				t.Errorf("evicted (-want +got):\n%s\nmessage: %s", diff, msg)
			}
			byUID := map[types.UID]string{}
			for _, p := range pods {
				byUID[p.UID] = p.Name
			}
			var goneNames []string
			for uid := range gone {
				goneNames = append(goneNames, byUID[uid])
			}
			sort.Strings(goneNames)
			if diff := cmp.Diff(tc.wantGone, goneNames); diff != "" {
				t.Errorf("gone (-want +got):\n%s", diff)
			}
			if !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("message %q, want it to hold %q", msg, tc.wantMsg)
			}
			if len(tc.want) == 0 {
				return
			}
			counts := map[string]int{}
			for _, e := range events.Events {
				counts[strings.SplitN(e, ":", 2)[0]]++
			}
			if counts[api.EventPreempting] != len(tc.members) || counts[api.EventPreempted] != len(tc.want) {
				t.Errorf("%d %s and %d %s Events, want one per member (%d) and per victim (%d):\n%s", counts[api.EventPreempting], api.EventPreempting,
					counts[api.EventPreempted], api.EventPreempted, len(tc.members), len(tc.want), strings.Join(events.Events, "\n"))
			}
		})
	}
}

// Evictions in flight count as gone until the informer shows them: a
// second call that sees only some of the victims leaving (the informer
// lags) evicts nothing more and returns every victim as gone.
func TestPreemptorForGangRemembersItsEvictions(t *testing.T) {
	var nodes []*corev1.Node
	var pods []*corev1.Pod
	for k, n := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, testbuild.Node(n).GPUs(8, "A100", 40960).Obj())
		pods = append(pods, notebooks(n, 8, func(i int) int { return 60 - 3*i - k })...)
	}
	members := gangMembers("inf", 2, 8, inference)
	pods = append(pods, members...)
	cache := newTestCache(t, nodes, pods)
	client := &testbuild.PreemptClient{}
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return preemptNow }}
	_, first, err := forGang(p, context.Background(), members, nodesFree(2, 8, false))
	if err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 16 {
		t.Fatalf("evicted %v, want the 16 notebooks of two nodes", client.Evicted)
	}
	for i, pod := range pods {
		if pod.Name == client.Evicted[0] || pod.Name == client.Evicted[1] {
			leaving := pod.DeepCopy()
			leaving.DeletionTimestamp = &metav1.Time{Time: preemptNow}
			pods[i] = leaving
			cache.SetPod(leaving)
		}
	}
	msg, again, err := forGang(p, context.Background(), members, nodesFree(2, 8, false))
	if err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 16 {
		t.Errorf("the second call evicted %v more (%s)", client.Evicted[16:], msg)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("gone (-first +second):\n%s", diff)
	}
}

// A gang for which nothing could be preempted is not asked about again
// for FruitlessFor: each ask lists every pod and plans the whole gang.
func TestPreemptorForGangPassesOverFruitlessGangs(t *testing.T) {
	var nodes []*corev1.Node
	var pods []*corev1.Pod
	for k, n := range []string{"n1", "n2"} {
		nodes = append(nodes, testbuild.Node(n).GPUs(8, "A100", 40960).Obj())
		pods = append(pods, notebooks(n, 8, func(i int) int { return 60 - 3*i - k })...)
	}
	members := gangMembers("inf", 2, 8, inference)
	pods = append(pods, members...)
	cache := newTestCache(t, nodes, pods)
	client := &testbuild.PreemptClient{}
	now := preemptNow
	listed := 0
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { listed++; return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return now }, FruitlessFor: 10 * time.Second}
	roomEnough := false
	fits := func(s planner.Snapshot) bool { return roomEnough && nodesFree(2, 8, false)(s) }
	ctx := context.Background()

	msg, gone, err := forGang(p, ctx, members, fits)
	if err != nil || len(gone) != 0 || msg != noVictims || listed != 1 {
		t.Fatalf("first ask: %q, gone %v, err %v, %d listings; want %q after one listing", msg, gone, err, listed, noVictims)
	}
	roomEnough = true
	now = now.Add(9 * time.Second)
	if msg, _, _ := forGang(p, ctx, members, fits); msg != noVictims || listed != 1 || len(client.Evicted) != 0 {
		t.Errorf("within 10s: %q after %d listings, evicted %v; want it passed over", msg, listed, client.Evicted)
	}
	now = now.Add(2 * time.Second)
	if _, _, err := forGang(p, ctx, members, fits); err != nil {
		t.Fatal(err)
	}
	if listed != 2 || len(client.Evicted) != 16 {
		t.Errorf("after 11s: %d listings, evicted %v; want the 16 notebooks", listed, client.Evicted)
	}
}

// forGang calls ForGang and, as the planner does once the gang's plan
// holds the room, the eviction it returns.
func forGang(p *Preemptor, ctx context.Context, members []*corev1.Pod, fits func(planner.Snapshot) bool) (string, map[types.UID]bool, error) {
	msg, gone, evict, err := p.ForGang(ctx, members, fits)
	if err != nil || evict == nil {
		return msg, gone, err
	}
	return msg, gone, evict(ctx)
}

// ForGang evicts nothing itself: the victims go when the planner calls
// the eviction it returns, after the gang's plan holds the room.
func TestPreemptorForGangEvictsOnlyWhenAsked(t *testing.T) {
	var nodes []*corev1.Node
	var pods []*corev1.Pod
	for k, n := range []string{"n1", "n2"} {
		nodes = append(nodes, testbuild.Node(n).GPUs(8, "A100", 40960).Obj())
		pods = append(pods, notebooks(n, 8, func(i int) int { return 60 - 3*i - k })...)
	}
	members := gangMembers("inf", 2, 4, inference)
	pods = append(pods, members...)
	cache := newTestCache(t, nodes, pods)
	client := &testbuild.PreemptClient{}
	events := &testbuild.Recorder{}
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Events: events, Now: func() time.Time { return preemptNow }}
	msg, gone, evict, err := p.ForGang(context.Background(), members, nodesFree(2, 4, true))
	if err != nil {
		t.Fatal(err)
	}
	if evict == nil || len(gone) != 8 {
		t.Fatalf("ForGang: %q, %d pods gone, eviction %v; want the 8 notebooks of one node", msg, len(gone), evict != nil)
	}
	if len(client.Evicted) != 0 || len(events.Events) != 0 {
		t.Fatalf("ForGang evicted %v (Events %v) before it was asked to", client.Evicted, events.Events)
	}
	if err := evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 8 {
		t.Errorf("evicted %v, want 8", client.Evicted)
	}
}
