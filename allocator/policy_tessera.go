package allocator

import (
	"math"

	"github.com/tessera-gpu/tessera/api"
)

// TesseraConfig tunes the tessera policy. The zero value is not useful;
// start from DefaultTesseraConfig.
type TesseraConfig struct {
	// FragWeight weighs FGD's fragmentation measure F(n) (the expected idle
	// GPU compute a random pod of the target workload could not use).
	FragWeight float64
	// StrandWeight weighs the GPU compute the node's free CPU cannot feed
	// at the workload's CPU-per-GPU ratio.
	StrandWeight float64
	// GapWeight weighs the expected final waste of partly used GPUs, and
	// GapCompetition is that model's competition constant: a gap that
	// fitting slices arrive for with total frequency p is filled with
	// probability p / (p + GapCompetition).
	GapWeight, GapCompetition float64
	// GapRouting (milli) models that the scheduler routes slices to the
	// gaps they fit best: in the gap-waste recursion a fitting slice s fills
	// gap g with weight freq(s) * exp(-W(g-s) / GapRouting) (relative to
	// the best filler) instead of freq(s). 0 keeps the weight freq(s), a
	// uniformly random fitting slice.
	GapRouting float64
	// OpenCost (milli, weighed by GapWeight like the gap waste) is a cost
	// per partly used GPU: completing a GPU earns it back, opening a
	// free one pays it.
	OpenCost float64
	// ModelWeight weighs the pressure that model-constrained pods put on a
	// GPU model (needs WithModelCapacity).
	ModelWeight float64
	// Scarcity weighs the competition between gaps for the slices that
	// fit them. A slice larger than half a GPU always takes a GPU of its
	// own and leaves a gap of 1000 minus its size, at the slice's frequency
	// o(g). Such a gap, with fitting slices of frequency p, is filled with
	// probability p / (max(p, Scarcity*o(g)) + GapCompetition) instead of
	// p / (p + GapCompetition) (0 turns it off). On the Alibaba trace there
	// are ten 810m slices for each slice of 190m or less: without it the
	// model said W(190) ~ 100 (most such gaps get filled), with it 175
	// (observed: ~185).
	Scarcity float64
	// ClaimFillers (0 or 1; needs Scarcity) makes those gaps claim the
	// slices that fit them best (the smallest gaps first, the largest
	// fitting slice first, Scarcity*o(g) of them); any other gap is then
	// filled with probability q / (q + GapCompetition), q the frequency of
	// the fitting slices left unclaimed. It helps on the seven Alibaba
	// workloads but hurts on variants with other slice sizes (docs/sim.md,
	// "Gap scarcity and the free GPU"), so it is off by default.
	ClaimFillers float64
	// FreeWaste weighs the expected final waste of a fully free GPU in the
	// gap-waste term (0: a free GPU counts as no waste). A free GPU ends
	// up with a whole-GPU pod (no waste) or a slice larger than half a GPU
	// (smaller slices mostly close gaps), in proportion to the GPUs they
	// take; it is capped so that opening a free GPU for any slice never
	// lowers the cost (the cap is the least W(1000-s) plus OpenCost).
	FreeWaste float64
	// Remainder (0 or 1) counts, in FGD's measure, the fully free GPUs of
	// a node beyond the last whole instance of a whole-GPU shape of several
	// GPUs as fragment for it (7 free GPUs: 3 for a 4-GPU shape). FGD asks
	// only whether one instance still fits, so taking one GPU of an empty
	// node looked free of cost for a 4-GPU shape and taking one of a node
	// with 4 free did not, though either leaves room for the same 4-GPU
	// pods (one on each node, or two on one): without an 8-GPU shape in the
	// workload, the extender spread small whole-GPU pods over empty nodes
	// rather than fill a half-used one.
	Remainder float64
	// PricedGaps (0 or 1) values gaps by the packing LP of the workload
	// (internal/packlp) instead of the recursion above: the workload's
	// pods, as many as the GPUs hold, priced by the LP's dual, and a GPU
	// left with g free wastes g minus the most milli above the prices it
	// can still be filled with (lpGapWaste). Scarcity, ClaimFillers,
	// GapCompetition, GapRouting and FreeWaste then do not apply; the
	// recursion stays where the LP cannot be solved.
	PricedGaps float64
}

