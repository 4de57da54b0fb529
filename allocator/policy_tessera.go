package allocator

import "math"

// TesseraConfig tunes the tessera policy.
type TesseraConfig struct {
	// Quantum, when > 0, rounds the score down to a multiple of Quantum
	// (milli GPU) before nodes are compared, so near-equal nodes tie.
	Quantum float64
	// Alpha weighs the change in CPU-stranded GPU compute against the
	// change in fragmentation.
	Alpha float64
	// CPUSlack scales the CPU the free GPUs of a node are expected to need.
	CPUSlack float64
	// GPUWeighted weighs workload shapes by their GPU demand instead of
	// their pod count.
	GPUWeighted bool
	// GapCPU makes the CPU reserve of each partially used GPU depend on the
	// shapes that fit its free compute (instead of the workload average).
	GapCPU bool
	// Delta weighs the expected final waste of partially used GPUs, and
	// Kappa is the competition constant of that model.
	Delta, Kappa float64
	// Beta weighs the model-pressure penalty (needs ModelCapacity).
	Beta float64
	// ModelCapacity is the number of GPUs per model in the cluster.
	ModelCapacity map[string]int
	// SurplusTie weighs, for CPU-only pods, the CPU surplus left on the node
	// (best fit on surplus when > 0).
	SurplusTie float64
}

// DefaultTesseraConfig returns the tuning used by NewPolicy("tessera").
func DefaultTesseraConfig() TesseraConfig { return TesseraConfig{Alpha: 1, CPUSlack: 1} }

type tesseraPolicy struct {
	model fragModel
	cfg   TesseraConfig
	// cpuPerMilli is the CPU (milli) the workload's GPU pods use per milli
	// of GPU compute.
	cpuPerMilli float64
	pressure    map[string]float64
	// gapCPU[g] is the CPU (milli) a GPU with g milli free is expected to
	// need to be used: g times the CPU-per-milli of the shapes that fit g.
	gapCPU [MilliPerGPU + 1]float64
	// gapWaste[g] is the expected final waste of a GPU left with g free.
	gapWaste [MilliPerGPU + 1]float64
}

// modelPressure returns, per GPU model, how much of the workload's GPU
// demand can only run on a set of models including it (spread over the set
// in proportion to capacity), relative to the model's share of capacity.
func modelPressure(m fragModel, capacity map[string]int) map[string]float64 {
	if len(capacity) == 0 {
		return nil
	}
	var capTotal float64
	for _, c := range capacity {
		capTotal += float64(c)
	}
	var demandTotal float64
	demand := make(map[string]float64)
	for _, s := range m.shapes {
		if s.cpuOK {
			continue
		}
		g := s.freq * float64(s.milli) * float64(s.count)
		demandTotal += g
		if len(s.models) == 0 {
			continue
		}
		var setCap float64
		for _, mod := range s.models {
			setCap += float64(capacity[mod])
		}
		if setCap == 0 {
			continue
		}
		for _, mod := range s.models {
			demand[mod] += g * float64(capacity[mod]) / setCap
		}
	}
	out := make(map[string]float64, len(capacity))
	for mod, c := range capacity {
		if c > 0 && demandTotal > 0 {
			out[mod] = (demand[mod] / demandTotal) / (float64(c) / capTotal)
		}
	}
	return out
}

var _ Policy = (*tesseraPolicy)(nil)

