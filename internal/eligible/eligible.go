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

// Allows reports whether the pod may be scheduled on node (nil: no).
func (p Pod) Allows(node *corev1.Node) bool { return p.Why(node) == "" }

// Why says why the pod may not be scheduled on node, in kube-scheduler's
// words; "" when it may (Allows).
func (p Pod) Why(node *corev1.Node) string {
	switch {
	case node == nil:
		return "node not known"
	case node.Spec.Unschedulable && !p.cordonOK:
		return "node is cordoned (unschedulable)"
	}
	if t, bad := corev1helpers.FindMatchingUntoleratedTaint(node.Spec.Taints, p.tolerations, hard); bad {
		return fmt.Sprintf("untolerated taint {%s: %s}", t.Key, t.Value)
	}
	if ok, err := p.affinity.Match(node); err != nil || !ok {
		return "node selector or required node affinity not matched"
	}
	return ""
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
