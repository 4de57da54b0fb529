package extender_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

// TestPlugin runs tessera-scheduler (kube-scheduler v1.34 with Tessera's
// plugin, scheduler/) as a user would: configured by
// deploy/scheduler/scheduler-config.yaml, the extender in its process as
// its ServiceAccount. One control plane for every case; each case has
// nodes of its own (label scenario=<case>) and its pods select them.
func TestPlugin(t *testing.T) {
	e := extenderenv.Start(t, extenderenv.Options{InProcess: true, Agent: true,
		ExtenderArgs: []string{"--gang-resync=500ms"}})
	w := e.WatchPods(t)
	for name, value := range map[string]int32{"plugin-low": 1, "plugin-mid": 500, "plugin-high": 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := e.Client.SchedulingV1().PriorityClasses().Create(t.Context(), pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("whole GPUs and slices bind, sealed, none over-committed, through Tessera's bind", func(t *testing.T) {
		for i := range 3 {
			e.CreateNode(t, extenderenv.NodeSpec{Name: "mix-" + itoa(i), GPUs: 4, Model: a100, MemMiB: 40960, Labels: sel("mix")})
		}
		// 11 of the 12 GPUs: 4 x 1 + 2 x 2 whole, 12 quarter slices.
		var whole, shares []string
		for i := range 4 {
			whole = append(whole, "mix-w1-"+itoa(i))
			e.CreatePod(t, extenderenv.PodSpec{Name: whole[len(whole)-1], GPUs: 1, Selector: sel("mix")})
		}
		for i := range 2 {
			whole = append(whole, "mix-w2-"+itoa(i))
			e.CreatePod(t, extenderenv.PodSpec{Name: whole[len(whole)-1], GPUs: 2, Selector: sel("mix")})
		}
		for i := range 12 {
			shares = append(shares, "mix-s-"+itoa(i))
			e.CreatePod(t, extenderenv.PodSpec{Name: shares[len(shares)-1], MemUnits: 10, Cores: 25, Selector: sel("mix")})
		}
		for _, n := range whole {
			e.WaitBound(t, ns, n, time.Minute)
		}
		// Reserve counted each pod in its cycle: no later pod was sent
		// where the GPUs were already taken, so none failed a cycle or a
		// bind on the way.
		for _, n := range append(slices.Clone(whole), shares...) {
			if ev := e.WaitEvent(t, ns, n, "Scheduled", "", 30*time.Second); strings.Contains(ev, "Failed") {
				t.Errorf("pod %s failed before it bound:\n%s", n, ev)
			}
		}
		for _, n := range shares {
			p := e.WaitBound(t, ns, n, time.Minute)
			a, found, err := e.Sealer.Assignment(p.UID, p.Annotations)
			if !found || err != nil {
				t.Errorf("slice %s: no assignment sealed by Tessera (found %v, err %v): %v", n, found, err, p.Annotations)
				continue
			}
			c := a.Container("main")
			if c == nil || c.Shared == nil || c.Shared.MemoryMiB != 10*1024 || c.Shared.Cores != 25 {
				t.Errorf("slice %s: assignment %+v, want 10240 MiB and 25 cores for main", n, a)
				continue
			}
			if c.Shared.GPU.UUID != extenderenv.GPUUUID(p.Spec.NodeName, c.Shared.GPU.Index) {
				t.Errorf("slice %s on node %s has GPU %s (index %d) of another node", n, p.Spec.NodeName, c.Shared.GPU.UUID, c.Shared.GPU.Index)
			}
		}
		e.WaitAgentIdle(t)
		extenderenv.CheckNoOvercommit(t, e.Client)
		if errs := e.Agent.Errors(); len(errs) > 0 {
			t.Errorf("node agent stand-in found over-committed nodes: %v", errs)
		}
		// The extender inside the scheduler serves /metrics and /status on
		// its --listen, and counted the 18 binds as its own.
		if placed := metricSum(t, e, "tessera_extender_placements_total"); placed < 18 {
			t.Errorf("tessera_extender_placements_total = %v, want >= 18: the GPU pods were not bound by Tessera's bind", placed)
		}
		if code, body := get(t, "http://"+e.Ext.Addr()+"/status/occupancy"); code != http.StatusOK || !strings.Contains(body, "mix-0") {
			t.Errorf("/status/occupancy: %d %.300s", code, body)
		}
	})

	t.Run("decisions written by the pod's creator are not taken", func(t *testing.T) {
		// trust-a is binpack's choice: one GPU taken, a 10 GiB slice on GPU 1.
		for _, n := range []string{"trust-a", "trust-b"} {
			e.CreateNode(t, extenderenv.NodeSpec{Name: n, GPUs: 8, Model: a100, MemMiB: 40960, Labels: sel("trust")})
		}
		e.CreatePod(t, extenderenv.PodSpec{Name: "trust-held", GPUs: 1, Node: "trust-a", Assign: extenderenv.WholeAssignment("trust-a", 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "trust-slice", MemUnits: 10, Node: "trust-a", Assign: extenderenv.SharedAssignment("trust-a", 1, 10240, 0)})
		// A gang plan, unsealed, naming trust-b: obeyed, the filter would
		// pass trust-b alone.
		plan, err := json.Marshal(api.GangPlan{APIVersion: api.Version, Kind: api.KindGangPlan, Gang: "forged", Node: "trust-b", Expires: time.Now().Add(time.Hour).UTC().Truncate(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		e.CreatePod(t, extenderenv.PodSpec{Name: "trust-plan", GPUs: 1, Selector: sel("trust"),
			Annotations: map[string]string{api.AnnotationGangPlan: string(plan)}})
		// An assignment, unsealed, naming trust-a's empty GPU 5: obeyed,
		// the bind would keep it instead of packing onto GPU 1.
		forged := extenderenv.SharedAssignment("trust-a", 5, 10240, 0)
		value, err := api.EncodeAssignment(forged)
		if err != nil {
			t.Fatal(err)
		}
		e.CreatePod(t, extenderenv.PodSpec{Name: "trust-assign", MemUnits: 10, Selector: sel("trust"),
			Annotations: map[string]string{api.AnnotationAssignment: value}})

		if p := e.WaitBound(t, ns, "trust-plan", time.Minute); p.Spec.NodeName != "trust-a" {
			t.Errorf("trust-plan bound to %s: its forged plan (trust-b) was obeyed; binpack's choice is trust-a", p.Spec.NodeName)
		}
		p := e.WaitBound(t, ns, "trust-assign", time.Minute)
		if p.Spec.NodeName != "trust-a" {
			t.Errorf("trust-assign bound to %s, want binpack's trust-a", p.Spec.NodeName)
		}
		// The bind writes its assignment before the Binding.
		a, found, err := e.Sealer.Assignment(p.UID, p.Annotations)
		switch {
		case !found || err != nil:
			t.Errorf("trust-assign: no assignment sealed by Tessera (found %v, err %v): %v", found, err, p.Annotations)
		case a.Container("main") == nil || a.Container("main").Shared == nil:
			t.Errorf("trust-assign: assignment %+v has no slice for main", a)
		case a.Container("main").Shared.GPU.UUID != extenderenv.GPUUUID("trust-a", 1):
			t.Errorf("trust-assign on GPU %s, want trust-a's GPU 1 (%s) beside the other slice; the forged GPU 5 is %s",
				a.Container("main").Shared.GPU.UUID, extenderenv.GPUUUID("trust-a", 1), extenderenv.GPUUUID("trust-a", 5))
		}
		waitIgnored(t, e, "trust-plan", api.AnnotationGangPlan)
		waitIgnored(t, e, "trust-assign", api.AnnotationAssignment)
	})

	// The plugin asks the extender only about the nodes the pod may go to
	// (taints, nodeSelector, required node affinity): a 10 GiB slice
	// barred from binpack's favourite (a node whose GPU a slice already
	// uses) lands on the empty node in its first cycle. Were the favourite
	// shortlisted, the stock filters would refuse it and the pod would
	// first fail (FailedScheduling) before its wide retry.
	for _, tc := range []struct {
		name  string
		pod   func(p *v1.Pod, other string)
		taint bool
	}{
		{name: "node selector", pod: func(p *v1.Pod, other string) { p.Spec.NodeSelector["pool"] = "ok" }},
		{name: "required node affinity", pod: func(p *v1.Pod, other string) {
			p.Spec.Affinity = requiredAffinity(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "pool", Operator: v1.NodeSelectorOpIn, Values: []string{"ok"}}}})
		}},
		{name: "required node affinity by field", pod: func(p *v1.Pod, other string) {
			p.Spec.Affinity = requiredAffinity(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{other}}}})
		}},
		{name: "untolerated taint", taint: true},
	} {
		t.Run("eligible nodes only: "+tc.name, func(t *testing.T) {
			scenario := "elig-" + strings.ReplaceAll(tc.name, " ", "-")
			best, other := scenario+"-best", scenario+"-other"
			e.CreateNode(t, extenderenv.NodeSpec{Name: best, GPUs: 2, Model: a100, Labels: sel(scenario)})
			e.CreateNode(t, extenderenv.NodeSpec{Name: other, GPUs: 2, Model: a100, Labels: map[string]string{"scenario": scenario, "pool": "ok"}})
			slice(t, e, scenario+"-held", best, 30)
			if tc.taint {
				taintNode(t, e, best, v1.Taint{Key: "dedicated", Value: "other", Effect: v1.TaintEffectNoSchedule})
			}
			p := extenderenv.PodSpec{Name: scenario, MemUnits: 10, Selector: sel(scenario)}.Pod()
			if tc.pod != nil {
				tc.pod(p, other)
			}
			createRaw(t, e, p)
			if got := e.WaitBound(t, ns, p.Name, time.Minute).Spec.NodeName; got != other {
				t.Fatalf("bound to %s, want %s", got, other)
			}
			ev := e.WaitEvent(t, ns, p.Name, "Scheduled", other, 30*time.Second)
			if strings.Contains(ev, "FailedScheduling") {
				t.Errorf("the pod failed a cycle before it bound: the plugin shortlisted a node it may not go to:\n%s", ev)
			}
		})
	}

	// A pod whose shortlist (binpack's favourite alone) fails a stock
	// filter the plugin does not see goes to the other node that fits at
	// once, without preempting the lower-priority pod in its way.
	for _, tc := range []struct {
		name   string
		holder func(p *v1.Pod) // a low-priority pod already on the favourite
		pod    func(p *v1.Pod)
	}{
		{name: "host port", holder: withHostPort(7777), pod: withHostPort(7777)},
		// (Not CPU: the extender counts nodes' CPU and memory itself.)
		{name: "pod anti-affinity", holder: withLabel("app", "solo"), pod: withAntiAffinity("app", "solo")},
	} {
		t.Run("wide retry when the shortlist fails a stock filter: "+tc.name, func(t *testing.T) {
			// For one GPU binpack ranks best (its last free GPU) alone on
			// top, then other (1 of 8 taken), then spare (empty): the retry
			// must still follow it, to other, where kube-scheduler's own
			// scores would take the emptier spare.
			scenario := "wide-" + strings.ReplaceAll(tc.name, " ", "-")
			best, other, spare := scenario+"-best", scenario+"-other", scenario+"-spare"
			for _, n := range []string{best, other, spare} {
				e.CreateNode(t, extenderenv.NodeSpec{Name: n, GPUs: 8, Labels: sel(scenario)})
			}
			e.CreatePod(t, extenderenv.PodSpec{Name: scenario + "-held-0", GPUs: 7, Node: best, Assign: extenderenv.WholeAssignment(best, 0, 1, 2, 3, 4, 5, 6)})
			e.CreatePod(t, extenderenv.PodSpec{Name: scenario + "-held-1", GPUs: 1, Node: other, Assign: extenderenv.WholeAssignment(other, 0)})
			holder := extenderenv.PodSpec{Name: scenario + "-holder", Node: best, PriorityClass: "plugin-low"}.Pod()
			tc.holder(holder)
			createRaw(t, e, holder)
			p := extenderenv.PodSpec{Name: scenario, GPUs: 1, Selector: sel(scenario), PriorityClass: "plugin-high"}.Pod()
			tc.pod(p)
			// Let the cluster settle, so that no event of these creations
			// is what brings the pod back.
			time.Sleep(time.Second)
			created := time.Now()
			createRaw(t, e, p)
			bound := e.WaitBound(t, ns, p.Name, 45*time.Second)
			took := time.Since(created)
			for _, b := range w.BindsOf(ns, p.Name) {
				if b.Name == p.Name {
					took = b.At.Sub(created)
				}
			}
			t.Logf("created -> bound on %s: %s", bound.Spec.NodeName, took.Round(time.Millisecond))
			if bound.Spec.NodeName != other {
				t.Errorf("bound to %s, want %s (binpack's choice once %s is out)", bound.Spec.NodeName, other, best)
			}
			// The retry comes at once, not after the unschedulable
			// queue's 5-minute flush.
			if took > 30*time.Second {
				t.Errorf("bound %s after its creation, want within 30s", took.Round(time.Millisecond))
			}
			// The path under test was taken: the first cycle failed.
			ev := e.WaitEvent(t, ns, p.Name, "FailedScheduling", "", 10*time.Second)
			t.Logf("events:\n%s", ev)
			if h := e.GetPod(t, ns, holder.Name); h.DeletionTimestamp != nil {
				t.Errorf("the low-priority %s on %s was preempted", h.Name, best)
			}
			if nn := e.GetPod(t, ns, p.Name).Status.NominatedNodeName; nn != "" {
				t.Errorf("nominated node %q: kube-scheduler's preemption ran", nn)
			}
		})
	}

	t.Run("a pod that fits nowhere: Tessera's reason, no preemption by kube-scheduler", func(t *testing.T) {
		// 15 GiB free in the node's count (GPU 0: 5, GPU 1: 10), 16 asked:
		// kube-scheduler's count would evict the low-priority 5 GiB slice,
		// which leaves no GPU with 16 free. The mid-priority pod may
		// evict only that slice, so Tessera's own preemption finds nothing.
		e.CreateNode(t, extenderenv.NodeSpec{Name: "nowhere", GPUs: 2, Model: a100, MemMiB: 40960, Labels: sel("nowhere")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nowhere-h0", MemUnits: 30, PriorityClass: "plugin-high", Node: "nowhere", Assign: extenderenv.SharedAssignment("nowhere", 0, 30720, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nowhere-h1", MemUnits: 30, PriorityClass: "plugin-high", Node: "nowhere", Assign: extenderenv.SharedAssignment("nowhere", 1, 30720, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nowhere-low", MemUnits: 5, PriorityClass: "plugin-low", Node: "nowhere", Assign: extenderenv.SharedAssignment("nowhere", 0, 5120, 0)})
		e.CreatePod(t, extenderenv.PodSpec{Name: "nowhere-16g", MemUnits: 16, PriorityClass: "plugin-mid", Selector: sel("nowhere")})
		cond := waitUnschedulable(t, e, "nowhere-16g", "no single GPU has 16384 MiB", time.Minute)
		t.Logf("PodScheduled=False %s: %s", cond.Reason, cond.Message)
		time.Sleep(5 * time.Second) // further cycles, Tessera's preemption passes (1s)
		for _, n := range []string{"nowhere-h0", "nowhere-h1", "nowhere-low"} {
			if p := e.GetPod(t, ns, n); p.DeletionTimestamp != nil {
				t.Errorf("%s was preempted for a pod no eviction makes fit", n)
			}
		}
		p := e.GetPod(t, ns, "nowhere-16g")
		if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
			t.Errorf("nowhere-16g: node %q, nominated %q; want neither", p.Spec.NodeName, p.Status.NominatedNodeName)
		}
	})

	t.Run("a clique pod's victims leaving: no more evicted by kube-scheduler's preemption", func(t *testing.T) {
		// Two NVLink cliques of four; low-priority pods on GPUs 0, 1, 4, 5
		// and mid-priority ones on 2, 3, 6, 7. A high-priority 4-GPU NVLink
		// pod needs one clique emptied: two low and two mid pods go
		// (Tessera's preemption). While they are leaving (no kubelet here
		// finishes them) they still hold their devices, so the node
		// Tessera passes fails NodeResourcesFit, and DefaultPreemption,
		// counting GPUs, would evict the other clique's low-priority pods
		// too: seen on make demo.
		node := "clq-0"
		e.CreateNode(t, extenderenv.NodeSpec{Name: node, GPUs: 8, Model: a100, Cliques: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, Labels: sel("clq")})
		var held []string
		for gpu := range 8 {
			pc := "plugin-low"
			if gpu%4 >= 2 {
				pc = "plugin-mid"
			}
			name := "clq-held-" + itoa(gpu)
			held = append(held, name)
			e.CreatePod(t, extenderenv.PodSpec{Name: name, GPUs: 1, PriorityClass: pc, Node: node, Assign: extenderenv.WholeAssignment(node, gpu)})
		}
		// The layout holds (the node agent stand-in records GPUs only for
		// pods without an assignment, and never over one written since
		// it read the pod).
		if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			for gpu, n := range held {
				p := e.GetPod(t, ns, n)
				a, found, err := e.Sealer.Assignment(p.UID, p.Annotations)
				if !found || err != nil || a.Container("main") == nil || len(a.Container("main").GPUs) != 1 || a.Container("main").GPUs[0].Index != gpu {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			t.Fatalf("the held pods' assignments are not GPUs 0..7 in order: %v", err)
		}
		e.CreatePod(t, extenderenv.PodSpec{Name: "clq-four", GPUs: 4, NVLink: true, PriorityClass: "plugin-high", Selector: sel("clq")})
		leaving := func() []int {
			var out []int
			for gpu, n := range held {
				if p := e.GetPod(t, ns, n); p.DeletionTimestamp != nil {
					out = append(out, gpu)
				}
			}
			return out
		}
		if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return len(leaving()) > 0, nil
		}); err != nil {
			t.Fatalf("no pod evicted for clq-four: %v", err)
		}
		time.Sleep(5 * time.Second) // more cycles while the victims leave
		gone := leaving()
		if !slices.Equal(gone, []int{0, 1, 2, 3}) && !slices.Equal(gone, []int{4, 5, 6, 7}) {
			t.Errorf("pods of GPUs %v evicted, want one clique's four (0-3 or 4-7)", gone)
		}
		for _, gpu := range gone {
			e.DeletePod(t, ns, held[gpu]) // as the kubelet finishes them
		}
		p := e.WaitBound(t, ns, "clq-four", time.Minute)
		t.Logf("clq-four bound to %s; evicted the pods of GPUs %v", p.Spec.NodeName, gone)
	})

	t.Run("a CPU-only pod binds", func(t *testing.T) {
		e.CreateNode(t, extenderenv.NodeSpec{Name: "cpu-0", GPUs: 2, Labels: sel("cpu")})
		e.CreatePod(t, extenderenv.PodSpec{Name: "cpu-only", Selector: sel("cpu")})
		p := e.WaitBound(t, ns, "cpu-only", time.Minute)
		if p.Spec.NodeName != "cpu-0" {
			t.Errorf("bound to %s, want cpu-0", p.Spec.NodeName)
		}
		for k := range p.Annotations {
			if strings.HasPrefix(k, api.Domain+"/") {
				t.Errorf("CPU-only pod has Tessera annotation %s=%s", k, p.Annotations[k])
			}
		}
	})

	t.Run("a gang binds whole, each member on its planned node", func(t *testing.T) {
		for i := range 2 {
			e.CreateNode(t, extenderenv.NodeSpec{Name: "gang-" + itoa(i), GPUs: 8, Labels: sel("gang")})
		}
		for i := range 3 {
			e.CreatePod(t, extenderenv.PodSpec{Name: "gang-m-" + itoa(i), GPUs: 4, Selector: sel("gang"), Gang: "gm", GangMinMember: 3})
		}
		for i := range 3 {
			p := e.WaitBound(t, ns, "gang-m-"+itoa(i), time.Minute)
			plan, found, err := e.Sealer.GangPlan(p.UID, p.Annotations)
			if !found || err != nil || plan.Node != p.Spec.NodeName {
				t.Errorf("member %s bound to %s, sealed plan %+v (found %v, err %v)", p.Name, p.Spec.NodeName, plan, found, err)
			}
		}
		if spread := extenderenv.Spread(w.BoundNow(ns, "gang-m-")); spread > 5*time.Second {
			t.Errorf("the members bound %s apart, want within 5s", spread)
		}
		e.WaitAgentIdle(t)
		extenderenv.CheckNoOvercommit(t, e.Client)
	})
}

// slice creates pod name on node with a slice of units GiB on its GPU 0,
// already placed (sealed assignment).
func slice(t *testing.T, e *extenderenv.Env, name, node string, units int64) {
	t.Helper()
	e.CreatePod(t, extenderenv.PodSpec{Name: name, MemUnits: units, Node: node, Assign: extenderenv.SharedAssignment(node, 0, units*1024, 0)})
}

func requiredAffinity(term v1.NodeSelectorTerm) *v1.Affinity {
	return &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{term}}}}
}

