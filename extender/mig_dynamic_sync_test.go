package extender

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

type migEvents struct {
	mu  sync.Mutex
	all []string
}

func (e *migEvents) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	name := ""
	if m, ok := obj.(metav1.Object); ok {
		name = m.GetName()
	}
	e.all = append(e.all, fmt.Sprintf("%s %s %s: %s", name, eventtype, reason, fmt.Sprintf(format, args...)))
}

func (e *migEvents) with(reason string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, s := range e.all {
		if strings.Contains(s, " "+reason+": ") {
			out = append(out, s)
		}
	}
	return out
}

// servingMIGNode is migNode with an agent that serves (dynamicMIG) or not.
func servingMIGNode(t *testing.T, name string, serves bool) *corev1.Node {
	t.Helper()
	n := migNode(name)
	inv, ok, err := api.GetGPUInventory(n.Annotations)
	if !ok || err != nil {
		t.Fatalf("inventory: %v %v", ok, err)
	}
	inv.DynamicMIG = serves
	for i := range inv.GPUs {
		inv.GPUs[i].Model = a100
	}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	return n
}

// unschedulableMIGPod is a pending pod kube-scheduler found unschedulable
// asking one instance of profile.
func unschedulableMIGPod(name, profile string) *corev1.Pod {
	p := migPod(name, profile, 1).Obj()
	p.Status.Phase = corev1.PodPending
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	return p
}

type migDynamicEnv struct {
	t      *testing.T
	d      *MIGDynamic
	client *fake.Clientset
	events *migEvents
	pods   []*corev1.Pod
	now    time.Time
}

func newMIGDynamicEnv(t *testing.T, nodes []*corev1.Node, pods ...*corev1.Pod) *migDynamicEnv {
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	e := &migDynamicEnv{t: t, client: fake.NewClientset(objs...), events: &migEvents{}, pods: pods, now: time.Unix(1000, 0)}
	e.d = &MIGDynamic{
		Cache:  newTestCache(t, nodes, pods),
		Pods:   func() ([]*corev1.Pod, error) { return e.pods, nil },
		Nodes:  e.nodes,
		Client: e.client, Events: e.events,
		Now: func() time.Time { return e.now },
	}
	return e
}

func (e *migDynamicEnv) nodes() ([]*corev1.Node, error) {
	l, err := e.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*corev1.Node
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out, nil
}

func (e *migDynamicEnv) sync() {
	e.t.Helper()
	if err := e.d.Sync(context.Background()); err != nil {
		e.t.Fatalf("Sync: %v", err)
	}
}

// request is the node's request, nil when there is none.
func (e *migDynamicEnv) request(node string) *api.MIGLayoutRequest {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	v, ok := n.Annotations[api.AnnotationMIGLayoutRequest]
	if !ok {
		return nil
	}
	r, err := api.ParseMIGLayoutRequest(v)
	if err != nil {
		e.t.Fatalf("request on %s: %v", node, err)
	}
	return r
}

func (e *migDynamicEnv) setAnnotation(node, key, value string) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.Annotations[key] = value
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestMIGDynamicAsksOnlyServingNodes: a node whose agent does not serve
// MIG layout requests (no dynamicMIG in its inventory) is never asked; the
// pod is told no node serves dynamic MIG. A node whose agent serves is
// asked, and the request names the pod.
func TestMIGDynamicAsksOnlyServingNodes(t *testing.T) {
	pod := unschedulableMIGPod("p", "4g.20gb")
	e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "off", false)}, pod)
	e.sync()
	if r := e.request("off"); r != nil {
		t.Fatalf("a node whose agent serves no request was asked: %+v", r)
	}
	un := e.events.with("MIGRepartitionUnavailable")
	if len(un) != 1 || !strings.Contains(un[0], "p Warning") || !strings.Contains(un[0], "off") || !strings.Contains(un[0], "--dynamic-mig") {
		t.Fatalf("events %q", e.events.all)
	}
	e.now = e.now.Add(time.Minute)
	e.sync()
	if n := len(e.events.with("MIGRepartitionUnavailable")); n != 1 {
		t.Fatalf("told %d times", n)
	}

	e = newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "off", false), servingMIGNode(t, "on", true)}, pod)
	e.sync()
	if r := e.request("off"); r != nil {
		t.Fatalf("a node whose agent serves no request was asked: %+v", r)
	}
	r := e.request("on")
	if r == nil || r.Pod == nil || r.Pod.String() != "default/p" || r.Pod.UID != string(pod.UID) || r.Generation != 1 {
		t.Fatalf("request on the serving node: %+v", r)
	}
	req := e.events.with("MIGRepartitionRequested")
	if len(req) != 1 || !strings.Contains(req[0], "node on was asked") {
		t.Fatalf("events %q", e.events.all)
	}
	if len(e.events.with("MIGRepartitionUnavailable")) != 0 {
		t.Fatalf("told unavailable although a node serves: %q", e.events.all)
	}
}

