package extender

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/eligible"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// TestNodeStateAccepts: whether a new pod may be scheduled on a node, as
// consolidation asks it of a pod it would move.
func TestNodeStateAccepts(t *testing.T) {
	noSchedule := corev1.Taint{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}
	tolerate := func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	}
	for _, tc := range []struct {
		name string
		node func(*corev1.Node)
		pod  func(*corev1.Pod)
		want bool
	}{
		{name: "a plain node", want: true},
		{name: "cordoned", node: func(n *corev1.Node) { n.Spec.Unschedulable = true }},
		{name: "a NoSchedule taint not tolerated", node: func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{noSchedule} }},
		{name: "a NoSchedule taint tolerated", node: func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{noSchedule} }, pod: tolerate, want: true},
		{name: "a NoExecute taint not tolerated", node: func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gone", Effect: corev1.TaintEffectNoExecute}}
		}},
		{name: "a PreferNoSchedule taint", node: func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "busy", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, want: true},
		{name: "a node selector not matched", pod: func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "b"} }},
		{name: "a node selector matched", node: func(n *corev1.Node) { n.Labels = map[string]string{"pool": "b"} },
			pod: func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "b"} }, want: true},
		{name: "another GPU model", pod: func(p *corev1.Pod) { p.Annotations[api.AnnotationGPUModel] = "H100" }},
		{name: "its GPU model", pod: func(p *corev1.Pod) { p.Annotations[api.AnnotationGPUModel] = "A100" }, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testbuild.Node("n").GPUs(8, "A100", 40960).Obj()
			if tc.node != nil {
				tc.node(node)
			}
			pod := testbuild.Pod("p").Whole(1).Obj()
			if tc.pod != nil {
				tc.pod(pod)
			}
			st := mustState(t, newTestCache(t, []*corev1.Node{node}, nil), "n")
			d, err := ParseDemand(pod)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Accepts(eligible.For(pod), d.Models); got != tc.want {
				t.Errorf("Accepts = %v, want %v", got, tc.want)
			}
		})
	}
}