func withHostPort(port int32) func(*v1.Pod) {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: port, HostPort: port, Protocol: v1.ProtocolTCP}}
	}
}

func withLabel(k, v string) func(*v1.Pod) {
	return func(p *v1.Pod) { p.Labels[k] = v }
}

// withAntiAffinity keeps the pod off nodes running a pod labelled k=v.
func withAntiAffinity(k, v string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}, TopologyKey: v1.LabelHostname}}}}
	}
}

func createRaw(t *testing.T, e *extenderenv.Env, p *v1.Pod) {
	t.Helper()
	if _, err := e.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// taintNode adds taint to node and waits a moment for the scheduler's and
// the extender's informers.
func taintNode(t *testing.T, e *extenderenv.Env, node string, taint v1.Taint) {
	t.Helper()
	n, err := e.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, taint)
	if _, err := e.Client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
}

// waitUnschedulable waits until pod's PodScheduled condition is False
// with a message containing want and returns it.
func waitUnschedulable(t *testing.T, e *extenderenv.Env, pod, want string, timeout time.Duration) v1.PodCondition {
	t.Helper()
	var got v1.PodCondition
	_, err := e.CP.WaitForPod(t.Context(), ns, pod, "unschedulable: "+want, timeout, func(p *v1.Pod) (bool, error) {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				got = c
				return strings.Contains(c.Message, want), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents: %s", err, e.Events(t, ns, pod))
	}
	return got
}

// waitIgnored waits for the Warning the extender records when it drops an
// annotation pod's creator wrote in Tessera's name.
func waitIgnored(t *testing.T, e *extenderenv.Env, pod, annotation string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		evs, err := e.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, nil
		}
		last = ""
		for _, ev := range evs.Items {
			last += fmt.Sprintf("[%s %s] %s\n", ev.Type, ev.Reason, ev.Message)
			if ev.Type == v1.EventTypeWarning && ev.Reason == "IgnoredAnnotation" && strings.Contains(ev.Message, annotation) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("pod %s: no Warning IgnoredAnnotation naming %s; events:\n%s", pod, annotation, last)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricSum is the sum of the extender's counter or gauge name over its
// labels.
func metricSum(t *testing.T, e *extenderenv.Env, name string) float64 {
	t.Helper()
	code, body := get(t, "http://"+e.Ext.Addr()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	var sum float64
	for _, m := range families[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}
