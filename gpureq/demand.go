package gpureq

import (
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
)

// Kind is how a container runs within its pod.
type Kind uint8

const (
	// Regular is a container of spec.containers.
	Regular Kind = iota
	// Init is an init container that runs to completion before the next
	// one starts.
	Init
	// Sidecar is a restartable init container (restartPolicy: Always): it
	// keeps running beside the init containers after it and the regular
	// containers.
	Sidecar
)

func (k Kind) String() string {
	switch k {
	case Init:
		return "init"
	case Sidecar:
		return "sidecar"
	}
	return "regular"
}

// initKind is the kind of the init container c.
func initKind(c *corev1.Container) Kind {
	if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
		return Sidecar
	}
	return Init
}

// Container is what one container asks of the GPUs.
type Container struct {
	Name string
	Kind Kind
	// Whole is the number of whole GPUs (tessera.dev/gpu).
	Whole int64
	// MemUnits are tessera.dev/gpu-memory units, Cores tessera.dev/gpu-core
	// percent of one GPU. Either or both make a shared slice.
	MemUnits int64
	Cores    int64
	// MIG counts the MIG instances asked per profile
	// (tessera.dev/mig-<profile>); nil when none.
	MIG map[string]int64
}

// Shared reports whether c asks for a shared slice.
func (c Container) Shared() bool { return c.MemUnits > 0 || c.Cores > 0 }

// Check refuses a container that asks for whole GPUs and a slice at once, or
// for more than one GPU's cores. Every component checks a container with it
// (the NRI plugin on what the kubelet allocated).
func (c Container) Check() *Refusal {
	if c.Whole > 0 && c.Shared() {
		return &Refusal{Code: CodeWholeAndShared, Container: c.Name,
			Message: fmt.Sprintf("container %q asks for whole GPUs (%s) and a shared slice (%s, %s) at once: an MPS client sees only its MPS server's GPU, so the two cannot be isolated together; put them in separate containers", c.Name, api.ResourceGPU, api.ResourceGPUMemory, api.ResourceGPUCore)}
	}
	if c.Cores > api.CoresPerGPU {
		return &Refusal{Code: CodeCoresAboveGPU, Container: c.Name,
			Message: fmt.Sprintf("container %q asks for %d %s, more than one GPU's %d: ask for %s instead", c.Name, c.Cores, api.ResourceGPUCore, api.CoresPerGPU, api.ResourceGPU)}
	}
	return nil
}

// Units are whole GPUs and slice units together.
type Units struct {
	Whole, MemUnits, Cores int64
}

// Pod is what a pod asks of the GPUs of a node, independent of the node.
type Pod struct {
	// Containers are the containers that ask for a Tessera resource, in
	// the order they start: init containers (sidecars among them) in spec
	// order, then the regular containers.
	Containers []Container
	// Peak is what the pod holds at once at its peak (KEP-753): the
	// kubelet allocates, and kube-scheduler counts, that many devices of
	// each resource.
	Peak Units
	// CPUMilli and MemMiB are the pod's effective CPU and memory requests
	// (PodRequests: overhead and pod-level resources included), memory
	// rounded up to a whole MiB.
	CPUMilli int64
	MemMiB   int64
	// MIG is what the pod holds at its peak of each MIG profile (the rule
	// of PeakUnits, per profile); nil when it asks for none.
	MIG map[string]int64
	// GPUCount is the number of GPUs each shared container's slice is
	// split over (api.AnnotationGPUCount; 1 when absent).
	GPUCount int
}

// Shares are the containers that ask for a shared slice, with their whole
// requests. All of them are served from the same GPUs.
func (p *Pod) Shares() []Container {
	var out []Container
	for _, c := range p.Containers {
		if c.Shared() {
			out = append(out, c)
		}
	}
	return out
}

// SharesPerGPU are Shares with each container's share of one of its
// GPUCount GPUs (Container.PerGPU; ParsePod refused an uneven split).
func (p *Pod) SharesPerGPU() []Container {
	out := p.Shares()
	for i := range out {
		out[i], _ = out[i].PerGPU(p.GPUCount)
	}
	return out
}