// DefaultTesseraConfig returns the tuning used by NewPolicy("tessera"),
// chosen on the Alibaba trace (see docs/sim.md).
func DefaultTesseraConfig() TesseraConfig {
	return TesseraConfig{FragWeight: 0.25, StrandWeight: 4, GapWeight: 4, GapCompetition: 0.01, GapRouting: 5, OpenCost: 40, ModelWeight: 2, Scarcity: 1, FreeWaste: 1, Remainder: 1, PricedGaps: 1}
}

// tesseraPolicy is Tessera's own policy. Like FGD it scores a node by how
// much a placement increases a cost of the node (higher score = smaller
// increase), and picks the slice's GPU with the same criterion, but its
// cost adds three terms to FGD's fragmentation measure (weighted by
// FragWeight, 0.25 by default) and is compared at full precision:
//
//   - CPU stranding: free GPU compute beyond what the node's free CPU can
//     serve at the workload's average CPU per GPU. FGD only notices a CPU
//     shortage once a typical pod no longer fits; this term steers CPU-heavy
//     pods (and CPU-only pods) to CPU-rich nodes before GPUs get stranded.
//   - Gap waste: for each partly used GPU, the expected compute that will
//     never be allocated, from a recursion over the workload's slice sizes
//     (a gap is either filled by a fitting slice, leaving a smaller gap, or
//     stays as it is; fillers that leave less waste are more likely, since
//     the scheduler routes each slice to the gap it fits best). FGD's
//     measure says a 530m gap is mostly fragment because most pods need
//     more; this term knows 470m slices are common and will likely fill it.
//     Each partly used GPU also costs OpenCost: W is a sum over gaps and
//     does not see that one large gap is at least as useful as two
//     smaller ones, so without it a slice may shrink a large gap rather
//     than complete a GPU, or open a free GPU rather than pair up when W
//     believes every gap will be closed.
//   - Model pressure: GPU demand that can only run on a set of models,
//     spread over the set by capacity and divided by the model's share of
//     the cluster. Pods that can run anywhere avoid models that constrained
//     pods depend on.
//
// The default weighs FGD's measure by 0.25: next to the routed gap-waste
// term it costs a little on the Alibaba trace (docs/sim.md), but it is the
// only term that charges a placement for breaking a node a multi-GPU pod
// of the workload could still use; without it the extender spreads small
// pods over empty nodes.
type tesseraPolicy struct {
	model fragModel
	cfg   TesseraConfig
	// cpuPerMilli is the CPU (milli) the workload's GPU pods use per milli
	// of GPU compute.
	cpuPerMilli float64
	// gapWaste[g] is the expected final waste of a GPU left with g free.
	gapWaste [MilliPerGPU + 1]float64
	pressure map[string]float64
	// hostClass[i] is the index in hostKeys of shape i's GPU demand (what
	// canHost looks at): shapes that differ only in CPU or GPU count share
	// it, so fragmented computes which GPUs can host it once.
	hostClass []int
	hostKeys  []compiledShape
}

var _ Policy = (*tesseraPolicy)(nil)

