// Package eligible says whether a pod may be scheduled on a node by what
// kube-scheduler's filters check there apart from resources: the node's
// cordon (NodeUnschedulable: unless the pod tolerates
// node.kubernetes.io/unschedulable), its NoSchedule and NoExecute taints
// (TaintToleration) and the pod's node selector and required node
// affinity (NodeAffinity), through the helpers kube-scheduler itself uses
// (k8s.io/component-helpers). It is the one copy of that rule: every
// Tessera component that chooses nodes for a pod asks it (the extender's
// gang planner, preemption and reclaim, consolidation, dynamic MIG, and
// tessera-scheduler's shortlist), so none of them plans a pod where
// kube-scheduler would refuse it, or evicts for room the pod cannot use.
package eligible

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Pod is a pod's constraints, read once and asked of many nodes.
type Pod struct {
	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
	// cordonOK: the pod tolerates a cordoned node's taint.
	cordonOK bool
}

// For reads pod's constraints.
func For(pod *corev1.Pod) Pod {
	return Pod{
		affinity:    nodeaffinity.GetRequiredNodeAffinity(pod),
		tolerations: pod.Spec.Tolerations,
		cordonOK:    corev1helpers.TolerationsTolerateTaint(pod.Spec.Tolerations, &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}),
	}
}

// Allows reports whether the pod may be scheduled on node (nil: no). It
// allocates nothing: planning asks it of every node for every member.
func (p Pod) Allows(node *corev1.Node) bool {
	r, _ := p.refusal(node)
	return r == admitted
}

// Why says why the pod may not be scheduled on node, in kube-scheduler's
// words; "" when it may (Allows).
func (p Pod) Why(node *corev1.Node) string {
	switch r, taint := p.refusal(node); r {
	case unknown:
		return "node not known"
	case cordoned:
		return "node is cordoned (unschedulable)"
	case tainted:
		return fmt.Sprintf("untolerated taint {%s: %s}", taint.Key, taint.Value)
	case unmatched:
		return "node selector or required node affinity not matched"
	}
	return ""
}

// refusal is what keeps a pod off a node, with the taint when it is an
// untolerated one: the checks of Allows and Why, in kube-scheduler's
// order of filters.
type refusal int

const (
	admitted refusal = iota
	unknown
	cordoned
	tainted
	unmatched
)

func (p Pod) refusal(node *corev1.Node) (refusal, corev1.Taint) {
	switch {
	case node == nil:
		return unknown, corev1.Taint{}
	case node.Spec.Unschedulable && !p.cordonOK:
		return cordoned, corev1.Taint{}
	}
	// FindMatchingUntoleratedTaint's test without its filtered copy of
	// the taints.
	for i := range node.Spec.Taints {
		if t := &node.Spec.Taints[i]; hard(t) && !corev1helpers.TolerationsTolerateTaint(p.tolerations, t) {
			return tainted, *t
		}
	}
	if ok, err := p.affinity.Match(node); err != nil || !ok {
		return unmatched, corev1.Taint{}
	}
	return admitted, corev1.Taint{}
}

// hard: the taints that keep a new pod off a node (PreferNoSchedule only
// weighs in kube-scheduler's scores).
func hard(t *corev1.Taint) bool {
	return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
}

// Node is the part of a node Allows reads (name, labels, taints, cordon),
// for a component that keeps less than the whole object: taints other
// than NoSchedule and NoExecute are left out.
func Node(name string, labels map[string]string, taints []corev1.Taint, unschedulable bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
	for _, t := range taints {
		if hard(&t) {
			n.Spec.Taints = append(n.Spec.Taints, t)
		}
	}
	return n
}
