package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// The tiers: inference always gets GPUs, training queues (it may
// not preempt), notebooks give way.
const (
	tierInference = "inference-critical"
	tierTraining  = "training-standard"
	tierNotebook  = "notebook-dev"
)

func priorityClasses(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	never := v1.PreemptNever
	for _, pc := range []schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: tierInference}, Value: 100000},
		{ObjectMeta: metav1.ObjectMeta{Name: tierTraining}, Value: 10000, PreemptionPolicy: &never},
		{ObjectMeta: metav1.ObjectMeta{Name: tierNotebook}, Value: 1000},
	} {
		if _, err := client.SchedulingV1().PriorityClasses().Create(t.Context(), &pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func createTier(t *testing.T, client kubernetes.Interface, ns, class string, s podSpec) *v1.Pod {
	t.Helper()
	p := s.pod(ns)
	p.Spec.PriorityClassName = class
	p, err := client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", s.name, err)
	}
	return p
}

// gone lists which of names no longer exist (or are being deleted).
func gone(t *testing.T, client kubernetes.Interface, ns string, names []string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		p, err := client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil {
			out = append(out, n)
		}
	}
	return out
}

// Tier preemption across shapes, on one node (l40s-1) with notebooks on
// every GPU: an inference slice against whole-GPU notebooks, an inference
// whole GPU against notebook slices, a 20 GiB inference slice against
// slices that leave no GPU 20 GiB. Each inference pod runs within
// preemptWithin, exactly one notebook is evicted for it, and a training
// pod (preemptionPolicy Never) created first keeps waiting, evicting
// nothing.
func TestTierPreemptionAcrossShapes(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	priorityClasses(t, client)
	const node = "l40s-1"
	inv := inventory(t, c, node)
	gpus := len(inv.GPUs)
	memUnits := int64(inv.GPUs[0].MemoryUnits)
	cases := []struct {
		name     string
		notebook func(i int) podSpec
		asker    podSpec
	}{
		{
			name:     "slice-vs-whole",
			notebook: func(i int) podSpec { return podSpec{name: fmt.Sprintf("nb-%d", i), gpus: 1, node: node} },
			asker:    podSpec{name: "inf", memUnits: 10, cores: 20, node: node},
		},
		{
			name: "whole-vs-slices",
			// Over half a GPU each: one notebook slice per GPU.
			notebook: func(i int) podSpec {
				return podSpec{name: fmt.Sprintf("nb-%d", i), memUnits: memUnits/2 + 2, cores: 30, node: node}
			},
			asker: podSpec{name: "inf", gpus: 1, node: node},
		},
		{
			name: "large-slice-vs-fragments",
			// Each GPU keeps less than 20 GiB free; the node has plenty.
			notebook: func(i int) podSpec {
				return podSpec{name: fmt.Sprintf("nb-%d", i), memUnits: memUnits - 19, cores: 30, node: node}
			},
			asker: podSpec{name: "inf", memUnits: 20, cores: 30, node: node},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, c, "e2e-tiers-"+tc.name)
			waitReleased(t, c)
			var notebooks []string
			for i := range gpus {
				s := tc.notebook(i)
				createTier(t, client, ns, tierNotebook, s)
				notebooks = append(notebooks, s.name)
			}
			for _, n := range notebooks {
				waitRunning(t, c, ns, n, 90*time.Second)
			}
			createTier(t, client, ns, tierTraining, podSpec{name: "train", gpus: 1, node: node})
			// Training fits nowhere, and may not preempt: it waits.
			waitUnschedulable(t, client, ns, "train", 30*time.Second)
			if g := gone(t, client, ns, notebooks); len(g) > 0 {
				t.Fatalf("training (preemptionPolicy Never) evicted %v", g)
			}
			start := time.Now()
			createTier(t, client, ns, tierInference, tc.asker)
			p, _ := waitRunning(t, c, ns, tc.asker.name, 60*time.Second)
			took := time.Since(start)
			t.Logf("%s Running on %s %s after creation", tc.asker.name, p.Spec.NodeName, took.Round(time.Millisecond))
			if took > preemptWithin {
				t.Errorf("inference took %s to run, want within %s\nevents: %s", took.Round(time.Millisecond), preemptWithin, describe(t, c, p))
			}
			if g := gone(t, client, ns, notebooks); len(g) != 1 {
				t.Errorf("evicted %v, want exactly one notebook", g)
			}
			if tr := getPod(t, client, ns, "train"); tr.Spec.NodeName != "" {
				t.Errorf("training bound to %s: it was to wait", tr.Spec.NodeName)
			}
			if ev, ok := waitEvent(t, client, ns, tc.asker.name, api.EventPreempting); !ok {
				t.Errorf("no %s Event on %s: %s", api.EventPreempting, tc.asker.name, ev)
			}
			occ, pods := occupancy(t, c)
			checkNoOvercommit(t, occ)
			checkRunningPods(t, c, pods)
		})
	}
}

