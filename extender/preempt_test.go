package extender

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

var preemptNow = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// running is a bound pod started minutes ago.
func running(b *testbuild.PodBuilder, minutesAgo int) *corev1.Pod {
	p := b.Obj()
	start := metav1.NewTime(preemptNow.Add(-time.Duration(minutesAgo) * time.Minute))
	p.CreationTimestamp, p.Status.StartTime, p.Status.Phase = start, &start, corev1.PodRunning
	return p
}

// asking is a pending pod kube-scheduler found unschedulable.
func asking(b *testbuild.PodBuilder) *corev1.Pod {
	p := b.Obj()
	p.CreationTimestamp = metav1.NewTime(preemptNow.Add(-time.Minute))
	p.Status.Phase = corev1.PodPending
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	return p
}

func gangPod(p *corev1.Pod, gang string, min int) *corev1.Pod {
	p.Annotations[api.AnnotationGang] = gang
	p.Annotations[api.AnnotationGangMinMember] = strings.Repeat("", 0) + string(rune('0'+min))
	return p
}

const (
	inference = 100000
	training  = 10000
	notebook  = 1000
)

func TestPreemptorAcrossShapes(t *testing.T) {
	never := corev1.PreemptNever
	twoGPUs := func(name string) *corev1.Node { return testbuild.Node(name).GPUs(2, "A100", 40960).Obj() }
	tests := []struct {
		name       string
		nodes      []*corev1.Node
		pods       []*corev1.Pod
		pdb        []string
		minRuntime time.Duration
		want       []string // evicted, sorted
		wantPlan   string   // the asker's planned node ("" = no plan)
		wantGPU    int      // the planned GPU of a slice (-1: none)
		wantTold   string   // in an Event, when set
	}{
		{
			name:  "an inference slice evicts one whole-GPU notebook, the newest",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-old").Whole(1).Priority(notebook).Node("n1").Holding(0), 30),
				running(testbuild.Pod("nb-new").Whole(1).Priority(notebook).Node("n1").Holding(1), 10),
				asking(testbuild.Pod("inf").Shared(10, 20).Priority(inference)),
			},
			want: []string{"nb-new"}, wantPlan: "n1", wantGPU: 1,
		},
		{
			name:  "a two-GPU inference slice evicts both whole-GPU notebooks; planned without a GPU",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-old").Whole(1).Priority(notebook).Node("n1").Holding(0), 30),
				running(testbuild.Pod("nb-new").Whole(1).Priority(notebook).Node("n1").Holding(1), 10),
				func() *corev1.Pod {
					p := asking(testbuild.Pod("inf").Shared(10, 20).Priority(inference))
					p.Annotations[api.AnnotationGPUCount] = "2"
					return p
				}(),
			},
			want: []string{"nb-new", "nb-old"}, wantPlan: "n1", wantGPU: -1,
		},
		{
			name:  "an inference whole GPU evicts the notebook slices of one GPU, the fewest",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("s-a").Shared(10, 20).Priority(notebook).Node("n1").On(0, 10240, 20), 10),
				running(testbuild.Pod("s-b").Shared(10, 20).Priority(notebook).Node("n1").On(0, 10240, 20), 10),
				running(testbuild.Pod("s-c").Shared(10, 20).Priority(notebook).Node("n1").On(1, 10240, 20), 10),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			want: []string{"s-c"}, wantPlan: "n1", wantGPU: -1,
		},
		{
			name:  "a 20 GiB slice against fragmented slices: only what makes one GPU fit",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				// GPU 0: 35 GiB used (5 free); GPU 1: 30 GiB used (10 free).
				running(testbuild.Pod("f-a").Shared(20, 10).Priority(notebook).Node("n1").On(0, 20480, 10), 10),
				running(testbuild.Pod("f-b").Shared(15, 10).Priority(notebook).Node("n1").On(0, 15360, 10), 5),
				running(testbuild.Pod("f-c").Shared(30, 10).Priority(notebook).Node("n1").On(1, 30720, 10), 20),
				asking(testbuild.Pod("inf").Shared(20, 10).Priority(inference)),
			},
			// newest first: f-b frees 15 GiB on GPU 0 (5+15 = 20): enough.
			want: []string{"f-b"}, wantPlan: "n1", wantGPU: 0,
		},
		{
			name:  "training (preemptionPolicy Never) waits",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-0").Whole(2).Priority(notebook).Node("n1").Holding(0, 1), 10),
				func() *corev1.Pod {
					p := asking(testbuild.Pod("train").Whole(1).Priority(training))
					p.Spec.PreemptionPolicy = &never
					return p
				}(),
			},
			wantGPU: -1,
		},
		{
			name:  "nothing of equal or higher priority is taken",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("inf-0").Whole(2).Priority(inference).Node("n1").Holding(0, 1), 10),
				asking(testbuild.Pod("inf-1").Whole(1).Priority(inference)),
			},
			wantGPU: -1,
		},
		{
			name:  "a pod that fits already preempts nothing",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-0").Whole(1).Priority(notebook).Node("n1").Holding(0), 10),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			wantGPU: -1,
		},
		{
			name:       "minimum runtime protects young pods",
			nodes:      []*corev1.Node{twoGPUs("n1")},
			minRuntime: 15 * time.Minute,
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-old").Whole(1).Priority(notebook).Node("n1").Holding(0), 30),
				running(testbuild.Pod("nb-new").Whole(1).Priority(notebook).Node("n1").Holding(1), 10),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			want: []string{"nb-old"}, wantPlan: "n1", wantGPU: -1,
		},
		{
			name:  "a budget that refuses passes the workload over",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pdb:   []string{"nb-new"},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-old").Whole(1).Priority(notebook).Node("n1").Holding(0), 30),
				running(testbuild.Pod("nb-new").Whole(1).Priority(notebook).Node("n1").Holding(1), 10),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			want: []string{"nb-old"}, wantPlan: "n1", wantGPU: -1,
		},
		{
			name:  "a gang goes whole, so a single pod on another node is the cheaper victim",
			nodes: []*corev1.Node{twoGPUs("n1"), twoGPUs("n2")},
			pods: []*corev1.Pod{
				gangPod(running(testbuild.Pod("g-0").Whole(1).Priority(notebook).Node("n1").Holding(0), 10), "g", 2),
				gangPod(running(testbuild.Pod("g-1").Whole(1).Priority(notebook).Node("n1").Holding(1), 10), "g", 2),
				running(testbuild.Pod("solo").Whole(2).Priority(notebook).Node("n2").Holding(0, 1), 10),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			want: []string{"solo"}, wantPlan: "n2", wantGPU: -1,
		},
		{
			name:  "a gang member's eviction takes the whole gang",
			nodes: []*corev1.Node{twoGPUs("n1"), twoGPUs("n2")},
			pods: []*corev1.Pod{
				gangPod(running(testbuild.Pod("g-0").Whole(2).Priority(notebook).Node("n1").Holding(0, 1), 10), "g", 2),
				gangPod(running(testbuild.Pod("g-1").Whole(2).Priority(notebook).Node("n2").Holding(0, 1), 10), "g", 2),
				asking(testbuild.Pod("inf").Whole(2).Priority(inference)),
			},
			want: []string{"g-0", "g-1"}, wantPlan: "n1", wantGPU: -1,
		},
		{
			name:  "an elastic gang gives back its newest extra member before any whole workload",
			nodes: []*corev1.Node{testbuild.Node("n2").GPUs(4, "A100", 40960).Obj(), testbuild.Node("n1").GPUs(1, "A100", 40960).Obj()},
			pods: []*corev1.Pod{
				gangPod(running(testbuild.Pod("el-0").Whole(1).Priority(notebook).Node("n2").Holding(0), 40), "el", 2),
				gangPod(running(testbuild.Pod("el-1").Whole(1).Priority(notebook).Node("n2").Holding(1), 40), "el", 2),
				gangPod(running(testbuild.Pod("el-2").Whole(1).Priority(notebook).Node("n2").Holding(2), 20), "el", 2),
				gangPod(running(testbuild.Pod("el-3").Whole(1).Priority(notebook).Node("n2").Holding(3), 30), "el", 2),
				// newer than every extra, on the node first by name, but
				// whole: it stays.
				running(testbuild.Pod("solo").Whole(1).Priority(notebook).Node("n1").Holding(0), 5),
				asking(testbuild.Pod("inf").Whole(1).Priority(inference)),
			},
			want: []string{"el-2"}, wantPlan: "n2", wantGPU: -1,
			wantTold: "Preempted: tessera: evicted for default/inf", // and below, why an extra member goes
		},
		{
			name:  "pods without GPUs are no victims: CPU is kube-scheduler's to preempt for",
			nodes: []*corev1.Node{twoGPUs("n1")},
			pods: []*corev1.Pod{
				running(testbuild.Pod("cpu-low").CPU("100").Priority(notebook).Node("n1"), 10),
				asking(testbuild.Pod("inf").Whole(1).CPU("100").Priority(inference)),
			},
			wantGPU: -1,
		},
		{
			name:  "a nodeSelector keeps the victims on the nodes the pod may use",
			nodes: []*corev1.Node{twoGPUs("n1"), testbuild.Node("n2").GPUs(2, "A100", 40960).Obj()},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-1").Whole(2).Priority(notebook).Node("n1").Holding(0, 1), 10),
				running(testbuild.Pod("nb-2").Whole(2).Priority(notebook).Node("n2").Holding(0, 1), 30),
				func() *corev1.Pod {
					p := asking(testbuild.Pod("inf").Whole(1).Priority(inference))
					p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "n2"}
					return p
				}(),
			},
			want: []string{"nb-2"}, wantPlan: "n2", wantGPU: -1,
		},
		{
			name: "a node the pod may not go to (a taint it does not tolerate, a cordon) is no reason to wait, and frees nothing",
			nodes: []*corev1.Node{
				twoGPUs("n1"),
				func() *corev1.Node {
					n := twoGPUs("n2")
					n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "train", Effect: corev1.TaintEffectNoSchedule}}
					return n
				}(),
				func() *corev1.Node { n := twoGPUs("n3"); n.Spec.Unschedulable = true; return n }(),
			},
			pods: []*corev1.Pod{
				running(testbuild.Pod("nb-1").Whole(2).Priority(notebook).Node("n1").Holding(0, 1), 10),
				running(testbuild.Pod("nb-2").Whole(1).Priority(notebook).Node("n2").Holding(0), 30),
				asking(testbuild.Pod("inf").Whole(2).Priority(inference)),
			},
			want: []string{"nb-1"}, wantPlan: "n1", wantGPU: -1,
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
			cache := newTestCache(t, tc.nodes, tc.pods)
			client := &testbuild.PreemptClient{PDB: map[string]bool{}}
			for _, n := range tc.pdb {
				client.PDB[n] = true
			}
			rec := &testbuild.Recorder{}
			p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return tc.pods, nil },
				Policy: testPolicy(t, PolicyBinpack), Events: rec, MinRuntime: tc.minRuntime, Now: func() time.Time { return preemptNow }}
			if err := p.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tc.wantTold != "" {
				told := strings.Join(rec.Events, "\n")
				if !strings.Contains(told, tc.wantTold) || !strings.Contains(told, api.ExtraMemberEvicted) {
					t.Errorf("events do not tell %q and why an extra member goes:\n%s", tc.wantTold, told)
				}
			}
			sort.Strings(client.Evicted)
			if diff := cmp.Diff(tc.want, client.Evicted); diff != "" {
				t.Errorf("evicted (-want +got):\n%s", diff)
			}
			var asker *corev1.Pod
			for _, pod := range tc.pods {
				if pod.Spec.NodeName == "" {
					asker = pod
				}
			}
			v, planned := client.Plans[asker.Name]
			if tc.wantPlan == "" {
				if planned {
					t.Errorf("plan %s, want none", v)
				}
				return
			}
			plan, err := api.ParseGangPlan(v)
			if err != nil {
				t.Fatalf("plan %q: %v", v, err)
			}
			if plan.Node != tc.wantPlan {
				t.Errorf("planned on %s, want %s", plan.Node, tc.wantPlan)
			}
			switch {
			case tc.wantGPU < 0 && plan.GPU != nil:
				t.Errorf("planned GPU %d, want none (whole GPUs)", plan.GPU.Index)
			case tc.wantGPU >= 0 && (plan.GPU == nil || plan.GPU.Index != tc.wantGPU):
				t.Errorf("planned GPU %+v, want %d", plan.GPU, tc.wantGPU)
			}
			if !plan.Expires.Equal(preemptNow.Add(2 * time.Minute)) {
				t.Errorf("hold expires %s, want 2m after now", plan.Expires)
			}
		})
	}
}

