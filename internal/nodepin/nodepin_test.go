package nodepin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

func gated(aff *corev1.Affinity) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0", UID: "u0"},
		Spec: corev1.PodSpec{
			Affinity:        aff,
			SchedulingGates: []corev1.PodSchedulingGate{{Name: "tessera.dev/gang"}},
			Containers:      []corev1.Container{{Name: "c", Image: "busybox"}},
		},
	}
}

func required(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
}

func exprTerm(key string, values ...string) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}}}
}

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// apply runs ops on pod's JSON as the API server would (the same library).
func apply(t *testing.T, pod *corev1.Pod, ops []Op) (*corev1.Pod, error) {
	t.Helper()
	doc, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		return nil, err
	}
	var got corev1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got, nil
}

func TestOpsPinEveryShapeOfAffinity(t *testing.T) {
	zoneA := map[string]string{"zone": "a"}
	for _, tc := range []struct {
		name string
		aff  *corev1.Affinity
		// the pinned pod must match exactly these of the nodes below
		want []string
	}{
		{name: "no affinity", want: []string{"n1", "n1-zone-b"}},
		{name: "pod affinity only", aff: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{}}, want: []string{"n1", "n1-zone-b"}},
		{name: "preferred node affinity only", aff: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: exprTerm("zone", "a")}}}}, want: []string{"n1", "n1-zone-b"}},
		{name: "one expression term", aff: required(exprTerm("zone", "a")), want: []string{"n1"}},
		{name: "two terms (ORed)", aff: required(exprTerm("zone", "a"), exprTerm("zone", "b")), want: []string{"n1", "n1-zone-b"}},
		{name: "a term with fields already", aff: required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n9"}}}}), want: []string{"n1", "n1-zone-b"}},
		{name: "the creator's fields exclude the node", aff: required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}}}}), want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := gated(tc.aff)
			ops, err := Ops(pod, "n1")
			if err != nil {
				t.Fatal(err)
			}
			got, err := apply(t, pod, ops)
			if err != nil {
				t.Fatalf("patch %v: %v", ops, err)
			}
			if !Pinned(got, "n1") {
				t.Errorf("not pinned after the patch: %+v", got.Spec.Affinity)
			}
			// Everything but the required node affinity is as it was.
			before, after := pod.DeepCopy(), got.DeepCopy()
			for _, p := range []*corev1.Pod{before, after} {
				if p.Spec.Affinity != nil && p.Spec.Affinity.NodeAffinity != nil {
					p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
				}
			}
			if tc.aff == nil || tc.aff.NodeAffinity == nil {
				if after.Spec.Affinity != nil && after.Spec.Affinity.NodeAffinity != nil && cmp.Equal(*after.Spec.Affinity.NodeAffinity, corev1.NodeAffinity{}) {
					after.Spec.Affinity.NodeAffinity = nil
				}
				if tc.aff == nil && after.Spec.Affinity != nil && cmp.Equal(*after.Spec.Affinity, corev1.Affinity{}) {
					after.Spec.Affinity = nil
				}
			}
			if d := cmp.Diff(before, after); d != "" {
				t.Errorf("the patch changed more than the required node affinity (-before +after):\n%s", d)
			}
			var matched []string
			for _, c := range []struct {
				id   string
				node *corev1.Node
			}{
				{"n1", node("n1", zoneA)},
				{"n1-zone-b", node("n1", map[string]string{"zone": "b"})}, // n1, had it been labelled zone=b
				{"n2", node("n2", zoneA)},
			} {
				ok, err := nodeaffinity.GetRequiredNodeAffinity(got).Match(c.node)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					matched = append(matched, c.id)
				}
			}
			if d := cmp.Diff(tc.want, matched); d != "" {
				t.Errorf("nodes the pinned pod matches (-want +got):\n%s", d)
			}
		})
	}
}

func TestOpsAreIdempotentAndGuarded(t *testing.T) {
	pod := gated(required(exprTerm("zone", "a")))
	ops, err := Ops(pod, "n1")
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := apply(t, pod, ops)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Ops(pinned, "n1"); err != nil || len(again) != 0 {
		t.Errorf("Ops on a pinned pod = %v, %v; want none", again, err)
	}
	// Read before its creator changed the affinity: the patch fails
	// instead of dropping the creator's change.
	changed := pod.DeepCopy()
	changed.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions = append(
		changed.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions,
		corev1.NodeSelectorRequirement{Key: "rack", Operator: corev1.NodeSelectorOpExists})
	if _, err := apply(t, changed, ops); err == nil {
		t.Error("a patch computed from a stale pod applied to a changed affinity")
	}
	// The same when the stale copy had no affinity at all.
	bare := gated(nil)
	ops, err = Ops(bare, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apply(t, gated(required(exprTerm("zone", "a"))), ops); err == nil {
		t.Error("a patch computed from a pod without affinity replaced an affinity set since")
	}
}

func TestOpsRefusals(t *testing.T) {
	ungated := gated(nil)
	ungated.Spec.SchedulingGates = nil
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		node string
		want string
	}{
		{"no node", gated(nil), "", "no node"},
		{"not gated", ungated, "n1", "no scheduling gates"},
		{"an empty term", gated(required(corev1.NodeSelectorTerm{})), "n1", "term 0 names no requirement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := Ops(tc.pod, tc.node)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Ops = %v, %v; want an error with %q", ops, err, tc.want)
			}
		})
	}
}

func TestPinned(t *testing.T) {
	pin := func(t corev1.NodeSelectorTerm, node string) corev1.NodeSelectorTerm {
		t.MatchFields = append(t.MatchFields, Requirement(node))
		return t
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"no affinity", gated(nil), false},
		{"every term pinned", gated(required(pin(exprTerm("zone", "a"), "n1"), pin(exprTerm("zone", "b"), "n1"))), true},
		{"one term unpinned", gated(required(pin(exprTerm("zone", "a"), "n1"), exprTerm("zone", "b"))), false},
		{"pinned elsewhere", gated(required(pin(exprTerm("zone", "a"), "n2"))), false},
		{"no terms", gated(required()), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Pinned(tc.pod, "n1"); got != tc.want {
				t.Errorf("Pinned = %v, want %v", got, tc.want)
			}
		})
	}
}
