package bound

import (
	"fmt"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/internal/packlp"
)

// Packable is what packing a set of pods onto a number of GPUs can reach
// at best, relaxed to a linear program: an upper bound on the GPU milli any
// placement of any subset of them holds.
type Packable struct {
	// Milli is the bound: no placement of the pods, online or offline,
	// holds more GPU milli on the GPUs.
	Milli float64
	// Patterns is how many ways of filling one GPU with slices the
	// column generation priced before no better one was left.
	Patterns int
}

// Pack bounds the GPU milli that any placement of a subset of the pods
// (whole GPUs and single-GPU slices; CPU-only pods and slices of GPU
// memory alone add nothing, as in TotalGPUMilli) can hold on gpus GPUs. It
// relaxes the problem to GPUs alone: node boundaries, GPU models, CPU and
// memory are left out, and every GPU holds any set of slices whose milli
// add up to at most 1000, so the bound holds for the real problem too. The
// bound is packlp's: the cutting-stock linear program with the choice to
// leave pods out, the objective of dual prices checked feasible against
// every filling of a GPU, valid whatever the solver's rounding.
func Pack(gpus int, pods []allocator.Request) (Packable, error) {
	if gpus < 0 {
		return Packable{}, fmt.Errorf("negative GPU count %d", gpus)
	}
	var whole int64
	count := map[int64]float64{}
	for _, r := range pods {
		switch r.Kind() {
		case allocator.Whole:
			whole += int64(r.GPUs)
		case allocator.Shared:
			switch {
			case r.GPUMilli >= allocator.MilliPerGPU:
				return Packable{}, fmt.Errorf("slice of %d milli: want less than %d", r.GPUMilli, allocator.MilliPerGPU)
			case r.GPUMilli > 0: // a slice of memory alone counts no milli
				count[r.GPUMilli]++
			}
		}
	}
	p := packlp.Problem{Bins: float64(gpus), Whole: float64(whole), Capacity: allocator.MilliPerGPU, PodCounts: true}.WithCounts(count)
	sol, err := packlp.Solve(p)
	if err != nil {
		return Packable{}, err
	}
	return Packable{Milli: sol.Bound, Patterns: sol.Patterns}, nil
}
