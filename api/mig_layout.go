package api

import (
	"encoding/json"
	"fmt"
	"regexp"
)

// AnnotationMIGLayoutRequest is the Node annotation in which the scheduler
// extender (dynamic MIG, --dynamic-mig) asks the node agent to repartition
// GPUs without a tenant: per GPU UUID, the MIG instances the GPU is to
// have. Its value is a MIGLayoutRequest as JSON. Only the extender's
// ServiceAccount writes it (tenants cannot patch Nodes).
const AnnotationMIGLayoutRequest = Domain + "/mig-layout-request"

// AnnotationMIGLayoutStatus is the Node annotation in which the node agent
// (--dynamic-mig) says what it did with a request: a MIGLayoutStatus as
// JSON.
const AnnotationMIGLayoutStatus = Domain + "/mig-layout-status"

// Kinds of the dynamic-MIG annotations.
const (
	KindMIGLayoutRequest = "MIGLayoutRequest"
	KindMIGLayoutStatus  = "MIGLayoutStatus"
)

// MIGLayoutRequest is the value of AnnotationMIGLayoutRequest.
type MIGLayoutRequest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Generation grows with every new request for the node.
	Generation int64 `json:"generation"`
	// GPUs are the GPUs to repartition, each at most once.
	GPUs []MIGLayoutGPU `json:"gpus"`
	// Pod is the pending pod the request is made for; every request names
	// one. The node agent serves the request only while that pod exists
	// (same UID), is not being deleted and is bound to no node; the
	// extender withdraws (removes) a request whose pod is gone or was
	// placed. A repartition is never made for no pod.
	Pod *MIGLayoutPod `json:"pod"`
}

// MIGLayoutPod names the pod a MIGLayoutRequest is for.
type MIGLayoutPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// String is namespace/name.
func (p *MIGLayoutPod) String() string { return p.Namespace + "/" + p.Name }

// MIGLayoutGPU is the layout one GPU is to have.
type MIGLayoutGPU struct {
	// UUID names the GPU ("GPU-<uuid>").
	UUID string `json:"uuid"`
	// Instances are the MIG instances the GPU is to have, and only those.
	Instances []MIGLayoutInstance `json:"instances"`
}

// MIGLayoutInstance is one wanted MIG instance: its profile and placement.
type MIGLayoutInstance struct {
	Profile string `json:"profile"`
	MIGPlacement
}

// MIGLayoutState says what the node agent did with a request's generation.
type MIGLayoutState string

// States of a MIGLayoutStatus.
const (
	// MIGLayoutApplied: every GPU of the request has its layout.
	MIGLayoutApplied MIGLayoutState = "Applied"
	// MIGLayoutRefused: a GPU has a tenant (an allocated instance or a
	// process) or its allocations could not be read; nothing was touched
	// on it. The agent tries again while the request stands.
	MIGLayoutRefused MIGLayoutState = "Refused"
	// MIGLayoutFailed: NVML failed creating or destroying an instance;
	// the GPU's layout was read again and published as it is.
	MIGLayoutFailed MIGLayoutState = "Failed"
)

// MIGLayoutStatus is the value of AnnotationMIGLayoutStatus.
type MIGLayoutStatus struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Generation is the request's generation this status is about.
	Generation int64          `json:"generation"`
	State      MIGLayoutState `json:"state"`
	// Message says why, for Refused and Failed.
	Message string `json:"message,omitempty"`
}

var gpuUUIDPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F-]{1,64}$`)

// maxMIGLayoutGPUs bounds a request (no node has more GPUs).
const maxMIGLayoutGPUs = 64

// maxMIGLayoutPodField bounds a pod's namespace, name and UID (a name has
// at most 253 characters).
const maxMIGLayoutPodField = 253

// Validate checks the request: version and kind, a positive generation,
// the pod it is for, GPU UUIDs each at most once, and per GPU served profiles at valid,
// non-overlapping placements (at most MIGSlices instances).
func (r *MIGLayoutRequest) Validate() error {
	if r.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, r.APIVersion)
	}
	if r.Kind != KindMIGLayoutRequest {
		return fmt.Errorf("kind: must be %q, got %q", KindMIGLayoutRequest, r.Kind)
	}
	if r.Generation <= 0 {
		return fmt.Errorf("generation: must be positive, got %d", r.Generation)
	}
	if r.Pod == nil {
		return fmt.Errorf("pod: required (the pending pod the request is for)")
	}
	for _, f := range []struct{ name, value string }{{"namespace", r.Pod.Namespace}, {"name", r.Pod.Name}, {"uid", r.Pod.UID}} {
		if f.value == "" || len(f.value) > maxMIGLayoutPodField {
			return fmt.Errorf("pod.%s: must have 1 to %d characters, got %d", f.name, maxMIGLayoutPodField, len(f.value))
		}
	}
	if len(r.GPUs) > maxMIGLayoutGPUs {
		return fmt.Errorf("gpus: at most %d, got %d", maxMIGLayoutGPUs, len(r.GPUs))
	}
	seen := map[string]bool{}
	for i, g := range r.GPUs {
		f := fmt.Sprintf("gpus[%d]", i)
		if !gpuUUIDPattern.MatchString(g.UUID) {
			return fmt.Errorf("%s.uuid: %q is not a GPU UUID like GPU-<hex>", f, g.UUID)
		}
		if seen[g.UUID] {
			return fmt.Errorf("%s.uuid: %s twice", f, g.UUID)
		}
		seen[g.UUID] = true
		if len(g.Instances) > MIGSlices {
			return fmt.Errorf("%s.instances: at most %d, got %d", f, MIGSlices, len(g.Instances))
		}
		places := make([]MIGPlacement, len(g.Instances))
		for k, in := range g.Instances {
			if err := CheckMIGProfile(fmt.Sprintf("%s.instances[%d].profile", f, k), in.Profile); err != nil {
				return err
			}
			places[k] = in.MIGPlacement
		}
		if err := CheckMIGPlacements(f+".instances", places); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the status.
func (s *MIGLayoutStatus) Validate() error {
	if s.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, s.APIVersion)
	}
	if s.Kind != KindMIGLayoutStatus {
		return fmt.Errorf("kind: must be %q, got %q", KindMIGLayoutStatus, s.Kind)
	}
	if s.Generation <= 0 {
		return fmt.Errorf("generation: must be positive, got %d", s.Generation)
	}
	switch s.State {
	case MIGLayoutApplied, MIGLayoutRefused, MIGLayoutFailed:
	default:
		return fmt.Errorf("state: must be %s, %s or %s, got %q", MIGLayoutApplied, MIGLayoutRefused, MIGLayoutFailed, s.State)
	}
	return nil
}

// ParseMIGLayoutRequest decodes and validates an AnnotationMIGLayoutRequest
// value. Unknown fields are errors.
func ParseMIGLayoutRequest(value string) (*MIGLayoutRequest, error) {
	var r MIGLayoutRequest
	if err := decodeStrict(value, &r); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutRequest, err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutRequest, err)
	}
	return &r, nil
}

// ParseMIGLayoutStatus decodes and validates an AnnotationMIGLayoutStatus
// value. Unknown fields are errors.
func ParseMIGLayoutStatus(value string) (*MIGLayoutStatus, error) {
	var s MIGLayoutStatus
	if err := decodeStrict(value, &s); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutStatus, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutStatus, err)
	}
	return &s, nil
}

// EncodeMIGLayoutRequest validates r and returns it as an annotation value.
func EncodeMIGLayoutRequest(r *MIGLayoutRequest) (string, error) {
	if err := r.Validate(); err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutRequest, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutRequest, err)
	}
	return string(b), nil
}

// EncodeMIGLayoutStatus validates s and returns it as an annotation value.
func EncodeMIGLayoutStatus(s *MIGLayoutStatus) (string, error) {
	if err := s.Validate(); err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutStatus, err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationMIGLayoutStatus, err)
	}
	return string(b), nil
}