// holdScene is one A100 GPU held whole by a notebook pod and an inference
// slice asking for room, with a Preemptor that lists pods (set them to
// change what its next pass sees).
type holdScene struct {
	nb, inf *corev1.Pod
	pods    []*corev1.Pod
	cache   *Cache
	client  *testbuild.PreemptClient
	p       *Preemptor
}

func newHoldScene(t *testing.T) *holdScene {
	node := testbuild.Node("n1").GPUs(1, "A100", 40960).Obj()
	sc := &holdScene{
		nb:     running(testbuild.Pod("nb").Whole(1).Priority(notebook).Node("n1").Holding(0), 10),
		inf:    asking(testbuild.Pod("inf").Shared(10, 20).Priority(inference)),
		client: &testbuild.PreemptClient{},
	}
	sc.pods = []*corev1.Pod{sc.nb, sc.inf}
	sc.cache = newTestCache(t, []*corev1.Node{node}, sc.pods)
	sc.p = &Preemptor{Cache: sc.cache, Client: sc.client, Pods: func() ([]*corev1.Pod, error) { return sc.pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return preemptNow }}
	return sc
}

// The ledger counts the hold: once the plan is seen, nothing more is
// evicted, and another pod does not fit the held room.
func TestPreemptorHoldsTheRoom(t *testing.T) {
	sc := newHoldScene(t)
	nb, inf, cache, client, p := sc.nb, sc.inf, sc.cache, sc.client, sc.p
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"nb"}, client.Evicted); diff != "" {
		t.Fatalf("evicted (-want +got):\n%s", diff)
	}
	// The informer shows the plan and the victim leaving.
	inf = inf.DeepCopy()
	inf.Annotations[api.AnnotationGangPlan] = client.Plans["inf"]
	nb = nb.DeepCopy()
	nb.DeletionTimestamp = &metav1.Time{Time: preemptNow}
	cache.SetPod(inf)
	cache.SetPod(nb)
	other := asking(testbuild.Pod("other").Shared(40, 100).Priority(inference))
	sc.pods = []*corev1.Pod{nb, inf, other}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 1 {
		t.Errorf("evicted %v: the second pass must not evict again", client.Evicted)
	}
	// Once the victim is gone, the held GPU does not fit a second 40 GiB slice.
	cache.DeletePod(nb.UID)
	st := mustState(t, cache, "n1")
	d, err := ParseDemand(other)
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(st, &d); r == Fits {
		t.Errorf("a 40 GiB slice fits the GPU held for inf")
	}

	// The hold expires: released, counted useless.
	p.Now = func() time.Time { return preemptNow.Add(3 * time.Minute) }
	sc.pods = []*corev1.Pod{inf}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, ok := client.Plans["inf"]; !ok || v != "" {
		t.Errorf("plan after expiry %q (set %v), want removed", v, ok)
	}
}