func newTesseraPolicy(m fragModel, cfg TesseraConfig, capacity map[string]int) *tesseraPolicy {
	p := &tesseraPolicy{model: m, cfg: cfg, pressure: modelPressure(m, capacity)}
	p.hostClass = make([]int, len(m.shapes))
	for i, s := range m.shapes {
		p.hostClass[i] = -1
		if s.cpuOK {
			continue
		}
		for k, h := range p.hostKeys {
			if h.whole == s.whole && (s.whole || h.milli == s.milli && h.mem == s.mem) {
				p.hostClass[i] = k
				break
			}
		}
		if p.hostClass[i] < 0 {
			p.hostClass[i] = len(p.hostKeys)
			p.hostKeys = append(p.hostKeys, s)
		}
	}
	var cpu, gpu float64
	for _, s := range m.shapes {
		if !s.cpuOK {
			cpu += s.freq * float64(s.cpu)
			gpu += s.freq * float64(s.milli) * float64(s.count)
		}
	}
	if gpu > 0 {
		p.cpuPerMilli = cpu / gpu
	}
	if cfg.PricedGaps > 0 {
		if w, ok := lpGapWaste(m); ok {
			p.gapWaste = w
			return p
		}
	}
	p.recursiveGapWaste()
	return p
}

// recursiveGapWaste fills p.gapWaste by the recursion over the workload's
// slice sizes (GapCompetition, GapRouting, Scarcity, ClaimFillers) and the
// free GPU's expected waste (FreeWaste): the gap waste without
// PricedGaps, or where the packing LP cannot be solved.
func (p *tesseraPolicy) recursiveGapWaste() {
	m, cfg := p.model, p.cfg
	// open[g]: how often a gap of g is created by a slice larger than half
	// a GPU, which always takes a GPU of its own.
	var open [MilliPerGPU + 1]float64
	for _, s := range m.shapes {
		if !s.cpuOK && !s.whole && 2*s.milli > MilliPerGPU {
			open[MilliPerGPU-int(s.milli)] += s.freq
		}
	}
	// left[g]: the frequency of the slices of at most g milli that those
	// gaps leave unclaimed.
	var left [MilliPerGPU + 1]float64
	claims := cfg.Scarcity > 0 && cfg.ClaimFillers > 0
	if claims {
		var rem [MilliPerGPU + 1]float64
		for _, s := range m.shapes {
			if !s.cpuOK && !s.whole {
				rem[s.milli] += s.freq
			}
		}
		for g := 1; g < MilliPerGPU; g++ {
			need := cfg.Scarcity * open[g]
			for ms := g; ms > 0 && need > 0; ms-- {
				take := math.Min(need, rem[ms])
				rem[ms] -= take
				need -= take
			}
		}
		for g := 1; g <= MilliPerGPU; g++ {
			left[g] = left[g-1] + rem[g]
		}
	}
	for g := 1; g < MilliPerGPU; g++ {
		// The least waste a fitting slice can leave, for the routing
		// weights (relative to it, so that they never all underflow).
		least := math.Inf(1)
		for _, s := range m.shapes {
			if !s.cpuOK && !s.whole && s.milli <= int64(g) {
				least = math.Min(least, p.gapWaste[g-int(s.milli)])
			}
		}
		var fit, next, wsum float64
		for _, s := range m.shapes {
			if s.cpuOK || s.whole || s.milli > int64(g) {
				continue
			}
			fit += s.freq
			w := s.freq
			if cfg.GapRouting > 0 {
				w *= math.Exp(-(p.gapWaste[g-int(s.milli)] - least) / cfg.GapRouting)
			}
			wsum += w
			next += w * p.gapWaste[g-int(s.milli)]
		}
		if fit == 0 {
			p.gapWaste[g] = float64(g)
			continue
		}
		filled := fit / (fit + cfg.GapCompetition)
		switch {
		case cfg.Scarcity > 0 && open[g] > 0:
			filled = fit / (math.Max(fit, cfg.Scarcity*open[g]) + cfg.GapCompetition)
		case claims:
			filled = left[g] / (left[g] + cfg.GapCompetition)
		}
		p.gapWaste[g] = (1-filled)*float64(g) + filled*next/wsum
	}
	p.gapWaste[MilliPerGPU] = cfg.FreeWaste * p.freeGPUWaste()
}

