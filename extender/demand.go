package extender

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/numa"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// ErrInvalidDemand is wrapped by every error of ParseDemand.
var ErrInvalidDemand = errors.New("invalid GPU request")

// ContainerShare is the shared GPU slice one container asks for (its kind
// says whether it runs beside the others: see gpureq.PeakAmount).
type ContainerShare = gpureq.Container

// Demand is what a pod asks of the GPUs of a node, independent of the node:
// gpureq's reading of the pod and the extender's scheduling annotations.
type Demand struct {
	// WholeGPUs is the number of whole GPUs (tessera.dev/gpu) the pod
	// holds at its peak.
	WholeGPUs int
	// Shares are the containers asking for a shared slice, in start
	// order, each with its share of one of its GPUs
	// (gpureq.Pod.SharesPerGPU). All of them are served from the same
	// GPUCount GPUs.
	Shares []ContainerShare
	// GPUCount is the number of GPUs the shares are split over
	// (api.AnnotationGPUCount; 1 for a slice of one GPU).
	GPUCount int
	// CPUMilli and MemMiB are the pod's effective CPU and memory requests.
	CPUMilli int64
	MemMiB   int64
	// Models restricts GPU models (api.AnnotationGPUModel); empty: any.
	Models []string
	// NVLink requires all whole GPUs, or the GPUs of a multi-GPU slice,
	// in one NVLink clique.
	NVLink bool
	// MIG counts the MIG instances the pod holds at its peak per profile
	// (tessera.dev/mig-<profile>); nil when none. A pod with MIG asks for
	// no whole GPU and no slice (gpureq refuses the mix).
	MIG map[string]int
	// Align is what must meet on one NUMA node where the node's topology
	// manager requires it: GPUs, exclusive CPUs, pinned memory
	// (numa.PodDemand).
	Align numa.Demand
}

// UsesGPUs reports whether d asks for any GPU resource: whole GPUs, a
// slice or MIG instances.
func (d *Demand) UsesGPUs() bool { return d.Kind() != allocator.CPUOnly || len(d.MIG) > 0 }

// Kind is the kind of GPU demand in the allocator's terms (a MIG demand is
// allocator.CPUOnly: the allocator has no MIG; see UsesGPUs).
func (d *Demand) Kind() allocator.Kind {
	switch {
	case d.WholeGPUs > 0:
		return allocator.Whole
	case len(d.Shares) > 0:
		return allocator.Shared
	}
	return allocator.CPUOnly
}

// SharedTotals returns the memory units and cores the shares hold at once
// at the pod's peak (gpureq.PeakUnits: init containers do not add to the
// others), over all their GPUs.
func (d *Demand) SharedTotals() (memUnits, cores int64) {
	u := gpureq.PeakUnits(d.Shares)
	n := int64(d.gpus())
	return u.MemUnits * n, u.Cores * n
}

// gpus is the number of GPUs a shared demand spans (at least 1).
func (d *Demand) gpus() int { return max(1, d.GPUCount) }

// unrecorded is what a pod demanding d, bound to a node, holds there that
// its assignment a (nil: none) does not name yet (gpureq.Unrecorded):
// whole GPUs, and MIG instances per profile.
func (d *Demand) unrecorded(a *api.Assignment) (whole int, mig map[string]int) {
	h := gpureq.Holds{Whole: d.WholeGPUs, MIG: d.MIG}
	if len(d.Shares) > 0 {
		h.SliceGPUs = d.gpus()
	}
	return gpureq.Unrecorded(h, a)
}

// SliceOn is what the shares take of each of their GPUs at once (gpureq.SlicePeak)
// on a node whose memory unit is unitMiB and whose core-only slice base is
// baseMiB (NodeInfo.SliceBaseMiB).
func (d *Demand) SliceOn(unitMiB, baseMiB int64) gpureq.Amount {
	return gpureq.SlicePeak(d.Shares, unitMiB, baseMiB)
}

// Request converts d to an allocator request for a node whose memory unit
// is unitMiB and whose core-only slice base is baseMiB: for a multi-GPU
// slice, what it takes of each one of its GPUs. Models are left out: the
// extender matches models itself (api.ModelMatches).
func (d *Demand) Request(unitMiB, baseMiB int64) allocator.Request {
	r := allocator.Request{CPUMilli: d.CPUMilli, MemMiB: d.MemMiB, GPUs: d.WholeGPUs}
	if len(d.Shares) > 0 {
		s := d.SliceOn(unitMiB, baseMiB)
		r.GPUMemMiB, r.GPUMilli = s.MemMiB, gpureq.CoresToMilli(s.Cores)
	}
	return r
}

// ParseDemand reads a pod's Tessera resource requests (gpureq.ParsePod),
// CPU and memory requests and scheduling annotations. Every error wraps
// ErrInvalidDemand (and, for the requests, a *gpureq.Refusal).
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
	p, err := gpureq.ParsePod(pod)
	d.CPUMilli, d.MemMiB = p.CPUMilli, p.MemMiB
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrInvalidDemand, err)
	}
	d.WholeGPUs = int(p.Peak.Whole)
	d.Shares = p.SharesPerGPU()
	d.GPUCount = p.GPUCount
	if d.GPUCount > 1 {
		if _, member, _ := api.GangOf(pod); member {
			return d, fmt.Errorf("%w: annotation %s: a gang member's slice spans one GPU (the gang planner plans one GPU per member)", ErrInvalidDemand, api.AnnotationGPUCount)
		}
	}
	d.MIG = p.Holds().MIG
	d.Align = numa.PodDemand(pod, p)
	if d.NVLink && d.WholeGPUs == 0 && d.GPUCount < 2 {
		d.NVLink = false // nothing to connect
	}
	return d, nil
}
