package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// AnnotationAssignment is the pod annotation that records which GPU(s) each
// of the pod's containers uses. Its value is an Assignment as JSON.
//
// Two writers share it: the scheduler extender writes the shared part (the
// GPU a container's tessera.dev/gpu-memory and tessera.dev/gpu-core units are
// served from), and the node agent writes the whole-GPU part from what the
// kubelet actually allocated (its PodResources API), so that the scheduler's
// view converges on the node's truth.
const AnnotationAssignment = Domain + "/assignment"

// KindAssignment is the kind of an Assignment.
const KindAssignment = "Assignment"

// Assignment is the value of AnnotationAssignment.
type Assignment struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Containers lists the containers that use a GPU, at most once each.
	Containers []ContainerAssignment `json:"containers"`
}

// ContainerAssignment is what one container uses.
type ContainerAssignment struct {
	// Name is the container's name (init containers included).
	Name string `json:"name"`
	// GPUs are the whole GPUs (tessera.dev/gpu) the kubelet allocated to
	// the container, by UUID and NVML index, ordered by index. The node
	// agent writes them.
	GPUs []GPURef `json:"gpus,omitempty"`
	// Shared is the slice of one GPU the container uses through
	// tessera.dev/gpu-memory and tessera.dev/gpu-core. The scheduler
	// extender writes it.
	Shared *SharedGPU `json:"shared,omitempty"`
	// MIG are the MIG instances (tessera.dev/mig-<profile>) the kubelet
	// allocated to the container, ordered by GPU index and placement. The
	// node agent writes them.
	MIG []MIGRef `json:"mig,omitempty"`
}

// MIGRef names one MIG instance of a node: its UUID, its profile and its
// GPU.
type MIGRef struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
	GPU     GPURef `json:"gpu"`
}

// GPURef names one GPU of a node.
type GPURef struct {
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
}

// SharedGPU is a slice of one GPU, or of several (a multi-GPU slice,
// AnnotationGPUCount): the same amount on each.
type SharedGPU struct {
	GPU GPURef `json:"gpu"`
	// Spread are the other GPUs of a multi-GPU slice, in index order after
	// GPU (whose index is the lowest); empty for a slice of one GPU. Each
	// gets MemoryMiB and Cores, and the container's MPS daemon serves
	// exactly these GPUs (docs/isolation.md).
	Spread []GPURef `json:"spread,omitempty"`
	// MemoryMiB is the GPU memory the container may use on each GPU.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// Cores is the share of each GPU's compute in percent (1..100).
	Cores int64 `json:"cores,omitempty"`
}

// GPUs are the slice's GPUs in index order: GPU, then Spread.
func (s *SharedGPU) GPUs() []GPURef {
	return append([]GPURef{s.GPU}, s.Spread...)
}

// UUIDs are the UUIDs of the slice's GPUs, in index order.
func (s *SharedGPU) UUIDs() []string {
	out := make([]string, 0, 1+len(s.Spread))
	for _, g := range s.GPUs() {
		out = append(out, g.UUID)
	}
	return out
}

// NewAssignment returns an empty Assignment of the current version.
func NewAssignment() *Assignment {
	return &Assignment{APIVersion: Version, Kind: KindAssignment, Containers: []ContainerAssignment{}}
}

