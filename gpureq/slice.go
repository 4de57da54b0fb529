package gpureq

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
)

// Amount is a slice in absolute terms: GPU memory in MiB and cores in
// percent of one GPU.
type Amount struct {
	MemMiB int64
	Cores  int64
}

// Add returns a + b.
func (a Amount) Add(b Amount) Amount {
	return Amount{MemMiB: a.MemMiB + b.MemMiB, Cores: a.Cores + b.Cores}
}

// Resolve is the slice container c takes on a node whose memory unit is
// unitMiB and whose slice base is baseMiB (CoreOnlyBaseMiB): its memory
// units times unitMiB, or, for a core-only slice, cores percent of baseMiB
// rounded up to a whole MiB. Cores are c's cores; 0 (a memory-only slice)
// means no compute limit.
func Resolve(c Container, unitMiB, baseMiB int64) Amount {
	if c.MemUnits > 0 {
		return Amount{MemMiB: c.MemUnits * unitMiB, Cores: c.Cores}
	}
	return Amount{MemMiB: CoreOnlyMiB(c.Cores, baseMiB), Cores: c.Cores}
}

// CoreOnlyMiB is the memory of a core-only slice of cores on a node whose
// slice base is baseMiB: cores percent of it, rounded up.
func CoreOnlyMiB(cores, baseMiB int64) int64 {
	return (cores*baseMiB + api.CoresPerGPU - 1) / api.CoresPerGPU
}

// Held is one container's resolved slice.
type Held struct {
	Kind   Kind
	Amount Amount
}

// PeakAmount is what the slices held (in start order) take of their GPU at
// once at the pod's peak (the rule of PeakUnits).
func PeakAmount(held []Held) Amount {
	v := peak(held, func(h Held) Kind { return h.Kind }, func(h Held) vec { return vec{h.Amount.MemMiB, h.Amount.Cores} })
	return Amount{MemMiB: v[0], Cores: v[1]}
}

// SlicePeak is what the shared containers of cs take of their one GPU at
// once, resolved with unitMiB and baseMiB.
func SlicePeak(cs []Container, unitMiB, baseMiB int64) Amount {
	held := make([]Held, 0, len(cs))
	for _, c := range cs {
		if c.Shared() {
			held = append(held, Held{Kind: c.Kind, Amount: Resolve(c, unitMiB, baseMiB)})
		}
	}
	return PeakAmount(held)
}

// MemoryUnits is the number of tessera.dev/gpu-memory devices a GPU of
// memMiB advertises: what is left after reserveMiB, in whole units of
// unitMiB (0 when nothing is left or unitMiB is 0).
func MemoryUnits(memMiB, reserveMiB, unitMiB uint64) int64 {
	if unitMiB == 0 || memMiB <= reserveMiB {
		return 0
	}
	return int64((memMiB - reserveMiB) / unitMiB)
}

// GPUCapacity is what shared slices of one GPU of memMiB may use: its
// advertised memory units in MiB, and every core.
func GPUCapacity(memMiB, reserveMiB, unitMiB uint64) Amount {
	return Amount{MemMiB: MemoryUnits(memMiB, reserveMiB, unitMiB) * int64(unitMiB), Cores: api.CoresPerGPU}
}

// CoreOnlyBaseMiB is the GPU memory a core-only slice takes its percentage
// of on a node whose GPUs share capacitiesMiB (GPUCapacity, every GPU of the
// node, healthy or not): the smallest of them, so that a core-only slice
// is the same on every GPU of the node and fits the smallest (the GPUs of
// a node are normally all alike). 0 for a node without GPUs.
func CoreOnlyBaseMiB(capacitiesMiB ...int64) int64 {
	var base int64
	for i, c := range capacitiesMiB {
		if i == 0 || c < base {
			base = c
		}
	}
	return max(base, 0)
}

// CoresToMilli maps a slice's cores to allocator milli. A slice of 100
// cores maps to 999 milli, because allocator slices are below one whole
// GPU; since the smallest slice is 1 core (10 milli), nothing else fits in
// the remaining milli.
func CoresToMilli(cores int64) int64 {
	return min(UsedCoresToMilli(cores), allocator.MilliPerGPU-1)
}

// UsedCoresToMilli maps the cores in use on a GPU to allocator milli,
// without the slice cap.
func UsedCoresToMilli(cores int64) int64 {
	return cores * (allocator.MilliPerGPU / api.CoresPerGPU)
}

// GPUUse is how one GPU is used now.
type GPUUse struct {
	// Whole: allocated whole (tessera.dev/gpu).
	Whole bool
	// Shared: serves slices, or a slice is assigned to it.
	Shared bool
}

// CheckWhole refuses to give a GPU used as u whole: whole and shared use of
// one GPU exclude each other.
func CheckWhole(u GPUUse) *Refusal {
	if u.Shared {
		return &Refusal{Code: CodeGPUServesShared, Message: "serves shared units and cannot be allocated whole"}
	}
	return nil
}

