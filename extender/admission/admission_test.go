package admission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/api"
)

type podBuilder struct{ pod corev1.Pod }

func makePod() *podBuilder {
	return &podBuilder{pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "w-0"}}}
}

func (b *podBuilder) Gang(name, min string) *podBuilder {
	if b.pod.Annotations == nil {
		b.pod.Annotations = map[string]string{}
	}
	b.pod.Annotations[api.AnnotationGang] = name
	if min != "" {
		b.pod.Annotations[api.AnnotationGangMinMember] = min
	}
	return b
}

func (b *podBuilder) PodGroup(name string) *podBuilder {
	b.pod.Labels = map[string]string{api.LabelPodGroup: name}
	return b
}

// Volcano sets the annotation by which Volcano names the pod's PodGroup.
func (b *podBuilder) Volcano(key, name string) *podBuilder {
	if b.pod.Annotations == nil {
		b.pod.Annotations = map[string]string{}
	}
	b.pod.Annotations[key] = name
	return b
}

func (b *podBuilder) Gates(names ...string) *podBuilder {
	for _, n := range names {
		b.pod.Spec.SchedulingGates = append(b.pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: n})
	}
	return b
}

func (b *podBuilder) Annotate(key, value string) *podBuilder {
	if b.pod.Annotations == nil {
		b.pod.Annotations = map[string]string{}
	}
	b.pod.Annotations[key] = value
	return b
}

// Container adds a container with these limits (resource name to
// quantity).
func (b *podBuilder) Container(limits map[corev1.ResourceName]string) *podBuilder {
	rl := corev1.ResourceList{}
	for r, q := range limits {
		rl[r] = resource.MustParse(q)
	}
	name := fmt.Sprintf("c%d", len(b.pod.Spec.Containers))
	b.pod.Spec.Containers = append(b.pod.Spec.Containers, corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: rl}})
	return b
}

// Node binds the pod at creation (spec.nodeName).
func (b *podBuilder) Node(name string) *podBuilder {
	b.pod.Spec.NodeName = name
	return b
}

// Generated leaves the pod's name to the API server, as a controller's
// pods are: only a prefix.
func (b *podBuilder) Generated(prefix string) *podBuilder {
	b.pod.Name, b.pod.GenerateName = "", prefix
	return b
}

func (b *podBuilder) Request(op admissionv1.Operation) *admissionv1.AdmissionRequest {
	raw, _ := json.Marshal(b.pod)
	return &admissionv1.AdmissionRequest{UID: "uid-1", Resource: podResource, Operation: op, Namespace: "ml", Name: b.pod.Name, Object: runtime.RawExtension{Raw: raw}}
}

