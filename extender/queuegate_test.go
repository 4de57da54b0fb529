package extender

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

type namespaces map[string]bool

func (n namespaces) Queued(ns string) bool { return n[ns] }

// A GPU pod of a queued namespace that its owner ungated (or that the
// webhook, failing open, never gated) passes no node and is not bound
// until the planner admits it with a plan: nothing its creator writes
// skips the queue.
func TestUngatedQueuedPodWaitsForItsPlan(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(8, "A100", 40960).Obj()}
	pod := testbuild.Pod("p").Whole(1).Obj()
	pod.Namespace = "ns-a"
	other := testbuild.Pod("o").Whole(1).Obj() // a namespace no Queue serves
	cpu := testbuild.Pod("c").CPU("1").Obj()
	cpu.Namespace = "ns-a" // no GPU: not the queue's
	f := newFixture(t, nodes, nil, pod, other, cpu)
	f.server.SetQueues(namespaces{"ns-a": true})
	names := []string{"a"}
	for _, tc := range []struct {
		pod  *corev1.Pod
		pass bool
	}{{pod, false}, {other, true}, {cpu, true}} {
		var res extenderv1.ExtenderFilterResult
		f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &names}, &res)
		if passed := res.NodeNames != nil && len(*res.NodeNames) == 1; passed != tc.pass {
			t.Errorf("%s/%s: filter passed %v (reasons %v), want %v", tc.pod.Namespace, tc.pod.Name, res.NodeNames, res.FailedNodes, tc.pass)
		}
	}
	var br extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: "a"}, &br)
	if !strings.Contains(br.Error, "waits to be admitted in its queue's order") {
		t.Errorf("bind answered %q, want a refusal", br.Error)
	}
	planned := withPlan(t, pod, "a", -1)
	var res extenderv1.ExtenderFilterResult
	f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: planned, NodeNames: &names}, &res)
	if res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Errorf("planned: filter passed %v, want its node", res.NodeNames)
	}
}
