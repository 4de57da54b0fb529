package allocator

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// MilliPerGPU is the compute capacity of one whole GPU in milli units.
const MilliPerGPU = 1000

// MaxGPUsPerNode is the largest number of GPUs a Node may have (GPUSet is a
// 64-bit mask).
const MaxGPUsPerNode = 64

// GPU is the free capacity of one GPU device on a node.
type GPU struct {
	// Index is the device index on the node (what the device plugin reports).
	Index int
	// MilliFree is the free compute share in milli GPUs, 0..1000.
	MilliFree int64
	// MemFreeMiB and MemTotalMiB are the GPU memory free / total in MiB. Both
	// may be zero when GPU memory is not tracked (as in the Alibaba trace).
	MemFreeMiB  int64
	MemTotalMiB int64
}

// FullyFree reports whether no slice or whole-GPU pod uses the GPU.
func (g GPU) FullyFree() bool {
	return g.MilliFree == MilliPerGPU && g.MemFreeMiB == g.MemTotalMiB
}

// Node is a snapshot of one node's capacity and free resources.
type Node struct {
	Name  string
	Model string // GPU model, e.g. "A100", "T4"; empty for a CPU-only node

	CPUMilliCapacity int64
	CPUMilliFree     int64
	MemMiBCapacity   int64
	MemMiBFree       int64

	GPUs []GPU

	// GPUPods counts the GPU pods running on the node by class: index 0
	// counts shared-slice pods, index k (k >= 1) counts pods holding k whole
	// GPUs. It may be nil or shorter than needed (missing entries are 0).
	// Only the gpuclustering policy reads it; Apply and Release keep it up
	// to date.
	GPUPods []int32
}

// Clone returns a deep copy of n.
func (n *Node) Clone() *Node {
	c := *n
	c.GPUs = append([]GPU(nil), n.GPUs...)
	if n.GPUPods != nil {
		c.GPUPods = append([]int32(nil), n.GPUPods...)
	}
	return &c
}

// GPUMilliFree returns the total free GPU compute of the node in milli.
func (n *Node) GPUMilliFree() int64 {
	var t int64
	for i := range n.GPUs {
		t += n.GPUs[i].MilliFree
	}
	return t
}

// FullyFreeGPUs returns how many GPUs of the node are completely unused.
func (n *Node) FullyFreeGPUs() int {
	c := 0
	for i := range n.GPUs {
		if n.GPUs[i].FullyFree() {
			c++
		}
	}
	return c
}

// podClassCount returns GPUPods[class] (0 when absent).
func (n *Node) podClassCount(class int) int32 {
	if class < 0 || class >= len(n.GPUPods) {
		return 0
	}
	return n.GPUPods[class]
}

// podClasses returns how many distinct GPU pod classes run on the node.
func (n *Node) podClasses() int {
	c := 0
	for _, v := range n.GPUPods {
		if v > 0 {
			c++
		}
	}
	return c
}

// DeviceIndices maps a GPUSet (positions in n.GPUs) to device indices.
func (n *Node) DeviceIndices(s GPUSet) []int {
	out := make([]int, 0, s.Len())
	for i := range n.GPUs {
		if s.Has(i) {
			out = append(out, n.GPUs[i].Index)
		}
	}
	return out
}

// Validate checks that the snapshot is self-consistent.
func (n *Node) Validate() error {
	if n.Name == "" {
		return errors.New("node has no name")
	}
	if n.CPUMilliCapacity < 0 || n.CPUMilliFree < 0 || n.CPUMilliFree > n.CPUMilliCapacity {
		return fmt.Errorf("node %s: CPU free %dm outside [0, %dm]", n.Name, n.CPUMilliFree, n.CPUMilliCapacity)
	}
	if n.MemMiBCapacity < 0 || n.MemMiBFree < 0 || n.MemMiBFree > n.MemMiBCapacity {
		return fmt.Errorf("node %s: memory free %dMiB outside [0, %dMiB]", n.Name, n.MemMiBFree, n.MemMiBCapacity)
	}
	if len(n.GPUs) > MaxGPUsPerNode {
		return fmt.Errorf("node %s: %d GPUs, at most %d supported", n.Name, len(n.GPUs), MaxGPUsPerNode)
	}
	for i, g := range n.GPUs {
		if g.MilliFree < 0 || g.MilliFree > MilliPerGPU {
			return fmt.Errorf("node %s: GPU %d compute free %dm outside [0, %dm]", n.Name, i, g.MilliFree, MilliPerGPU)
		}
		if g.MemTotalMiB < 0 || g.MemFreeMiB < 0 || g.MemFreeMiB > g.MemTotalMiB {
			return fmt.Errorf("node %s: GPU %d memory free %dMiB outside [0, %dMiB]", n.Name, i, g.MemFreeMiB, g.MemTotalMiB)
		}
	}
	for i, v := range n.GPUPods {
		if v < 0 {
			return fmt.Errorf("node %s: negative GPU pod count %d for class %d", n.Name, v, i)
		}
	}
	return nil
}

// Kind is the kind of GPU demand of a request.
type Kind uint8

const (
	// CPUOnly requests no GPU.
	CPUOnly Kind = iota
	// Shared requests one slice of a single GPU.
	Shared
	// Whole requests one or more whole GPUs.
	Whole
)