// CheckShared refuses to put a slice on a GPU used as u.
func CheckShared(u GPUUse) *Refusal {
	if u.Whole {
		return &Refusal{Code: CodeGPUUsedWhole, Message: "is allocated whole and cannot serve shared units"}
	}
	return nil
}

// FitSlice checks that a slice of want fits a GPU of capacity c whose
// slices use used: memory and cores each within the capacity.
func FitSlice(c, used, want Amount) *Refusal {
	if used.MemMiB+want.MemMiB > c.MemMiB {
		return &Refusal{Code: CodeMemoryOvercommitted, Used: used.MemMiB, Capacity: c.MemMiB, Asked: want.MemMiB,
			Message: fmt.Sprintf("over-committed: %d MiB of its %d shared MiB are in use and the slice asks for %d MiB", used.MemMiB, c.MemMiB, want.MemMiB)}
	}
	if used.Cores+want.Cores > c.Cores {
		return &Refusal{Code: CodeCoresOvercommitted, Used: used.Cores, Capacity: c.Cores, Asked: want.Cores,
			Message: fmt.Sprintf("over-committed: %d%% of its compute is in use and the slice asks for %d%%", used.Cores, want.Cores)}
	}
	return nil
}

// CheckDevices checks a container's n devices of one Tessera resource r,
// all a device plugin's Allocate sees of it, on a node of gpus GPUs whose
// largest GPU advertises maxMemUnits memory units: no more cores or memory
// than the node's GPUs could serve together. Allocate does not know the
// pod, so it cannot know its GPU count (api.AnnotationGPUCount): a
// container may hold up to one GPU's share on each of up to
// min(gpus, api.MaxGPUCount) GPUs. The pod's own rules (one GPU's cores
// per GPU, an even split) are the extender's at filter and the NRI
// plugin's at creation. (Whole GPUs and a slice in one container cannot be
// seen there either: the kubelet allocates each resource on its own.)
func CheckDevices(r corev1.ResourceName, n, maxMemUnits, gpus int64) *Refusal {
	spread := max(1, min(gpus, api.MaxGPUCount))
	switch r {
	case api.ResourceGPUCore:
		if n > api.CoresPerGPU*spread {
			return &Refusal{Code: CodeCoresAboveGPU, Message: fmt.Sprintf("%d %s units, more than the node's %d GPUs' %d: ask for %s instead", n, api.ResourceGPUCore, spread, api.CoresPerGPU*spread, api.ResourceGPU)}
		}
	case api.ResourceGPUMemory:
		if n > maxMemUnits*spread {
			return &Refusal{Code: CodeSliceTooLarge, Message: fmt.Sprintf("%d %s units, more than the node's %d GPUs share together (%d each)", n, api.ResourceGPUMemory, spread, maxMemUnits)}
		}
	}
	return nil
}

// StartIndex is the place of pod's container name in the order the
// containers start: init containers (sidecars among them) in spec order,
// then the regular containers; a name the pod lacks comes after all.
// PeakAmount and PeakUnits take containers in this order.
func StartIndex(pod *corev1.Pod, name string) int {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return i
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return len(pod.Spec.InitContainers) + i
		}
	}
	return len(pod.Spec.InitContainers) + len(pod.Spec.Containers)
}

// AssignedSlice is one container's slice that an assignment records on one
// GPU.
type AssignedSlice struct {
	Container string
	GPU       api.GPURef
	Held
}

// AssignedSlices are the slices assignment a records for pod, one per
// container and GPU (a multi-GPU slice on each of its GPUs), in the pod's
// start order (StartIndex; the assignment lists containers by name), each
// with its container's kind: per GPU, what PeakAmount takes. Nil when a
// records none.
func AssignedSlices(pod *corev1.Pod, a *api.Assignment) []AssignedSlice {
	if a == nil {
		return nil
	}
	var out []AssignedSlice
	for _, ca := range a.Containers {
		s := ca.Shared
		if s == nil {
			continue
		}
		h := Held{Kind: KindOf(pod, ca.Name), Amount: Amount{MemMiB: s.MemoryMiB, Cores: s.Cores}}
		for _, g := range s.GPUs() {
			out = append(out, AssignedSlice{Container: ca.Name, GPU: g, Held: h})
		}
	}
	slices.SortStableFunc(out, func(x, y AssignedSlice) int {
		return cmp.Compare(StartIndex(pod, x.Container), StartIndex(pod, y.Container))
	})
	return out
}

// AssignedSlicePeaks is what the slices assignment a records for pod take
// of each GPU (by UUID) at once, at the pod's peak (PeakAmount): an init
// container's slice is not counted beside the containers that start
// after it ended, a sidecar's is. What the extender's fit counts of a bound
// pod, and what every view of a GPU's use shows.
func AssignedSlicePeaks(pod *corev1.Pod, a *api.Assignment) map[string]Amount {
	all := AssignedSlices(pod, a)
	if all == nil {
		return nil
	}
	held := map[string][]Held{}
	for _, s := range all {
		held[s.GPU.UUID] = append(held[s.GPU.UUID], s.Held)
	}
	out := make(map[string]Amount, len(held))
	for uuid, hs := range held {
		out[uuid] = PeakAmount(hs)
	}
	return out
}
