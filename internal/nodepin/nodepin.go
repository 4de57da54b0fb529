// Package nodepin narrows a gated pod's required node affinity to the one
// node Tessera planned for it, in the same JSON patch that lifts the pod's
// scheduling gates.
//
// Why: kube-scheduler runs its Filter plugins (and the extender's filter)
// on every node for every pod, though a planned gang member may go to one
// node only. With metadata.name In [node] in every required term, the
// NodeAffinity plugin's PreFilter hands kube-scheduler that one node, so a
// member costs one node's evaluation instead of the cluster's, and a
// sampled percentageOfNodesToScore can no longer hide the planned node.
//
// The API server allows the change only while the pod is gated
// (KEP-3838, "mutable scheduling directives"): a required node affinity
// may be set when it has no terms, and otherwise each term may only gain
// requirements. Both narrow: the pod may still go only where its creator
// allowed. A pin is for good; the planner evicts a member whose plan
// expires unbound, and its controller recreates it unpinned.
package nodepin

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Op is one JSON patch (RFC 6902) operation.
type Op = map[string]any

const (
	pathAffinity = "/spec/affinity"
	pathNode     = pathAffinity + "/nodeAffinity"
	pathRequired = pathNode + "/requiredDuringSchedulingIgnoredDuringExecution"
	pathTerms    = pathRequired + "/nodeSelectorTerms"
)

// Requirement is the requirement a pin adds to each term.
func Requirement(node string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
}

// Ops returns the JSON patch operations that pin pod to node, each
// addition preceded by a test of what it builds on (so a pod changed
// since it was read fails the patch instead of losing its creator's
// affinity). It returns no operations and no error when the pod is pinned
// to node already, and an error when the pod cannot be pinned: no node, no
// scheduling gates (the API server would refuse the change), or a required
// term that names no requirement (it matches no node; the API server
// allows no additions to it).
func Ops(pod *corev1.Pod, node string) ([]Op, error) {
	if node == "" {
		return nil, fmt.Errorf("pin of pod %s/%s: no node", pod.Namespace, pod.Name)
	}
	if len(pod.Spec.SchedulingGates) == 0 {
		return nil, fmt.Errorf("pin of pod %s/%s: the pod has no scheduling gates, so its node affinity cannot change", pod.Namespace, pod.Name)
	}
	if Pinned(pod, node) {
		return nil, nil
	}
	term := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{Requirement(node)}}
	required := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}
	aff := pod.Spec.Affinity
	switch {
	case aff == nil:
		return []Op{test(pathAffinity, nil), add(pathAffinity, &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required}})}, nil
	case aff.NodeAffinity == nil:
		return []Op{test(pathNode, nil), add(pathNode, &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: required})}, nil
	case aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil:
		return []Op{test(pathRequired, nil), add(pathRequired, required)}, nil
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return []Op{test(pathTerms, terms), add(pathTerms, required.NodeSelectorTerms)}, nil
	}
	ops := []Op{test(pathTerms, terms)}
	for i, t := range terms {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			return nil, fmt.Errorf("pin of pod %s/%s: required node affinity term %d names no requirement", pod.Namespace, pod.Name, i)
		}
		if pinnedTerm(t, node) {
			continue
		}
		p := fmt.Sprintf("%s/%d/matchFields", pathTerms, i)
		if len(t.MatchFields) == 0 {
			ops = append(ops, add(p, term.MatchFields))
		} else {
			ops = append(ops, add(p+"/-", Requirement(node)))
		}
	}
	return ops, nil
}

// Pinned reports whether pod may go to node only: every required node
// affinity term asks metadata.name In [node] and nothing else of the name.
func Pinned(pod *corev1.Pod, node string) bool {
	aff := pod.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return false
	}
	for _, t := range terms {
		if !pinnedTerm(t, node) {
			return false
		}
	}
	return true
}

func pinnedTerm(t corev1.NodeSelectorTerm, node string) bool {
	return slices.ContainsFunc(t.MatchFields, func(r corev1.NodeSelectorRequirement) bool {
		return r.Key == metav1.ObjectNameField && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 && r.Values[0] == node
	})
}

func test(path string, value any) Op { return Op{"op": "test", "path": path, "value": value} }

func add(path string, value any) Op { return Op{"op": "add", "path": path, "value": value} }
