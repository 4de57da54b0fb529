package allocator

// gpuPackingPolicy is the artifact's GpuPacking policy. From best to worst:
// (1) a slice on an already shared GPU, the fuller the better, in [50, 100];
// (2) fully free GPUs on a node already in use, fewer is better, in [33, 50];
// (3) a node with all GPUs free, smaller nodes first, below 33. CPU-only
// pods score 0 everywhere. GPUs are picked best-fit. Integer arithmetic as
// in the artifact.
type gpuPackingPolicy struct{}

var _ Policy = gpuPackingPolicy{}

func (gpuPackingPolicy) Name() string { return PolicyGPUPacking }

func (gpuPackingPolicy) Evaluate(n *Node, r Request) Evaluation {
	kind := r.Kind()
	if kind == CPUOnly {
		return Evaluation{}
	}
	ev := Evaluation{GPUs: bestFitChoice(n, r)}
	free := int64(n.FullyFreeGPUs())
	if free == int64(len(n.GPUs)) {
		ev.Score = float64(max(100/3-free, free))
		return ev
	}
	var idx [MaxGPUsPerNode]int
	order := idx[:len(n.GPUs)]
	for i := range order {
		order[i] = i
	}
	// Stable insertion sort by free compute, smallest first (no allocation).
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && n.GPUs[order[j]].MilliFree < n.GPUs[order[j-1]].MilliFree; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	need := r.gpuCount()
	usedFree := int64(0)
	var freeRatio int64
	for _, i := range order {
		if need == 0 {
			break
		}
		g := &n.GPUs[i]
		ok := sliceFits(g, r)
		if kind == Whole {
			ok = g.FullyFree()
		}
		if !ok {
			continue
		}
		need--
		if g.MilliFree == MilliPerGPU {
			usedFree++
		}
		freeRatio += g.MilliFree * 100 / MilliPerGPU
	}
	switch {
	case need != 0:
		ev.Score = 0
	case usedFree > 0:
		ev.Score = float64(max(100/2-usedFree, 100/3))
	default:
		ev.Score = float64(max(100-freeRatio/10, 100/2))
	}
	return ev
}
