package sim

import (
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
)

// BenchmarkPodScoringTrace measures one pod's scoring against the 1213
// nodes of the Alibaba cluster (Fit and Evaluate on every node, no cache),
// per policy, with the cluster in the state FGD leaves it after 70% of
// seed 42's arrivals; the pods scored are the next 200 arrivals, in turn.
func BenchmarkPodScoringTrace(b *testing.B) {
	tr := loadTraceTB(b, "default")
	plan, err := NewPlan(tr, 42, PlanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := TargetWorkload(tr, 0)
	if err != nil {
		b.Fatal(err)
	}
	fgd, err := allocator.NewPolicy("fgd", allocator.WithWorkload(w))
	if err != nil {
		b.Fatal(err)
	}
	nodes := NewNodes(plan.Nodes)
	capacity := int64(tr.TotalGPUs()) * allocator.MilliPerGPU
	var arrived int64
	next := 0
	for ; next < len(plan.Order) && arrived < capacity*7/10; next++ {
		r := plan.Pods[plan.Order[next]].Request
		arrived += r.TotalGPUMilli()
		sel, err := allocator.Select(fgd, nodes, r, plan.Rank)
		if err != nil {
			b.Fatal(err)
		}
		if sel.Node >= 0 {
			if err := allocator.Apply(nodes[sel.Node], r, sel.Evaluation.GPUs); err != nil {
				b.Fatal(err)
			}
		}
	}
	var reqs []allocator.Request
	for i := next; i < next+200 && i < len(plan.Order); i++ {
		reqs = append(reqs, plan.Pods[plan.Order[i]].Request)
	}
	full, _ := TargetWorkload(tr, 1)
	for _, name := range allocator.PolicyNames() {
		pw := w
		if name == allocator.PolicyTessera {
			pw = full
		}
		p, err := allocator.NewPolicy(name, allocator.WithWorkload(pw), allocator.WithRand(plan.Rand), allocator.WithModelCapacity(ModelCapacity(tr.Nodes)))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := allocator.Select(p, nodes, reqs[i%len(reqs)], plan.Rank); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReplay measures a whole simulation run (seed 42 of the default
// trace, with the evaluation cache), per policy.
func BenchmarkReplay(b *testing.B) {
	tr := loadTraceTB(b, "default")
	for _, name := range []string{"random", "bestfit", "fgd", "tessera"} {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := Run(tr, Config{Policy: name, Seed: 42}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
