//go:build simrepro

package sim

import (
	"context"
	"testing"
)

// TestReproMIG replays the default trace on dynamic-MIG A100s (sharing pods
// mapped to the smallest covering profile, whole GPUs as 7g) under the four
// MIG policies, seeds 42..51 (40 runs, about 10 s on 2 cores; docs/sim.md,
// MIG). It checks what docs/sim.md reports: MIG's coarser shares leave
// more of the arrived demand unplaced than FGD without MIG (published
// 4.77 %), FGD's node choice beats the first fitting node, and no run
// places more demand than the MIG compute it hands out.
func TestReproMIG(t *testing.T) {
	tr := loadTraceTB(t, "default")
	results, err := RunMIGAll(context.Background(), MIGJobs([]*Trace{tr}, MIGPolicies(), reproSeeds, MIGConfig{}), reproWorkers(), nil)
	if err != nil {
		t.Fatal(err)
	}
	by := make(map[string]MIGSummary)
	for _, s := range SummarizeMIG(results) {
		by[s.Policy] = s
		t.Logf("default mig-%-13s unplaced demand@100 %.2f ± %.2f, idle compute@100 %.2f ± %.2f, GPU pods placed %.2f ± %.2f",
			s.Policy, s.Unplaced.Mean, s.Unplaced.SD, s.Idle.Mean, s.Idle.SD, s.GPUPodsPlaced.Mean, s.GPUPodsPlaced.SD)
		if s.Unplaced.N != len(reproSeeds) {
			t.Errorf("mig-%s: %d seeds at 100%%", s.Policy, s.Unplaced.N)
		}
	}
	for _, r := range results {
		for i := range r.Curve {
			if d, s := r.Curve[i].AllocPct, r.SliceCurve[i].AllocPct; d > s+0.01 {
				t.Errorf("mig-%s seed %d at %d%%: demand placed %.2f%% > MIG compute handed out %.2f%%", r.Policy, r.Seed, r.Curve[i].ArrivedPct, d, s)
			}
		}
	}
	const fgdPublished = 4.77 // unallocated GPU % at 100%, FGD without MIG
	for _, p := range MIGPolicies() {
		if u := by[p].Unplaced.Mean; u <= fgdPublished {
			t.Errorf("mig-%s: %.2f%% unplaced, not above FGD without MIG (%.2f%%)", p, u, fgdPublished)
		}
	}
	if f, ff := by[MIGFGD].Unplaced, by[MIGFirstFit].Unplaced; f.Mean >= ff.Mean {
		t.Errorf("mig-fgd %.2f ± %.2f is not below mig-firstfit %.2f ± %.2f", f.Mean, f.SD, ff.Mean, ff.SD)
	}
}
