package bound

import (
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/sim"
)

// Below 100 % arrived the bound is what has not arrived yet, at least:
// with every pod one whole GPU and the nodes empty, every policy places
// all of them, and the bound is exactly the replay's.
func TestUnallocatedAtWholeGPUsOnly(t *testing.T) {
	tr := &sim.Trace{Workload: "whole"}
	for i := range 4 {
		tr.Nodes = append(tr.Nodes, sim.NodeSpec{Name: string(rune('a' + i)), CPUMilli: 64000, MemMiB: 1 << 18, GPUs: 4, Model: "G"})
	}
	for i := range 8 {
		tr.Pods = append(tr.Pods, sim.PodSpec{Name: string(rune('a' + i)), Request: allocator.Request{GPUs: 1, CPUMilli: 1000, MemMiB: 1024}})
	}
	res, err := sim.Run(tr, sim.Config{Policy: "bestfit", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, pct := range []int{50, 100} {
		p, _ := sim.At(res.Curve, pct)
		b, err := UnallocatedAt(tr, 1, sim.PlanOptions{}, pct)
		if err != nil {
			t.Fatal(err)
		}
		if d := b.UnallocatedPct - p.UnallocatedPct; d > 0.01 || d < -0.01 {
			t.Errorf("at %d %%: bound %.3f, replay %.2f: want equal", pct, b.UnallocatedPct, p.UnallocatedPct)
		}
	}
}
