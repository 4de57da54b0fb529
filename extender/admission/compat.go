package admission

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// ReviewNVIDIAGPU is the nvidia.com/gpu compatibility webhook (off unless
// installed, docs/admission.md): a pod created asking nvidia.com/gpu, as
// manifests written for NVIDIA's device plugin do, is rewritten to ask the
// same number of tessera.dev/gpu, so that Tessera's node agent and extender
// serve it unchanged. Only the resource's name changes, in the limits and
// requests of every container (init containers included); a container
// asking both names is refused (which count it meant is not clear), as is a
// count that is not a whole number. Everything else passes untouched.
func ReviewNVIDIAGPU(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp, pod, done := podCreate(req)
	if done {
		return resp
	}
	var ops []patchOp
	for _, list := range []struct {
		path       string
		containers []corev1.Container
	}{{"/spec/initContainers", pod.Spec.InitContainers}, {"/spec/containers", pod.Spec.Containers}} {
		for i := range list.containers {
			c := &list.containers[i]
			res, changed, err := renameNVIDIAGPU(c)
			if err != nil {
				return deny(resp, http.StatusUnprocessableEntity, err.Error())
			}
			if changed {
				ops = append(ops, patchOp{Op: "replace", Path: list.path + "/" + strconv.Itoa(i) + "/resources", Value: res})
			}
		}
	}
	if len(ops) == 0 {
		return resp
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return deny(resp, http.StatusInternalServerError, fmt.Sprintf("encoding the patch: %v", err))
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	resp.Warnings = []string{fmt.Sprintf("%s is served as %s by Tessera (nvidia.com/gpu compatibility)", api.ResourceNVIDIAGPU, api.ResourceGPU)}
	return resp
}

// renameNVIDIAGPU returns c's resources with nvidia.com/gpu renamed
// tessera.dev/gpu, and whether anything changed.
func renameNVIDIAGPU(c *corev1.Container) (corev1.ResourceRequirements, bool, error) {
	out := *c.Resources.DeepCopy()
	changed := false
	for _, l := range []struct {
		what string
		list corev1.ResourceList
	}{{"limits", out.Limits}, {"requests", out.Requests}} {
		q, ok := l.list[api.ResourceNVIDIAGPU]
		if !ok {
			continue
		}
		if _, both := l.list[api.ResourceGPU]; both {
			return out, false, fmt.Errorf("container %q asks for both %s and %s in its %s: ask for one (%s is served as %s here)",
				c.Name, api.ResourceNVIDIAGPU, api.ResourceGPU, l.what, api.ResourceNVIDIAGPU, api.ResourceGPU)
		}
		if _, err := gpureq.Count(q); err != nil {
			return out, false, fmt.Errorf("container %q: %s %w", c.Name, api.ResourceNVIDIAGPU, err)
		}
		delete(l.list, api.ResourceNVIDIAGPU)
		l.list[api.ResourceGPU] = q
		changed = true
	}
	return out, changed, nil
}
