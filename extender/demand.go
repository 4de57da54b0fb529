package extender

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
)

// ErrInvalidDemand is wrapped by every error of ParseDemand.
var ErrInvalidDemand = errors.New("invalid GPU request")

// ContainerShare is the shared GPU slice one container asks for.
type ContainerShare struct {
	Name     string
	MemUnits int64 // tessera.dev/gpu-memory units
	Cores    int64 // tessera.dev/gpu-core percent
}

// Demand is what a pod asks of the GPUs of a node, independent of the node.
type Demand struct {
	// WholeGPUs is the number of whole GPUs (tessera.dev/gpu).
	WholeGPUs int
	// Shares are the containers asking for a shared slice. All of them are
	// served from the same GPU.
	Shares []ContainerShare
	// CPUMilli and MemMiB are the pod's effective CPU and memory requests.
	CPUMilli int64
	MemMiB   int64
	// Models restricts GPU models (api.AnnotationGPUModel); empty: any.
	Models []string
	// NVLink requires all whole GPUs in one NVLink clique.
	NVLink bool
}

// Kind is the kind of GPU demand.
func (d *Demand) Kind() allocator.Kind {
	switch {
	case d.WholeGPUs > 0:
		return allocator.Whole
	case len(d.Shares) > 0:
		return allocator.Shared
	}
	return allocator.CPUOnly
}

// SharedTotals returns the summed memory units and cores of the shares.
func (d *Demand) SharedTotals() (memUnits, cores int64) {
	for _, s := range d.Shares {
		memUnits += s.MemUnits
		cores += s.Cores
	}
	return memUnits, cores
}

// ShareMiB is the GPU memory (MiB) share s takes on a GPU with gpuMemMiB
// of advertised memory and memory units of unitMiB: its units, or, when it
// asks only for cores, cores percent of the GPU's memory (rounded up).
func ShareMiB(s ContainerShare, unitMiB, gpuMemMiB int64) int64 {
	if s.MemUnits > 0 {
		return s.MemUnits * unitMiB
	}
	return (s.Cores*gpuMemMiB + api.CoresPerGPU - 1) / api.CoresPerGPU
}

// coresToMilli maps GPU cores (percent) to allocator milli. A slice of 100
// cores maps to 999 milli, because allocator slices are below one whole
// GPU; since the smallest slice is 1 core (10 milli), nothing else fits in
// the remaining milli.
func coresToMilli(cores int64) int64 {
	m := cores * (allocator.MilliPerGPU / api.CoresPerGPU)
	if m >= allocator.MilliPerGPU {
		m = allocator.MilliPerGPU - 1
	}
	return m
}

// Request converts d to an allocator request for a node whose memory unit
// is unitMiB and whose GPUs advertise gpuMemMiB each. Models are left out:
// the extender matches models itself (api.ModelMatches).
func (d *Demand) Request(unitMiB, gpuMemMiB int64) allocator.Request {
	r := allocator.Request{CPUMilli: d.CPUMilli, MemMiB: d.MemMiB, GPUs: d.WholeGPUs}
	var cores int64
	for _, s := range d.Shares {
		r.GPUMemMiB += ShareMiB(s, unitMiB, gpuMemMiB)
		cores += s.Cores
	}
	r.GPUMilli = coresToMilli(cores)
	return r
}

