package allocator

// bestFitPolicy is the artifact's BestFit policy: the node left with the
// least free (CPU, total GPU) after placement, each normalised by the
// largest node and weighted 1/2, scores highest. Score = int(100 * (1 -
// leftover)). (The artifact then min-max normalises scores over the
// feasible nodes, which keeps their order and ties.) GPUs are picked
// best-fit.
type bestFitPolicy struct{}

var _ Policy = bestFitPolicy{}

func (bestFitPolicy) Name() string { return PolicyBestFit }

func (bestFitPolicy) Evaluate(n *Node, r Request) Evaluation {
	free := [2]float64{float64(n.CPUMilliFree), float64(n.GPUMilliFree())}
	req := [2]float64{float64(r.CPUMilli), float64(r.TotalGPUMilli())}
	maxSpec := [2]float64{maxSpecCPU, maxSpecGPU}
	weights := [2]float64{0.5, 0.5}
	var s float64
	for i := range free {
		s += (free[i] - req[i]) / maxSpec[i] * weights[i]
	}
	s = (1.0 - s) * 100
	return Evaluation{Score: float64(int64(s)), GPUs: bestFitChoice(n, r)}
}
