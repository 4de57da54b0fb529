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
// for what the decision gives it).
var ErrDisagrees = errors.New("disagrees with the pod's resource requests")

// Sanitize removes from pod, in place, every state annotation that is not
// Tessera's decision for this very pod: a decision without a valid seal, a
// sealed one that is malformed or disagrees with the pod's requests, and a
// seal without its decision. It returns what it removed. Components call it
// on every pod they read (informer transforms, API reads, the scheduler's
// arguments), so nothing downstream can act on a tenant's annotation.
func (s *Sealer) Sanitize(pod *corev1.Pod) []Ignored {
	if pod == nil || len(pod.Annotations) == 0 {
		return nil
	}
	out := s.SanitizeAnnotations(pod.UID, pod.Annotations)
	if a, found, err := s.Assignment(pod.UID, pod.Annotations); found {
		if err == nil {
			err = AssignmentFitsPod(a, pod)
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

// AssignmentFitsPod checks that a names only containers of pod, gives whole
// GPUs only to containers that ask for tessera.dev/gpu (at most as many as
// they ask for: the node agent records them after the kubelet allocated
// them) and a shared slice only to containers that ask for
// tessera.dev/gpu-memory or tessera.dev/gpu-core, with no more cores than
// they ask for when they ask for cores.
func AssignmentFitsPod(a *Assignment, pod *corev1.Pod) error {
	containers := map[string]*corev1.Container{}
	for i := range pod.Spec.InitContainers {
		containers[pod.Spec.InitContainers[i].Name] = &pod.Spec.InitContainers[i]
	}
	for i := range pod.Spec.Containers {
		containers[pod.Spec.Containers[i].Name] = &pod.Spec.Containers[i]
	}
	for _, ca := range a.Containers {
		c, ok := containers[ca.Name]
		if !ok {
			return fmt.Errorf("annotation %s: %w: the pod has no container %q", AnnotationAssignment, ErrDisagrees, ca.Name)
		}
		if n := containerQuantity(c, ResourceGPU); int64(len(ca.GPUs)) > n {
			return fmt.Errorf("annotation %s: %w: container %q is given %d whole GPUs but asks for %d %s", AnnotationAssignment, ErrDisagrees, ca.Name, len(ca.GPUs), n, ResourceGPU)
		}
		if sh := ca.Shared; sh != nil {
			mem, cores := containerQuantity(c, ResourceGPUMemory), containerQuantity(c, ResourceGPUCore)
			if mem <= 0 && cores <= 0 {
				return fmt.Errorf("annotation %s: %w: container %q is given a shared slice but asks for neither %s nor %s", AnnotationAssignment, ErrDisagrees, ca.Name, ResourceGPUMemory, ResourceGPUCore)
			}
			if cores > 0 && sh.Cores > cores {
				return fmt.Errorf("annotation %s: %w: container %q is given %d cores but asks for %d %s", AnnotationAssignment, ErrDisagrees, ca.Name, sh.Cores, cores, ResourceGPUCore)
			}
		}
	}
	return nil
}

// containerQuantity is the container's integer request of an extended
// resource (its limit when it sets only a limit); 0 when absent or not an
// integer.
func containerQuantity(c *corev1.Container, name corev1.ResourceName) int64 {
	q, ok := c.Resources.Requests[name]
	if !ok {
		q, ok = c.Resources.Limits[name]
	}
	if !ok {
		return 0
	}
	v, exact := q.AsInt64()
	if !exact || v < 0 {
		return 0
	}
	return v
}
