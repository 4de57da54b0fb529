package allocator

// spreadPolicy is a least-allocated policy for the extender: the node with
// the largest mean free share of CPU, memory and GPU compute after
// placement scores highest (0..100). A slice goes to the GPU with the most
// free compute; whole GPUs take the first fully free ones.
type spreadPolicy struct{}

var _ Policy = spreadPolicy{}

func (spreadPolicy) Name() string { return PolicySpread }

func (spreadPolicy) Evaluate(n *Node, r Request) Evaluation {
	var sum, dims float64
	if n.CPUMilliCapacity > 0 {
		sum += float64(n.CPUMilliFree-r.CPUMilli) / float64(n.CPUMilliCapacity)
		dims++
	}
	if n.MemMiBCapacity > 0 {
		sum += float64(n.MemMiBFree-r.MemMiB) / float64(n.MemMiBCapacity)
		dims++
	}
	if len(n.GPUs) > 0 {
		sum += float64(n.GPUMilliFree()-r.TotalGPUMilli()) / float64(len(n.GPUs)*MilliPerGPU)
		dims++
	}
	ev := Evaluation{}
	if dims > 0 {
		ev.Score = 100 * sum / dims
	}
	switch r.Kind() {
	case Shared:
		best := -1
		for i := range n.GPUs {
			g := &n.GPUs[i]
			if sliceFits(g, r) && (best < 0 || g.MilliFree > n.GPUs[best].MilliFree) {
				best = i
			}
		}
		if best >= 0 {
			ev.GPUs = GPUSet(0).With(best)
		}
	case Whole:
		ev.GPUs = firstFreeGPUs(n, r.GPUs)
	}
	return ev
}
