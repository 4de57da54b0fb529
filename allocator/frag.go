package allocator

import (
	"fmt"

	"github.com/tessera-gpu/tessera/api"
)

// FragCategory classifies a node against one workload shape, following the
// FGD paper's quadrants (Fig. 5) and its artifact.
type FragCategory uint8

const (
	// LackBoth (Q1): the shape lacks both CPU and GPU on the node.
	LackBoth FragCategory = iota
	// LackGPU (Q2): enough CPU, but no GPU set can host the shape.
	LackGPU
	// Satisfied (Q3): the shape fits; GPUs too small for it are still fragments.
	Satisfied
	// LackCPU (Q4): the GPUs could host the shape but the CPU is short.
	LackCPU
	// CPUOnlySatisfied (XL): a CPU-only shape fits (its idle GPUs count as fragments).
	CPUOnlySatisfied
	// CPUOnlyLackCPU (XR): a CPU-only shape lacks CPU.
	CPUOnlyLackCPU
	// NoAccess: the node's GPU model is not allowed by the shape.
	NoAccess

	// NumFragCategories is the number of categories.
	NumFragCategories
)

// FragAmount is the expected amount of idle GPU compute (milli) of a node
// per category, weighted by shape frequency.
type FragAmount [NumFragCategories]float64

// Fragmented is the fragmentation measure of FGD: every category except
// Satisfied, summed in category order (as the artifact does).
func (f FragAmount) Fragmented() float64 {
	var out float64
	for i := FragCategory(0); i < NumFragCategories; i++ {
		if i != Satisfied {
			out += f[i]
		}
	}
	return out
}

// Idle is the total idle GPU compute the amount describes.
func (f FragAmount) Idle() float64 {
	var out float64
	for _, v := range f {
		out += v
	}
	return out
}

// Add adds o to f.
func (f *FragAmount) Add(o FragAmount) {
	for i := range f {
		f[i] += o[i]
	}
}

// compiledShape is a Shape prepared for fast evaluation.
type compiledShape struct {
	cpu    int64
	milli  int64 // per GPU
	mem    int64 // GPU memory of a slice
	count  int   // GPUs needed (1 for a slice)
	whole  bool
	cpuOK  bool // CPU-only shape
	freq   float64
	models []string
}

// allows reports whether the shape may run on a GPU of model
// (api.ModelAllowed; an exact name first, the common case on a hot path).
func (s *compiledShape) allows(model string) bool {
	if len(s.models) == 0 {
		return true
	}
	for _, m := range s.models {
		if m == model {
			return true
		}
	}
	return api.ModelAllowed(model, s.models)
}

// canHost reports whether one GPU can take one unit of the shape.
func (s *compiledShape) canHost(g *GPU) bool {
	if s.whole {
		return g.FullyFree()
	}
	return g.MilliFree >= s.milli && g.MemFreeMiB >= s.mem
}

// fragModel is a compiled Workload.
type fragModel struct {
	shapes []compiledShape
}

func compileWorkload(w Workload) fragModel {
	m := fragModel{shapes: make([]compiledShape, len(w.Shapes))}
	for i, s := range w.Shapes {
		r := s.Request
		m.shapes[i] = compiledShape{
			cpu:    r.CPUMilli,
			milli:  r.perGPUMilli(),
			mem:    r.GPUMemMiB,
			count:  r.gpuCount(),
			whole:  r.Kind() == Whole,
			cpuOK:  r.Kind() == CPUOnly,
			freq:   s.Freq,
			models: r.Models,
		}
	}
	return m
}

// amount computes the FragAmount of a node state given by its model, free
// CPU and GPUs (NodeGpuShareFragAmount in the artifact).
func (m *fragModel) amount(model string, cpuFree int64, gpus []GPU) FragAmount {
	var out FragAmount
	var idle int64
	for i := range gpus {
		idle += gpus[i].MilliFree
	}
	fidle := float64(idle)
	for si := range m.shapes {
		s := &m.shapes[si]
		cpuOK := cpuFree >= s.cpu
		var cat FragCategory
		switch {
		case s.cpuOK:
			if cpuOK {
				cat = CPUOnlySatisfied
			} else {
				cat = CPUOnlyLackCPU
			}
		case !s.allows(model):
			cat = NoAccess
		default:
			hosts := 0
			var small int64
			for gi := range gpus {
				if s.canHost(&gpus[gi]) {
					hosts++
				} else {
					small += gpus[gi].MilliFree
				}
			}
			switch {
			case hosts >= s.count && cpuOK:
				out[LackGPU] += s.freq * float64(small)
				out[Satisfied] += s.freq * float64(idle-small)
				continue
			case hosts >= s.count:
				cat = LackCPU
			case cpuOK:
				cat = LackGPU
			default:
				cat = LackBoth
			}
		}
		out[cat] += s.freq * fidle
	}
	return out
}

// NodeFrag returns the fragmentation amount of node n with respect to
// workload w (the FGD paper's F_n(M)).
func NodeFrag(n *Node, w Workload) FragAmount {
	m := compileWorkload(w)
	return m.amount(n.Model, n.CPUMilliFree, n.GPUs)
}

// FragMeter measures node fragmentation against a fixed workload. Build it
// once with NewFragMeter and reuse it; it is safe for concurrent use.
type FragMeter struct {
	model fragModel
}

// NewFragMeter compiles w for repeated NodeFrag-style measurements.
func NewFragMeter(w Workload) (*FragMeter, error) {
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("frag meter: %w", err)
	}
	return &FragMeter{model: compileWorkload(w)}, nil
}

// Amount returns the fragmentation amount of node n.
func (m *FragMeter) Amount(n *Node) FragAmount {
	return m.model.amount(n.Model, n.CPUMilliFree, n.GPUs)
}