// ParsePod reads a pod's Tessera requests, its GPU count
// (api.AnnotationGPUCount) and its CPU and memory requests. A request
// defaults to the limit. It refuses (a *Refusal) a quantity that is not a
// non-negative integer, a GPU count that does not parse, a container or a
// pod that asks for whole GPUs and a slice, a container or the pod's
// concurrent containers asking for more than one GPU's cores (per GPU of a
// multi-GPU slice), a slice its GPU count does not split evenly, a GPU
// count on a pod without a slice, and more whole GPUs than a node can
// have. The CPU and memory are set even when it refuses.
func ParsePod(pod *corev1.Pod) (Pod, error) {
	out := Pod{GPUCount: 1}
	reqs := resourcehelper.PodRequests(effective(pod, cpuOrMemory), resourcehelper.PodResourcesOptions{})
	if q, ok := reqs[corev1.ResourceCPU]; ok {
		out.CPUMilli = saturated(q, resource.Milli)
	}
	if q, ok := reqs[corev1.ResourceMemory]; ok {
		out.MemMiB = saturated(q, 0)
		if out.MemMiB < math.MaxInt64 {
			out.MemMiB = (out.MemMiB + (1<<20 - 1)) >> 20
		} else {
			out.MemMiB >>= 20
		}
	}
	n, countSet, err := api.GetGPUCount(pod.Annotations)
	if err != nil {
		return out, &Refusal{Code: CodeInvalidGPUCount, Message: err.Error()}
	}
	out.GPUCount = n
	read := func(c *corev1.Container, kind Kind) error {
		rc := Container{Name: c.Name, Kind: kind}
		for _, r := range [...]struct {
			name corev1.ResourceName
			dst  *int64
		}{{api.ResourceGPU, &rc.Whole}, {api.ResourceGPUMemory, &rc.MemUnits}, {api.ResourceGPUCore, &rc.Cores}} {
			q, ok := quantity(c, r.name)
			if !ok {
				continue
			}
			v, err := Count(q)
			if err != nil {
				return &Refusal{Code: CodeInvalidQuantity, Container: c.Name,
					Message: fmt.Sprintf("container %q: %s %v", c.Name, r.name, err)}
			}
			*r.dst = v
		}
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range list {
				profile, ok := api.MIGProfileOf(name)
				if !ok {
					continue
				}
				if _, seen := rc.MIG[profile]; seen {
					continue // the request, read first
				}
				q, _ := quantity(c, name)
				v, err := Count(q)
				if err != nil {
					return &Refusal{Code: CodeInvalidQuantity, Container: c.Name,
						Message: fmt.Sprintf("container %q: %s %v", c.Name, name, err)}
				}
				if rc.MIG == nil {
					rc.MIG = map[string]int64{}
				}
				rc.MIG[profile] = v
			}
		}
		per, r := rc.PerGPU(n)
		if r != nil {
			return r
		}
		if r := per.Check(); r != nil {
			if r.Code == CodeCoresAboveGPU && n > 1 {
				r.Message = fmt.Sprintf("container %q asks for %d %s over %d GPUs, %d on each, more than one GPU's %d", c.Name, rc.Cores, api.ResourceGPUCore, n, per.Cores, api.CoresPerGPU)
			}
			return r
		}
		if rc.Whole > 0 || rc.Shared() || len(rc.MIG) > 0 {
			out.Containers = append(out.Containers, rc)
		}
		return nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if err := read(c, initKind(c)); err != nil {
			return out, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := read(&pod.Spec.Containers[i], Regular); err != nil {
			return out, err
		}
	}
	out.Peak = PeakUnits(out.Containers)
	out.MIG = PeakMIG(out.Containers)
	whole, shared := false, false
	for _, c := range out.Containers {
		whole, shared = whole || c.Whole > 0, shared || c.Shared()
	}
	switch {
	case len(out.MIG) > 0 && (whole || shared):
		return out, &Refusal{Code: CodeMIGAndOther, Message: "the pod asks for MIG instances and whole GPUs or a shared slice: use one kind of GPU resource per pod"}
	case whole && shared:
		return out, &Refusal{Code: CodeWholeAndShared, Message: "the pod asks for whole GPUs and a shared slice: use one or the other"}
	case out.Peak.Whole > allocator.MaxGPUsPerNode:
		return out, &Refusal{Code: CodeTooManyGPUs, Message: fmt.Sprintf("the pod asks for %d GPUs, at most %d per node", out.Peak.Whole, allocator.MaxGPUsPerNode)}
	case countSet && !shared:
		return out, &Refusal{Code: CodeGPUCountWithoutSlice, Message: fmt.Sprintf("annotation %s splits shared slices (%s, %s) over several GPUs, and the pod asks for none: remove it, or ask for %s for whole GPUs", api.AnnotationGPUCount, api.ResourceGPUMemory, api.ResourceGPUCore, api.ResourceGPU)}
	case out.Peak.Cores > api.CoresPerGPU*int64(n):
		if n > 1 {
			return out, &Refusal{Code: CodeCoresAboveGPU, Message: fmt.Sprintf("the pod's containers ask for %d %s together over %d GPUs, %d on each, more than one GPU's %d", out.Peak.Cores, api.ResourceGPUCore, n, out.Peak.Cores/int64(n), api.CoresPerGPU)}
		}
		return out, &Refusal{Code: CodeCoresAboveGPU, Message: fmt.Sprintf("the pod's containers ask for %d %s together, more than one GPU's %d", out.Peak.Cores, api.ResourceGPUCore, api.CoresPerGPU)}
	}
	return out, nil
}

// saturated is q in units of 10^scale, rounded up, within int64: a
// quantity beyond int64 (an absurd request the API server accepts) is
// math.MaxInt64 or math.MinInt64, never wrapped around.
func saturated(q resource.Quantity, scale resource.Scale) int64 {
	if q.Cmp(*resource.NewScaledQuantity(math.MaxInt64, scale)) >= 0 {
		return math.MaxInt64
	}
	if q.Cmp(*resource.NewScaledQuantity(math.MinInt64, scale)) <= 0 {
		return math.MinInt64
	}
	return q.ScaledValue(scale)
}

