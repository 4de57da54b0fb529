package allocator

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Shape is one kind of pod of the target workload and how popular it is.
type Shape struct {
	// Request is the pod shape. Only CPUMilli, the GPU demand (GPUs or
	// GPUMilli/GPUMemMiB) and Models matter to fragmentation; MemMiB is
	// ignored, as in the FGD paper.
	Request Request
	// Freq is the share of pods of this shape, in (0, 1].
	Freq float64
}

// Workload is the "target workload" of fragmentation-aware policies: the
// pod shapes expected to arrive and their popularity. It is plain data;
// the frequencies should sum to 1.
type Workload struct {
	Shapes []Shape
}

// Validate checks the shapes and that the frequencies sum to 1 (±1e-3).
func (w Workload) Validate() error {
	if len(w.Shapes) == 0 {
		return errors.New("workload has no shapes")
	}
	var sum float64
	for i, s := range w.Shapes {
		if err := s.Request.Validate(); err != nil {
			return fmt.Errorf("workload shape %d: %w", i, err)
		}
		if !(s.Freq > 0 && s.Freq <= 1) {
			return fmt.Errorf("workload shape %d (%s): frequency %v outside (0, 1]", i, s.Request, s.Freq)
		}
		sum += s.Freq
	}
	if math.Abs(sum-1) > 1e-3 {
		return fmt.Errorf("workload frequencies sum to %.4f, want 1", sum)
	}
	return nil
}

// DefaultPopularity is the share of pods the FGD artifact keeps when it
// builds the target workload (its podPopularityThreshold of 95%).
const DefaultPopularity = 0.95

// shapeKey is how the FGD artifact groups pods into shapes: CPU, per-GPU
// compute, GPU count and the allowed-model list (memory is ignored).
type shapeKey struct {
	cpu    int64
	milli  int64 // per GPU: 1000 for whole GPUs, the slice otherwise
	count  int   // number of GPUs (1 for a slice)
	mem    int64 // GPU memory of a slice (0 in the trace)
	models string
}

// less is the artifact's PodResource.Less order (CPU, GPU milli, GPU
// count, model), extended with GPU memory.
func (a shapeKey) less(b shapeKey) bool {
	switch {
	case a.cpu != b.cpu:
		return a.cpu < b.cpu
	case a.milli != b.milli:
		return a.milli < b.milli
	case a.count != b.count:
		return a.count < b.count
	case a.mem != b.mem:
		return a.mem < b.mem
	}
	return a.models < b.models
}

func keyOf(r Request) shapeKey {
	k := shapeKey{cpu: r.CPUMilli}
	if r.Kind() != CPUOnly {
		k.milli = r.perGPUMilli()
		k.count = r.gpuCount()
		k.mem = r.GPUMemMiB
		k.models = strings.Join(r.Models, "|")
	}
	return k
}

// NewWorkload builds the target workload from a list of pod requests the
// way the FGD artifact does (utils.GetTypicalPods): group the pods by
// shape, sort the shapes by decreasing count, keep the most popular ones
// until they cover at least `popularity` (e.g. DefaultPopularity) of all
// pods, and renormalise their frequencies to sum to 1. Pods' memory is not
// part of the shape. popularity must be in (0, 1].
func NewWorkload(reqs []Request, popularity float64) (Workload, error) {
	if len(reqs) == 0 {
		return Workload{}, errors.New("no pods to build a workload from")
	}
	if !(popularity > 0 && popularity <= 1) {
		return Workload{}, fmt.Errorf("popularity %v outside (0, 1]", popularity)
	}
	counts := make(map[shapeKey]float64)
	first := make(map[shapeKey]Request)
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return Workload{}, fmt.Errorf("pod %d: %w", i, err)
		}
		k := keyOf(r)
		if _, ok := first[k]; !ok {
			rr := r
			rr.MemMiB = 0
			if rr.Kind() == CPUOnly {
				rr.Models = nil
			}
			first[k] = rr
		}
		counts[k]++
	}
	keys := make([]shapeKey, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	// Decreasing count; equal counts in decreasing key order (the artifact
	// sorts with sort.Reverse over (count, key)).
	sort.Slice(keys, func(i, j int) bool {
		ci, cj := counts[keys[i]], counts[keys[j]]
		if ci != cj {
			return ci > cj
		}
		return keys[j].less(keys[i])
	})
	total := float64(len(reqs))
	// The artifact compares against a percentage threshold: 95 * total / 100.
	want := popularity * 100 * total / 100.0
	var cum float64
	kept := 0
	for cum < want && kept < len(keys) {
		cum += counts[keys[kept]]
		kept++
	}
	shapes := make([]Shape, kept)
	for i := 0; i < kept; i++ {
		f := counts[keys[i]] / total
		if kept < len(keys) {
			f /= cum / total
		}
		shapes[i] = Shape{Request: first[keys[i]], Freq: f}
	}
	return Workload{Shapes: shapes}, nil
}