// With --preemption=false the preemptor only releases expired holds (the
// plans quota reclaim writes): it evicts nothing for a pod that would
// preempt, and a hold past its time is released.
func TestPreemptorHoldsOnly(t *testing.T) {
	sc := newHoldScene(t)
	nb, inf, cache, client, p := sc.nb, sc.inf, sc.cache, sc.client, sc.p
	p.HoldsOnly = true
	// TestPreemptorHoldsTheRoom's first pass evicts nb for inf.
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 0 || len(client.Plans) != 0 {
		t.Errorf("evicted %v, plans %v: want nothing (no preemption)", client.Evicted, client.Plans)
	}
	// A hold quota reclaim wrote, past its time.
	held := inf.DeepCopy()
	if err := api.SetGangPlan(held.Annotations, api.GangPlan{Gang: held.Name, Node: "n1", Expires: preemptNow.Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	cache.SetPod(held)
	sc.pods = []*corev1.Pod{nb, held}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, ok := client.Plans[held.Name]; !ok || v != "" {
		t.Errorf("plan of %s after expiry %q (set %v), want removed", held.Name, v, ok)
	}
	if len(client.Evicted) != 0 {
		t.Errorf("evicted %v, want nothing", client.Evicted)
	}
}

// A pod kube-scheduler's preemption nominated a node for is its for a
// while: the preemptor evicts nothing for it, though the informer does not
// show the victims there leaving yet; once the nomination is cleared, or
// has been kept past the grace (a stale one), it does.
func TestPreemptorLeavesNominatedPodsToKubeScheduler(t *testing.T) {
	node := testbuild.Node("n1").GPUs(1, "A100", 40960).Obj()
	nb := running(testbuild.Pod("nb").Whole(1).Priority(notebook).Node("n1").Holding(0), 10)
	inf := asking(testbuild.Pod("inf").Whole(1).Priority(inference))
	inf.Status.NominatedNodeName = "n2"
	pods := []*corev1.Pod{nb, inf}
	cache := newTestCache(t, []*corev1.Node{node}, pods)
	client := &testbuild.PreemptClient{}
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return preemptNow }}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 0 {
		t.Fatalf("evicted %v for a pod kube-scheduler nominated a node for", client.Evicted)
	}
	now := preemptNow.Add(DefaultNominationGrace - time.Second)
	p.Now = func() time.Time { return now }
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 0 {
		t.Fatalf("evicted %v within the nomination's grace", client.Evicted)
	}
	for _, tc := range []struct {
		name string
		set  func()
	}{
		{"the nomination cleared", func() { inf.Status.NominatedNodeName = "" }},
		{"a stale nomination", func() { now = preemptNow.Add(DefaultNominationGrace) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inf.Status.NominatedNodeName = "n2"
			now = preemptNow
			client := &testbuild.PreemptClient{}
			p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
				Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return now }}
			if err := p.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			tc.set()
			if err := p.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"nb"}, client.Evicted); diff != "" {
				t.Fatalf("evicted (-want +got):\n%s", diff)
			}
		})
	}
}