// preemptWithin bounds how long a preempting pod may take from creation to
// Running: its victim's eviction and stop, the kubelet freeing the devices,
// the node agent's read of it, kube-scheduler's retry (its backoff alone
// reaches 10 s) and the node's start, on a loaded 2-core CI machine. It
// tells held room from the 5-minute wait of an unschedulable pod.
const preemptWithin = 30 * time.Second

// waitUnschedulable waits until kube-scheduler marks the pod
// unschedulable (and checks it stays unbound).
func waitUnschedulable(t *testing.T, client kubernetes.Interface, ns, name string, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("bound to %s", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not found unschedulable: %v", ns, name, err)
	}
}

// events renders the Events of a pod, oldest first.
func events(t *testing.T, client kubernetes.Interface, ns, name string) string {
	t.Helper()
	l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range l.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// waitEvent waits up to 30 s for an Event of reason on the named object
// (Events are sent asynchronously and may land after the effect they
// report) and returns its events as events does, and whether one came.
func waitEvent(t *testing.T, client kubernetes.Interface, ns, name, reason string) (string, bool) {
	t.Helper()
	_, err := pollEvent(t.Context(), client, ns, name, reason, "", 30*time.Second)
	return events(t, client, ns, name), err == nil
}

// pollEvent polls until the named object has an Event of reason whose
// message contains substr, for up to timeout, and returns its message.
func pollEvent(ctx context.Context, client kubernetes.Interface, ns, name, reason, substr string, timeout time.Duration) (string, error) {
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		i := slices.IndexFunc(l.Items, func(e v1.Event) bool { return e.Reason == reason && strings.Contains(e.Message, substr) })
		if i >= 0 {
			msg = l.Items[i].Message
		}
		return i >= 0, nil
	})
	return msg, err
}

