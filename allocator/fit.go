package allocator

import (
	"fmt"
	"strconv"
)

// Reason says why a request does not fit a node. The zero value, Fits,
// means it fits. Reasons are ordered the way Fit checks them, so a node
// that fails several checks reports the first one.
type Reason uint8

const (
	// Fits means the request fits the node.
	Fits Reason = iota
	// InvalidRequest means the request itself is malformed (see Request.Validate).
	InvalidRequest
	// NoGPUs means the request needs a GPU and the node has none.
	NoGPUs
	// ModelNotAllowed means the node's GPU model is not in the request's list.
	ModelNotAllowed
	// InsufficientCPU means the node has too little free CPU.
	InsufficientCPU
	// InsufficientMemory means the node has too little free memory.
	InsufficientMemory
	// InsufficientWholeGPUs means the node has fewer fully free GPUs than requested.
	InsufficientWholeGPUs
	// NoGPUForSlice means no single GPU has enough free compute and GPU memory for the slice.
	NoGPUForSlice

	numReasons
)

// Reasons lists every non-Fits reason, in check order (for counters).
func Reasons() []Reason {
	out := make([]Reason, 0, numReasons-1)
	for r := InvalidRequest; r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// String returns a short, stable identifier usable as a metric label.
func (r Reason) String() string {
	switch r {
	case Fits:
		return "fits"
	case InvalidRequest:
		return "invalid-request"
	case NoGPUs:
		return "no-gpus"
	case ModelNotAllowed:
		return "gpu-model-not-allowed"
	case InsufficientCPU:
		return "insufficient-cpu"
	case InsufficientMemory:
		return "insufficient-memory"
	case InsufficientWholeGPUs:
		return "insufficient-whole-gpus"
	case NoGPUForSlice:
		return "no-gpu-for-slice"
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Message returns a human-readable sentence for r.
func (r Reason) Message() string {
	switch r {
	case Fits:
		return "the request fits"
	case InvalidRequest:
		return "the request is malformed"
	case NoGPUs:
		return "the node has no GPUs"
	case ModelNotAllowed:
		return "the node's GPU model is not allowed by the request"
	case InsufficientCPU:
		return "not enough free CPU"
	case InsufficientMemory:
		return "not enough free memory"
	case InsufficientWholeGPUs:
		return "not enough fully free GPUs"
	case NoGPUForSlice:
		return "no single GPU has enough free compute and memory for the slice"
	}
	return r.String()
}

// FitError is the error form of a Reason for one node.
type FitError struct {
	Node   string
	Reason Reason
}

func (e *FitError) Error() string {
	return fmt.Sprintf("node %s: %s", e.Node, e.Reason.Message())
}

// CheckFit is Fit returning an error (a *FitError) instead of a Reason.
func CheckFit(n *Node, r Request) error {
	if reason := Fit(n, r); reason != Fits {
		return &FitError{Node: n.Name, Reason: reason}
	}
	return nil
}

// Fit reports whether r fits n, and if not, why. It does not allocate.
func Fit(n *Node, r Request) Reason {
	if r.CPUMilli < 0 || r.MemMiB < 0 || r.GPUs < 0 || r.GPUMilli < 0 || r.GPUMemMiB < 0 ||
		(r.GPUs > 0 && (r.GPUMilli > 0 || r.GPUMemMiB > 0)) || r.GPUMilli >= MilliPerGPU {
		return InvalidRequest
	}
	kind := r.Kind()
	if kind != CPUOnly {
		if len(n.GPUs) == 0 {
			return NoGPUs
		}
		if !r.AllowsModel(n.Model) {
			return ModelNotAllowed
		}
	}
	if n.CPUMilliFree < r.CPUMilli {
		return InsufficientCPU
	}
	if n.MemMiBFree < r.MemMiB {
		return InsufficientMemory
	}
	switch kind {
	case Whole:
		if n.FullyFreeGPUs() < r.GPUs {
			return InsufficientWholeGPUs
		}
	case Shared:
		for i := range n.GPUs {
			if sliceFits(&n.GPUs[i], r) {
				return Fits
			}
		}
		return NoGPUForSlice
	}
	return Fits
}

// sliceFits reports whether the slice of r fits on GPU g.
func sliceFits(g *GPU, r Request) bool {
	return g.MilliFree >= r.GPUMilli && g.MemFreeMiB >= r.GPUMemMiB
}
