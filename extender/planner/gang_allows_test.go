package planner

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
)

func TestPodAllows(t *testing.T) {
	node := func(name string, labels map[string]string) gang.Node {
		return gang.Node{Node: &allocator.Node{Name: name}, Labels: labels}
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
	for _, tc := range []struct {
		name   string
		spec   corev1.PodSpec
		a0, b0 bool
	}{
		{"nothing", corev1.PodSpec{}, true, true},
		{"nodeSelector", corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"}}, true, false},
		{"In", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("pool", corev1.NodeSelectorOpIn, "a", "c")}})}, true, false},
		{"NotIn matches a node without the label", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpNotIn, "9")}})}, false, true},
		{"Exists", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpExists)}})}, true, false},
		{"DoesNotExist", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpDoesNotExist)}})}, false, true},
		{"Gt", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpGt, "8")}})}, true, false},
		{"Lt", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpLt, "9")}})}, false, false},
		{"terms are ORed", corev1.PodSpec{Affinity: affinity(
			corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("pool", corev1.NodeSelectorOpIn, "b")}},
			corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "a0")}})}, true, true},
		{"an empty term matches nothing", corev1.PodSpec{Affinity: affinity(corev1.NodeSelectorTerm{})}, false, false},
		{"selector and affinity both apply", corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"},
			Affinity: affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "a0")}})}, false, false},
	} {
		allows := podAllows(&corev1.Pod{Spec: tc.spec})
		if tc.name == "nothing" {
			if allows != nil {
				t.Errorf("%s: want nil (any node)", tc.name)
			}
			continue
		}
		if got := allows(a0); got != tc.a0 {
			t.Errorf("%s: a0 allowed %v, want %v", tc.name, got, tc.a0)
		}
		if got := allows(b0); got != tc.b0 {
			t.Errorf("%s: b0 allowed %v, want %v", tc.name, got, tc.b0)
		}
	}
}
