// Package admission is the extender's mutating admission webhook for gangs
// and queues: a pod that declares a gang (api.GangOf) is created with the
// scheduling gate api.SchedulingGateGang, so kube-scheduler leaves it alone
// until the gang planner has placed the whole gang and lifts the gate. A
// malformed gang declaration (api.GangOf: gangs named differently, a gang
// name that is no DNS-1123 subdomain, a size, cap or timeout not written
// as a plain decimal, gang-only annotations on a pod that declares no
// gang), and a GPU request the extender could never place (extender.ParseDemand: gpureq's rules, a malformed
// tessera.dev/nvlink or tessera.dev/gpu-model), are refused at creation
// with the reason. A GPU
// pod outside any gang, in a namespace a Queue serves, is created with
// api.SchedulingGateQueue: the same planner admits it in queue order.
// ReviewNVIDIAGPU (compat.go) serves pods written for NVIDIA's device plugin.
//
// The HTTP handler decodes, calls the pure Review, and encodes.
package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/gpureq"
)

// patchOp is one JSON Patch (RFC 6902) operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

var podResource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

// Review decides one admission request. It never fails: a request it cannot
// read is refused with the reason. queued reports whether a Queue serves a
// namespace (nil: none does).
func Review(req *admissionv1.AdmissionRequest, queued func(namespace string) bool) *admissionv1.AdmissionResponse {
	resp, pod, done := podCreate(req)
	if done {
		return resp
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if pod.Name == "" {
		pod.Name = req.Name
	}
	if pod.Name == "" && pod.GenerateName != "" {
		// A controller's pod is named after admission: messages name it
		// by its prefix ("pod tr/big-(generated)", not "pod tr/").
		pod.Name = pod.GenerateName + "(generated)"
	}
	_, member, err := api.GangOf(pod)
	if err != nil {
		return deny(resp, http.StatusUnprocessableEntity, err.Error())
	}
	if err := errors.Join(api.CheckRuntimeHints(pod.Annotations), api.CheckNUMAAlignment(pod.Annotations)); err != nil {
		// Read only by reservations and consolidation, which would take a
		// malformed hint silently as none.
		return deny(resp, http.StatusUnprocessableEntity, fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err))
	}
	if err := gpureq.CheckCreate(pod); err != nil && pod.Spec.NodeName == "" {
		// Read as asked by the components, but never run as the user
		// meant: 0 of a resource, a resource Tessera does not serve,
		// memory units written as bytes.
		return deny(resp, http.StatusUnprocessableEntity, fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err))
	}
	if _, err := extender.ParseDemand(pod); err != nil && pod.Spec.NodeName == "" {
		// The extender's filter would refuse such a pod on every node,
		// for good: said at creation, the user sees it at once. A pod
		// bound at creation (an admin's: deploy/admission refuses it to
		// tenants) skips the extender; its node judges it.
		return deny(resp, http.StatusUnprocessableEntity, fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err))
	}
	gate := corev1.PodSchedulingGate{Name: api.SchedulingGateGang}
	switch {
	case pod.Spec.NodeName != "":
		// Bound at creation (an admin's pod, a kubelet's mirror pod):
		// nothing schedules it, and the API server refuses a pod that is
		// both bound and gated ("spec.nodeName: Forbidden: cannot be set
		// until all schedulingGates have been cleared"), which hid
		// deploy/admission's own message from tenants and broke an
		// admin's bound pod in a queued namespace.
		return resp
	case member && api.HasGangGate(pod):
		return resp
	case member:
	case queued == nil || api.HasQueueGate(pod) || len(gpureq.QuotaCount(pod)) == 0 || !queued(pod.Namespace):
		return resp
	default:
		gate.Name = api.SchedulingGateQueue
	}
	op := patchOp{Op: "add", Path: "/spec/schedulingGates/-", Value: gate}
	if len(pod.Spec.SchedulingGates) == 0 {
		op = patchOp{Op: "add", Path: "/spec/schedulingGates", Value: []corev1.PodSchedulingGate{gate}}
	}
	patch, err := json.Marshal([]patchOp{op})
	if err != nil {
		return deny(resp, http.StatusInternalServerError, fmt.Sprintf("encoding the patch: %v", err))
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return resp
}

// podCreate starts the review of req: the allowing response, and the pod
// when req creates one. done is set when the review ends here: req is not
// a pod's creation (allowed), or its pod cannot be decoded (refused).
func podCreate(req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse, pod *corev1.Pod, done bool) {
	resp = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Resource != podResource || req.Operation != admissionv1.Create {
		return resp, nil, true
	}
	pod = &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return deny(resp, http.StatusBadRequest, fmt.Sprintf("decoding the pod: %v", err)), nil, true
	}
	return resp, pod, false
}

func deny(resp *admissionv1.AdmissionResponse, code int32, msg string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: msg}
	return resp
}

// maxBody bounds an AdmissionReview (the API server sends at most a few
// MiB: the object and its old version).
const maxBody = 8 << 20

// Handler serves Review over HTTP as the API server calls webhooks.
type Handler struct {
	// Queued reports whether a Queue serves a namespace; nil: none does.
	Queued func(namespace string) bool
	// Review decides a request instead of the gang and queue Review (e.g.
	// ReviewNVIDIAGPU).
	Review func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse
}

var _ http.Handler = Handler{}

type errorReply struct {
	Error string `json:"error"`
}

func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	fail := func(code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(errorReply{Error: msg})
	}
	if r.Method != http.MethodPost {
		fail(http.StatusMethodNotAllowed, "admission reviews are POSTed")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		fail(http.StatusBadRequest, fmt.Sprintf("reading the request: %v", err))
		return
	}
	if len(body) > maxBody {
		fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("admission review larger than %d bytes", maxBody))
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		fail(http.StatusBadRequest, fmt.Sprintf("decoding the admission review: %v", err))
		return
	}
	if review.Request == nil {
		fail(http.StatusBadRequest, errors.New("admission review without a request").Error())
		return
	}
	var resp *admissionv1.AdmissionResponse
	if h.Review != nil {
		resp = h.Review(review.Request)
	} else {
		resp = Review(review.Request, h.Queued)
	}
	if !resp.Allowed {
		logger.Info("Refused a pod", "pod", klog.KRef(review.Request.Namespace, review.Request.Name), "reason", resp.Result.Message)
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		logger.Error(err, "Writing the admission response")
	}
}