func (k Kind) String() string {
	switch k {
	case CPUOnly:
		return "cpu-only"
	case Shared:
		return "shared"
	case Whole:
		return "whole"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Request is what one pod asks for.
type Request struct {
	CPUMilli int64
	MemMiB   int64

	// GPUs is the number of whole GPUs. When it is > 0, GPUMilli and
	// GPUMemMiB must be 0.
	GPUs int
	// GPUMilli and GPUMemMiB describe one shared slice of a single GPU:
	// compute in milli (1..999) and/or GPU memory in MiB. Both dimensions
	// must fit on the same GPU.
	GPUMilli  int64
	GPUMemMiB int64

	// Models lists the GPU models the pod may run on; empty means any.
	// It is ignored for CPU-only requests.
	Models []string
}

// Kind returns the kind of GPU demand of r.
func (r Request) Kind() Kind {
	switch {
	case r.GPUs > 0:
		return Whole
	case r.GPUMilli > 0 || r.GPUMemMiB > 0:
		return Shared
	}
	return CPUOnly
}

// TotalGPUMilli is the GPU compute r asks for in milli (1000 per whole GPU).
func (r Request) TotalGPUMilli() int64 {
	if r.GPUs > 0 {
		return int64(r.GPUs) * MilliPerGPU
	}
	return r.GPUMilli
}

// perGPUMilli is the compute r needs on each GPU it uses.
func (r Request) perGPUMilli() int64 {
	if r.GPUs > 0 {
		return MilliPerGPU
	}
	return r.GPUMilli
}

// gpuCount is how many GPUs r occupies (1 for a slice).
func (r Request) gpuCount() int {
	switch r.Kind() {
	case Whole:
		return r.GPUs
	case Shared:
		return 1
	}
	return 0
}

// podClass is the GPUPods index of r (-1 for CPU-only).
func (r Request) podClass() int {
	switch r.Kind() {
	case Whole:
		return r.GPUs
	case Shared:
		return 0
	}
	return -1
}

// AllowsModel reports whether r may run on a GPU of the given model: one
// of r.Models matches it as api.ModelAllowed says (a name or a word of it:
// "A100" matches "NVIDIA A100-SXM4-40GB"); no Models, any model.
func (r Request) AllowsModel(model string) bool { return api.ModelAllowed(model, r.Models) }

// Validate checks that r is well formed.
func (r Request) Validate() error {
	switch {
	case r.CPUMilli < 0:
		return fmt.Errorf("negative CPU request %dm", r.CPUMilli)
	case r.MemMiB < 0:
		return fmt.Errorf("negative memory request %dMiB", r.MemMiB)
	case r.GPUs < 0:
		return fmt.Errorf("negative GPU count %d", r.GPUs)
	case r.GPUMilli < 0 || r.GPUMemMiB < 0:
		return fmt.Errorf("negative GPU slice (%dm, %dMiB)", r.GPUMilli, r.GPUMemMiB)
	case r.GPUs > 0 && (r.GPUMilli > 0 || r.GPUMemMiB > 0):
		return fmt.Errorf("request asks for %d whole GPUs and a slice (%dm, %dMiB): use one or the other", r.GPUs, r.GPUMilli, r.GPUMemMiB)
	case r.GPUMilli >= MilliPerGPU:
		return fmt.Errorf("slice of %dm GPU compute: a slice must be below %dm, ask for GPUs=1 instead", r.GPUMilli, MilliPerGPU)
	case r.GPUs > MaxGPUsPerNode:
		return fmt.Errorf("request asks for %d GPUs, at most %d per node", r.GPUs, MaxGPUsPerNode)
	}
	return nil
}

// String renders r compactly, e.g. "cpu=4000m mem=8192Mi gpu=0.5".
func (r Request) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cpu=%dm mem=%dMi", r.CPUMilli, r.MemMiB)
	switch r.Kind() {
	case Whole:
		fmt.Fprintf(&b, " gpus=%d", r.GPUs)
	case Shared:
		fmt.Fprintf(&b, " slice=%dm", r.GPUMilli)
		if r.GPUMemMiB > 0 {
			fmt.Fprintf(&b, "/%dMi", r.GPUMemMiB)
		}
	}
	if len(r.Models) > 0 {
		fmt.Fprintf(&b, " models=%s", strings.Join(r.Models, "|"))
	}
	return b.String()
}

// GPUSet is a set of GPUs of one node, as positions in Node.GPUs (bit i is
// Node.GPUs[i]). Use Node.DeviceIndices to get device indices.
type GPUSet uint64

// Has reports whether position i is in the set.
func (s GPUSet) Has(i int) bool { return i >= 0 && i < 64 && s&(1<<uint(i)) != 0 }

// With returns the set with position i added.
func (s GPUSet) With(i int) GPUSet { return s | 1<<uint(i) }

// Len returns the number of GPUs in the set.
func (s GPUSet) Len() int { return bits.OnesCount64(uint64(s)) }

// Positions returns the positions in ascending order.
func (s GPUSet) Positions() []int {
	out := make([]int, 0, s.Len())
	for v := uint64(s); v != 0; v &= v - 1 {
		out = append(out, bits.TrailingZeros64(v))
	}
	return out
}

// String renders the positions joined by "-", like the artifact's GPU index
// annotation ("0-1-3"); the empty set is "".
func (s GPUSet) String() string {
	var b strings.Builder
	for i, p := range s.Positions() {
		if i > 0 {
			b.WriteByte('-')
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}
