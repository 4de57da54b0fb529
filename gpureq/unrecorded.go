package gpureq

import "github.com/tessera-gpu/tessera/api"

// Holds is what a pod holds of its node's GPUs at its peak, by kind:
// whole GPUs, the GPUs its slice spans (0: no slice), MIG instances per
// profile (nil: none).
type Holds struct {
	Whole     int
	SliceGPUs int
	MIG       map[string]int
}

// Holds is what p holds of its node's GPUs (a MIG count capped at 2^20).
func (p *Pod) Holds() Holds {
	h := Holds{Whole: int(p.Peak.Whole)}
	if len(p.Shares()) > 0 {
		h.SliceGPUs = max(1, p.GPUCount)
	}
	for profile, n := range p.MIG {
		if h.MIG == nil {
			h.MIG = map[string]int{}
		}
		h.MIG[profile] = int(min(n, 1<<20))
	}
	return h
}

// Unrecorded is what a pod bound to a node, holding h, holds there that
// its assignment a (nil: none, or one that cannot be read) does not name
// yet: whole GPUs beyond those recorded (each once, Recorded), or, when
// no container records a slice, every GPU its slice spans (bound without
// the extender: its GPUs are unknown, so it holds that many of the
// node's); and MIG instances of each profile beyond those recorded (nil
// when none). The extender's ledger and the status views read from the
// API server count the same.
func Unrecorded(h Holds, a *api.Assignment) (whole int, mig map[string]int) {
	gpus, instances := Recorded(a)
	sliceRecorded := false
	if a != nil {
		for _, c := range a.Containers {
			sliceRecorded = sliceRecorded || c.Shared != nil
		}
	}
	recordedMIG := map[string]int{}
	for _, m := range instances {
		recordedMIG[m.Profile]++
	}
	whole = max(0, h.Whole-len(gpus))
	if h.SliceGPUs > 0 && !sliceRecorded {
		whole = h.SliceGPUs
	}
	for profile, n := range h.MIG {
		if left := n - recordedMIG[profile]; left > 0 {
			if mig == nil {
				mig = map[string]int{}
			}
			mig[profile] = left
		}
	}
	return whole, mig
}

// Recorded are the whole GPUs and the MIG instances that a's containers
// name (none for a nil a), each once, in the order first named. The node
// agent records what the kubelet allocated to each container, and the
// kubelet hands a regular init container's devices on to the containers
// after it (its device manager's devicesToReuse) while keeping them
// allocated to the pod until it ends: a GPU can be named for the init
// container and again for a later one, and the pod holds it once (an init
// container of 2 GPUs before a container of 1 holds 2, not 3). Every
// reader of a pod's recorded GPUs counts them through this.
func Recorded(a *api.Assignment) (whole []api.GPURef, mig []api.MIGRef) {
	if a == nil {
		return nil, nil
	}
	seen := map[string]bool{}
	for _, c := range a.Containers {
		for _, g := range c.GPUs {
			if !seen[g.UUID] {
				seen[g.UUID] = true
				whole = append(whole, g)
			}
		}
		for _, m := range c.MIG {
			if !seen[m.UUID] {
				seen[m.UUID] = true
				mig = append(mig, m)
			}
		}
	}
	return whole, mig
}
