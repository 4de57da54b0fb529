package allocator

import "math/rand"

// randomPolicy is the artifact's Random policy: every feasible node is
// equally likely, and a slice goes to a uniformly random GPU that fits it
// (whole GPUs take the first fully free ones).
type randomPolicy struct {
	rng *rand.Rand
}

var _ Policy = (*randomPolicy)(nil)
var _ Randomized = (*randomPolicy)(nil)

func (p *randomPolicy) Name() string { return PolicyRandom }

// Randomized implements Randomized.
func (p *randomPolicy) Randomized() bool { return true }

func (p *randomPolicy) Evaluate(n *Node, r Request) Evaluation {
	ev := Evaluation{Score: p.rng.Float64()}
	switch r.Kind() {
	case Shared:
		seen := 0
		pick := -1
		for i := range n.GPUs {
			if !sliceFits(&n.GPUs[i], r) {
				continue
			}
			seen++
			if p.rng.Intn(seen) == 0 {
				pick = i
			}
		}
		if pick >= 0 {
			ev.GPUs = GPUSet(0).With(pick)
		}
	case Whole:
		ev.GPUs = firstFreeGPUs(n, r.GPUs)
	}
	return ev
}
