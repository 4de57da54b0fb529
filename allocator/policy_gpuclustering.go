package allocator

// gpuClusteringPolicy is the artifact's GpuClustering policy: put a GPU pod
// where pods of the same class (shared slice, 1 GPU, 2 GPUs, ...) already
// run, preferring nodes that host only that class, then nodes that host it
// among others, then empty nodes, then nodes of other classes; inside each
// band, fuller nodes first. CPU-only pods score 0 everywhere. GPUs are
// picked best-fit. Integer arithmetic as in the artifact.
type gpuClusteringPolicy struct{}

var _ Policy = gpuClusteringPolicy{}

func (gpuClusteringPolicy) Name() string { return PolicyGPUClustering }

func (gpuClusteringPolicy) Evaluate(n *Node, r Request) Evaluation {
	class := r.podClass()
	if class < 0 {
		return Evaluation{}
	}
	fill := 25 * (int64(maxSpecGPU) - n.GPUMilliFree()) / int64(maxSpecGPU)
	var band int64
	classes := n.podClasses()
	switch {
	case n.podClassCount(class) > 0 && classes == 1:
		band = 75
	case n.podClassCount(class) > 0:
		band = 50
	case classes == 0:
		band = 25
	}
	return Evaluation{Score: float64(fill + band), GPUs: bestFitChoice(n, r)}
}
