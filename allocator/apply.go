package allocator

import "fmt"

// Apply accounts request r placed on GPUs gpus of node n: it subtracts the
// CPU, memory and GPU capacity and bumps the GPU pod class count. It checks
// everything first and leaves n untouched when it returns an error.
func Apply(n *Node, r Request, gpus GPUSet) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("apply on node %s: %w", n.Name, err)
	}
	if err := CheckFit(n, r); err != nil {
		return fmt.Errorf("apply %s: %w", r, err)
	}
	if err := checkGPUSet(n, r, gpus, false); err != nil {
		return fmt.Errorf("apply %s on node %s: %w", r, n.Name, err)
	}
	n.CPUMilliFree -= r.CPUMilli
	n.MemMiBFree -= r.MemMiB
	for i := range n.GPUs {
		if !gpus.Has(i) {
			continue
		}
		g := &n.GPUs[i]
		if r.Kind() == Whole {
			g.MilliFree = 0
			g.MemFreeMiB = 0
		} else {
			g.MilliFree -= r.GPUMilli
			g.MemFreeMiB -= r.GPUMemMiB
		}
	}
	if c := r.podClass(); c >= 0 {
		for len(n.GPUPods) <= c {
			n.GPUPods = append(n.GPUPods, 0)
		}
		n.GPUPods[c]++
	}
	return nil
}

// Release undoes Apply: it gives back what r placed on GPUs gpus of node n
// used. It checks everything first and leaves n untouched on error.
func Release(n *Node, r Request, gpus GPUSet) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("release on node %s: %w", n.Name, err)
	}
	if n.CPUMilliFree+r.CPUMilli > n.CPUMilliCapacity {
		return fmt.Errorf("release %s on node %s: CPU would exceed capacity %dm", r, n.Name, n.CPUMilliCapacity)
	}
	if n.MemMiBFree+r.MemMiB > n.MemMiBCapacity {
		return fmt.Errorf("release %s on node %s: memory would exceed capacity %dMiB", r, n.Name, n.MemMiBCapacity)
	}
	if err := checkGPUSet(n, r, gpus, true); err != nil {
		return fmt.Errorf("release %s on node %s: %w", r, n.Name, err)
	}
	c := r.podClass()
	if c >= 0 && n.podClassCount(c) <= 0 {
		return fmt.Errorf("release %s on node %s: no GPU pod of that class is accounted on the node", r, n.Name)
	}
	n.CPUMilliFree += r.CPUMilli
	n.MemMiBFree += r.MemMiB
	for i := range n.GPUs {
		if !gpus.Has(i) {
			continue
		}
		g := &n.GPUs[i]
		if r.Kind() == Whole {
			g.MilliFree = MilliPerGPU
			g.MemFreeMiB = g.MemTotalMiB
		} else {
			g.MilliFree += r.GPUMilli
			g.MemFreeMiB += r.GPUMemMiB
		}
	}
	if c >= 0 {
		n.GPUPods[c]--
	}
	return nil
}

// checkGPUSet verifies that gpus is a valid GPU choice for r on n, either
// for placing (release=false) or for giving back (release=true).
func checkGPUSet(n *Node, r Request, gpus GPUSet, release bool) error {
	if len(n.GPUs) < 64 && uint64(gpus)>>uint(len(n.GPUs)) != 0 {
		return fmt.Errorf("GPU set %q names GPUs beyond the node's %d", gpus, len(n.GPUs))
	}
	switch r.Kind() {
	case CPUOnly:
		if gpus != 0 {
			return fmt.Errorf("CPU-only request given GPUs %q", gpus)
		}
	case Whole:
		if gpus.Len() != r.GPUs {
			return fmt.Errorf("request for %d whole GPUs given %d GPUs (%q)", r.GPUs, gpus.Len(), gpus)
		}
		for i := range n.GPUs {
			if !gpus.Has(i) {
				continue
			}
			g := n.GPUs[i]
			if !release && !g.FullyFree() {
				return fmt.Errorf("GPU %d is not fully free", i)
			}
			if release && (g.MilliFree != 0 || g.MemFreeMiB != 0) {
				return fmt.Errorf("GPU %d is not fully used, cannot release a whole GPU", i)
			}
		}
	case Shared:
		if gpus.Len() != 1 {
			return fmt.Errorf("slice request given %d GPUs (%q), want exactly 1", gpus.Len(), gpus)
		}
		for i := range n.GPUs {
			if !gpus.Has(i) {
				continue
			}
			g := n.GPUs[i]
			if !release && !sliceFits(&g, r) {
				return fmt.Errorf("slice (%dm, %dMiB) does not fit GPU %d (%dm, %dMiB free)", r.GPUMilli, r.GPUMemMiB, i, g.MilliFree, g.MemFreeMiB)
			}
			if release && (g.MilliFree+r.GPUMilli > MilliPerGPU || g.MemFreeMiB+r.GPUMemMiB > g.MemTotalMiB) {
				return fmt.Errorf("releasing slice (%dm, %dMiB) would exceed GPU %d capacity", r.GPUMilli, r.GPUMemMiB, i)
			}
		}
	}
	return nil
}
