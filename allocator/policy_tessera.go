package allocator

// TesseraConfig tunes the tessera policy.
type TesseraConfig struct {
	// Placeholder; tuned below.
	Quantize bool
}

// DefaultTesseraConfig returns the tuning used by NewPolicy("tessera").
func DefaultTesseraConfig() TesseraConfig { return TesseraConfig{} }

type tesseraPolicy struct {
	model fragModel
	cfg   TesseraConfig
}

var _ Policy = (*tesseraPolicy)(nil)

func newTesseraPolicy(m fragModel, cfg TesseraConfig) *tesseraPolicy {
	return &tesseraPolicy{model: m, cfg: cfg}
}

func (p *tesseraPolicy) Name() string { return PolicyTessera }

func (p *tesseraPolicy) Evaluate(n *Node, r Request) Evaluation {
	before := p.model.amount(n.Model, n.CPUMilliFree, n.GPUs).Fragmented()
	var buf [MaxGPUsPerNode]GPU
	gpus := buf[:len(n.GPUs)]
	copy(gpus, n.GPUs)
	cpu := n.CPUMilliFree - r.CPUMilli
	var set GPUSet
	switch r.Kind() {
	case Shared:
		best := Evaluation{}
		found := false
		for i := range gpus {
			if !sliceFits(&n.GPUs[i], r) {
				continue
			}
			gpus[i].MilliFree -= r.GPUMilli
			gpus[i].MemFreeMiB -= r.GPUMemMiB
			after := p.model.amount(n.Model, cpu, gpus).Fragmented()
			gpus[i] = n.GPUs[i]
			if s := before - after; !found || s > best.Score {
				best = Evaluation{Score: s, GPUs: GPUSet(0).With(i)}
				found = true
			}
		}
		return best
	case Whole:
		set = firstFreeGPUs(n, r.GPUs)
		for i := range gpus {
			if set.Has(i) {
				gpus[i].MilliFree = 0
				gpus[i].MemFreeMiB = 0
			}
		}
	}
	after := p.model.amount(n.Model, cpu, gpus).Fragmented()
	return Evaluation{Score: before - after, GPUs: set}
}