// A higher tier never takes a queue below its guarantee: the notebook of
// a queue at its guarantee is spared, the one of a queue above it goes.
func TestPreemptorKeepsQueueGuarantees(t *testing.T) {
	node := testbuild.Node("n1").GPUs(2, "A100", 40960).Obj()
	node.Status.Capacity = corev1.ResourceList{api.ResourceGPU: resource.MustParse("2")}
	atGuarantee := running(testbuild.Pod("nb-guaranteed").Whole(1).Priority(notebook).Node("n1").Holding(0), 10)
	atGuarantee.Namespace, atGuarantee.UID = "ns-a", "uid-nb-guaranteed"
	borrowed := running(testbuild.Pod("nb-borrowed").Whole(1).Priority(notebook).Node("n1").Holding(1), 30)
	borrowed.Namespace, borrowed.UID = "ns-b", "uid-nb-borrowed"
	inf := asking(testbuild.Pod("inf").Whole(1).Priority(inference))
	pods := []*corev1.Pod{atGuarantee, borrowed, inf}
	cache := newTestCache(t, []*corev1.Node{node}, pods)
	client := &testbuild.PreemptClient{}
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"ns-a"}, 1, 0, preemptNow), testbuild.QueueObj(t, "team-b", "", []string{"ns-b"}, 0, 0, preemptNow)},
		Pods:   func() ([]*corev1.Pod, error) { return pods, nil }, Nodes: func() ([]*corev1.Node, error) { return []*corev1.Node{node}, nil },
	}
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Queues: book, Now: func() time.Time { return preemptNow }}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Without queues the newer nb-guaranteed would go (newest first).
	if diff := cmp.Diff([]string{"nb-borrowed"}, client.Evicted); diff != "" {
		t.Errorf("evicted (-want +got):\n%s", diff)
	}
}

