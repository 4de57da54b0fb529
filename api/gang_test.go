package api

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
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
		{
			name:   "Volcano annotation, size from the object",
			pod:    gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "train"}),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		{
			name:   "Volcano's newer annotation",
			pod:    gangPod(nil, map[string]string{AnnotationVolcanoGroupNameV2: "train"}),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		{
			name: "Volcano, both spellings and tessera's annotations agreeing",
			pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "train", AnnotationVolcanoGroupNameV2: "train",
				AnnotationGang: "train", AnnotationGangMinMember: "2", AnnotationGangTimeout: "30"}),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 2, Timeout: 30 * time.Second},
			wantOK: true,
		},
		{
			name:   "elastic, with a cap",
			pod:    gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2", AnnotationGangMaxMember: "4"}),
			want:   &Gang{Namespace: "ml", Name: "t", Source: GangFromAnnotations, MinMember: 2, MaxMember: 4, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		{
			name:   "a cap on a PodGroup's gang, its minimum read later",
			pod:    gangPod(map[string]string{LabelPodGroup: "t"}, map[string]string{AnnotationGangMaxMember: "3"}),
			want:   &Gang{Namespace: "ml", Name: "t", Source: GangFromPodGroup, MaxMember: 3, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		{name: "cap below the minimum", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "3", AnnotationGangMaxMember: "2"}), wantOK: true, wantErr: "gang-max-member=2 is below the gang's minimum of 3 members"},
		{name: "cap not a number", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangMaxMember: "many"}), wantOK: true, wantErr: `gang-max-member="many" is not a number of members: write a whole number with the digits 0-9 only`},
		{name: "cap zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangMaxMember: "0"}), wantOK: true, wantErr: "gang-max-member"},
		{name: "annotation without size", pod: gangPod(nil, map[string]string{AnnotationGang: "t"}), wantOK: true, wantErr: "tessera.dev/gang-min-member is required"},
		{name: "size not a number", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "four"}), wantOK: true, wantErr: `gang-min-member="four"`},
		{name: "size zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "0"}), wantOK: true, wantErr: "must be 1..2147483647"},
		{name: "bad timeout", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "-5"}), wantOK: true, wantErr: "gang-timeout-seconds"},
		{name: "names disagree", pod: gangPod(map[string]string{LabelPodGroup: "a"}, map[string]string{AnnotationGang: "b", AnnotationGangMinMember: "1"}), wantOK: true, wantErr: "name different gangs"},
		{name: "empty name", pod: gangPod(map[string]string{LabelPodGroup: " "}, nil), wantOK: true, wantErr: "empty"},
		{name: "empty Volcano name", pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: ""}), wantOK: true, wantErr: "annotation scheduling.k8s.io/group-name) is empty"},
		{name: "Volcano spellings disagree", pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "a", AnnotationVolcanoGroupNameV2: "b"}), wantOK: true, wantErr: `scheduling.k8s.io/group-name="a" and annotation scheduling.volcano.sh/group-name="b" name different gangs`},
		{name: "Volcano and tessera disagree", pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "a", AnnotationGang: "b", AnnotationGangMinMember: "1"}), wantOK: true, wantErr: "name different gangs"},
		{name: "both PodGroup kinds", pod: gangPod(map[string]string{LabelPodGroup: "a"}, map[string]string{AnnotationVolcanoGroupName: "a"}), wantOK: true, wantErr: "scheduler-plugins PodGroup and annotation scheduling.k8s.io/group-name a Volcano PodGroup"},
		{name: "Volcano with a bad size", pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "a", AnnotationGangMinMember: "0"}), wantOK: true, wantErr: "must be 1..2147483647"},
		// Sizes, caps and timeouts are plain decimals (ParseDecimal), as
		// tessera.dev/gpu-count: one spelling per number.
		{name: "size with a space", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: " 2"}), wantOK: true, wantErr: `gang-min-member=" 2" is not a number of members: write a whole number with the digits 0-9 only`},
		{name: "size with a trailing space", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2 "}), wantOK: true, wantErr: "digits 0-9 only"},
		{name: "size with a sign", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "+2"}), wantOK: true, wantErr: "digits 0-9 only"},
		{name: "size with a leading zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "02"}), wantOK: true, wantErr: `gang-min-member="02" is not a number of members: no leading zero`},
		{name: "size empty", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: ""}), wantOK: true, wantErr: "empty"},
		{name: "size beyond an int32", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2147483648"}), wantOK: true, wantErr: "must be 1..2147483647"},
		{name: "size in an exponent", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2e0"}), wantOK: true, wantErr: "digits 0-9 only"},
		{name: "cap with spaces", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2", AnnotationGangMaxMember: " 4 "}), wantOK: true, wantErr: `gang-max-member=" 4 "`},
		{name: "cap with a leading zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "2", AnnotationGangMaxMember: "04"}), wantOK: true, wantErr: "no leading zero"},
		{name: "timeout with a sign", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "+30"}), wantOK: true, wantErr: `gang-timeout-seconds="+30" is not a number of seconds: write a whole number with the digits 0-9 only`},
		{name: "timeout with a leading zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "030"}), wantOK: true, wantErr: "no leading zero"},
		{name: "timeout zero", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "0"}), wantOK: true, wantErr: "must be 1..9223372036"},
		{name: "timeout longer than a time.Duration", pod: gangPod(nil, map[string]string{AnnotationGang: "t", AnnotationGangMinMember: "1", AnnotationGangTimeout: "9223372037"}), wantOK: true, wantErr: "must be 1..9223372036"},
		// A gang's name is a DNS-1123 subdomain, as a PodGroup's: it is
		// part of the keys a gang is filed under ("gang ml/train").
		{name: "name not a DNS-1123 subdomain", pod: gangPod(nil, map[string]string{AnnotationGang: "Not_A Valid/Name", AnnotationGangMinMember: "2"}), wantOK: true, wantErr: `the gang name "Not_A Valid/Name" (annotation tessera.dev/gang) is not a valid name: a lowercase RFC 1123 subdomain`},
		{name: "name in capitals", pod: gangPod(nil, map[string]string{AnnotationGang: "Train", AnnotationGangMinMember: "2"}), wantOK: true, wantErr: "is not a valid name"},
		{name: "name with a space", pod: gangPod(nil, map[string]string{AnnotationGang: " train", AnnotationGangMinMember: "2"}), wantOK: true, wantErr: "is not a valid name"},
		{name: "PodGroup label not a PodGroup's name", pod: gangPod(map[string]string{LabelPodGroup: "Train_1"}, nil), wantOK: true, wantErr: "(label scheduling.x-k8s.io/pod-group) is not a valid name"},
		{name: "Volcano name not a PodGroup's name", pod: gangPod(nil, map[string]string{AnnotationVolcanoGroupName: "a/b"}), wantOK: true, wantErr: "(annotation scheduling.k8s.io/group-name) is not a valid name"},
		{
			name:   "dotted name",
			pod:    gangPod(nil, map[string]string{AnnotationGang: "train.v2", AnnotationGangMinMember: "2"}),
			want:   &Gang{Namespace: "ml", Name: "train.v2", Source: GangFromAnnotations, MinMember: 2, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
		// Gang-only annotations on a pod that declares no gang: refused,
		// not taken as a plain pod.
		{name: "size without a gang", pod: gangPod(nil, map[string]string{AnnotationGangMinMember: "2"}), wantOK: true, wantErr: "annotation tessera.dev/gang-min-member needs a gang: annotation tessera.dev/gang"},
		{name: "cap without a gang", pod: gangPod(nil, map[string]string{AnnotationGangMaxMember: "2"}), wantOK: true, wantErr: "annotation tessera.dev/gang-max-member needs a gang"},
		{name: "timeout without a gang", pod: gangPod(nil, map[string]string{AnnotationGangTimeout: "30"}), wantOK: true, wantErr: "annotation tessera.dev/gang-timeout-seconds needs a gang"},
		{name: "topology without a gang", pod: gangPod(nil, map[string]string{AnnotationGangTopology: "rack"}), wantOK: true, wantErr: "annotation tessera.dev/gang-topology needs a gang"},
		{name: "other annotations, no gang", pod: gangPod(map[string]string{"app": "x"}, map[string]string{AnnotationGPUCount: "2", "tessera.dev/gang-plan-x": "y"})},
		{
			name:   "PodGroup label with a size of its own",
			pod:    gangPod(map[string]string{LabelPodGroup: "train"}, map[string]string{AnnotationGangMinMember: "1"}),
			want:   &Gang{Namespace: "ml", Name: "train", Source: GangFromPodGroup, MinMember: 1, Timeout: DefaultGangTimeout},
			wantOK: true,
		},
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

func volcanoPodGroup(spec map[string]any) *unstructured.Unstructured {
	u := podGroup(spec)
	u.SetAPIVersion("scheduling.volcano.sh/v1beta1")
	u.SetKind("PodGroup")
	return u
}

func TestApplyVolcanoPodGroup(t *testing.T) {
	volcanoGang := func(ann map[string]string) (*Gang, *corev1.Pod) {
		t.Helper()
		a := map[string]string{AnnotationVolcanoGroupName: "train"}
		for k, v := range ann {
			a[k] = v
		}
		pod := gangPod(nil, a)
		g, ok, err := GangOf(pod)
		if !ok || err != nil || g.Source != GangFromVolcano {
			t.Fatalf("GangOf = %+v, %v, %v", g, ok, err)
		}
		return g, pod
	}
	tests := []struct {
		name string
		ann  map[string]string
		spec map[string]any
		want *Gang
	}{
		{
			name: "minMember, queue and priority class; no timeout in Volcano",
			spec: map[string]any{"minMember": int64(3), "queue": "research", "priorityClassName": "high",
				"minResources": map[string]any{"nvidia.com/gpu": "3"}},
			want: &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 3, Timeout: DefaultGangTimeout, Queue: "research", PriorityClassName: "high"},
		},
		{
			name: "no queue is Volcano's default queue",
			spec: map[string]any{"minMember": int64(1)},
			want: &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 1, Timeout: DefaultGangTimeout, Queue: VolcanoDefaultQueue},
		},
		{
			name: "minTaskMember above minMember raises the size",
			spec: map[string]any{"minMember": int64(2), "minTaskMember": map[string]any{"ps": int64(1), "worker": int64(3)}},
			want: &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 4, Timeout: DefaultGangTimeout, Queue: VolcanoDefaultQueue,
				MinTaskMember: map[string]int{"ps": 1, "worker": 3}},
		},
		{
			name: "minTaskMember below minMember",
			spec: map[string]any{"minMember": int64(5), "minTaskMember": map[string]any{"worker": int64(3)}},
			want: &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 5, Timeout: DefaultGangTimeout, Queue: VolcanoDefaultQueue,
				MinTaskMember: map[string]int{"worker": 3}},
		},
		{
			name: "the pod's annotations win; tessera's timeout applies",
			ann:  map[string]string{AnnotationGangMinMember: "2", AnnotationGangTimeout: "45"},
			spec: map[string]any{"minMember": int64(3), "scheduleTimeoutSeconds": int64(5)},
			want: &Gang{Namespace: "ml", Name: "train", Source: GangFromVolcano, MinMember: 2, Timeout: 45 * time.Second, Queue: VolcanoDefaultQueue},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, pod := volcanoGang(tc.ann)
			if err := g.ApplyPodGroup(volcanoPodGroup(tc.spec), pod); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("gang (-want +got):\n%s", diff)
			}
		})
	}
	for name, tc := range map[string]struct {
		spec    map[string]any
		wantErr string
	}{
		"no minMember":            {map[string]any{"queue": "q"}, "spec.minMember must be an integer from 1 to 2147483647; it is missing"},
		"zero minMember":          {map[string]any{"minMember": int64(0)}, "spec.minMember must be an integer from 1 to 2147483647; got 0"},
		"string minMember":        {map[string]any{"minMember": "3"}, `spec.minMember must be an integer from 1 to 2147483647; got "3"`},
		"minMember above int32":   {map[string]any{"minMember": int64(1) << 31}, "spec.minMember"},
		"negative task minimum":   {map[string]any{"minMember": int64(1), "minTaskMember": map[string]any{"w": int64(-1)}}, `spec.minTaskMember must be a map of task names to integers from 0 to 2147483647 (task "w"); got {"w":-1}`},
		"task minimum a string":   {map[string]any{"minMember": int64(1), "minTaskMember": map[string]any{"w": "1"}}, "spec.minTaskMember"},
		"minTaskMember a list":    {map[string]any{"minMember": int64(1), "minTaskMember": []any{int64(1)}}, "spec.minTaskMember must be a map"},
		"task minimums overflow":  {map[string]any{"minMember": int64(1), "minTaskMember": map[string]any{"a": int64(math.MaxInt32), "b": int64(1)}}, "add up to at most"},
		"queue a number":          {map[string]any{"minMember": int64(1), "queue": int64(3)}, "spec.queue must be a string; got 3"},
		"priority class a number": {map[string]any{"minMember": int64(1), "priorityClassName": true}, "spec.priorityClassName must be a string; got true"},
	} {
		g, pod := volcanoGang(nil)
		before := *g
		err := g.ApplyPodGroup(volcanoPodGroup(tc.spec), pod)
		if !errors.Is(err, ErrInvalidGang) || !strings.Contains(err.Error(), "Volcano PodGroup ml/train") || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: ApplyPodGroup = %v, want ErrInvalidGang naming the Volcano PodGroup and containing %q", name, err, tc.wantErr)
		}
		if diff := cmp.Diff(&before, g); diff != "" {
			t.Errorf("%s: a refused PodGroup changed the gang (-before +after):\n%s", name, diff)
		}
	}
	// An object of the other kind, or another object, never completes it.
	g, pod := volcanoGang(nil)
	if err := g.ApplyPodGroup(podGroupOf("scheduling.x-k8s.io/v1alpha1", map[string]any{"minMember": int64(3)}), pod); err == nil || !strings.Contains(err.Error(), "not of group scheduling.volcano.sh") {
		t.Errorf("a scheduler-plugins object applied to a Volcano gang: %v", err)
	}
	other := volcanoPodGroup(map[string]any{"minMember": int64(3)})
	other.SetName("other")
	if err := g.ApplyPodGroup(other, pod); err == nil {
		t.Error("another PodGroup applied to the gang")
	}
	// And a Volcano object never completes a scheduler-plugins gang.
	spPod := gangPod(map[string]string{LabelPodGroup: "train"}, nil)
	sp, _, _ := GangOf(spPod)
	if err := sp.ApplyPodGroup(volcanoPodGroup(map[string]any{"minMember": int64(3)}), spPod); err == nil || !strings.Contains(err.Error(), "not of group scheduling.x-k8s.io") {
		t.Errorf("a Volcano object applied to a scheduler-plugins gang: %v", err)
	}
	// Nor any object a gang declared by annotations.
	annPod := gangPod(nil, map[string]string{AnnotationGang: "train", AnnotationGangMinMember: "1"})
	ag, _, _ := GangOf(annPod)
	if err := ag.ApplyPodGroup(volcanoPodGroup(map[string]any{"minMember": int64(3)}), annPod); err == nil {
		t.Error("a PodGroup applied to a gang declared by annotations")
	}
}

