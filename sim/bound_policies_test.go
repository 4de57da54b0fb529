package sim_test

import (
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/sim"
	"github.com/tessera-gpu/tessera/sim/bound"
)

// The bound holds for every policy: no replay leaves fewer GPUs
// unallocated than it says, at any arrived percentage (up to the replay's
// rounding to 2 decimals).
func TestBoundBelowEveryPolicy(t *testing.T) {
	for _, seed := range []int64{3, 11, 29} {
		tr := sim.SynthTrace(seed)
		for _, policy := range allocator.PolicyNames() {
			res, err := sim.Run(tr, sim.Config{Policy: policy, Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			for _, pct := range []int{60, 90, 100, 115, 130} {
				p, ok := sim.At(res.Curve, pct)
				if !ok {
					continue
				}
				b, err := bound.UnallocatedAt(tr, 42, sim.PlanOptions{}, pct)
				if err != nil {
					t.Fatal(err)
				}
				if b.UnallocatedPct > p.UnallocatedPct+0.01 {
					t.Errorf("trace %d, %s at %d %%: bound %.3f above the replay's %.2f", seed, policy, pct, b.UnallocatedPct, p.UnallocatedPct)
				}
				if b.Events == 0 || b.UnallocatedPct < 0 {
					t.Errorf("trace %d at %d %%: %+v", seed, pct, b)
				}
			}
		}
	}
}