// A whole-GPU asker's plan names the GPUs its victims leave, so that no
// slice takes one while a victim's slice is still there: on make demo,
// each replacement of four evicted slices (two per GPU) was bound to the
// GPU its victim had left, beside the slice not yet gone, and the asker
// never got its two GPUs.
// preemptPairedSlices runs the preemptor for inf, an inference pod asking
// for two GPUs' worth, on node n1 of four A100s, each running two notebook
// slices of 15 GiB and 50 % (s0a, s0b on GPU 0, ...), and checks that it
// evicted the four slices of two GPUs.
func preemptPairedSlices(t *testing.T, inf *corev1.Pod) (*Cache, *testbuild.PreemptClient, *testbuild.Recorder, []*corev1.Pod) {
	t.Helper()
	node := testbuild.Node("n1").GPUs(4, "A100", 40960).Obj()
	var victims []*corev1.Pod
	for i, name := range []string{"s0a", "s0b", "s1a", "s1b", "s2a", "s2b", "s3a", "s3b"} {
		victims = append(victims, running(testbuild.Pod(name).Shared(15, 50).Priority(notebook).Node("n1").On(i/2, 15360, 50), 10+i))
	}
	pods := append(append([]*corev1.Pod(nil), victims...), inf)
	cache := newTestCache(t, []*corev1.Node{node}, pods)
	client := &testbuild.PreemptClient{}
	events := &testbuild.Recorder{}
	p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
		Policy: testPolicy(t, PolicyBinpack), Now: func() time.Time { return preemptNow }, Events: events}
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(client.Evicted) != 4 {
		t.Fatalf("evicted %v, want the four slices of two GPUs", client.Evicted)
	}
	return cache, client, events, victims
}

