package sim

import (
	"fmt"
	"math/rand"
	"sort"

	"github.com/tessera-gpu/tessera/allocator"
)

// DefaultRatio is the FGD protocol's workload size: pods keep arriving
// until their GPU requests reach 1.3x the cluster's GPU capacity.
const DefaultRatio = 1.3

// DefaultPermDraws is how many numbers the artifact's random source gives
// to Kubernetes informers between tuning the workload and drawing the node
// name permutation (each reflector draws one for its watch timeout). It was
// found by replaying the deterministic policies against the published
// per-seed curves (see TestReproduceArtifactExactly and docs/sim.md).
const DefaultPermDraws = 10

// TieBreak says how equally scored nodes are ordered.
type TieBreak int

const (
	// TieBreakArtifact is what the artifact really does: its scheduler picks
	// the smallest node name, and the simulator renames every node
	// "<NNNN>-<name>" with NNNN from a per-seed random permutation, so ties
	// go to a random (but seed-determined) node.
	TieBreakArtifact TieBreak = iota
	// TieBreakName picks the smallest original node name.
	TieBreakName
)

// ParseTieBreak parses "artifact" or "name".
func ParseTieBreak(s string) (TieBreak, error) {
	switch s {
	case "artifact", "":
		return TieBreakArtifact, nil
	case "name":
		return TieBreakName, nil
	}
	return 0, fmt.Errorf("unknown tie-break %q (want artifact or name)", s)
}

func (t TieBreak) String() string {
	if t == TieBreakName {
		return "name"
	}
	return "artifact"
}

// Plan is one seed's arrival sequence and node order.
type Plan struct {
	// Nodes are the trace's nodes sorted by name.
	Nodes []NodeSpec
	// Rank[i] is Nodes[i]'s tie-break rank (lower wins).
	Rank []int
	// Pods are the trace's pods sorted by name.
	Pods []PodSpec
	// Order lists the arriving pods as indices into Pods, in arrival order.
	Order []int
	// Rand is the artifact's random source after the plan was drawn; the
	// random policy keeps drawing from it.
	Rand *rand.Rand
}

// PlanOptions tune NewPlan.
type PlanOptions struct {
	Ratio    float64 // DefaultRatio when 0
	TieBreak TieBreak
	// PermDraws is how many draws to skip before the node permutation;
	// nil means DefaultPermDraws.
	PermDraws *int
}

// NewPlan draws one seed's arrivals exactly as the FGD artifact does
// (simulator.Simulate, SortClusterPods, TunePodsByNodeTotalResource and
// syncClusterResourceList), with Go's math/rand seeded by seed:
//
//  1. one rand.Int() (logged by the artifact);
//  2. sort the pods by name and shuffle them;
//  3. add pods sampled uniformly with replacement from the name-sorted list
//     until the next one would push the GPU request past ratio x capacity
//     (or, if there were already too many, drop random pods);
//  4. sort nodes by name and draw a permutation that prefixes their names,
//     which decides ties.
func NewPlan(t *Trace, seed int64, o PlanOptions) (*Plan, error) {
	ratio := o.Ratio
	if ratio == 0 {
		ratio = DefaultRatio
	}
	if ratio < 0 {
		return nil, fmt.Errorf("negative workload ratio %v", ratio)
	}
	draws := DefaultPermDraws
	if o.PermDraws != nil {
		draws = *o.PermDraws
	}
	if draws < 0 {
		return nil, fmt.Errorf("negative permutation draws %d", draws)
	}
	p := &Plan{
		Nodes: append([]NodeSpec(nil), t.Nodes...),
		Pods:  append([]PodSpec(nil), t.Pods...),
	}
	sort.SliceStable(p.Nodes, func(i, j int) bool { return p.Nodes[i].Name < p.Nodes[j].Name })
	sort.SliceStable(p.Pods, func(i, j int) bool { return p.Pods[i].Name < p.Pods[j].Name })

	rng := rand.New(rand.NewSource(seed))
	p.Rand = rng
	rng.Int()

	p.Order = make([]int, len(p.Pods))
	for i := range p.Order {
		p.Order[i] = i
	}
	rng.Shuffle(len(p.Order), func(i, j int) { p.Order[i], p.Order[j] = p.Order[j], p.Order[i] })

	var podTotal, nodeTotal int64
	for _, i := range p.Order {
		podTotal += p.Pods[i].Request.TotalGPUMilli()
	}
	for _, n := range p.Nodes {
		nodeTotal += int64(n.GPUs) * allocator.MilliPerGPU
	}
	if nodeTotal == 0 {
		return nil, fmt.Errorf("the cluster has no GPUs")
	}
	if podTotal == 0 {
		return nil, fmt.Errorf("the workload requests no GPUs")
	}
	target := ratio * float64(nodeTotal)
	switch {
	case ratio == 0 || float64(podTotal) == target:
	case float64(podTotal) > target:
		for float64(podTotal) > target && len(p.Order) > 0 {
			idx := rng.Intn(len(p.Order))
			podTotal -= p.Pods[p.Order[idx]].Request.TotalGPUMilli()
			p.Order = append(p.Order[:idx], p.Order[idx+1:]...)
		}
	default:
		n := len(p.Pods)
		for {
			idx := rng.Intn(n)
			r := p.Pods[idx].Request
			// The artifact compares with the per-GPU milli of the pod but
			// adds its total; we keep that quirk.
			if float64(podTotal+perGPUMilli(r)) > target {
				break
			}
			podTotal += r.TotalGPUMilli()
			p.Order = append(p.Order, idx)
		}
	}

	for i := 0; i < draws; i++ {
		rng.Int63()
	}
	perm := rng.Perm(len(p.Nodes))
	p.Rank = make([]int, len(p.Nodes))
	for i := range p.Rank {
		if o.TieBreak == TieBreakName {
			p.Rank[i] = i
		} else {
			p.Rank[i] = perm[i]
		}
	}
	return p, nil
}

// perGPUMilli is the artifact's PodResource.MilliGpu: 1000 for whole GPUs,
// the share for a slice, 0 for CPU-only pods.
func perGPUMilli(r allocator.Request) int64 {
	switch r.Kind() {
	case allocator.Whole:
		return allocator.MilliPerGPU
	case allocator.Shared:
		return r.GPUMilli
	}
	return 0
}