func TestReview(t *testing.T) {
	gate := `{"name":"tessera.dev/gang"}`
	tests := []struct {
		name      string
		req       *admissionv1.AdmissionRequest
		wantPatch string // "" for none
		wantDeny  string
	}{
		{name: "not a gang member", req: makePod().Request(admissionv1.Create)},
		{name: "annotated member", req: makePod().Gang("train", "4").Request(admissionv1.Create), wantPatch: `[{"op":"add","path":"/spec/schedulingGates","value":[` + gate + `]}]`},
		{name: "PodGroup member with other gates", req: makePod().PodGroup("train").Gates("other").Request(admissionv1.Create), wantPatch: `[{"op":"add","path":"/spec/schedulingGates/-","value":` + gate + `}]`},
		{name: "Volcano PodGroup member", req: makePod().Volcano(api.AnnotationVolcanoGroupName, "train").Request(admissionv1.Create), wantPatch: `[{"op":"add","path":"/spec/schedulingGates","value":[` + gate + `]}]`},
		{name: "Volcano member, newer annotation", req: makePod().Volcano(api.AnnotationVolcanoGroupNameV2, "train").Gates("other").Request(admissionv1.Create), wantPatch: `[{"op":"add","path":"/spec/schedulingGates/-","value":` + gate + `}]`},
		{name: "Volcano and scheduler-plugins PodGroups", req: makePod().PodGroup("train").Volcano(api.AnnotationVolcanoGroupName, "train").Request(admissionv1.Create), wantDeny: "ml/w-0: invalid gang declaration: label scheduling.x-k8s.io/pod-group names a scheduler-plugins PodGroup"},
		{name: "already gated", req: makePod().Gang("train", "4").Gates(api.SchedulingGateGang).Request(admissionv1.Create)},
		{name: "update passes", req: makePod().Gang("train", "4").Request(admissionv1.Update)},
		{name: "malformed declaration", req: makePod().Gang("train", "").Request(admissionv1.Create), wantDeny: "ml/w-0: invalid gang declaration: tessera.dev/gang-min-member is required"},
		{name: "malformed declaration of a controller's pod", req: makePod().Generated("big-").Gang("big", "").Request(admissionv1.Create), wantDeny: "pod ml/big-(generated): invalid gang declaration: tessera.dev/gang-min-member is required"},
		// Gang-only annotations without a gang, sizes not written plainly
		// and gang names that are no object name are refused: taken
		// silently, the pod ran alone or in another gang than meant.
		{name: "size without a gang", req: makePod().Annotate(api.AnnotationGangMinMember, "2").Request(admissionv1.Create), wantDeny: "pod ml/w-0: invalid gang declaration: annotation tessera.dev/gang-min-member needs a gang: annotation tessera.dev/gang"},
		{name: "cap without a gang", req: makePod().Annotate(api.AnnotationGangMaxMember, "4").Request(admissionv1.Create), wantDeny: "annotation tessera.dev/gang-max-member needs a gang"},
		{name: "timeout without a gang", req: makePod().Annotate(api.AnnotationGangTimeout, "60").Request(admissionv1.Create), wantDeny: "annotation tessera.dev/gang-timeout-seconds needs a gang"},
		{name: "topology without a gang", req: makePod().Annotate(api.AnnotationGangTopology, "rack").Gates(api.SchedulingGateGang).Request(admissionv1.Create), wantDeny: "annotation tessera.dev/gang-topology needs a gang"},
		{name: "size with a space", req: makePod().Gang("train", " 2").Request(admissionv1.Create), wantDeny: `pod ml/w-0: invalid gang declaration: tessera.dev/gang-min-member=" 2" is not a number of members: write a whole number with the digits 0-9 only`},
		{name: "size with a sign", req: makePod().Gang("train", "+2").Request(admissionv1.Create), wantDeny: `tessera.dev/gang-min-member="+2" is not a number of members`},
		{name: "size with a leading zero", req: makePod().Gang("train", "02").Request(admissionv1.Create), wantDeny: `tessera.dev/gang-min-member="02" is not a number of members: no leading zero`},
		{name: "gang name not an object name", req: makePod().Gang("Not_A Valid/Name", "2").Request(admissionv1.Create), wantDeny: `pod ml/w-0: invalid gang declaration: the gang name "Not_A Valid/Name" (annotation tessera.dev/gang) is not a valid name`},
		{name: "PodGroup label not a PodGroup name", req: makePod().PodGroup("Train_1").Request(admissionv1.Create), wantDeny: `the gang name "Train_1" (label scheduling.x-k8s.io/pod-group) is not a valid name`},
		// A PodGroup's member may set its size: it is gated, and waits for
		// its PodGroup all the same (the planner reads it).
		{name: "PodGroup member with a size", req: makePod().PodGroup("train").Annotate(api.AnnotationGangMinMember, "1").Request(admissionv1.Create), wantPatch: `[{"op":"add","path":"/spec/schedulingGates","value":[` + gate + `]}]`},
		// The gang gate on a pod that declares no gang: a plain pod,
		// admitted as it is (the planner lifts the gate).
		{name: "gang gate without a gang", req: makePod().Gates(api.SchedulingGateGang).Request(admissionv1.Create)},
		{name: "malformed expected run time", req: makePod().Annotate(api.AnnotationExpectedRuntime, "garbage").Request(admissionv1.Create), wantDeny: `pod ml/w-0: annotation tessera.dev/expected-runtime: "garbage" is not a duration of hours, minutes and seconds`},
		{name: "malformed preemptible", req: makePod().Annotate(api.AnnotationPreemptible, "perhaps").Request(admissionv1.Create), wantDeny: `pod ml/w-0: annotation tessera.dev/preemptible: "perhaps" is neither "true" nor "false"`},
		{name: "a slice", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUMemory: "8", api.ResourceGPUCore: "30"}).Request(admissionv1.Create)},
		{name: "whole GPUs in one NVLink clique", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "4"}).Annotate(api.AnnotationNVLink, api.NVLinkRequired).Annotate(api.AnnotationGPUModel, "A100|H100").Request(admissionv1.Create)},
		{name: "more cores than a GPU has", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUCore: "150"}).Request(admissionv1.Create), wantDeny: "pod ml/w-0: invalid GPU request: container \"c0\" asks for 150 tessera.dev/gpu-core"},
		{name: "whole GPUs and a slice in one pod", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "1"}).Container(map[corev1.ResourceName]string{api.ResourceGPUMemory: "4"}).Request(admissionv1.Create), wantDeny: "pod ml/w-0: invalid GPU request: the pod asks for whole GPUs and a shared slice"},
		{name: "bound at creation: its node judges it", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUCore: "150"}).Node("n1").Request(admissionv1.Create)},
		{name: "a fraction of a GPU", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "500m"}).Request(admissionv1.Create), wantDeny: "must be a whole number, got 500m"},
		{name: "a GPU count past int64", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "9223372036854775808"}).Request(admissionv1.Create), wantDeny: "tessera.dev/gpu is too large, got 9223372036854775808"},
		{name: "a negative count", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUCore: "-1"}).Request(admissionv1.Create), wantDeny: "tessera.dev/gpu-core must not be negative, got -1"},
		{name: "malformed nvlink", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "2"}).Annotate(api.AnnotationNVLink, "maybe").Request(admissionv1.Create), wantDeny: "pod ml/w-0: invalid GPU request: annotation tessera.dev/nvlink"},
		{name: "malformed gpu-model", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "1"}).Annotate(api.AnnotationGPUModel, "A100||H100").Request(admissionv1.Create), wantDeny: "pod ml/w-0: invalid GPU request: annotation tessera.dev/gpu-model: model 1"},
		{name: "NUMA alignment opted out", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "1"}).Annotate(api.AnnotationNUMAAlignment, "false").Request(admissionv1.Create)},
		{name: "NUMA alignment misspelt", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "1"}).Annotate(api.AnnotationNUMAAlignment, "flase").Request(admissionv1.Create), wantDeny: `pod ml/w-0: annotation tessera.dev/numa-alignment: "flase" is none of "true", "enabled", "false" (opt out of NUMA alignment) or "disabled"`},
		// Asked as the components read them, but never run as meant.
		{name: "zero whole GPUs", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPU: "0"}).Request(admissionv1.Create),
			wantDeny: `pod ml/w-0: container "c0" asks for 0 tessera.dev/gpu: remove it`},
		{name: "zero memory units beside cores", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUMemory: "0", api.ResourceGPUCore: "10"}).Request(admissionv1.Create),
			wantDeny: `asks for 0 tessera.dev/gpu-memory`},
		{name: "a resource Tessera does not serve", req: makePod().Container(map[corev1.ResourceName]string{"tessera.dev/gpu-mem": "4"}).Request(admissionv1.Create),
			wantDeny: `pod ml/w-0: container "c0" asks for tessera.dev/gpu-mem, which Tessera does not serve`},
		{name: "a MIG profile that is no profile", req: makePod().Container(map[corev1.ResourceName]string{"tessera.dev/mig-bogus": "1"}).Request(admissionv1.Create),
			wantDeny: `asks for tessera.dev/mig-bogus, which Tessera does not serve`},
		{name: "memory units as bytes", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUMemory: "4Gi"}).Request(admissionv1.Create),
			wantDeny: `pod ml/w-0: container "c0" asks for 4Gi tessera.dev/gpu-memory: it counts units`},
		{name: "memory units in decimal bytes", req: makePod().Container(map[corev1.ResourceName]string{api.ResourceGPUMemory: "24G"}).Request(admissionv1.Create),
			wantDeny: `asks for 24G tessera.dev/gpu-memory: it counts units`},
		{name: "a MIG instance", req: makePod().Container(map[corev1.ResourceName]string{"tessera.dev/mig-1g.5gb": "2"}).Request(admissionv1.Create)},
		{name: "other vendors' resources are not Tessera's to judge", req: makePod().Container(map[corev1.ResourceName]string{"example.com/fpga": "0", api.ResourceGPU: "1"}).Request(admissionv1.Create)},
		{name: "well-formed hints", req: makePod().Annotate(api.AnnotationExpectedRuntime, "2h30m").Annotate(api.AnnotationPreemptible, "true").Request(admissionv1.Create)},
		{name: "garbage object", req: &admissionv1.AdmissionRequest{UID: "u", Resource: podResource, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte("{")}}, wantDeny: "decoding the pod"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(tc.req, nil)
			if resp.UID != tc.req.UID {
				t.Errorf("UID = %q, want %q", resp.UID, tc.req.UID)
			}
			if tc.wantDeny != "" {
				if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, tc.wantDeny) {
					t.Fatalf("response = %+v, want a refusal containing %q", resp, tc.wantDeny)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			if diff := cmp.Diff(tc.wantPatch, string(resp.Patch)); diff != "" {
				t.Errorf("patch (-want +got):\n%s", diff)
			}
			if (resp.PatchType != nil) != (tc.wantPatch != "") {
				t.Errorf("patch type = %v with patch %q", resp.PatchType, resp.Patch)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler{})
	defer srv.Close()
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  makePod().Gang("train", "2").Request(admissionv1.Create),
	}
	body, _ := json.Marshal(review)
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || !out.Response.Allowed || out.Response.UID != "uid-1" || len(out.Response.Patch) == 0 || out.Kind != "AdmissionReview" {
		t.Errorf("response = %+v", out)
	}
	for name, tc := range map[string]struct {
		method, body string
		code         int
	}{
		"garbage":    {http.MethodPost, "not json", http.StatusBadRequest},
		"no request": {http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
		"GET":        {http.MethodGet, "", http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var reply errorReply
		err = json.NewDecoder(resp.Body).Decode(&reply)
		resp.Body.Close()
		if resp.StatusCode != tc.code || err != nil || reply.Error == "" {
			t.Errorf("%s: status %d, JSON error %q (%v); want %d with a JSON error", name, resp.StatusCode, reply.Error, err, tc.code)
		}
	}
}

// A GPU pod outside any gang, in a namespace a Queue serves, gets the
// queue gate; a gang member the gang gate; nothing else is touched.
func TestReviewQueued(t *testing.T) {
	gpu := func(b *podBuilder) *podBuilder {
		b.pod.Spec.Containers = []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{api.ResourceGPU: resource.MustParse("1")}}}}
		return b
	}
	queued := func(ns string) bool { return ns == "ml" }
	tests := []struct {
		name   string
		req    *admissionv1.AdmissionRequest
		queued func(string) bool
		want   string // the gate added, "" for none
	}{
		{"GPU pod in a queued namespace", gpu(makePod()).Request(admissionv1.Create), queued, api.SchedulingGateQueue},
		{"gang member in a queued namespace", gpu(makePod()).Gang("g", "2").Request(admissionv1.Create), queued, api.SchedulingGateGang},
		{"already gated by its user", gpu(makePod()).Gates(api.SchedulingGateQueue).Request(admissionv1.Create), queued, ""},
		// The gang gate its user added declares no gang: the queue's gate
		// still holds it (the planner lifts the gang's, never the queue's,
		// without the queue's admission).
		{"gang gate without a gang in a queued namespace", gpu(makePod()).Gates(api.SchedulingGateGang).Request(admissionv1.Create), queued, api.SchedulingGateQueue},
		{"pod without a GPU", makePod().Request(admissionv1.Create), queued, ""},
		{"namespace no Queue serves", gpu(makePod()).Request(admissionv1.Create), func(string) bool { return false }, ""},
		{"no queues at all", gpu(makePod()).Request(admissionv1.Create), nil, ""},
		// Bound at creation (an admin's pod, a mirror pod): the API
		// server refuses a bound pod with gates.
		{"GPU pod bound at creation in a queued namespace", gpu(makePod()).Node("n1").Request(admissionv1.Create), queued, ""},
		{"gang member bound at creation", gpu(makePod()).Gang("g", "2").Node("n1").Request(admissionv1.Create), queued, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(tc.req, tc.queued)
			if !resp.Allowed {
				t.Fatalf("refused: %v", resp.Result)
			}
			got := ""
			if resp.Patch != nil {
				var ops []struct {
					Value json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal(resp.Patch, &ops); err != nil || len(ops) != 1 {
					t.Fatalf("patch %s: %v", resp.Patch, err)
				}
				for _, n := range []string{api.SchedulingGateGang, api.SchedulingGateQueue} {
					if strings.Contains(string(ops[0].Value), `"`+n+`"`) {
						got = n
					}
				}
			}
			if got != tc.want {
				t.Errorf("gate %q (patch %s), want %q", got, resp.Patch, tc.want)
			}
		})
	}
}
