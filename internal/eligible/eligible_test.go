package eligible

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAllows(t *testing.T) {
	noSchedule := corev1.Taint{Key: "gpu", Value: "mig", Effect: corev1.TaintEffectNoSchedule}
	tolerates := []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "mig", Effect: corev1.TaintEffectNoSchedule}}
	// One term per name: the API server allows a single value for a
	// field selector's In.
	byName := func(names ...string) *corev1.Affinity {
		sel := &corev1.NodeSelector{}
		for _, n := range names {
			sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
		}
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: sel}}
	}
	for _, tc := range []struct {
		name string
		node func(*corev1.Node)
		spec corev1.PodSpec
		want bool
	}{
		{name: "a plain node", want: true},
		{name: "cordoned", node: func(n *corev1.Node) { n.Spec.Unschedulable = true }},
		{name: "cordoned, the pod tolerates it", node: func(n *corev1.Node) { n.Spec.Unschedulable = true },
			spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists}}}, want: true},
		{name: "a NoSchedule taint not tolerated", node: func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{noSchedule} }},
		{name: "a NoSchedule taint tolerated", node: func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{noSchedule} },
			spec: corev1.PodSpec{Tolerations: tolerates}, want: true},
		{name: "a NoExecute taint not tolerated", node: func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gone", Effect: corev1.TaintEffectNoExecute}}
		}},
		{name: "a PreferNoSchedule taint", node: func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "busy", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, want: true},
		{name: "node selector matched", spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"}}, want: true},
		{name: "node selector not matched", spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"}}},
		{name: "required affinity by name, matched", spec: corev1.PodSpec{Affinity: byName("n", "m")}, want: true},
		{name: "required affinity by name, not matched", spec: corev1.PodSpec{Affinity: byName("m")}},
		{name: "required affinity without terms", spec: corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "a"}}}
			if tc.node != nil {
				tc.node(node)
			}
			p := For(&corev1.Pod{Spec: tc.spec})
			if got := p.Allows(node); got != tc.want {
				t.Errorf("Allows = %v, want %v", got, tc.want)
			}
			// The same through the trimmed node.
			trimmed := Node(node.Name, node.Labels, node.Spec.Taints, node.Spec.Unschedulable)
			if got := p.Allows(trimmed); got != tc.want {
				t.Errorf("Allows(Node(...)) = %v, want %v", got, tc.want)
			}
		})
	}
	if For(&corev1.Pod{}).Allows(nil) {
		t.Error("an unknown node is eligible")
	}
}

func TestNodeKeepsHardTaints(t *testing.T) {
	n := Node("n", nil, []corev1.Taint{
		{Key: "a", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: "b", Effect: corev1.TaintEffectNoSchedule},
		{Key: "c", Effect: corev1.TaintEffectNoExecute},
	}, true)
	if len(n.Spec.Taints) != 2 || n.Spec.Taints[0].Key != "b" || n.Spec.Taints[1].Key != "c" || !n.Spec.Unschedulable {
		t.Errorf("Node = %+v", n.Spec)
	}
}

// TestAffinity: the node affinity operators, as kube-scheduler reads them.
func TestAffinity(t *testing.T) {
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	a0 := node("a0", map[string]string{"pool": "a", "gen": "9"})
	b0 := node("b0", map[string]string{"pool": "b"})
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	affinity := func(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	expr := func(r corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{r}}
	}
	for _, tc := range []struct {
		name   string
		spec   corev1.PodSpec
		a0, b0 bool
	}{
		{"nothing", corev1.PodSpec{}, true, true},
		{"nodeSelector", corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"}}, true, false},
		{"In", corev1.PodSpec{Affinity: affinity(expr(req("pool", corev1.NodeSelectorOpIn, "a", "c")))}, true, false},
		{"NotIn matches a node without the label", corev1.PodSpec{Affinity: affinity(expr(req("gen", corev1.NodeSelectorOpNotIn, "9")))}, false, true},
		{"Exists", corev1.PodSpec{Affinity: affinity(expr(req("gen", corev1.NodeSelectorOpExists)))}, true, false},
		{"DoesNotExist", corev1.PodSpec{Affinity: affinity(expr(req("gen", corev1.NodeSelectorOpDoesNotExist)))}, false, true},
		{"Gt", corev1.PodSpec{Affinity: affinity(expr(req("gen", corev1.NodeSelectorOpGt, "8")))}, true, false},
		{"Lt", corev1.PodSpec{Affinity: affinity(expr(req("gen", corev1.NodeSelectorOpLt, "9")))}, false, false},
		{"terms are ORed", corev1.PodSpec{Affinity: affinity(
			expr(req("pool", corev1.NodeSelectorOpIn, "b")),
			corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "a0")}})}, true, true},
		{"an empty term matches nothing", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{})}, false, false},
		{"selector and affinity both apply", corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"},
			Affinity: affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "a0")}})}, false, false},
	} {
		p := For(&corev1.Pod{Spec: tc.spec})
		if got := p.Allows(a0); got != tc.a0 {
			t.Errorf("%s: a0 allowed %v, want %v", tc.name, got, tc.a0)
		}
		if got := p.Allows(b0); got != tc.b0 {
			t.Errorf("%s: b0 allowed %v, want %v", tc.name, got, tc.b0)
		}
	}
}

// TestWhy: the reason agrees with Allows and names what refuses the pod.
func TestWhy(t *testing.T) {
	node := func(f func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "a"}}}
		if f != nil {
			f(n)
		}
		return n
	}
	for _, tc := range []struct {
		node *corev1.Node
		spec corev1.PodSpec
		want string
	}{
		{node(nil), corev1.PodSpec{}, ""},
		{nil, corev1.PodSpec{}, "node not known"},
		{node(func(n *corev1.Node) { n.Spec.Unschedulable = true }), corev1.PodSpec{}, "node is cordoned (unschedulable)"},
		{node(func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gpu", Value: "mig", Effect: corev1.TaintEffectNoSchedule}}
		}), corev1.PodSpec{}, "untolerated taint {gpu: mig}"},
		{node(nil), corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"}}, "node selector or required node affinity not matched"},
	} {
		p := For(&corev1.Pod{Spec: tc.spec})
		if got := p.Why(tc.node); got != tc.want {
			t.Errorf("Why = %q, want %q", got, tc.want)
		}
		if p.Allows(tc.node) != (tc.want == "") {
			t.Errorf("Allows = %v, Why %q", p.Allows(tc.node), tc.want)
		}
	}
}

// BenchmarkAllowsTainted: Allows on a node whose taint the pod does not
// tolerate allocates nothing (planning asks it of every node for every
// member).
func BenchmarkAllowsTainted(b *testing.B) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Value: "mig", Effect: corev1.TaintEffectNoSchedule}}}}
	p := For(&corev1.Pod{})
	b.ReportAllocs()
	for b.Loop() {
		if p.Allows(node) {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkAllowsSelector: a pod with a node selector on a node it
// matches.
func BenchmarkAllowsSelector(b *testing.B) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "a", "kubernetes.io/hostname": "n"}}}
	p := For(&corev1.Pod{Spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"}}})
	b.ReportAllocs()
	for b.Loop() {
		if !p.Allows(node) {
			b.Fatal("refused")
		}
	}
}
