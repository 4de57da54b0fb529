package admission

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/api"
)

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func compatPod(init, ctrs []corev1.Container) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "p"}, Spec: corev1.PodSpec{InitContainers: init, Containers: ctrs}}
}

func ctr(name string, limits, requests corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Image: "x", Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests}}
}

func TestReviewNVIDIAGPU(t *testing.T) {
	nv, ts := string(api.ResourceNVIDIAGPU), string(api.ResourceGPU)
	tests := []struct {
		name    string
		pod     corev1.Pod
		op      admissionv1.Operation
		want    *corev1.Pod // nil: no patch
		refused string
	}{
		{name: "limits only", pod: compatPod(nil, []corev1.Container{ctr("main", rl(nv, "2", "cpu", "1"), nil)}),
			want: ptr(compatPod(nil, []corev1.Container{ctr("main", rl(ts, "2", "cpu", "1"), nil)}))},
		{name: "limits and requests, init container and a second container", pod: compatPod(
			[]corev1.Container{ctr("init", rl(nv, "1"), rl(nv, "1"))},
			[]corev1.Container{ctr("main", rl(nv, "4"), rl(nv, "4", "memory", "1Gi")), ctr("side", rl("cpu", "1"), nil)}),
			want: ptr(compatPod(
				[]corev1.Container{ctr("init", rl(ts, "1"), rl(ts, "1"))},
				[]corev1.Container{ctr("main", rl(ts, "4"), rl(ts, "4", "memory", "1Gi")), ctr("side", rl("cpu", "1"), nil)}))},
		{name: "no nvidia.com/gpu", pod: compatPod(nil, []corev1.Container{ctr("main", rl(ts, "1"), nil)})},
		{name: "not a create", op: admissionv1.Update, pod: compatPod(nil, []corev1.Container{ctr("main", rl(nv, "1"), nil)})},
		{name: "both names", pod: compatPod(nil, []corev1.Container{ctr("main", rl(nv, "1", ts, "1"), nil)}),
			refused: `container "main" asks for both nvidia.com/gpu and tessera.dev/gpu in its limits: ask for one (nvidia.com/gpu is served as tessera.dev/gpu here)`},
		{name: "a fraction", pod: compatPod(nil, []corev1.Container{ctr("main", rl(nv, "500m"), nil)}),
			refused: `container "main": nvidia.com/gpu must be a whole number, got 500m`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			op := tc.op
			if op == "" {
				op = admissionv1.Create
			}
			resp := ReviewNVIDIAGPU(&admissionv1.AdmissionRequest{UID: "u", Resource: podResource, Operation: op, Object: runtime.RawExtension{Raw: raw}})
			if tc.refused != "" {
				if resp.Allowed || resp.Result == nil || resp.Result.Message != tc.refused {
					t.Fatalf("response = %+v, want refused with %q", resp, tc.refused)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %v", resp.Result)
			}
			if tc.want == nil {
				if resp.Patch != nil {
					t.Fatalf("patched: %s", resp.Patch)
				}
				return
			}
			p, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Apply(raw)
			if err != nil {
				t.Fatalf("apply %s: %v", resp.Patch, err)
			}
			var got corev1.Pod
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(*tc.want, got); diff != "" {
				t.Errorf("patched pod (-want +got):\n%s", diff)
			}
			if len(resp.Warnings) != 1 {
				t.Errorf("warnings = %v, want one", resp.Warnings)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestNVIDIAGPUHandler(t *testing.T) {
	pod := compatPod(nil, []corev1.Container{ctr("main", rl(string(api.ResourceNVIDIAGPU), "1"), nil)})
	raw, _ := json.Marshal(pod)
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &admissionv1.AdmissionRequest{UID: "u", Resource: podResource, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}},
	})
	rec := httptest.NewRecorder()
	Handler{Review: ReviewNVIDIAGPU}.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/admission/nvidia-gpu", bytes.NewReader(body)))
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || !out.Response.Allowed || !strings.Contains(string(out.Response.Patch), string(api.ResourceGPU)) {
		t.Fatalf("response = %+v", out.Response)
	}
}