func podGroupOf(apiVersion string, spec map[string]any) *unstructured.Unstructured {
	u := podGroup(spec)
	u.SetAPIVersion(apiVersion)
	u.SetKind("PodGroup")
	return u
}

func TestGangSourcePodGroupGVR(t *testing.T) {
	for src, want := range map[GangSource]string{GangFromPodGroup: "scheduling.x-k8s.io", GangFromVolcano: "scheduling.volcano.sh", GangFromAnnotations: ""} {
		gvr, ok := src.PodGroupGVR()
		if gvr.Group != want || ok != (want != "") || src.FromPodGroup() != ok {
			t.Errorf("%s: PodGroupGVR = %v, %v", src, gvr, ok)
		}
	}
	if VolcanoPodGroupGVR.String() != "scheduling.volcano.sh/v1beta1, Resource=podgroups" {
		t.Errorf("VolcanoPodGroupGVR = %v", VolcanoPodGroupGVR)
	}
}

// FuzzApplyVolcanoPodGroup: a Volcano PodGroup either completes the gang
// with a valid size, queue and task minimums, or is refused with an error
// naming the object and a spec field, leaving the gang as it was.
func FuzzApplyVolcanoPodGroup(f *testing.F) {
	f.Add(int64(3), true, "research", "high", "worker", int64(2), true, "")
	f.Add(int64(0), true, "", "", "", int64(0), false, "")
	f.Add(int64(2), true, "", "", "worker", int64(5), true, "")
	f.Add(int64(2), false, "", "", "", int64(0), false, "")
	f.Add(int64(1), true, "", "", "w", int64(-1), true, "")
	f.Add(int64(1)<<31, true, "", "", "", int64(0), false, "")
	f.Add(int64(4), true, "q", "", "w", int64(1), true, "2")
	f.Fuzz(func(t *testing.T, minMember int64, hasMin bool, queue, pc, task string, taskMin int64, hasTask bool, podMin string) {
		ann := map[string]string{AnnotationVolcanoGroupName: "train"}
		if podMin != "" {
			ann[AnnotationGangMinMember] = podMin
		}
		pod := gangPod(nil, ann)
		g, _, err := GangOf(pod)
		if err != nil {
			return
		}
		spec := map[string]any{}
		if hasMin {
			spec["minMember"] = minMember
		}
		if queue != "" {
			spec["queue"] = queue
		}
		if pc != "" {
			spec["priorityClassName"] = pc
		}
		if hasTask {
			spec["minTaskMember"] = map[string]any{task: taskMin}
		}
		before := *g
		if err := g.ApplyPodGroup(volcanoPodGroup(spec), pod); err != nil {
			if !errors.Is(err, ErrInvalidGang) || !strings.Contains(err.Error(), "Volcano PodGroup ml/train") || !strings.Contains(err.Error(), "spec.") {
				t.Fatalf("error %v is not ErrInvalidGang naming the PodGroup and a field", err)
			}
			if diff := cmp.Diff(&before, g); diff != "" {
				t.Fatalf("a refused PodGroup changed the gang:\n%s", diff)
			}
			return
		}
		if g.MinMember < 1 || g.Timeout <= 0 || g.Queue == "" || g.Source != GangFromVolcano {
			t.Fatalf("applied an invalid PodGroup: %+v", g)
		}
		if podMin == "" {
			sum := 0
			for _, n := range g.MinTaskMember {
				sum += n
			}
			if g.MinMember < sum || int64(g.MinMember) < minMember {
				t.Fatalf("size %d below minMember %d or the tasks' sum %d", g.MinMember, minMember, sum)
			}
		}
	})
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
	until := expires.Add(-time.Hour)
	for name, in := range map[string]GangPlan{
		"a slice's GPU": {Gang: "train", Node: "n1", GPU: &GPURef{UUID: "GPU-11111111-2222-3333-4444-555555555555", Index: 3}, Expires: expires},
		"a multi-GPU slice's GPUs": {Gang: "spread", Node: "n1", GPU: &GPURef{UUID: "GPU-11111111-2222-3333-4444-555555555555", Index: 3}, Expires: expires,
			Spread: []GPURef{{UUID: "GPU-11111111-2222-3333-4444-666666666666", Index: 6}}},
		"whole GPUs": {Gang: "inf", Node: "n1", Expires: expires, GPUs: []GPURef{
			{UUID: "GPU-11111111-2222-3333-4444-555555555555", Index: 5},
			{UUID: "GPU-11111111-2222-3333-4444-666666666666", Index: 6},
		}},
		"awaiting pods": {Gang: "inf", Node: "n1", Expires: expires, Awaits: []types.UID{"uid-a", "uid-b"}, AwaitUntil: &until},
	} {
		ann := map[string]string{}
		if err := SetGangPlan(ann, in); err != nil {
			t.Fatal(err)
		}
		out, ok, err := GetGangPlan(ann)
		if err != nil || !ok {
			t.Fatalf("%s: GetGangPlan = %v, %v", name, ok, err)
		}
		in.APIVersion, in.Kind = Version, KindGangPlan
		if diff := cmp.Diff(&in, out); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", name, diff)
		}
	}
	if _, ok, err := GetGangPlan(map[string]string{}); ok || err != nil {
		t.Errorf("absent plan = %v, %v", ok, err)
	}
	const head = `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"2026-11-22T01:00:00Z",`
	const g5 = `{"uuid":"GPU-11111111-2222-3333-4444-555555555555","index":5}`
	for name, tc := range map[string]struct{ v, why string }{
		"gpu and gpus":         {head + `"gpu":` + g5 + `,"gpus":[` + g5 + `]}`, "both set"},
		"a GPU twice":          {head + `"gpus":[` + g5 + `,` + g5 + `]}`, "listed twice"},
		"spread without gpu":   {head + `"spread":[` + g5 + `]}`, "spread is set without gpu"},
		"spread repeats gpu":   {head + `"gpu":` + g5 + `,"spread":[` + g5 + `]}`, `spread[0].uuid: "GPU-11111111-2222-3333-4444-555555555555" is listed twice`},
		"spread out of order":  {head + `"gpu":` + g5 + `,"spread":[{"uuid":"GPU-11111111-2222-3333-4444-666666666666","index":4}]}`, "increasing index order, 4 after 5"},
		"spread bad uuid":      {head + `"gpu":` + g5 + `,"spread":[{"uuid":"gpu6","index":6}]}`, "spread[0]: uuid"},
		"spread too wide":      {head + `"gpu":{"uuid":"GPU-11111111-2222-3333-4444-555555555555","index":0},"spread":[` + spreadOf(MaxGPUCount) + `]}`, "at most 16 GPUs, got 17"},
		"bad uuid":             {head + `"gpus":[{"uuid":"gpu5","index":5}]}`, "gpus[0]"},
		"too many":             {head + `"gpus":[` + strings.TrimSuffix(strings.Repeat(g5+",", 65), ",") + `]}`, "at most 64"},
		"awaits without until": {head + `"awaits":["u1"]}`, "awaits is set without awaitUntil"},
		"until without awaits": {head + `"awaitUntil":"2026-11-22T00:02:00Z"}`, "awaitUntil is set without awaits"},
		"a pod awaited twice":  {head + `"awaits":["u1","u1"],"awaitUntil":"2026-11-22T00:02:00Z"}`, `awaits[1]: "u1" is listed twice`},
		"an empty uid":         {head + `"awaits":["u1",""],"awaitUntil":"2026-11-22T00:02:00Z"}`, "awaits[1] is empty"},
		"too many awaited":     {head + `"awaits":["u` + strings.Join(seqStrings(MaxAwaited+1), `","u`) + `"],"awaitUntil":"2026-11-22T00:02:00Z"}`, "1025 pods, at most 1024"},
	} {
		if _, _, err := GetGangPlan(map[string]string{AnnotationGangPlan: tc.v}); err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: GetGangPlan error %v, want one saying %q", name, err, tc.why)
		}
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