// TestMIGDynamicWithdraws: a request whose pod is gone, was replaced by a
// pod of the same name, was placed, or whose node's agent stopped serving,
// is removed from the Node; one whose pod still waits stays, and the pod
// is told which node has not answered yet.
func TestMIGDynamicWithdraws(t *testing.T) {
	ask := func(t *testing.T, e *migDynamicEnv) string {
		t.Helper()
		e.sync()
		if e.request("on") == nil {
			t.Fatal("not asked")
		}
		n, _ := e.client.CoreV1().Nodes().Get(context.Background(), "on", metav1.GetOptions{})
		return n.Annotations[api.AnnotationMIGLayoutRequest]
	}
	t.Run("pod waits: kept, told it is unanswered", func(t *testing.T) {
		e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "on", true)}, unschedulableMIGPod("p", "4g.20gb"))
		ask(t, e)
		e.now = e.now.Add(5 * time.Second)
		e.sync()
		if e.request("on") == nil {
			t.Fatal("withdrawn while its pod waits")
		}
		if got := e.events.with("MIGRepartitionUnanswered"); len(got) != 0 {
			t.Fatalf("unanswered before the cooldown: %q", got)
		}
		e.now = e.now.Add(40 * time.Second)
		e.sync()
		e.sync()
		got := e.events.with("MIGRepartitionUnanswered")
		if len(got) != 1 || !strings.Contains(got[0], "p Warning") || !strings.Contains(got[0], "node on was asked 45s ago") || !strings.Contains(got[0], "request 1") {
			t.Fatalf("events %q", e.events.all)
		}
		if r := e.request("on"); r == nil || r.Generation != 1 {
			t.Fatalf("request %+v", r)
		}
	})
	t.Run("refused: the pod is told the agent's answer", func(t *testing.T) {
		e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "on", true)}, unschedulableMIGPod("p", "4g.20gb"))
		ask(t, e)
		e.setAnnotation("on", api.AnnotationMIGLayoutStatus, `{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutStatus","generation":1,"state":"Refused","message":"GPU 2 has a tenant"}`)
		e.sync()
		got := e.events.with("MIGRepartitionRefused")
		if len(got) != 1 || !strings.Contains(got[0], "GPU 2 has a tenant") {
			t.Fatalf("events %q", e.events.all)
		}
	})
	for _, tc := range []struct {
		name   string
		change func(e *migDynamicEnv)
		why    string
	}{
		{"pod deleted", func(e *migDynamicEnv) { e.pods = nil }, "its pod default/p is gone"},
		{"pod replaced", func(e *migDynamicEnv) {
			p := unschedulableMIGPod("p", "4g.20gb")
			p.UID = "other"
			e.pods = []*corev1.Pod{p}
		}, "a new pod has the name"},
		{"pod terminating", func(e *migDynamicEnv) {
			p := e.pods[0].DeepCopy()
			now := metav1.Now()
			p.DeletionTimestamp = &now
			e.pods = []*corev1.Pod{p}
		}, "being deleted"},
		{"pod placed elsewhere", func(e *migDynamicEnv) {
			p := e.pods[0].DeepCopy()
			p.Spec.NodeName = "elsewhere"
			e.pods = []*corev1.Pod{p}
		}, "placed on node elsewhere"},
		{"agent stopped serving", func(e *migDynamicEnv) {
			n := servingMIGNode(e.t, "on", false)
			e.setAnnotation("on", api.AnnotationGPUInventory, n.Annotations[api.AnnotationGPUInventory])
		}, "does not serve"},
		{"malformed", func(e *migDynamicEnv) {
			e.setAnnotation("on", api.AnnotationMIGLayoutRequest, `{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutRequest","generation":1,"gpus":[]}`)
		}, "pod: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "on", true)}, unschedulableMIGPod("p", "4g.20gb"))
			ask(t, e)
			tc.change(e)
			e.sync()
			if r := e.request("on"); r != nil {
				t.Fatalf("request not withdrawn: %+v", r)
			}
			got := e.events.with("MIGRepartitionWithdrawn")
			if len(got) != 1 || !strings.HasPrefix(got[0], "on Normal") || !strings.Contains(got[0], tc.why) {
				t.Fatalf("events %q, want a withdrawal saying %q", e.events.all, tc.why)
			}
		})
	}
	t.Run("a newer request is not removed", func(t *testing.T) {
		e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "on", true)}, unschedulableMIGPod("p", "4g.20gb"))
		old := ask(t, e)
		e.pods = nil
		nodes, _ := e.nodes()
		plan := e.d.decide(e.pods, nodes)
		if len(plan.withdraw) != 1 || plan.withdraw[0].value != old {
			t.Fatalf("plan %+v", plan)
		}
		// A newer request is written between the decision and the removal.
		e.setAnnotation("on", api.AnnotationMIGLayoutRequest, strings.Replace(old, `"generation":1`, `"generation":2`, 1))
		if err := e.d.carry(context.Background(), plan); err == nil {
			t.Fatal("removing a request that changed meanwhile succeeded")
		}
		if r := e.request("on"); r == nil || r.Generation != 2 {
			t.Fatalf("request %+v", r)
		}
	})
}

// TestMIGDynamicUnknownRecordedInstance: a pod recorded holding an instance
// the node's inventory does not list (destroyed out of band, the node's
// layout lost) makes no GPU of the node a candidate: any may be its.
func TestMIGDynamicUnknownRecordedInstance(t *testing.T) {
	holder := testbuild.Pod("holder").Node("on").HoldingMIG("7g.40gb", [2]int{2, 9}).Obj()
	e := newMIGDynamicEnv(t, []*corev1.Node{servingMIGNode(t, "on", true)}, holder, unschedulableMIGPod("p", "4g.20gb"))
	e.sync()
	if r := e.request("on"); r != nil {
		t.Fatalf("asked a node where a pod holds an instance it does not list: %+v", r)
	}
}
