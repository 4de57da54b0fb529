package gpureq

// Code identifies why a request, a slice or an assignment is refused. It is
// stable: components use it as a metric label and tests compare it.
type Code string

// Refusal codes.
const (
	// CodeInvalidQuantity: a Tessera resource is not a non-negative
	// integer.
	CodeInvalidQuantity Code = "invalid-quantity"
	// CodeZeroQuantity: a Tessera resource asked as 0 (CheckCreate).
	CodeZeroQuantity Code = "zero-quantity"
	// CodeUnknownResource: a tessera.dev/ resource Tessera does not serve
	// (CheckCreate).
	CodeUnknownResource Code = "unknown-resource"
	// CodeMemUnitsAsBytes: tessera.dev/gpu-memory written as bytes (a
	// binary suffix, or beyond MaxMemUnits; CheckCreate).
	CodeMemUnitsAsBytes Code = "memory-units-as-bytes"
	// CodeWholeAndShared: one container, or one pod, asks for whole GPUs
	// and a shared slice (an MPS client sees only its server's GPU).
	CodeWholeAndShared Code = "whole-and-shared"
	// CodeMIGAndOther: a pod asks for MIG instances and whole GPUs or a
	// slice.
	CodeMIGAndOther Code = "mig-and-other"
	// CodeCoresAboveGPU: a container, or the containers of a pod running
	// together, ask for more than one GPU's cores.
	CodeCoresAboveGPU Code = "cores-above-one-gpu"
	// CodeTooManyGPUs: more whole GPUs than a node can have.
	CodeTooManyGPUs Code = "too-many-gpus"
	// CodeSliceTooLarge: a slice's memory is more than any GPU of the
	// node shares.
	CodeSliceTooLarge Code = "slice-larger-than-any-gpu"
	// CodeGPUServesShared: a GPU asked for whole serves (or is assigned)
	// shared slices.
	CodeGPUServesShared Code = "gpu-serves-shared"
	// CodeGPUUsedWhole: a GPU asked to serve a slice is used whole.
	CodeGPUUsedWhole Code = "gpu-used-whole"
	// CodeMemoryOvercommitted and CodeCoresOvercommitted: the slice does
	// not fit beside the slices the GPU serves.
	CodeMemoryOvercommitted Code = "memory-over-committed"
	CodeCoresOvercommitted  Code = "cores-over-committed"
	// CodeAssignmentDisagrees: an assignment gives a container what it
	// does not ask for, or more than it holds.
	CodeAssignmentDisagrees Code = "assignment-disagrees"
	// CodeInvalidGPUCount: api.AnnotationGPUCount is not a count of
	// 1..api.MaxGPUCount.
	CodeInvalidGPUCount Code = "invalid-gpu-count"
	// CodeGPUCountWithoutSlice: api.AnnotationGPUCount on a pod that asks
	// for no shared slice (whole GPUs, MIG instances or no GPU).
	CodeGPUCountWithoutSlice Code = "gpu-count-without-slice"
	// CodeGPUCountUneven: a shared container's memory units or cores do
	// not split evenly over its GPU count.
	CodeGPUCountUneven Code = "gpu-count-uneven"
	// CodeGPUCountAboveNode: more GPUs than the node has for slices.
	CodeGPUCountAboveNode Code = "gpu-count-above-node"
	// CodeMPSGroup: the slice's GPUs are under the MPS daemon of another
	// set of GPUs (the group rule, multigpu.go).
	CodeMPSGroup Code = "mps-group-conflict"
)

// Refusal is a typed "no": what is refused (Code), for which container
// (empty: the pod or a GPU), and a sentence that says why.
type Refusal struct {
	Code      Code
	Container string
	Message   string
	// Used, Capacity and Asked are the numbers behind an over-commit or
	// an assignment that gives too much (MiB or cores, as Code says).
	Used, Capacity, Asked int64
}

// Error implements error: the message.
func (r *Refusal) Error() string { return r.Message }

var _ error = (*Refusal)(nil)