func TestPreemptorHoldsWholeGPUsFromSlices(t *testing.T) {
	inf := asking(testbuild.Pod("inf").Whole(2).Priority(inference))
	cache, client, events, victims := preemptPairedSlices(t, inf)
	plan, err := api.ParseGangPlan(client.Plans["inf"])
	if err != nil {
		t.Fatal(err)
	}
	if plan.GPUsText() == "" || !strings.Contains(strings.Join(events.Events, "\n"), "to make room on "+plan.GPUsText()+" of node n1") {
		t.Errorf("plan %+v names no GPUs, or the Preempting Event not them:\n%s", plan, strings.Join(events.Events, "\n"))
	}
	// The informer shows the plan, then the victims leave one by one;
	// after each, a replacement slice fits none of the freed GPUs.
	inf = inf.DeepCopy()
	inf.Annotations[api.AnnotationGangPlan] = client.Plans["inf"]
	cache.SetPod(inf)
	repl := asking(testbuild.Pod("repl").Shared(15, 50).Priority(notebook))
	d, err := ParseDemand(repl)
	if err != nil {
		t.Fatal(err)
	}
	use := func() map[int]string {
		out := map[int]string{}
		for _, g := range OccupancyView(&Snapshot{Nodes: map[string]*NodeState{"n1": mustState(t, cache, "n1")}}).Nodes[0].GPUs {
			out[g.Index] = g.Use() + " " + strings.Join(g.Whole, ",")
		}
		return out
	}
	for _, v := range victims {
		if !slices.Contains(client.Evicted, v.Name) {
			continue
		}
		cache.DeletePod(v.UID)
		if r := Check(mustState(t, cache, "n1"), &d); r == Fits {
			t.Fatalf("after %s left, a replacement slice fits a GPU held for inf", v.Name)
		}
		for i, u := range use() {
			if strings.HasPrefix(u, "whole+shared") {
				t.Errorf("after %s left, the status shows GPU %d over-committed: %s", v.Name, i, u)
			}
		}
	}
	// Once the victims are gone, the status shows the hold.
	for _, g := range plan.GPUs {
		if got := use()[g.Index]; got != "whole default/inf (planned)" {
			t.Errorf("GPU %d: %q, want it whole for inf (planned)", g.Index, got)
		}
	}
	// The asker itself fits, as its bind sees the node (its hold left out).
	st := mustState(t, cache, "n1").without(map[types.UID]bool{inf.UID: true})
	own, err := ParseDemand(inf)
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(st, &own); r != Fits {
		t.Errorf("inf does not fit the room held for it: %v", r)
	}
}

