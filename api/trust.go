package api

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Ignored is a state annotation Sanitize removed from a pod, and why.
type Ignored struct {
	Annotation string
	Err        error
}

func (i Ignored) String() string {
	return fmt.Sprintf("ignored annotation %s: %v", i.Annotation, i.Err)
}

// ErrDisagrees is wrapped when a sealed decision does not fit the pod's own
// resource requests (a container it names does not exist or does not ask
// for what the decision gives it): see gpureq.CheckAssignment.
var ErrDisagrees = errors.New("disagrees with the pod's resource requests")

// AssignmentCheck checks a sealed assignment against the pod's own
// resource requests (gpureq.CheckAssignment, which api cannot import: gpureq
// imports api). Its error wraps ErrDisagrees.
type AssignmentCheck func(a *Assignment, pod *corev1.Pod) error

// Sanitize removes from pod, in place, every state annotation that is not
// Tessera's decision for this very pod: a decision without a valid seal, a
// sealed one that is malformed or that fits rejects (it disagrees with the
// pod's requests), and a seal without its decision. It returns what it
// removed. Components call it (through internal/podtrust, which passes
// gpureq.CheckAssignment) on every pod they read (informer transforms, API
// reads, the scheduler's arguments), so nothing downstream can act on a
// tenant's annotation. A nil fits checks the seal and the value only.
func (s *Sealer) Sanitize(pod *corev1.Pod, fits AssignmentCheck) []Ignored {
	if pod == nil || len(pod.Annotations) == 0 {
		return nil
	}
	out := s.SanitizeAnnotations(pod.UID, pod.Annotations)
	if a, found, err := s.Assignment(pod.UID, pod.Annotations); found {
		if err == nil && fits != nil {
			err = fits(a, pod)
		}
		if err != nil {
			delete(pod.Annotations, AnnotationAssignment)
			delete(pod.Annotations, AnnotationAssignmentSeal)
			out = append(out, Ignored{Annotation: AnnotationAssignment, Err: err})
		}
	}
	return out
}

// SanitizeAnnotations is Sanitize for a reader that has a pod's UID and
// annotations but not its spec (the NRI plugin's pod sandbox): it checks the
// seals and that the values parse, not the fit to the pod's requests (the
// NRI plugin checks the container's assignment against what the kubelet
// allocated to it).
func (s *Sealer) SanitizeAnnotations(uid types.UID, annotations map[string]string) []Ignored {
	var out []Ignored
	drop := func(name string, err error) {
		delete(annotations, name)
		delete(annotations, sealOf(name))
		out = append(out, Ignored{Annotation: name, Err: err})
	}
	if _, found, err := s.Assignment(uid, annotations); found && err != nil {
		drop(AnnotationAssignment, err)
	}
	if _, found, err := s.GangPlan(uid, annotations); found && err != nil {
		drop(AnnotationGangPlan, err)
	}
	for _, name := range []string{AnnotationAssignment, AnnotationGangPlan} {
		if _, value := annotations[name]; !value {
			if _, seal := annotations[sealOf(name)]; seal {
				delete(annotations, sealOf(name))
				out = append(out, Ignored{Annotation: sealOf(name), Err: fmt.Errorf("a seal without %s", name)})
			}
		}
	}
	return out
}