// freeGPUWaste is the expected final waste of a fully free GPU: the pods
// that take free GPUs are the whole-GPU ones, which leave nothing, and the
// slices larger than half a GPU, which leave a gap of waste W(1000-s), in
// proportion to the GPUs they take. Slices of half a GPU or less mostly
// close gaps. It is capped at the least W(1000-s) + OpenCost over the
// workload's slices, so that taking a free GPU for a slice never lowers
// the cost: without the cap, a workload of mostly large slices (gpushare80)
// made opening a GPU look better than closing a gap, every slice spread
// onto free GPUs and the unallocated share went from 10 % to 17-20 %.
func (p *tesseraPolicy) freeGPUWaste() float64 {
	var sum, w float64
	least := math.Inf(1)
	for _, s := range p.model.shapes {
		if s.cpuOK {
			continue
		}
		if !s.whole {
			least = math.Min(least, p.gapWaste[MilliPerGPU-int(s.milli)]+p.cfg.OpenCost)
			if 2*s.milli <= MilliPerGPU {
				continue
			}
		}
		f := s.freq * float64(s.count)
		w += f
		if !s.whole {
			sum += f * p.gapWaste[MilliPerGPU-int(s.milli)]
		}
	}
	if w == 0 {
		return 0
	}
	return math.Min(sum/w, least)
}

