package planner_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// A 2 x 8 GPU gang waits on four 8-GPU nodes with 13 GPUs free, scattered:
// n0 runs two movable pods (preemptible, of a ReplicaSet), n1 one, n2
// three, n3 four that may not move. With consolidation the fewest moves
// free two whole nodes (n0 and n1: three pods; their replacements fit on
// n2 and n3), the pods are evicted with a Consolidated Event each, and the
// gang is planned there at once.
func TestConsolidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		// off: no consolidator; perMinute: its budget; fresh: it has just
		// started; orphan: n1's pod has no controller; pinned: n1's pod
		// may run only on n1 (required node affinity); cpuBound: n1's pod
		// asks for 100 CPUs, n2's and n3's pods for 20 each, so that only
		// n0 has enough free for it; memberAffinity:
		// the members require the four nodes by name; pdb: the pods whose
		// eviction a PodDisruptionBudget refuses; due: reservations on,
		// with a wait the gang has not reached
		off            bool
		perMinute      int
		fresh          bool
		orphan         bool
		pinned         bool
		memberAffinity bool
		cpuBound       bool
		pdb            []string
		notDue         bool
		evicted        []string
		blocked        float64
		planned        []string // the gang's nodes
		reason         string   // in the members' waiting reason
	}{
		{name: "on", perMinute: 4, evicted: []string{"n0-a", "n0-b", "n1-a"}, planned: []string{"n0", "n1"}},
		{name: "off", off: true},
		{name: "more moves than the budget", perMinute: 2, reason: "consolidation: more moves than the budget: it needs 3 moves, 2 are left this minute"},
		{name: "the first minute after a start", perMinute: 4, fresh: true},
		{name: "a pod without a controller does not move", perMinute: 6, orphan: true, evicted: []string{"n0-a", "n0-b", "n2-a", "n2-b", "n2-c"}, planned: []string{"n0", "n2"}},
		{name: "a pod that may run only on its own node does not move", perMinute: 6, pinned: true, evicted: []string{"n0-a", "n0-b", "n2-a", "n2-b", "n2-c"}, planned: []string{"n0", "n2"}},
		// (on, n1's pod would go to n2 or n3: it goes to n0, so n2 is
		// freed in place of n0)
		{name: "a pod moves only where its CPU is free", perMinute: 6, cpuBound: true, evicted: []string{"n1-a", "n2-a", "n2-b", "n2-c"}, planned: []string{"n1", "n2"}},
		{name: "members with a required node affinity", perMinute: 4, memberAffinity: true, evicted: []string{"n0-a", "n0-b", "n1-a"}, planned: []string{"n0", "n1"}},
		{name: "a PodDisruptionBudget keeps a pod", perMinute: 6, pdb: []string{"n1-a"}, blocked: 1, evicted: []string{"n0-a", "n0-b", "n2-a", "n2-b", "n2-c"}, planned: []string{"n0", "n2"}},
		{name: "not due a reservation yet", perMinute: 4, notDue: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
			clk := clocktesting.NewFakePassiveClock(f.now.Add(-2 * time.Minute))
			var c *planner.Consolidator
			if !tc.off {
				var err error
				if c, err = planner.NewConsolidator(&extender.KubeEvicter{Client: f.client}, f.events, clk, tc.perMinute); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.fresh {
				clk.SetTime(f.now)
			}
			// Dry runs: refused for the pods of tc.pdb, else allowed and
			// not counted as evictions.
			f.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
				if slices.Contains(tc.pdb, ev.Name) {
					return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
				}
				if ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0 {
					return true, nil, nil
				}
				return false, nil, nil
			})
			cfg := planner.ReservationConfig{}
			if tc.notDue {
				cfg.ReserveAfter = 10 * time.Minute
			}
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
				Events: f.events, Now: func() time.Time { return f.now }, Reservation: cfg, Consolidation: c})
			movable := map[string]bool{"n0": true, "n1": !tc.orphan, "n2": true, "n3": false}
			for n, count := range map[string]int{"n0": 2, "n1": 1, "n2": 3, "n3": 4} {
				for k := range count {
					f.placed(fmt.Sprintf("%s-%c", n, 'a'+k), n, k, movable[n])
				}
			}
			if tc.pinned {
				f.edit("n1-a", func(p *corev1.Pod) { p.Spec.Affinity = requireNodes("n1") })
			}
			if tc.cpuBound {
				cpu := func(q string) func(*corev1.Pod) {
					return func(p *corev1.Pod) {
						p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
					}
				}
				f.edit("n1-a", cpu("100"))
				for _, name := range []string{"n2-a", "n2-b", "n2-c", "n3-a", "n3-b", "n3-c", "n3-d"} {
					f.edit(name, cpu("20"))
				}
			}
			for i := range 2 {
				m := f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
				if tc.memberAffinity {
					f.edit(m.Name, func(p *corev1.Pod) { p.Spec.Affinity = requireNodes("n0", "n1", "n2", "n3") })
				}
			}
			f.sync()
			f.mu.Lock()
			evicted := slices.Clone(f.evicted)
			f.mu.Unlock()
			slices.Sort(evicted)
			events := strings.Join(f.events.Events, "\n")
			if !slices.Equal(evicted, tc.evicted) {
				t.Errorf("evicted %v, want %v\nevents:\n%s", evicted, tc.evicted, events)
			}
			var nodes []string
			for _, s := range f.state("big-") {
				if s.planned {
					nodes = append(nodes, s.node)
				}
			}
			slices.Sort(nodes)
			if !slices.Equal(nodes, tc.planned) {
				t.Errorf("gang planned on %v, want %v\nevents:\n%s", nodes, tc.planned, events)
			}
			if got := strings.Count(events, planner.EventConsolidated+": tessera: evicted from node"); got != len(tc.evicted) {
				t.Errorf("%d %s Events, want %d:\n%s", got, planner.EventConsolidated, len(tc.evicted), events)
			}
			if tc.reason != "" && !strings.Contains(events, tc.reason) {
				t.Errorf("no waiting reason %q:\n%s", tc.reason, events)
			}
			if c != nil {
				if got := testutil.ToFloat64(c.Moves().WithLabelValues("evicted")); got != float64(len(tc.evicted)) {
					t.Errorf("consolidation_moves_total{result=evicted} = %v, want %d", got, len(tc.evicted))
				}
				if got := testutil.ToFloat64(c.Moves().WithLabelValues("blocked")); got != tc.blocked {
					t.Errorf("consolidation_moves_total{result=blocked} = %v, want %v", got, tc.blocked)
				}
			}
			if len(tc.evicted) == 0 {
				return
			}
			// The next pass moves nothing more: the gang is planned.
			f.sync()
			f.mu.Lock()
			again := len(f.evicted)
			f.mu.Unlock()
			if again != len(tc.evicted) {
				t.Errorf("%d evictions after a second pass, want %d", again, len(tc.evicted))
			}
		})
	}
}