// TestBindOfAHeldMultiGPUSliceWaitsForItsVictims: a slice over two GPUs
// that preemption made room for is held by count (its plan names no GPU);
// kube-scheduler binds it as soon as its hold passes the filter, while
// the four slices evicted for it still leave the node. The bind waits for
// them, as a whole-GPU pod's waits for its node to offer the GPUs, rather
// than fail with "no 2 GPUs have ..." and a FailedBinding Event (seen on
// make demo) for kube-scheduler to try again.
//
// Under tessera-scheduler the pod is reserved first, in the scheduling
// cycle: its Reserve succeeds (the plan holds the room) and the bind waits
// the same way, instead of an Unschedulable cycle (a FailedScheduling
// Event) and a retry.
func TestBindOfAHeldMultiGPUSliceWaitsForItsVictims(t *testing.T) {
	for _, reserveFirst := range []bool{false, true} {
		name := "bind verb"
		if reserveFirst {
			name = "tessera-scheduler: Reserve, then Bind"
		}
		t.Run(name, func(t *testing.T) { testHeldMultiGPUSliceWaits(t, reserveFirst) })
	}
}

func testHeldMultiGPUSliceWaits(t *testing.T, reserveFirst bool) {
	inf := asking(testbuild.Pod("inf").Shared(40, 120).Priority(inference))
	inf.Annotations[api.AnnotationGPUCount] = "2"
	cache, client, events, victims := preemptPairedSlices(t, inf)
	inf = inf.DeepCopy()
	inf.Annotations[api.AnnotationGangPlan] = client.Plans["inf"]
	cache.SetPod(inf)
	var leaving []*corev1.Pod
	for _, v := range victims {
		if slices.Contains(client.Evicted, v.Name) {
			v = v.DeepCopy()
			v.DeletionTimestamp = &metav1.Time{Time: preemptNow}
			cache.SetPod(v)
			leaving = append(leaving, v)
		}
	}
	fp := newFakePods(inf)
	srv := NewServer(cache, testPolicy(t, PolicyBinpack), fp, events, nil)
	if reserveFirst {
		if err := srv.Reserve(inf, "n1"); err != nil {
			t.Fatalf("Reserve while the victims leave: %v", err)
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- srv.Bind(context.Background(), &extenderv1.ExtenderBindingArgs{PodNamespace: inf.Namespace, PodName: inf.Name, PodUID: inf.UID, Node: "n1"})
	}()
	select {
	case err := <-done:
		t.Fatalf("the bind ended while the victims still leave: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	for _, v := range leaving {
		cache.DeletePod(v.UID)
	}
	if err := <-done; err != nil {
		t.Fatalf("bind once the victims left: %v", err)
	}
	bound, err := fp.GetPod(context.Background(), inf.Namespace, inf.Name)
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := api.GetAssignment(bound.Annotations)
	if err != nil || len(a.Containers) != 1 || a.Containers[0].Shared == nil {
		t.Fatalf("assignment %+v, %v: want one container's slice", a, err)
	}
	var got []int
	for _, g := range a.Containers[0].Shared.GPUs() {
		got = append(got, g.Index)
	}
	if want := []int{0, 1}; !slices.Equal(got, want) {
		t.Errorf("the slice went to GPUs %v, want %v (the victims')", got, want)
	}
	for _, e := range events.Events {
		if strings.HasPrefix(e, "FailedBinding") {
			t.Errorf("event %s", e)
		}
	}
}