// quantity is the container's request of name, or its limit when it sets
// only a limit.
func quantity(c *corev1.Container, name corev1.ResourceName) (resource.Quantity, bool) {
	if q, ok := c.Resources.Requests[name]; ok {
		return q, true
	}
	q, ok := c.Resources.Limits[name]
	return q, ok
}

func cpuOrMemory(name corev1.ResourceName) bool {
	return name == corev1.ResourceCPU || name == corev1.ResourceMemory
}

func anyResource(corev1.ResourceName) bool { return true }

// effective returns pod, or a copy of it whose containers' requests default
// to their limits (the API server's defaulting, for pods that did not go
// through it) when some of the resources of interest lack a request. The
// pods the API server stored need no copy.
func effective(pod *corev1.Pod, of func(corev1.ResourceName) bool) *corev1.Pod {
	missing := func(cs []corev1.Container) bool {
		for i := range cs {
			for name := range cs[i].Resources.Limits {
				if _, ok := cs[i].Resources.Requests[name]; !ok && of(name) {
					return true
				}
			}
		}
		return false
	}
	if !missing(pod.Spec.InitContainers) && !missing(pod.Spec.Containers) {
		return pod
	}
	fill := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i := range cs {
			out[i] = cs[i]
			if len(cs[i].Resources.Limits) == 0 {
				continue
			}
			reqs := make(corev1.ResourceList, len(cs[i].Resources.Limits)+len(cs[i].Resources.Requests))
			for name, q := range cs[i].Resources.Limits {
				reqs[name] = q
			}
			for name, q := range cs[i].Resources.Requests {
				reqs[name] = q
			}
			out[i].Resources.Requests = reqs
		}
		return out
	}
	cp := *pod
	cp.Spec.InitContainers = fill(pod.Spec.InitContainers)
	cp.Spec.Containers = fill(pod.Spec.Containers)
	return &cp
}

// vec is up to three amounts aggregated together.
type vec [3]int64

// peak aggregates per-container amounts (of items in start order) the way
// the kubelet admits a pod and kube-scheduler counts it (KEP-753,
// k8s.io/component-helpers/resource.AggregateContainerRequests): regular
// containers and sidecars add up; an init container holds its own amount
// beside the sidecars started before it; the pod holds the larger.
func peak[T any](items []T, kind func(T) Kind, vals func(T) vec) vec {
	var run, sidecars, inits vec
	for _, it := range items {
		v := vals(it)
		switch kind(it) {
		case Regular:
			for j := range v {
				run[j] += v[j]
			}
		case Sidecar:
			for j := range v {
				run[j] += v[j]
				sidecars[j] += v[j]
				inits[j] = max(inits[j], sidecars[j])
			}
		case Init:
			for j := range v {
				inits[j] = max(inits[j], v[j]+sidecars[j])
			}
		}
	}
	for j := range run {
		run[j] = max(run[j], inits[j])
	}
	return run
}

// PeakUnits is what containers (in start order) hold at once at their peak.
func PeakUnits(cs []Container) Units {
	v := peak(cs, func(c Container) Kind { return c.Kind }, func(c Container) vec { return vec{c.Whole, c.MemUnits, c.Cores} })
	return Units{Whole: v[0], MemUnits: v[1], Cores: v[2]}
}

// PeakMIG is what containers (in start order) hold at once at their peak of
// each MIG profile (the rule of PeakUnits, profile by profile); nil when
// they ask for none.
func PeakMIG(cs []Container) map[string]int64 {
	var out map[string]int64
	for _, c := range cs {
		for profile := range c.MIG {
			if _, done := out[profile]; done {
				continue
			}
			v := peak(cs, func(c Container) Kind { return c.Kind }, func(c Container) vec { return vec{c.MIG[profile]} })
			if v[0] > 0 {
				if out == nil {
					out = map[string]int64{}
				}
				out[profile] = v[0]
			}
		}
	}
	return out
}

// KindOf is the kind of pod's container name (Regular when the pod has no
// such container).
func KindOf(pod *corev1.Pod, name string) Kind {
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.Name == name {
			return initKind(c)
		}
	}
	return Regular
}

// Count reads a device resource's quantity as a count: a whole number, not
// negative, that fits an int64. The error says which of those it is not
// (the caller names the container and resource), with the value as asked.
func Count(q resource.Quantity) (int64, error) {
	switch v, exact := q.AsInt64(); {
	case q.Sign() < 0:
		return 0, fmt.Errorf("must not be negative, got %s", q.String())
	case exact:
		return v, nil
	case q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) > 0:
		return 0, fmt.Errorf("is too large, got %s", q.String())
	default:
		return 0, fmt.Errorf("must be a whole number, got %s", q.String())
	}
}