func TestGangRoom(t *testing.T) {
	for _, tc := range []struct{ max, running, want int }{
		{0, 5, -1}, {4, 1, 3}, {4, 4, 0}, {4, 6, 0},
	} {
		g := &Gang{MinMember: 1, MaxMember: tc.max}
		if got := g.Room(tc.running); got != tc.want {
			t.Errorf("max %d, running %d: room %d, want %d", tc.max, tc.running, got, tc.want)
		}
	}
}

// Extras gives back the newest members beyond the minimum; members that
// started in the same second (start times are stored to the second) go by
// creation, then by name, whatever order they are listed in.
func TestGangExtras(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	member := func(name string, started, created time.Time) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, CreationTimestamp: metav1.NewTime(created)}}
		p.Status.StartTime = &metav1.Time{Time: started}
		return p
	}
	started := func(p *corev1.Pod) time.Time { return p.Status.StartTime.Time }
	names := func(pods []*corev1.Pod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p.Name)
		}
		return out
	}
	tests := []struct {
		name    string
		min     int
		running []*corev1.Pod
		want    []string
	}{
		{"minimum unknown", 0, []*corev1.Pod{member("w-0", t0, t0), member("w-1", t0, t0)}, nil},
		{"at the minimum", 2, []*corev1.Pod{member("w-0", t0, t0), member("w-1", t0, t0)}, nil},
		{"newest start first", 1, []*corev1.Pod{
			member("w-2", t0.Add(time.Minute), t0), member("w-0", t0, t0), member("w-1", t0.Add(2*time.Minute), t0),
		}, []string{"w-1", "w-2"}},
		{"same start: later creation first", 1, []*corev1.Pod{
			member("w-1", t0, t0), member("w-0", t0, t0.Add(time.Second)), member("w-2", t0, t0),
		}, []string{"w-0", "w-2"}},
		{"same start and creation: greater name first", 2, []*corev1.Pod{
			member("w-3", t0, t0), member("w-1", t0, t0), member("w-2", t0, t0), member("w-0", t0, t0),
		}, []string{"w-3", "w-2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gang{Name: "g", MinMember: tc.min}
			got := names(g.Extras(tc.running, started))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Extras (-want +got):\n%s", diff)
			}
			// The same members listed the other way round.
			rev := append([]*corev1.Pod(nil), tc.running...)
			for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
				rev[i], rev[j] = rev[j], rev[i]
			}
			if diff := cmp.Diff(tc.want, names(g.Extras(rev, started))); diff != "" {
				t.Errorf("Extras of the members in reverse order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGangPlanWhere(t *testing.T) {
	ref := func(i int) GPURef {
		return GPURef{UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Index: i}
	}
	three := ref(3)
	for _, tc := range []struct {
		plan      GangPlan
		gpus, out string
	}{
		{GangPlan{Node: "n1"}, "", "node n1"},
		{GangPlan{Node: "n1", GPU: &three}, "GPU 3", "GPU 3 of node n1"},
		{GangPlan{Node: "n1", GPU: &three, Spread: []GPURef{ref(4), ref(6)}}, "GPUs 3, 4, 6", "GPUs 3, 4, 6 of node n1"},
		{GangPlan{Node: "n1", GPUs: []GPURef{ref(5)}}, "GPU 5", "GPU 5 of node n1"},
		{GangPlan{Node: "n1", GPUs: []GPURef{ref(5), ref(7)}}, "GPUs 5, 7", "GPUs 5, 7 of node n1"},
	} {
		if got := tc.plan.GPUsText(); got != tc.gpus {
			t.Errorf("%+v: GPUsText() = %q, want %q", tc.plan, got, tc.gpus)
		}
		if got := tc.plan.Where(); got != tc.out {
			t.Errorf("%+v: Where() = %q, want %q", tc.plan, got, tc.out)
		}
	}
}

// spreadOf is n GPU references of indices 1..n, comma-separated JSON.
func spreadOf(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"uuid":"GPU-%08d-0000-0000-0000-000000000000","index":%d}`, i+1, i+1)
	}
	return strings.Join(out, ",")
}

// seqStrings is "0", "1", ... up to n-1.
func seqStrings(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// A plan awaits its pods until the first of: every one gone, AwaitUntil.
func TestGangPlanAwaiting(t *testing.T) {
	now := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	until := now.Add(2 * time.Minute)
	plan := GangPlan{Awaits: []types.UID{"a", "b"}, AwaitUntil: &until}
	for _, tc := range []struct {
		name string
		at   time.Time
		gone map[types.UID]bool
		want bool
	}{
		{"both there", now, nil, true},
		{"one gone", now, map[types.UID]bool{"a": true}, true},
		{"both gone", now, map[types.UID]bool{"a": true, "b": true}, false},
		{"at the deadline", until, nil, false},
	} {
		if got := plan.Awaiting(tc.at, func(uid types.UID) bool { return tc.gone[uid] }); got != tc.want {
			t.Errorf("%s: Awaiting = %v, want %v", tc.name, got, tc.want)
		}
	}
	if (&GangPlan{}).Awaiting(now, func(types.UID) bool { return false }) {
		t.Error("a plan awaiting nothing awaits")
	}
}
