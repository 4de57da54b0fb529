package allocator

import "math"

// fgdPolicy is Fragmentation Gradient Descent (FGD, USENIX ATC'23) as in
// its artifact: a node's score is how much placing the pod there reduces
// the node's expected GPU fragmentation with respect to the target
// workload, squashed as int(100 * sigmoid(-Δfrag / 1000)) (so the artifact's
// integer scores, and their ties, are kept). A slice goes to the GPU of
// the node with the best such score (first one on ties); whole GPUs take
// the first fully free ones.
type fgdPolicy struct {
	model fragModel
}

var _ Policy = (*fgdPolicy)(nil)

func (p *fgdPolicy) Name() string { return PolicyFGD }

func (p *fgdPolicy) Evaluate(n *Node, r Request) Evaluation {
	before := p.model.amount(n.Model, n.CPUMilliFree, n.GPUs).Fragmented()
	var buf [MaxGPUsPerNode]GPU
	gpus := buf[:len(n.GPUs)]
	copy(gpus, n.GPUs)
	cpu := n.CPUMilliFree - r.CPUMilli
	var set GPUSet
	switch r.Kind() {
	case Shared:
		best := Evaluation{Score: -1}
		for i := range gpus {
			if !sliceFits(&n.GPUs[i], r) {
				continue
			}
			gpus[i].MilliFree -= r.GPUMilli
			gpus[i].MemFreeMiB -= r.GPUMemMiB
			after := p.model.amount(n.Model, cpu, gpus).Fragmented()
			gpus[i] = n.GPUs[i]
			if s := fgdScore(before - after); s > best.Score {
				best = Evaluation{Score: s, GPUs: GPUSet(0).With(i)}
			}
		}
		return best
	case Whole:
		set = firstFreeGPUs(n, r.GPUs)
		for i := range gpus {
			if set.Has(i) {
				gpus[i].MilliFree = 0
				gpus[i].MemFreeMiB = 0
			}
		}
	}
	after := p.model.amount(n.Model, cpu, gpus).Fragmented()
	return Evaluation{Score: fgdScore(before - after), GPUs: set}
}

// fgdScore is the artifact's int64(sigmoid(Δ/1000) * MaxNodeScore), where Δ
// is the fragmentation before minus after the placement.
func fgdScore(reduction float64) float64 {
	return float64(int64(sigmoid(reduction/1000) * 100))
}

func sigmoid(x float64) float64 { return 1.0 / (1.0 + math.Exp(-x)) }
