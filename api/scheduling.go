package api

import (
	"fmt"
	"strings"
	"unicode"
)

// Pod annotations read by the scheduler extender (tessera-extender).
const (
	// AnnotationGPUModel restricts the GPU models a pod may run on: a list
	// of model names separated by "|", e.g. "A100|H100". A name matches a
	// GPU whose NVML product name (e.g. "NVIDIA A100-SXM4-40GB") equals it
	// or contains it between non-alphanumeric boundaries, ignoring case.
	AnnotationGPUModel = Domain + "/gpu-model"
	// AnnotationNVLink, set to "required", asks that all of the pod's whole
	// GPUs (tessera.dev/gpu), or the GPUs of its multi-GPU slice
	// (AnnotationGPUCount), be in one NVLink clique of the node (see
	// GPUInventory.NVLinkCliques). Any other value than "required" or
	// "false" (the default) is an error.
	AnnotationNVLink = Domain + "/nvlink"
)

// Values of AnnotationNVLink.
const (
	NVLinkRequired = "required"
	NVLinkNone     = "false"
)

// GPUModels parses an AnnotationGPUModel value into its model names. An
// empty list means any model. Empty names ("A100||H100") are errors.
func GPUModels(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, fmt.Errorf("annotation %s: empty value", AnnotationGPUModel)
	}
	parts := strings.Split(value, "|")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("annotation %s: model %d of %q is empty", AnnotationGPUModel, i, value)
		}
		if strings.ContainsAny(p, ",;") {
			// No GPU's product name has one: "A100,L40S" matched no GPU,
			// and the pod waited with only explain saying why.
			return nil, fmt.Errorf("annotation %s: model %q of %q holds a comma or semicolon: separate models with \"|\", as in \"A100|L40S\"", AnnotationGPUModel, p, value)
		}
		out = append(out, p)
	}
	return out, nil
}

// GetGPUModels returns the model list of a pod's annotations (nil when the
// annotation is absent).
func GetGPUModels(annotations map[string]string) ([]string, error) {
	v, ok := annotations[AnnotationGPUModel]
	if !ok {
		return nil, nil
	}
	return GPUModels(v)
}

// ModelMatches reports whether GPU model name model (as NVML reports it)
// matches the name want of an AnnotationGPUModel list.
func ModelMatches(model, want string) bool {
	m, w := strings.ToUpper(model), strings.ToUpper(strings.TrimSpace(want))
	if w == "" {
		return false
	}
	for from := 0; from <= len(m)-len(w); {
		i := strings.Index(m[from:], w)
		if i < 0 {
			return false
		}
		i += from
		end := i + len(w)
		if (i == 0 || !isAlnum(m[i-1])) && (end == len(m) || !isAlnum(m[end])) {
			return true
		}
		from = i + 1
	}
	return false
}

// ModelAllowed reports whether GPU model name model matches one of want
// (ModelMatches); an empty want allows every model. It is the one test of
// a pod's AnnotationGPUModel list against a GPU: the extender's filter,
// the allocator's fit (gang planning, the simulator) and consolidation
// all ask it.
func ModelAllowed(model string, want []string) bool {
	if len(want) == 0 {
		return true
	}
	for _, w := range want {
		if ModelMatches(model, w) {
			return true
		}
	}
	return false
}

func isAlnum(b byte) bool { return b < 0x80 && (unicode.IsLetter(rune(b)) || unicode.IsDigit(rune(b))) }

// GetNVLinkRequired reports whether a pod's annotations require NVLink
// between its whole GPUs.
func GetNVLinkRequired(annotations map[string]string) (bool, error) {
	v, ok := annotations[AnnotationNVLink]
	if !ok {
		return false, nil
	}
	switch strings.TrimSpace(v) {
	case NVLinkRequired:
		return true, nil
	case NVLinkNone, "":
		return false, nil
	}
	return false, fmt.Errorf("annotation %s: %q is neither %q nor %q", AnnotationNVLink, v, NVLinkRequired, NVLinkNone)
}
