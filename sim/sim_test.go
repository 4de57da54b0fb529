package sim

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/allocator"
)

// referenceReplay is the simulator without its evaluation cache: every pod
// is placed with allocator.Select over all nodes.
func referenceReplay(t *testing.T, tr *Trace, policy string, seed int64) []Event {
	t.Helper()
	plan, err := NewPlan(tr, seed, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := TargetWorkload(tr, 0)
	if err != nil {
		t.Fatal(err)
	}
	pw := w
	if policy == "tessera" {
		pw, _ = TargetWorkload(tr, 1)
	}
	p, err := allocator.NewPolicy(policy, allocator.WithWorkload(pw), allocator.WithRand(plan.Rand), allocator.WithModelCapacity(ModelCapacity(tr.Nodes)))
	if err != nil {
		t.Fatal(err)
	}
	meter, _ := allocator.NewFragMeter(w)
	nodes := NewNodes(plan.Nodes)
	var events []Event
	var arrived, used int64
	for _, i := range plan.Order {
		r := plan.Pods[i].Request
		arrived += r.TotalGPUMilli()
		sel, err := allocator.Select(p, nodes, r, plan.Rank)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Node >= 0 {
			if err := allocator.Apply(nodes[sel.Node], r, sel.Evaluation.GPUs); err != nil {
				t.Fatal(err)
			}
			used += r.TotalGPUMilli()
		}
		var frag float64
		for _, n := range nodes {
			frag += meter.Amount(n).Fragmented()
		}
		events = append(events, Event{ArrivedMilli: arrived, UsedMilli: used, FragMilli: frag})
	}
	return events
}

// The cached replay must make exactly the decisions of a plain
// Select-per-pod loop, for every policy.
func TestRunMatchesUncachedReference(t *testing.T) {
	tr := synthTrace(7)
	for _, policy := range allocator.PolicyNames() {
		t.Run(policy, func(t *testing.T) {
			res, err := Run(tr, Config{Policy: policy, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			want := referenceReplay(t, tr, policy, 3)
			if d := cmp.Diff(want, res.Events, cmp.Comparer(func(a, b float64) bool { return a == b || (a-b < 1e-6 && b-a < 1e-6) })); d != "" {
				t.Errorf("cached replay differs from the reference (-want +got):\n%s", d)
			}
			if policy != "random" && res.Evaluations == 0 {
				t.Errorf("no evaluations counted")
			}
		})
	}
}

func TestRunInvariants(t *testing.T) {
	tr := synthTrace(11)
	capacity := int64(tr.TotalGPUs()) * 1000
	for _, policy := range []string{"bestfit", "fgd", "tessera"} {
		res, err := Run(tr, Config{Policy: policy, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		if res.Pods != len(res.Events) || res.Placed > res.Pods || res.Placed == 0 {
			t.Errorf("%s: %d pods, %d events, %d placed", policy, res.Pods, len(res.Events), res.Placed)
		}
		var prev Event
		for i, e := range res.Events {
			if e.ArrivedMilli < prev.ArrivedMilli || e.UsedMilli < prev.UsedMilli || e.UsedMilli > e.ArrivedMilli || e.UsedMilli > capacity || e.FragMilli < 0 {
				t.Fatalf("%s: event %d %+v after %+v breaks an invariant", policy, i, e, prev)
			}
			prev = e
		}
		if last := res.Curve[len(res.Curve)-1]; last.ArrivedPct != MaxArrivedPct {
			t.Errorf("%s: curve ends at %d%%, want %d%%", policy, last.ArrivedPct, MaxArrivedPct)
		}
		if p, ok := At(res.Curve, 100); !ok || p.UnallocatedPct < 0 || p.UnallocatedPct > 100 {
			t.Errorf("%s: point at 100%%: %+v %v", policy, p, ok)
		}
	}
}

func TestRunErrors(t *testing.T) {
	tr := synthTrace(1)
	if _, err := Run(tr, Config{Policy: "nope"}); !errors.Is(err, allocator.ErrUnknownPolicy) {
		t.Errorf("unknown policy: %v", err)
	}
	if _, err := Run(tr, Config{Policy: "fgd", Popularity: 2}); err == nil {
		t.Errorf("popularity 2 accepted")
	}
}
