package gpureq

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

// CheckAssignment checks that a names only containers of pod, gives whole
// GPUs only to containers that ask for tessera.dev/gpu (at most as many as
// they ask for: the node agent records them after the kubelet allocated
// them) and a shared slice only to containers that ask for
// tessera.dev/gpu-memory or tessera.dev/gpu-core, with no more cores than
// they ask for when they ask for cores (a multi-GPU slice: its cores on
// each GPU times its GPUs; the slice is what was sealed, so a GPU count
// annotation changed after it was decided widens nothing). A quantity that is not a
// non-negative integer counts as not asked for. The error wraps
// api.ErrDisagrees and is a *Refusal (CodeAssignmentDisagrees).
func CheckAssignment(a *api.Assignment, pod *corev1.Pod) error {
	containers := map[string]*corev1.Container{}
	for i := range pod.Spec.InitContainers {
		containers[pod.Spec.InitContainers[i].Name] = &pod.Spec.InitContainers[i]
	}
	for i := range pod.Spec.Containers {
		containers[pod.Spec.Containers[i].Name] = &pod.Spec.Containers[i]
	}
	disagrees := func(container, format string, args ...any) error {
		r := &Refusal{Code: CodeAssignmentDisagrees, Container: container, Message: fmt.Sprintf(format, args...)}
		return fmt.Errorf("annotation %s: %w: %w", api.AnnotationAssignment, api.ErrDisagrees, r)
	}
	for _, ca := range a.Containers {
		c, ok := containers[ca.Name]
		if !ok {
			return disagrees(ca.Name, "the pod has no container %q", ca.Name)
		}
		if n := lenient(c, api.ResourceGPU); int64(len(ca.GPUs)) > n {
			return disagrees(ca.Name, "container %q is given %d whole GPUs but asks for %d %s", ca.Name, len(ca.GPUs), n, api.ResourceGPU)
		}
		perProfile := map[string]int64{}
		for _, m := range ca.MIG {
			perProfile[m.Profile]++
		}
		for profile, n := range perProfile {
			if asked := lenient(c, api.MIGResource(profile)); n > asked {
				return disagrees(ca.Name, "container %q is given %d %s instances but asks for %d", ca.Name, n, api.MIGResource(profile), asked)
			}
		}
		if sh := ca.Shared; sh != nil {
			mem, cores := lenient(c, api.ResourceGPUMemory), lenient(c, api.ResourceGPUCore)
			if mem <= 0 && cores <= 0 {
				return disagrees(ca.Name, "container %q is given a shared slice but asks for neither %s nor %s", ca.Name, api.ResourceGPUMemory, api.ResourceGPUCore)
			}
			n := int64(1 + len(sh.Spread))
			if cores > 0 && sh.Cores*n > cores {
				if n > 1 {
					return disagrees(ca.Name, "container %q is given %d cores on each of %d GPUs but asks for %d %s", ca.Name, sh.Cores, n, cores, api.ResourceGPUCore)
				}
				return disagrees(ca.Name, "container %q is given %d cores but asks for %d %s", ca.Name, sh.Cores, cores, api.ResourceGPUCore)
			}
		}
	}
	return nil
}

// lenient is the container's integer request of an extended resource (its
// limit when it sets only a limit); 0 when absent or not a non-negative
// integer.
func lenient(c *corev1.Container, name corev1.ResourceName) int64 {
	q, ok := quantity(c, name)
	if !ok {
		return 0
	}
	v, exact := q.AsInt64()
	if !exact || v < 0 {
		return 0
	}
	return v
}

// GrantSlice checks a shared assignment s for a container that holds held
// (its slice resolved on the node: what the kubelet allocated to it) and
// returns the slice to enforce: s, with memory or cores it leaves at 0 set
// to what the container holds. It refuses (CodeAssignmentDisagrees, with
// Capacity the held and Asked the given amount) an assignment that gives
// more memory or cores than the container holds.
func GrantSlice(s api.SharedGPU, held Amount) (api.SharedGPU, *Refusal) {
	if s.MemoryMiB > held.MemMiB {
		return s, &Refusal{Code: CodeAssignmentDisagrees, Capacity: held.MemMiB, Asked: s.MemoryMiB,
			Message: fmt.Sprintf("the assignment gives %d MiB of GPU memory but the container holds only %d MiB", s.MemoryMiB, held.MemMiB)}
	}
	if s.Cores > held.Cores {
		return s, &Refusal{Code: CodeAssignmentDisagrees, Capacity: held.Cores, Asked: s.Cores,
			Message: fmt.Sprintf("the assignment gives %d%% of the GPU's compute but the container holds only %d %s units", s.Cores, held.Cores, api.ResourceGPUCore)}
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = held.MemMiB
	}
	if s.Cores == 0 {
		s.Cores = held.Cores
	}
	return s, nil
}