func newTesseraPolicy(m fragModel, cfg TesseraConfig) *tesseraPolicy {
	var cpu, gpu float64
	for _, s := range m.shapes {
		if s.cpuOK {
			continue
		}
		cpu += s.freq * float64(s.cpu)
		gpu += s.freq * float64(s.milli) * float64(s.count)
	}
	if cfg.GPUWeighted {
		var tot float64
		shapes := make([]compiledShape, 0, len(m.shapes))
		for _, s := range m.shapes {
			if !s.cpuOK {
				s.freq *= float64(s.milli) * float64(s.count)
				tot += s.freq
				shapes = append(shapes, s)
			}
		}
		for i := range shapes {
			shapes[i].freq /= tot
		}
		m = fragModel{shapes: shapes}
	}
	p := &tesseraPolicy{model: m, cfg: cfg, pressure: modelPressure(m, cfg.ModelCapacity)}
	// Expected final waste of a gap: it is closed as is with probability
	// 1-phi, or receives a random fitting slice and recurses.
	for g := 1; g < MilliPerGPU; g++ {
		var pf, ew float64
		for _, s := range m.shapes {
			if s.cpuOK || s.whole || s.milli > int64(g) {
				continue
			}
			pf += s.freq
			ew += s.freq * p.gapWaste[g-int(s.milli)]
		}
		if pf == 0 {
			p.gapWaste[g] = float64(g)
			continue
		}
		phi := pf / (pf + cfg.Kappa)
		p.gapWaste[g] = (1-phi)*float64(g) + phi*ew/pf
	}
	for g := 1; g <= MilliPerGPU; g++ {
		var c, mm float64
		for _, s := range m.shapes {
			if s.cpuOK || s.milli > int64(g) {
				continue
			}
			c += s.freq * float64(s.cpu) / float64(s.count)
			mm += s.freq * float64(s.milli)
		}
		if mm > 0 {
			p.gapCPU[g] = float64(g) * c / mm * cfg.CPUSlack
		}
	}
	if gpu > 0 {
		p.cpuPerMilli = cpu / gpu * cfg.CPUSlack
	}
	return p
}

func (p *tesseraPolicy) Name() string { return PolicyTessera }

// stranded estimates the free GPU compute of a node that will not find the
// CPU it needs: free GPU milli beyond what the free CPU can serve at the
// workload's CPU-per-GPU ratio.
func (p *tesseraPolicy) stranded(cpuFree int64, gpus []GPU) float64 {
	if p.cpuPerMilli <= 0 {
		return 0
	}
	var free int64
	var need float64
	for i := range gpus {
		free += gpus[i].MilliFree
		need += p.gapCPU[gpus[i].MilliFree]
	}
	if p.cfg.GapCPU {
		if need <= float64(cpuFree) || need == 0 {
			return 0
		}
		return float64(free) * (1 - float64(cpuFree)/need)
	}
	return math.Max(0, float64(free)-float64(cpuFree)/p.cpuPerMilli)
}

func (p *tesseraPolicy) cost(model string, cpuFree int64, gpus []GPU) float64 {
	c := p.model.amount(model, cpuFree, gpus).Fragmented() + p.cfg.Alpha*p.stranded(cpuFree, gpus)
	if p.cfg.Delta != 0 {
		var w float64
		for i := range gpus {
			w += p.gapWaste[gpus[i].MilliFree]
		}
		c += p.cfg.Delta * w
	}
	return c
}

func (p *tesseraPolicy) q(x float64) float64 {
	if p.cfg.Quantum > 0 {
		return math.Floor(x / p.cfg.Quantum)
	}
	return x
}

func (p *tesseraPolicy) Evaluate(n *Node, r Request) Evaluation {
	before := p.cost(n.Model, n.CPUMilliFree, n.GPUs)
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
			after := p.cost(n.Model, cpu, gpus)
			gpus[i] = n.GPUs[i]
			if s := p.q(before-after) - p.cfg.Beta*p.pressure[n.Model]*float64(r.GPUMilli); !found || s > best.Score {
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
	after := p.cost(n.Model, cpu, gpus)
	score := p.q(before-after) - p.cfg.Beta*p.pressure[n.Model]*float64(r.TotalGPUMilli())
	if r.Kind() == CPUOnly && p.cfg.SurplusTie != 0 {
		surplus := float64(cpu) - float64(n.GPUMilliFree())*p.cpuPerMilli
		score -= p.cfg.SurplusTie * surplus / 1000
	}
	return Evaluation{Score: score, GPUs: set}
}