// The same tiers in a namespace a Queue serves: the inference slice is
// held by the queue gate, so kube-scheduler never finds it unschedulable;
// the planner asks Tessera's preemption, which evicts one notebook, and
// the slice runs within preemptWithin.
func TestTierPreemptionInQueuedNamespace(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	priorityClasses(t, client)
	const node = "l40s-1"
	gpus := len(inventory(t, c, node).GPUs)
	nsNB := namespace(t, c, "e2e-tiers-q-notebooks")
	nsInf := namespace(t, c, "e2e-tiers-q-serving")
	waitReleased(t, c)
	createQueue(t, dyn, "e2e-serving", "", []string{nsInf}, 2, 0)
	waitQueuesSeen(t, c, nil, "e2e-serving")
	var notebooks []string
	for i := range gpus {
		s := podSpec{name: fmt.Sprintf("nb-%d", i), gpus: 1, node: node}
		createTier(t, client, nsNB, tierNotebook, s)
		notebooks = append(notebooks, s.name)
	}
	for _, n := range notebooks {
		waitRunning(t, c, nsNB, n, 90*time.Second)
	}
	start := time.Now()
	inf := createTier(t, client, nsInf, tierInference, podSpec{name: "inf", memUnits: 10, cores: 20, node: node})
	if len(inf.Spec.SchedulingGates) == 0 {
		t.Errorf("the inference pod of a queued namespace was created without the queue gate")
	}
	p, _ := waitRunning(t, c, nsInf, "inf", 60*time.Second)
	took := time.Since(start)
	t.Logf("queued inference slice Running on %s %s after creation", p.Spec.NodeName, took.Round(time.Millisecond))
	if took > preemptWithin {
		t.Errorf("took %s, want within %s\n%s", took.Round(time.Millisecond), preemptWithin, describe(t, c, p))
	}
	if g := gone(t, client, nsNB, notebooks); len(g) != 1 {
		t.Errorf("evicted %v, want exactly one notebook", g)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// Tier preemption for a gang, on a cluster of its own (three dgx-a100
// nodes of 8 GPUs): 1-GPU notebook-tier pods fill every GPU; an
// inference-tier gang of 2 x 8 GPUs (gated until the planner plans it, so
// kube-scheduler never preempts for it) fits nowhere. The planner asks
// Tessera's preemption, which evicts the notebooks of exactly two nodes
// (the third keeps its eight) and plans the gang there at once; both
// members run within preemptWithin of the gang's creation, with a Preempting Event
// on each member and a Preempted Event on each victim.
func TestTierPreemptionForAGang(t *testing.T) {
	nodes := []nodesim.NodeSpec{{Name: "a100-1", Profile: "dgx-a100"}, {Name: "a100-2", Profile: "dgx-a100"}, {Name: "a100-3", Profile: "dgx-a100"}}
	const ns = "e2e-tiers-gang"
	c := ownCluster(t.Context(), t, ns, nodes)
	client := c.Client()
	priorityClasses(t, client)
	onNode := map[string][]string{}
	var notebooks []string
	for _, n := range nodes {
		for i := range 8 {
			s := podSpec{name: fmt.Sprintf("nb-%s-%d", n.Name, i), gpus: 1, node: n.Name}
			createTier(t, client, ns, tierNotebook, s)
			onNode[n.Name] = append(onNode[n.Name], s.name)
			notebooks = append(notebooks, s.name)
		}
	}
	for _, n := range notebooks {
		waitRunning(t, c, ns, n, 2*time.Minute)
	}
	start := time.Now()
	for i := range 2 {
		createTier(t, client, ns, tierInference, podSpec{name: fmt.Sprintf("inf-%d", i), gpus: 8,
			annotations: map[string]string{api.AnnotationGang: "inf", api.AnnotationGangMinMember: "2"}})
	}
	var infNodes []string
	for i := range 2 {
		p, _ := waitRunning(t, c, ns, fmt.Sprintf("inf-%d", i), 2*time.Minute)
		infNodes = append(infNodes, p.Spec.NodeName)
	}
	took := time.Since(start)
	slices.Sort(infNodes)
	t.Logf("the 2 x 8 GPU inference gang runs on %v %s after creation", infNodes, took.Round(time.Millisecond))
	if took > preemptWithin {
		t.Errorf("the gang took %s to run, want within %s\n%s", took.Round(time.Millisecond), preemptWithin, describe(t, c, getPod(t, client, ns, "inf-0")))
	}
	if infNodes[0] == infNodes[1] {
		t.Fatalf("both members on %s", infNodes[0])
	}
	var want []string
	for _, n := range infNodes {
		want = append(want, onNode[n]...)
	}
	slices.Sort(want)
	evicted := gone(t, client, ns, notebooks)
	slices.Sort(evicted)
	if !slices.Equal(evicted, want) {
		t.Errorf("evicted %v, want exactly the notebooks of the gang's nodes %v: %v", evicted, infNodes, want)
	}
	for i := range 2 {
		if ev, ok := waitEvent(t, client, ns, fmt.Sprintf("inf-%d", i), api.EventPreempting); !ok {
			t.Errorf("no %s Event on inf-%d: %s", api.EventPreempting, i, ev)
		}
	}
	if len(evicted) > 0 {
		if ev, ok := waitEvent(t, client, ns, evicted[0], api.EventPreempted); !ok {
			t.Errorf("no %s Event on %s: %s", api.EventPreempted, evicted[0], ev)
		}
	}
	t.Logf("inf-0's events:%s", events(t, client, ns, "inf-0"))
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// Tier preemption for a gang whose victims belong to a Deployment: the
// Deployment's controller replaces each evicted pod at once, and
// kube-scheduler binds the replacement wherever the extender lets it. A
// Deployment of 16 one-GPU notebooks fills a100-1 and a100-2; an inference
// gang of 2 x 4 GPUs that must share a node (gang-topology
// kubernetes.io/hostname:required), allowed on those two nodes only,
// evicts the 8 notebooks of one node, once: their replacements wait, as
// the freed room is the gang's. (Before the room was held before the
// evictions, the replacements were bound into it and the gang preempted
// again pass after pass: 41 pods for this gang on make demo's cluster.)
func TestTierPreemptionForAGangOfDeploymentVictims(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	waitReleased(t, c)
	ns := namespace(t, c, "e2e-tiers-deployment")
	priorityClasses(t, client)
	a100Deployment(t, client, ns, "notebooks", 16, tierNotebook, podSpec{gpus: 1})
	runningNotebooks := func(ctx context.Context) (map[string][]string, int, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=notebooks"})
		if err != nil {
			return nil, 0, err
		}
		byNode, pending := map[string][]string{}, 0
		for _, p := range l.Items {
			switch {
			case p.DeletionTimestamp != nil:
			case p.Status.Phase == v1.PodRunning:
				byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p.Name)
			default:
				pending++
			}
		}
		return byNode, pending, nil
	}
	var byNode map[string][]string
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		byNode, _, err = runningNotebooks(ctx)
		return err == nil && len(byNode["a100-1"]) == 8 && len(byNode["a100-2"]) == 8, nil
	}); err != nil {
		t.Fatalf("the Deployment's 16 notebooks do not all run on a100-1 and a100-2: %v (%v)", err, byNode)
	}

	node := nodeGangOnA100s(t, c, ns, "inf", tierInference)
	// Give further rounds of preemption, had there been any, time to show.
	time.Sleep(5 * time.Second)
	names := eventedPods(t, client, ns, api.EventPreempted)
	want := slices.Clone(byNode[node])
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("preempted %d pods %v, want the 8 notebooks that ran on %s: %v", len(names), names, node, want)
	}
	after, pending, err := runningNotebooks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(after[node]) != 0 || pending != 8 {
		t.Errorf("after the preemption: notebooks running %v, %d pending; want none on %s and its 8 replacements pending", after, pending, node)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// A whole-GPU pod of a higher tier against a Deployment of slices, two per
// GPU: it evicts the four slices of two GPUs and runs there, while the
// Deployment's replacements wait. Its plan names the two GPUs: with a hold
// by count, each replacement was bound beside the victim slice still
// leaving, on the GPU freed for it, and the pod never ran (make demo,
// 2026-11-28).
func TestTierPreemptionOfSlicesHoldsTheFreedGPUs(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	waitReleased(t, c)
	ns := namespace(t, c, "e2e-tiers-slices")
	priorityClasses(t, client)
	a100Deployment(t, client, ns, "slices", 32, tierNotebook, podSpec{memUnits: 15, cores: 50})
	count := func(ctx context.Context) (running, pending int, err error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=slices"})
		if err != nil {
			return 0, 0, err
		}
		for _, p := range l.Items {
			switch {
			case p.DeletionTimestamp != nil:
			case p.Status.Phase == v1.PodRunning:
				running++
			default:
				pending++
			}
		}
		return running, pending, nil
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		running, _, err := count(ctx)
		return err == nil && running == 32, nil
	}); err != nil {
		t.Fatalf("the Deployment's 32 slices do not all run on the A100s: %v", err)
	}

	p := podSpec{name: "inf", gpus: 2}.pod(ns)
	onA100s(p)
	p.Spec.PriorityClassName = tierInference
	if _, err := client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c, ns, "inf", time.Minute)
	// Give further rounds of preemption, had there been any, time to show.
	time.Sleep(5 * time.Second)
	if names := eventedPods(t, client, ns, api.EventPreempted); len(names) != 4 {
		t.Errorf("preempted %d pods %v, want the 4 slices of two GPUs", len(names), names)
	}
	if running, pending, err := count(t.Context()); err != nil || running != 28 || pending != 4 {
		t.Errorf("after the preemption: %d slices running, %d pending (%v); want 28 and the 4 replacements pending", running, pending, err)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}

