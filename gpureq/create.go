package gpureq

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/api"
)

// MaxMemUnits bounds a pod's tessera.dev/gpu-memory at creation: 2^20 units
// (a TiB of the smallest unit size, 1 MiB) is more than any node's GPUs
// share, and a quantity written in bytes ("24Gi" is 25,769,803,776 units)
// lies far above it.
const MaxMemUnits = 1 << 20

// CheckCreate refuses, at a pod's creation, what ParsePod reads but no
// node would ever run as the user meant it; components that meet a running
// pod do not apply it (a pod admitted before keeps running):
//
//   - a Tessera resource asked as 0 (CodeZeroQuantity): it asks for
//     nothing, and the kubelet fails the pod on a node where that resource
//     has no healthy device ("no healthy devices present");
//   - a tessera.dev/ resource Tessera does not serve (CodeUnknownResource):
//     a typo such as tessera.dev/gpu-mem would wait for ever as
//     "Insufficient";
//   - tessera.dev/gpu-memory written with a binary suffix, or above
//     MaxMemUnits (CodeMemUnitsAsBytes): it counts units, not bytes.
func CheckCreate(pod *corev1.Pod) error {
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for i := range all {
		c := &all[i]
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for _, name := range slices.Sorted(maps.Keys(list)) {
				if r := checkCreateResource(c.Name, name, list[name]); r != nil {
					return r
				}
			}
		}
	}
	return nil
}

// checkCreateResource is CheckCreate's rule for one resource of a
// container.
func checkCreateResource(container string, name corev1.ResourceName, q resource.Quantity) *Refusal {
	if !strings.HasPrefix(string(name), api.Domain+"/") {
		return nil
	}
	if !slices.Contains(api.Resources(), name) && !api.IsMIGResource(name) {
		return &Refusal{Code: CodeUnknownResource, Container: container, Message: fmt.Sprintf(
			"container %q asks for %s, which Tessera does not serve: ask for %s (whole GPUs), %s and %s (a shared slice) or %s<profile> (MIG instances)",
			container, name, api.ResourceGPU, api.ResourceGPUMemory, api.ResourceGPUCore, api.ResourceMIGPrefix)}
	}
	if q.IsZero() {
		return &Refusal{Code: CodeZeroQuantity, Container: container, Message: fmt.Sprintf(
			"container %q asks for 0 %s: remove it (a pod that lists a GPU resource fails on a node where that resource has no healthy device)", container, name)}
	}
	if name == api.ResourceGPUMemory && (q.Format == resource.BinarySI || q.CmpInt64(MaxMemUnits) > 0) {
		return &Refusal{Code: CodeMemUnitsAsBytes, Container: container, Message: fmt.Sprintf(
			"container %q asks for %s %s: it counts units of the node's unit size (%d MiB unless the node agent is configured otherwise), not bytes: write a plain count such as 4, at most %d",
			container, q.String(), name, api.DefaultMemoryUnitMiB, MaxMemUnits)}
	}
	return nil
}