// Validate checks an Assignment and names the first offending field.
func (a *Assignment) Validate() error {
	if a.APIVersion != Version {
		return fmt.Errorf("apiVersion: must be %q, got %q", Version, a.APIVersion)
	}
	if a.Kind != KindAssignment {
		return fmt.Errorf("kind: must be %q, got %q", KindAssignment, a.Kind)
	}
	names := map[string]int{}
	for i, c := range a.Containers {
		field := fmt.Sprintf("containers[%d]", i)
		if strings.TrimSpace(c.Name) == "" {
			return fmt.Errorf("%s.name: must not be empty", field)
		}
		if j, dup := names[c.Name]; dup {
			return fmt.Errorf("%s.name: container %q is also containers[%d]", field, c.Name, j)
		}
		names[c.Name] = i
		uuids := map[string]bool{}
		for k, g := range c.GPUs {
			if err := g.validate(); err != nil {
				return fmt.Errorf("%s.gpus[%d].%w", field, k, err)
			}
			if uuids[g.UUID] {
				return fmt.Errorf("%s.gpus[%d].uuid: %q is listed twice", field, k, g.UUID)
			}
			uuids[g.UUID] = true
		}
		if s := c.Shared; s != nil {
			if err := s.GPU.validate(); err != nil {
				return fmt.Errorf("%s.shared.gpu.%w", field, err)
			}
			if s.MemoryMiB < 0 {
				return fmt.Errorf("%s.shared.memoryMiB: must be 0 or more, got %d", field, s.MemoryMiB)
			}
			if s.Cores < 0 || s.Cores > CoresPerGPU {
				return fmt.Errorf("%s.shared.cores: must be 0..%d, got %d", field, CoresPerGPU, s.Cores)
			}
			if s.MemoryMiB == 0 && s.Cores == 0 {
				return fmt.Errorf("%s.shared: must give memoryMiB or cores", field)
			}
			if uuids[s.GPU.UUID] {
				return fmt.Errorf("%s.shared.gpu: %q is also one of the container's whole GPUs", field, s.GPU.UUID)
			}
			if len(s.Spread)+1 > MaxGPUCount {
				return fmt.Errorf("%s.shared.spread: a slice spans at most %d GPUs, got %d", field, MaxGPUCount, len(s.Spread)+1)
			}
			prev := s.GPU
			inSlice := map[string]bool{s.GPU.UUID: true}
			for k, g := range s.Spread {
				f := fmt.Sprintf("%s.shared.spread[%d]", field, k)
				if err := g.validate(); err != nil {
					return fmt.Errorf("%s.%w", f, err)
				}
				if inSlice[g.UUID] || uuids[g.UUID] {
					return fmt.Errorf("%s.uuid: %q is listed twice", f, g.UUID)
				}
				if g.Index <= prev.Index {
					return fmt.Errorf("%s.index: the slice's GPUs must be in increasing index order, %d after %d", f, g.Index, prev.Index)
				}
				inSlice[g.UUID], prev = true, g
			}
		}
		for k, m := range c.MIG {
			f := fmt.Sprintf("%s.mig[%d]", field, k)
			if !ValidMIGUUID(m.UUID) {
				return fmt.Errorf("%s.uuid: %q is not a MIG UUID like MIG-<hex>", f, m.UUID)
			}
			if uuids[m.UUID] {
				return fmt.Errorf("%s.uuid: %q is listed twice", f, m.UUID)
			}
			uuids[m.UUID] = true
			if err := CheckMIGProfile(f+".profile", m.Profile); err != nil {
				return err
			}
			if err := m.GPU.validate(); err != nil {
				return fmt.Errorf("%s.gpu.%w", f, err)
			}
		}
	}
	return nil
}

func (g GPURef) validate() error {
	if !uuidPattern.MatchString(g.UUID) {
		return fmt.Errorf("uuid: %q is not a GPU UUID like GPU-<hex>", g.UUID)
	}
	if g.Index < 0 {
		return fmt.Errorf("index: must be 0 or more, got %d", g.Index)
	}
	return nil
}

// Container returns the entry of the named container, or nil.
func (a *Assignment) Container(name string) *ContainerAssignment {
	for i := range a.Containers {
		if a.Containers[i].Name == name {
			return &a.Containers[i]
		}
	}
	return nil
}

// ParseAssignment decodes and validates an AnnotationAssignment value.
// Unknown fields are errors.
func ParseAssignment(value string) (*Assignment, error) {
	var a Assignment
	if err := decodeStrict(value, &a); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationAssignment, err)
	}
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationAssignment, err)
	}
	return &a, nil
}

// GetAssignment returns the Assignment in annotations; ok is false when
// there is none. A value that is present but malformed is an error.
func GetAssignment(annotations map[string]string) (a *Assignment, ok bool, err error) {
	value, ok := annotations[AnnotationAssignment]
	if !ok {
		return nil, false, nil
	}
	a, err = ParseAssignment(value)
	if err != nil {
		return nil, true, err
	}
	return a, true, nil
}

// EncodeAssignment validates a and returns it as an annotation value.
func EncodeAssignment(a *Assignment) (string, error) {
	if err := a.Validate(); err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationAssignment, err)
	}
	b, err := json.Marshal(a)
	if err != nil {
		return "", fmt.Errorf("annotation %s: %w", AnnotationAssignment, err)
	}
	return string(b), nil
}

// SetAssignment validates a and stores it in annotations, which must not be
// nil. On error annotations is left unchanged.
func SetAssignment(annotations map[string]string, a *Assignment) error {
	value, err := EncodeAssignment(a)
	if err != nil {
		return err
	}
	annotations[AnnotationAssignment] = value
	return nil
}

// decodeStrict decodes one JSON value into v, rejecting unknown fields and
// trailing data.
func decodeStrict(value string, v any) error {
	if strings.TrimSpace(value) == "" {
		return fmt.Errorf("empty value")
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("not valid JSON for this value: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}