// ParseDemand reads a pod's Tessera resource requests, CPU and memory
// requests and scheduling annotations. Every error wraps ErrInvalidDemand.
func ParseDemand(pod *corev1.Pod) (Demand, error) {
	var d Demand
	models, err := api.GetGPUModels(pod.Annotations)
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrInvalidDemand, err)
	}
	d.Models = models
	if d.NVLink, err = api.GetNVLinkRequired(pod.Annotations); err != nil {
		return d, fmt.Errorf("%w: %w", ErrInvalidDemand, err)
	}

	type totals struct{ gpus, mem, cores, cpu, memBytes int64 }
	var run totals
	var initMax totals
	var shares []ContainerShare
	add := func(c *corev1.Container, t *totals, isMax bool) error {
		var ct totals
		var err error
		if ct.gpus, err = intQuantity(c, api.ResourceGPU); err != nil {
			return err
		}
		if ct.mem, err = intQuantity(c, api.ResourceGPUMemory); err != nil {
			return err
		}
		if ct.cores, err = intQuantity(c, api.ResourceGPUCore); err != nil {
			return err
		}
		if ct.gpus > 0 && (ct.mem > 0 || ct.cores > 0) {
			return fmt.Errorf("container %q asks for whole GPUs and a shared slice: use one or the other", c.Name)
		}
		if ct.cores > api.CoresPerGPU {
			return fmt.Errorf("container %q asks for %d %s, more than one GPU's %d: ask for %s instead", c.Name, ct.cores, api.ResourceGPUCore, api.CoresPerGPU, api.ResourceGPU)
		}
		if ct.mem > 0 || ct.cores > 0 {
			shares = append(shares, ContainerShare{Name: c.Name, MemUnits: ct.mem, Cores: ct.cores})
		}
		ct.cpu = requestOf(c, corev1.ResourceCPU).MilliValue()
		ct.memBytes = requestOf(c, corev1.ResourceMemory).Value()
		if isMax {
			t.gpus, t.mem, t.cores = max(t.gpus, ct.gpus), max(t.mem, ct.mem), max(t.cores, ct.cores)
			t.cpu, t.memBytes = max(t.cpu, ct.cpu), max(t.memBytes, ct.memBytes)
		} else {
			t.gpus, t.mem, t.cores, t.cpu, t.memBytes = t.gpus+ct.gpus, t.mem+ct.mem, t.cores+ct.cores, t.cpu+ct.cpu, t.memBytes+ct.memBytes
		}
		return nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		t := &initMax
		if sidecar {
			t = &run
		}
		if err := add(c, t, !sidecar); err != nil {
			return d, fmt.Errorf("%w: %w", ErrInvalidDemand, err)
		}
	}
	for i := range pod.Spec.Containers {
		if err := add(&pod.Spec.Containers[i], &run, false); err != nil {
			return d, fmt.Errorf("%w: %w", ErrInvalidDemand, err)
		}
	}
	gpus := max(run.gpus, initMax.gpus)
	mem, cores := max(run.mem, initMax.mem), max(run.cores, initMax.cores)
	d.CPUMilli = max(run.cpu, initMax.cpu)
	d.MemMiB = (max(run.memBytes, initMax.memBytes) + (1<<20 - 1)) >> 20
	if o, ok := pod.Spec.Overhead[corev1.ResourceCPU]; ok {
		d.CPUMilli += o.MilliValue()
	}
	if o, ok := pod.Spec.Overhead[corev1.ResourceMemory]; ok {
		d.MemMiB += (o.Value() + (1<<20 - 1)) >> 20
	}
	switch {
	case gpus > 0 && (mem > 0 || cores > 0):
		return d, fmt.Errorf("%w: the pod asks for whole GPUs and a shared slice: use one or the other", ErrInvalidDemand)
	case gpus > allocator.MaxGPUsPerNode:
		return d, fmt.Errorf("%w: the pod asks for %d GPUs, at most %d per node", ErrInvalidDemand, gpus, allocator.MaxGPUsPerNode)
	case cores > api.CoresPerGPU:
		return d, fmt.Errorf("%w: the pod's containers ask for %d %s together, more than one GPU's %d", ErrInvalidDemand, cores, api.ResourceGPUCore, api.CoresPerGPU)
	}
	d.WholeGPUs = int(gpus)
	if mem > 0 || cores > 0 {
		d.Shares = shares
	}
	if d.NVLink && d.WholeGPUs == 0 {
		d.NVLink = false // nothing to connect
	}
	return d, nil
}

// intQuantity returns the integer request (or limit, for extended
// resources that only set a limit) of resource name.
func intQuantity(c *corev1.Container, name corev1.ResourceName) (int64, error) {
	q, ok := c.Resources.Requests[name]
	if !ok {
		q, ok = c.Resources.Limits[name]
	}
	if !ok {
		return 0, nil
	}
	v, exact := q.AsInt64()
	if !exact || v < 0 {
		return 0, fmt.Errorf("container %q: %s must be a non-negative integer, got %s", c.Name, name, q.String())
	}
	return v, nil
}

func requestOf(c *corev1.Container, name corev1.ResourceName) *resource.Quantity {
	if q, ok := c.Resources.Requests[name]; ok {
		return &q
	}
	return resource.NewQuantity(0, resource.DecimalSI)
}