// placed creates a 1-GPU pod bound to node on GPU gpu; movable ones are
// marked preemptible and owned by a ReplicaSet.
func (f *gangFixture) placed(name, node string, gpu int, movable bool) {
	f.t.Helper()
	p := testbuild.Pod(name).Whole(1).Node(node).Holding(gpu).Obj()
	p.UID = types.UID("uid-" + name)
	p.Status.StartTime = &metav1.Time{Time: f.now.Add(-time.Hour)}
	if movable {
		p.Annotations[api.AnnotationPreemptible] = "true"
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: new(bool)}}
		*p.OwnerReferences[0].Controller = true
	}
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
}

// edit changes pod name in the API server and the ledger.
func (f *gangFixture) edit(name string, change func(*corev1.Pod)) {
	f.t.Helper()
	pods := f.client.CoreV1().Pods(metav1.NamespaceDefault)
	p, err := pods.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	change(p)
	if p, err = pods.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.cache.SetPod(p)
}

// requireNodes is a required node affinity for the nodes named, one term
// each (the API server allows a single value for a field selector's In).
func requireNodes(names ...string) *corev1.Affinity {
	sel := &corev1.NodeSelector{}
	for _, n := range names {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: sel}}
}

func TestMovable(t *testing.T) {
	owned := func(kind string) []metav1.OwnerReference {
		yes := true
		return []metav1.OwnerReference{{Kind: kind, Name: "x", UID: "u", Controller: &yes}}
	}
	base := func() *corev1.Pod {
		p := testbuild.Pod("p").Whole(1).Node("n0").Obj()
		p.Annotations[api.AnnotationPreemptible] = "true"
		p.OwnerReferences = owned("ReplicaSet")
		return p
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
		want bool
	}{
		{"a preemptible ReplicaSet pod", func(*corev1.Pod) {}, true},
		{"a Job's", func(p *corev1.Pod) { p.OwnerReferences = owned("Job") }, true},
		{"a StatefulSet's", func(p *corev1.Pod) { p.OwnerReferences = owned("StatefulSet") }, true},
		{"a DaemonSet's", func(p *corev1.Pod) { p.OwnerReferences = owned("DaemonSet") }, false},
		{"no controller", func(p *corev1.Pod) { p.OwnerReferences = nil }, false},
		{"an owner that is not the controller", func(p *corev1.Pod) { p.OwnerReferences[0].Controller = nil }, false},
		{"not marked", func(p *corev1.Pod) { delete(p.Annotations, api.AnnotationPreemptible) }, false},
		{"marked false", func(p *corev1.Pod) { p.Annotations[api.AnnotationPreemptible] = "false" }, false},
		{"malformed mark", func(p *corev1.Pod) { p.Annotations[api.AnnotationPreemptible] = "yes" }, false},
		{"a gang member", func(p *corev1.Pod) { p.Annotations[api.AnnotationGang] = "g" }, false},
		{"not bound", func(p *corev1.Pod) { p.Spec.NodeName = "" }, false},
		{"leaving", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }, false},
		{"ended", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, false},
		{"required anti-affinity", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname}}}}
		}, false},
		{"required affinity", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname}}}}
		}, false},
		{"preferred anti-affinity only", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname}}}}}
		}, true},
		{"a spread it must keep", func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule}}
		}, false},
		{"a spread it may break", func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway}}
		}, true},
	} {
		p := base()
		tc.edit(p)
		if got := planner.Movable(p); got != tc.want {
			t.Errorf("%s: Movable = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := planner.Movable(nil); got {
		t.Error("Movable(nil) = true")
	}
}

func TestNewConsolidatorRefusesNoMoves(t *testing.T) {
	if _, err := planner.NewConsolidator(nil, nil, nil, 0); err == nil {
		t.Error("0 moves per minute accepted")
	}
}

// Pods consolidation evicted may still be listed (the informer is behind,
// or a pass plans again on a snapshot taken before): they count as
// leaving, the gang is planned on their room, and nothing more is moved.
func TestConsolidationPlansOnTheRoomItsMovesFree(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(4)...)
	clk := clocktesting.NewFakePassiveClock(f.now.Add(-2 * time.Minute))
	c, err := planner.NewConsolidator(&extender.KubeEvicter{Client: f.client}, f.events, clk, 4)
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(f.now)
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list, Policy: testPolicy(t, extender.PolicyBinpack),
		Events: f.events, Now: func() time.Time { return f.now }, Consolidation: c})
	for n, count := range map[string]int{"n0": 2, "n1": 1, "n2": 3, "n3": 4} {
		for k := range count {
			f.placed(fmt.Sprintf("%s-%c", n, 'a'+k), n, k, n != "n3")
		}
	}
	for _, name := range []string{"n0-a", "n0-b", "n1-a"} {
		c.Moved(types.UID("uid-" + name)) // evicted by an earlier pass
	}
	for i := range 2 {
		f.member("big", 2, i, 8, f.now.Add(-2*time.Minute))
	}
	f.sync()
	f.mu.Lock()
	evicted := slices.Clone(f.evicted)
	f.mu.Unlock()
	if len(evicted) != 0 {
		t.Errorf("evicted %v, want nothing more", evicted)
	}
	var nodes []string
	for _, s := range f.state("big-") {
		if s.planned {
			nodes = append(nodes, s.node)
		}
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"n0", "n1"}) {
		t.Errorf("gang planned on %v, want n0 and n1\nevents:\n%s", nodes, strings.Join(f.events.Events, "\n"))
	}
	// Without the hints (two minutes later), nothing is left to count as
	// leaving: a new planner pass with the same pods would move again.
	clk.SetTime(f.now.Add(2 * time.Minute))
	if ev, _ := c.Hints(); len(ev) != 0 {
		t.Errorf("hints %v two minutes after", ev)
	}
}

