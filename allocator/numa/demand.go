package numa

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/gpureq"
)

// Guaranteed reports whether the pod is of the Guaranteed QoS class: the
// class the API server recorded at creation (status.qosClass, which the
// pod's creator cannot set), else computed the way the API server does:
// every container, init containers included, has CPU and memory limits and
// requests equal to them.
func Guaranteed(pod *corev1.Pod) bool {
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass == corev1.PodQOSGuaranteed
	}
	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	if len(all) == 0 {
		return false
	}
	for _, c := range all {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			lim, ok := c.Resources.Limits[r]
			if !ok || lim.IsZero() {
				return false
			}
			if req, ok := c.Resources.Requests[r]; ok && req.Cmp(lim) != 0 {
				return false
			}
		}
	}
	return true
}

// ExclusiveCPUs is how many CPUs the CPU manager's static policy gives
// container c of a Guaranteed pod to itself: its CPU request when that is a
// whole number of CPUs, else none (the container runs in the shared pool).
func ExclusiveCPUs(c *corev1.Container) int {
	q, ok := requestOrLimit(c, corev1.ResourceCPU)
	if !ok {
		return 0
	}
	m := q.MilliValue()
	if m <= 0 || m%1000 != 0 {
		return 0
	}
	return int(m / 1000)
}

// requestOrLimit is c's request of name, or its limit when it sets only a
// limit (the API server's defaulting).
func requestOrLimit(c *corev1.Container, name corev1.ResourceName) (resource.Quantity, bool) {
	if q, ok := c.Resources.Requests[name]; ok {
		return q, true
	}
	q, ok := c.Resources.Limits[name]
	return q, ok
}

// memMiB is c's memory request in MiB, rounded up.
func memMiB(c *corev1.Container) int64 {
	q, ok := requestOrLimit(c, corev1.ResourceMemory)
	if !ok {
		return 0
	}
	return (q.ScaledValue(resource.Scale(0)) + (1<<20 - 1)) >> 20
}

// PodDemand is pod's alignment demand, given its GPU requests as gpureq
// parsed them. Exclusive CPUs and pinned memory count only for a Guaranteed
// pod (the CPU and memory managers' static policies); GPUs count for every
// pod (the device manager hints for them whatever the QoS class).
func PodDemand(pod *corev1.Pod, gpus gpureq.Pod) Demand {
	guaranteed := Guaranteed(pod)
	byName := map[string]gpureq.Container{}
	for _, c := range gpus.Containers {
		byName[c.Name] = c
	}
	var d Demand
	slice := -1 // position in d.Containers of the merged slice unit
	var appCPUs, initCPUs int
	var appMem, initMem int64
	add := func(c *corev1.Container) {
		n := Need{Name: c.Name}
		if g, ok := byName[c.Name]; ok {
			n.GPUs, n.Slice, n.MIG = int(g.Whole), g.Shared(), migNeed(g.MIG)
		}
		if guaranteed {
			n.CPUs, n.MemMiB = ExclusiveCPUs(c), memMiB(c)
		}
		appCPUs += n.CPUs
		appMem += n.MemMiB
		if n.GPUs == 0 && !n.Slice && n.CPUs == 0 && migCount(n.MIG) == 0 {
			return // memory alone is aligned with the pod's other units
		}
		if n.Slice && slice >= 0 {
			m := &d.Containers[slice]
			m.Name = m.Name + "+" + n.Name
			m.CPUs += n.CPUs
			m.MemMiB += n.MemMiB
			return
		}
		if n.Slice {
			slice = len(d.Containers)
		}
		d.Containers = append(d.Containers, n)
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
			continue
		}
		if guaranteed {
			initCPUs = max(initCPUs, ExclusiveCPUs(c))
			initMem = max(initMem, memMiB(c))
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	d.Pod = Need{
		GPUs:   int(gpus.Peak.Whole),
		Slice:  gpus.Peak.MemUnits > 0 || gpus.Peak.Cores > 0,
		CPUs:   max(appCPUs, initCPUs),
		MemMiB: max(appMem, initMem),
		MIG:    migNeed(gpus.MIG),
	}
	if d.Pod.GPUs == 0 && !d.Pod.Slice && d.Pod.CPUs == 0 && migCount(d.Pod.MIG) == 0 {
		d.Pod = Need{}
	}
	return d
}

// migNeed is a MIG request per profile as a Need's (nil when none).
func migNeed(m map[string]int64) map[string]int {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]int, len(m))
	for p, n := range m {
		out[p] = int(n)
	}
	return out
}
