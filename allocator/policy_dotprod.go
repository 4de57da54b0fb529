package allocator

// Normalisers of the artifact (MaxSpecCpu, MaxSpecGpu): the largest node.
const (
	maxSpecCPU = 128000.0
	maxSpecGPU = 8000.0
)

// dotProdPolicy is the artifact's DotProd policy (Tetris-like, dimension
// extension "merge", normalisation "max"): the dot product of the node's
// free (CPU, total GPU) vector and the pod's request, both divided by the
// largest node; a smaller product scores higher. Score = int(100 * (1 -
// dot/2)). GPUs are picked best-fit.
type dotProdPolicy struct{}

var _ Policy = dotProdPolicy{}

func (dotProdPolicy) Name() string { return PolicyDotProd }

func (dotProdPolicy) Evaluate(n *Node, r Request) Evaluation {
	nodeVec := [2]float64{float64(n.CPUMilliFree) / maxSpecCPU, float64(n.GPUMilliFree()) / maxSpecGPU}
	podVec := [2]float64{float64(r.CPUMilli) / maxSpecCPU, float64(r.TotalGPUMilli()) / maxSpecGPU}
	var dot float64
	for i := range nodeVec {
		dot += nodeVec[i] * podVec[i]
	}
	dot /= float64(len(podVec))
	s := 1 - dot
	return Evaluation{Score: float64(int64(100 * s)), GPUs: bestFitChoice(n, r)}
}