// numaNode is an 8-GPU node whose topology manager policy is policy
// ("" for a node without a NUMA report): GPUs 0-3 on NUMA node 0, 4-7 on
// NUMA node 1, 32 exclusive CPUs free on each.
func numaNode(t *testing.T, name, policy string) *corev1.Node {
	t.Helper()
	b := testbuild.Node(name).GPUs(8, "A100", 40960).CPU("64")
	for i := range b.Inv.GPUs {
		b.Inv.GPUs[i].NUMANode = i / 4
	}
	node := b.Obj()
	if policy == "" {
		return node
	}
	v, err := api.EncodeNUMATopology(&api.NUMATopology{APIVersion: api.Version, Kind: api.KindNUMATopology, TopologyManagerPolicy: policy,
		TopologyManagerScope: api.TopologyScopeContainer, CPUManagerPolicy: api.CPUManagerPolicyStatic, Source: api.NUMASourcePodResources,
		Zones: []api.NUMAZone{{ID: 0, CPUs: 32, FreeCPUs: 32}, {ID: 1, CPUs: 32, FreeCPUs: 32}}})
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations[api.AnnotationNUMATopology] = v
	return node
}

// Consolidation moves a pod only where it comes back: a Guaranteed pod
// with exclusive CPUs beside its GPU must have both on one NUMA node, which
// the consolidation model (GPUs by position, CPUs by node) does not check,
// so it is not moved onto a node whose topology manager requires
// alignment, even where it would fit (here n1's free GPU 7 has 32 free
// CPUs beside it): a move is made only where the model can tell. An 8-GPU
// gang waits; n0 runs one movable pod, n1 runs seven pods that may not
// move. Moving n0's pod to n1's free GPU frees n0 for the gang: done for a
// 1-GPU BestEffort pod and for a Guaranteed one when n1 does not require
// alignment, not for a Guaranteed pod with exclusive CPUs when it does.
func TestConsolidationHonoursNUMAAlignment(t *testing.T) {
	for _, tc := range []struct {
		name       string
		policy     string // n1's topology manager policy
		guaranteed bool   // n0's movable pod asks for 4 exclusive CPUs
		moved      bool
	}{
		{name: "no NUMA report", policy: "", guaranteed: true, moved: true},
		{name: "best-effort policy", policy: "best-effort", guaranteed: true, moved: true},
		{name: "single-numa-node, one GPU alone", policy: "single-numa-node", moved: true},
		{name: "single-numa-node, a GPU and exclusive CPUs", policy: "single-numa-node", guaranteed: true, moved: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGangFixture(t, numaNode(t, "n0", ""), numaNode(t, "n1", tc.policy))
			// Started two minutes ago (no moves in its first minute).
			clk := clocktesting.NewFakePassiveClock(f.now.Add(-2 * time.Minute))
			c, err := planner.NewConsolidator(&extender.KubeEvicter{Client: f.client}, f.events, clk, 4)
			if err != nil {
				t.Fatal(err)
			}
			clk.SetTime(f.now)
			f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list,
				Policy: testPolicy(t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }, Consolidation: c})
			f.placed("n0-a", "n0", 0, true)
			if tc.guaranteed {
				f.edit("n0-a", func(p *corev1.Pod) {
					rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("1Gi")}
					for r, q := range rl {
						p.Spec.Containers[0].Resources.Requests[r] = q
						if p.Spec.Containers[0].Resources.Limits == nil {
							p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
						}
						p.Spec.Containers[0].Resources.Limits[r] = q
					}
					p.Status.QOSClass = corev1.PodQOSGuaranteed
				})
			}
			for k := range 7 {
				f.placed(fmt.Sprintf("n1-%c", 'a'+k), "n1", k, false)
			}
			f.member("big", 1, 0, 8, f.now.Add(-2*time.Minute))
			f.sync()
			f.mu.Lock()
			evicted := slices.Compact(slices.Clone(f.evicted)) // (the dry run is counted too)
			f.mu.Unlock()
			if moved := slices.Equal(evicted, []string{"n0-a"}); moved != tc.moved {
				t.Errorf("evicted %v, want n0-a moved: %v\nevents:\n%s", evicted, tc.moved, strings.Join(f.events.Events, "\n"))
			}
		})
	}
}
