package sim

import (
	"fmt"
	"math/rand"

	"github.com/tessera-gpu/tessera/allocator"
)

// synthTrace builds a small cluster and workload shaped like the Alibaba
// trace (8-GPU and 2-GPU nodes of two models; CPU-only, slice, one-GPU and
// multi-GPU pods, some restricted to a model).
func synthTrace(seed int64) *Trace {
	rng := rand.New(rand.NewSource(seed))
	t := &Trace{Workload: "synthetic"}
	for i := 0; i < 24; i++ {
		n := NodeSpec{Name: fmt.Sprintf("node-%02d", i), CPUMilli: 96000, MemMiB: 393216, GPUs: 8, Model: "G2"}
		if i%3 == 0 {
			n = NodeSpec{Name: fmt.Sprintf("node-%02d", i), CPUMilli: 104000, MemMiB: 524288, GPUs: 2, Model: "T4"}
		}
		t.Nodes = append(t.Nodes, n)
	}
	slices := []int64{810, 470, 320, 650, 230, 160}
	for i := 0; i < 160; i++ {
		r := allocator.Request{CPUMilli: int64(1+rng.Intn(16)) * 1000, MemMiB: int64(1+rng.Intn(32)) * 1024}
		switch k := rng.Intn(10); {
		case k < 2:
		case k < 6:
			r.GPUMilli = slices[rng.Intn(len(slices))]
		case k < 9:
			r.GPUs = 1
		default:
			r.GPUs = []int{2, 4, 8}[rng.Intn(3)]
		}
		if r.Kind() != allocator.CPUOnly && rng.Intn(5) == 0 {
			r.Models = []string{"T4"}
		}
		t.Pods = append(t.Pods, PodSpec{Name: fmt.Sprintf("pod-%03d", i), Request: r})
	}
	return t
}
