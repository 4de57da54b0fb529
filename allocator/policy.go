package allocator

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
)

// Evaluation is a policy's verdict on one node for one request.
type Evaluation struct {
	// Score: higher is better. Scores are comparable only between nodes
	// evaluated by the same policy for the same request.
	Score float64
	// GPUs is the GPU choice the policy makes on that node (empty for a
	// CPU-only request).
	GPUs GPUSet
}

// Policy scores nodes for a request and picks GPUs inside a node.
//
// Evaluate must only be called for a node the request fits (Fit(n, r) ==
// Fits); its result is then a valid placement for Apply. Evaluate does not
// modify the node. Policies built by NewPolicy are safe for concurrent use,
// except random, which draws from the *rand.Rand it was given.
type Policy interface {
	Name() string
	Evaluate(n *Node, r Request) Evaluation
}

// Randomized is implemented by policies whose Evaluate draws random numbers.
// Callers must not cache their evaluations.
type Randomized interface {
	Randomized() bool
}

// IsRandomized reports whether p draws random numbers in Evaluate.
func IsRandomized(p Policy) bool {
	r, ok := p.(Randomized)
	return ok && r.Randomized()
}

// Policy names accepted by NewPolicy.
const (
	PolicyRandom        = "random"
	PolicyDotProd       = "dotprod"
	PolicyGPUClustering = "gpuclustering"
	PolicyGPUPacking    = "gpupacking"
	PolicyBestFit       = "bestfit"
	PolicyFGD           = "fgd"
	PolicySpread        = "spread"
	PolicyTessera       = "tessera"
)

// PolicyNames returns every name NewPolicy accepts, sorted.
func PolicyNames() []string {
	names := []string{PolicyRandom, PolicyDotProd, PolicyGPUClustering, PolicyGPUPacking,
		PolicyBestFit, PolicyFGD, PolicySpread, PolicyTessera}
	sort.Strings(names)
	return names
}

// NeedsWorkload reports whether the named policy needs WithWorkload.
func NeedsWorkload(name string) bool {
	return name == PolicyFGD || name == PolicyTessera
}

// ErrUnknownPolicy is wrapped by NewPolicy's error for an unknown name.
var ErrUnknownPolicy = errors.New("unknown policy")

// Option configures NewPolicy.
type Option func(*options)

type options struct {
	workload   *Workload
	rng        *rand.Rand
	tesseraCfg TesseraConfig
	tesseraSet bool
	capacity   map[string]int
}

// WithWorkload gives fragmentation-aware policies (fgd, tessera) their
// target workload.
func WithWorkload(w Workload) Option {
	return func(o *options) { o.workload = &w }
}

// WithRand gives the random policy its source of randomness. Without it
// NewPolicy("random") fails: randomness is always explicit.
func WithRand(r *rand.Rand) Option {
	return func(o *options) { o.rng = r }
}

// WithModelCapacity tells the tessera policy how many GPUs of each model
// the cluster has (for its model-pressure term). Without it, that term is 0.
func WithModelCapacity(gpusPerModel map[string]int) Option {
	return func(o *options) {
		o.capacity = make(map[string]int, len(gpusPerModel))
		for k, v := range gpusPerModel {
			o.capacity[k] = v
		}
	}
}

// WithTesseraConfig overrides the tessera policy's tuning.
func WithTesseraConfig(c TesseraConfig) Option {
	return func(o *options) { o.tesseraCfg = c; o.tesseraSet = true }
}

// NewPolicy builds the policy called name (case-insensitive).
func NewPolicy(name string, opts ...Option) (Policy, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	needWorkload := func() (fragModel, error) {
		if o.workload == nil {
			return fragModel{}, fmt.Errorf("policy %q needs a target workload (WithWorkload)", name)
		}
		if err := o.workload.Validate(); err != nil {
			return fragModel{}, fmt.Errorf("policy %q: %w", name, err)
		}
		return compileWorkload(*o.workload), nil
	}
	switch strings.ToLower(strings.TrimSpace(name)) {
	case PolicyRandom:
		if o.rng == nil {
			return nil, fmt.Errorf("policy %q needs a random source (WithRand)", name)
		}
		return &randomPolicy{rng: o.rng}, nil
	case PolicyDotProd:
		return dotProdPolicy{}, nil
	case PolicyGPUClustering:
		return gpuClusteringPolicy{}, nil
	case PolicyGPUPacking:
		return gpuPackingPolicy{}, nil
	case PolicyBestFit:
		return bestFitPolicy{}, nil
	case PolicySpread:
		return spreadPolicy{}, nil
	case PolicyFGD:
		m, err := needWorkload()
		if err != nil {
			return nil, err
		}
		return &fgdPolicy{model: m}, nil
	case PolicyTessera:
		m, err := needWorkload()
		if err != nil {
			return nil, err
		}
		cfg := DefaultTesseraConfig()
		if o.tesseraSet {
			cfg = o.tesseraCfg
		}
		return newTesseraPolicy(m, cfg, o.capacity), nil
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownPolicy, name, strings.Join(PolicyNames(), ", "))
}

// Place returns the GPUs policy p would use for r on n, or a *FitError
// when r does not fit n.
func Place(p Policy, n *Node, r Request) (GPUSet, error) {
	if err := CheckFit(n, r); err != nil {
		return 0, err
	}
	return p.Evaluate(n, r).GPUs, nil
}

// bestFitGPU returns the position of the GPU with the least free compute
// that still fits the slice of r (first one on ties), or -1.
func bestFitGPU(n *Node, r Request) int {
	best := -1
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !sliceFits(g, r) {
			continue
		}
		if best < 0 || g.MilliFree < n.GPUs[best].MilliFree {
			best = i
		}
	}
	return best
}

// firstFreeGPUs returns the first k fully free GPUs by position (the
// artifact's AllocateExclusiveGpuId).
func firstFreeGPUs(n *Node, k int) GPUSet {
	var s GPUSet
	for i := range n.GPUs {
		if k == 0 {
			break
		}
		if n.GPUs[i].FullyFree() {
			s = s.With(i)
			k--
		}
	}
	return s
}

// bestFitChoice is the artifact's "best" GPU selection: best-fit GPU for a
// slice, the first fully free GPUs for whole GPUs.
func bestFitChoice(n *Node, r Request) GPUSet {
	switch r.Kind() {
	case Shared:
		if i := bestFitGPU(n, r); i >= 0 {
			return GPUSet(0).With(i)
		}
	case Whole:
		return firstFreeGPUs(n, r.GPUs)
	}
	return 0
}