// A PodDisruptionBudget does not keep a lower tier's GPUs from a higher
// one, as under kube-scheduler's preemption (which deletes a single pod's
// victims past their budgets itself): with every notebook of a Deployment
// protected (maxUnavailable 0) and the A100 nodes full, a gang of 2 x 4
// inference GPUs on one node still runs; the 8 notebooks of its node are
// deleted for it, each with a Preempted Event that says it went past its
// budget, and no other.
func TestTierPreemptionPastABudget(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	waitReleased(t, c)
	ns := namespace(t, c, "e2e-tiers-budget")
	priorityClasses(t, client)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "notebooks", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(intstr.FromInt32(0)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "notebooks"}}}}
	if _, err := client.PolicyV1().PodDisruptionBudgets(ns).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a100Deployment(t, client, ns, "notebooks", 16, tierNotebook, podSpec{gpus: 1})
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=notebooks", FieldSelector: "status.phase=Running"})
		if err != nil {
			return false, err
		}
		b, err := client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		// The disruption controller has counted them: an eviction is refused.
		return err == nil && len(l.Items) == 16 && b.Status.CurrentHealthy == 16 && b.Status.DisruptionsAllowed == 0, nil
	}); err != nil {
		t.Fatalf("the 16 notebooks do not run under their budget: %v", err)
	}
	node := nodeGangOnA100s(t, c, ns, "inf", tierInference)
	time.Sleep(3 * time.Second) // further evictions, had there been any
	l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "reason=" + api.EventPreempted})
	if err != nil {
		t.Fatal(err)
	}
	var victims []string
	for _, e := range l.Items {
		victims = append(victims, e.InvolvedObject.Name)
		if !strings.Contains(e.Message, "deleted past its PodDisruptionBudget") {
			t.Errorf("Preempted Event on %s does not say it went past its budget: %s", e.InvolvedObject.Name, e.Message)
		}
	}
	if len(victims) != 8 {
		t.Errorf("preempted %d pods %v, want the 8 notebooks of %s", len(victims), victims, node)
	}
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
