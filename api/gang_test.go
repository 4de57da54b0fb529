package api

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func gangPod(labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "worker-0", Labels: labels, Annotations: annotations}}
}

func TestGangOf(t *testing.T) {
	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    *Gang
		wantOK  bool
		wantErr string
	}{
		{name: "no gang", pod: gangPod(nil, nil)},
		{
			name:   "annotations",
			pod:    gangPod(nil, map[string]string{AnnotationGang: "train", AnnotationGangMinMember: "4", AnnotationGangTimeout: "30"}),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromAnnotations, MinMember: 4, Timeout: 30 * time.Second},
			wantOK: true,
		},
		{
			name:   "PodGroup label, size from the object",
			pod:    gangPod(map[string]string{LabelPodGroup: "train"}, nil),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromPodGroup, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		{
			name: "topology levels",
			pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2",
				AnnotationGangTopology: "nvidia.com/gpu.clique, rack:required"}),
			want: &Gang{Namespace: "ml", Name: "t", Source: GangFromAnnotations, MinMember: 2, Timeout: DefaultGangTimeout,
				Levels: []TopologyLevel{{Key: "nvidia.com/gpu.clique"}, {Key: "rack", Required: true}}},
			wantOK: true,
		},
		{name: "annotation without size", pod: gangPod(nil, map[string]string{AnnotationGang: "t"}), wantOK: true, wantErr: "tessera.dev/gang-min-member is required"},
		{name: "size not a number", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "four"}), wantOK: true, wantErr: `gang-min-member="four"`},
		{name: "size zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "0"}), wantOK: true, wantErr: "at least 1"},
		{name: "bad timeout", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "-5"}), wantOK: true, wantErr: "gang-timeout-seconds"},
		{name: "names disagree", pod: gangPod(map[string]string{LabelPodGroup: "a"}, map[string]string{AnnotationGang: "b", AnnotationGangMinMember: "1"}), wantOK: true, wantErr: "name different gangs"},
		{name: "empty name", pod: gangPod(map[string]string{LabelPodGroup: " "}, nil), wantOK: true, wantErr: "empty"},
		{name: "bad level mode", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTopology: "rack:always"}), wantOK: true, wantErr: `mode "always"`},
		{name: "repeated level", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTopology: "rack,rack"}), wantOK: true, wantErr: "repeated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, ok, err := GangOf(tc.pod)
			if ok != tc.wantOK {
				t.Errorf("ok = %v, want %v", ok, tc.wantOK)
			}
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidGang) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "ml/worker-0") {
					t.Fatalf("GangOf error = %v, want ErrInvalidGang naming the pod and containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("GangOf (-want +got):\n%s", diff)
			}
		})
	}
}

func podGroup(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetNamespace("ml")
	u.SetName("train")
	return u
}

func TestApplyPodGroup(t *testing.T) {
	pod := gangPod(map[string]string{LabelPodGroup: "train"}, nil)
	g, _, err := GangOf(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.ApplyPodGroup(podGroup(map[string]any{"minMember": int64(4), "scheduleTimeoutSeconds": int64(60)}), pod); err != nil {
		t.Fatal(err)
	}
	if g.MinMember != 4 || g.Timeout != time.Minute {
		t.Errorf("gang = %+v, want minMember 4 and timeout 1m", g)
	}
	// The pod's own annotation wins over the object.
	pod.Annotations = map[string]string{AnnotationGangMinMember: "2"}
	g, _, _ = GangOf(pod)
	if err := g.ApplyPodGroup(podGroup(map[string]any{"minMember": int64(4)}), pod); err != nil || g.MinMember != 2 {
		t.Errorf("gang = %+v, %v; want the annotation's minMember 2", g, err)
	}
	for name, spec := range map[string]map[string]any{
		"no minMember":     {},
		"zero minMember":   {"minMember": int64(0)},
		"string minMember": {"minMember": "4"},
		"bad timeout":      {"minMember": int64(1), "scheduleTimeoutSeconds": int64(0)},
	} {
		g, _, _ := GangOf(gangPod(map[string]string{LabelPodGroup: "train"}, nil))
		if err := g.ApplyPodGroup(podGroup(spec), pod); !errors.Is(err, ErrInvalidGang) {
			t.Errorf("%s: ApplyPodGroup = %v, want ErrInvalidGang", name, err)
		}
	}
}

func TestHasGangGate(t *testing.T) {
	pod := gangPod(nil, nil)
	if HasGangGate(pod) {
		t.Error("a pod without gates has the gang gate")
	}
	pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other"}, {Name: SchedulingGateGang}}
	if !HasGangGate(pod) {
		t.Error("the gang gate is not seen")
	}
}

func TestGangPlanRoundTrip(t *testing.T) {
	expires := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	ann := map[string]string{}
	in := GangPlan{Gang: "train", Node: "n1", GPU: &GPURef{UUID: "GPU-11111111-2222-3333-4444-555555555555", Index: 3}, Expires: expires}
	if err := SetGangPlan(ann, in); err != nil {
		t.Fatal(err)
	}
	out, ok, err := GetGangPlan(ann)
	if err != nil || !ok {
		t.Fatalf("GetGangPlan = %v, %v", ok, err)
	}
	in.APIVersion, in.Kind = Version, KindGangPlan
	if diff := cmp.Diff(&in, out); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, ok, err := GetGangPlan(map[string]string{}); ok || err != nil {
		t.Errorf("absent plan = %v, %v", ok, err)
	}
	for name, v := range map[string]string{
		"garbage":       "{",
		"wrong kind":    `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","gang":"g","node":"n","expires":"2026-11-22T01:00:00Z"}`,
		"no node":       `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","expires":"2026-11-22T01:00:00Z"}`,
		"no expiry":     `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n"}`,
		"unknown field": `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"2026-11-22T01:00:00Z","extra":1}`,
	} {
		if _, ok, err := GetGangPlan(map[string]string{AnnotationGangPlan: v}); !ok || err == nil || !strings.Contains(err.Error(), AnnotationGangPlan) {
			t.Errorf("%s: GetGangPlan = %v, %v; want an error naming the annotation", name, ok, err)
		}
	}
}