// modelPressure returns, per GPU model, the share of the workload's GPU
// demand that can only run on sets of models including it (spread over
// each set in proportion to capacity), divided by the model's share of the
// cluster's GPUs.
func modelPressure(m fragModel, capacity map[string]int) map[string]float64 {
	if len(capacity) == 0 {
		return nil
	}
	var capTotal, demandTotal float64
	for _, c := range capacity {
		capTotal += float64(c)
	}
	demand := make(map[string]float64)
	for _, s := range m.shapes {
		if s.cpuOK {
			continue
		}
		g := s.freq * float64(s.milli) * float64(s.count)
		demandTotal += g
		if len(s.models) == 0 {
			continue // it may run anywhere: no model's pressure
		}
		// The models of the cluster the shape may run on (api.ModelAllowed:
		// a name it asks for, or a word of one).
		var set []string
		var setCap float64
		for mod, c := range capacity {
			if api.ModelAllowed(mod, s.models) {
				set = append(set, mod)
				setCap += float64(c)
			}
		}
		if setCap == 0 {
			continue
		}
		for _, mod := range set {
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

func (p *tesseraPolicy) Name() string { return PolicyTessera }

// cost of a node state (lower is better).
func (p *tesseraPolicy) cost(model string, cpuFree int64, gpus []GPU) float64 {
	var free int64
	var gaps float64
	var open int
	for i := range gpus {
		free += gpus[i].MilliFree
		gaps += p.gapWaste[gpus[i].MilliFree]
		if gpus[i].MilliFree > 0 && gpus[i].MilliFree < MilliPerGPU {
			open++
		}
	}
	gaps += p.cfg.OpenCost * float64(open)
	c := p.cfg.GapWeight * gaps
	if p.cpuPerMilli > 0 {
		c += p.cfg.StrandWeight * math.Max(0, float64(free)-float64(cpuFree)/p.cpuPerMilli)
	}
	if p.cfg.FragWeight != 0 {
		c += p.cfg.FragWeight * p.fragmented(model, cpuFree, gpus)
	}
	return c
}

// maxHostClasses bounds the shape classes fragmented keeps on the stack;
// a workload with more falls back to fragModel.amount.
const maxHostClasses = 64

// fragmented is p.model.amount(model, cpuFree, gpus).Fragmented(), bit for
// bit (the same sums in the same order), but it finds which GPUs can host
// a shape once per GPU demand rather than once per shape; with Remainder,
// a whole-GPU shape of several GPUs that fits also counts the free GPUs
// beyond its last whole instance (remainderMilli).
func (p *tesseraPolicy) fragmented(model string, cpuFree int64, gpus []GPU) float64 {
	if len(p.hostKeys) > maxHostClasses {
		return p.model.amount(model, cpuFree, gpus).Fragmented() + p.remainders(model, cpuFree, gpus)
	}
	var hosts [maxHostClasses]int
	var small [maxHostClasses]int64
	for k := range p.hostKeys {
		h := &p.hostKeys[k]
		for gi := range gpus {
			if h.canHost(&gpus[gi]) {
				hosts[k]++
			} else {
				small[k] += gpus[gi].MilliFree
			}
		}
	}
	var out FragAmount
	var idle int64
	for i := range gpus {
		idle += gpus[i].MilliFree
	}
	fidle := float64(idle)
	for si := range p.model.shapes {
		s := &p.model.shapes[si]
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
			k := p.hostClass[si]
			switch {
			case hosts[k] >= s.count && cpuOK:
				lack := small[k] + p.remainderMilli(s, hosts[k])
				out[LackGPU] += s.freq * float64(lack)
				out[Satisfied] += s.freq * float64(idle-lack)
				continue
			case hosts[k] >= s.count:
				cat = LackCPU
			case cpuOK:
				cat = LackGPU
			default:
				cat = LackBoth
			}
		}
		out[cat] += s.freq * fidle
	}
	return out.Fragmented()
}

// remainderMilli is, with Remainder, the compute of the hosts free GPUs
// beyond the last whole instance of whole-GPU shape s; 0 otherwise.
func (p *tesseraPolicy) remainderMilli(s *compiledShape, hosts int) int64 {
	if p.cfg.Remainder == 0 || !s.whole || s.count < 2 {
		return 0
	}
	return int64(hosts%s.count) * MilliPerGPU
}

// remainders is what Remainder adds to FGD's measure (amount) for the
// shapes that fit: the fallback of fragmented for wide workloads.
func (p *tesseraPolicy) remainders(model string, cpuFree int64, gpus []GPU) float64 {
	if p.cfg.Remainder == 0 {
		return 0
	}
	var out float64
	for si := range p.model.shapes {
		s := &p.model.shapes[si]
		if !s.whole || s.count < 2 || s.cpuOK || !s.allows(model) || cpuFree < s.cpu {
			continue
		}
		hosts := 0
		for gi := range gpus {
			if s.canHost(&gpus[gi]) {
				hosts++
			}
		}
		if hosts >= s.count {
			out += s.freq * float64(p.remainderMilli(s, hosts))
		}
	}
	return out
}

func (p *tesseraPolicy) Evaluate(n *Node, r Request) Evaluation {
	before := p.cost(n.Model, n.CPUMilliFree, n.GPUs)
	penalty := p.cfg.ModelWeight * p.pressure[n.Model] * float64(r.TotalGPUMilli())
	var buf [MaxGPUsPerNode]GPU
	gpus := buf[:len(n.GPUs)]
	copy(gpus, n.GPUs)
	cpu := n.CPUMilliFree - r.CPUMilli
	var set GPUSet
	switch r.Kind() {
	case Shared:
		best := Evaluation{Score: math.Inf(-1)}
		for i := range gpus {
			if !sliceFits(&n.GPUs[i], r) || sameStateBefore(n.GPUs, i) {
				continue
			}
			gpus[i].MilliFree -= r.GPUMilli
			gpus[i].MemFreeMiB -= r.GPUMemMiB
			s := before - p.cost(n.Model, cpu, gpus) - penalty
			gpus[i] = n.GPUs[i]
			if s > best.Score {
				best = Evaluation{Score: s, GPUs: GPUSet(0).With(i)}
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
	return Evaluation{Score: before - p.cost(n.Model, cpu, gpus) - penalty, GPUs: set}
}

// sameStateBefore reports whether a GPU before i is in the same state as
// GPU i. The cost depends only on the multiset of GPU states, so placing
// a slice on either scores the same (up to float rounding) and the first
// one wins; evaluating only it saves the repeated cost on nodes with many
// free GPUs.
func sameStateBefore(gpus []GPU, i int) bool {
	g := &gpus[i]
	for j := 0; j < i; j++ {
		if h := &gpus[j]; h.MilliFree == g.MilliFree && h.MemFreeMiB == g.MemFreeMiB && h.MemTotalMiB == g.MemTotalMiB {
			return true
		}
	}
	return false
}
