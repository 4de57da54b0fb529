package sim

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/mig"
	"github.com/tessera-gpu/tessera/api"
)

func a100(t testing.TB) *mig.Model {
	t.Helper()
	m, ok := mig.Lookup(DefaultMIGModel)
	if !ok {
		t.Fatalf("no model %s", DefaultMIGModel)
	}
	return m
}

// TestMIGProfileOf maps the trace's GPU shares to A100-40GB profiles: the
// smallest whose compute slices / 7 cover the share.
func TestMIGProfileOf(t *testing.T) {
	m := a100(t)
	for _, tc := range []struct {
		r     allocator.Request
		want  string
		count int
	}{
		{allocator.Request{GPUMilli: 50}, "1g.5gb", 1},
		{allocator.Request{GPUMilli: 110}, "1g.5gb", 1},
		{allocator.Request{GPUMilli: 160}, "2g.10gb", 1},
		{allocator.Request{GPUMilli: 230}, "2g.10gb", 1},
		{allocator.Request{GPUMilli: 290}, "3g.20gb", 1},
		{allocator.Request{GPUMilli: 320}, "3g.20gb", 1},
		{allocator.Request{GPUMilli: 370}, "3g.20gb", 1},
		{allocator.Request{GPUMilli: 460}, "4g.20gb", 1},
		{allocator.Request{GPUMilli: 550}, "4g.20gb", 1},
		{allocator.Request{GPUMilli: 590}, "7g.40gb", 1},
		{allocator.Request{GPUMilli: 810}, "7g.40gb", 1},
		{allocator.Request{GPUs: 1}, "7g.40gb", 1},
		{allocator.Request{GPUs: 8}, "7g.40gb", 8},
		{allocator.Request{CPUMilli: 4000}, "", 0},
	} {
		p, n, ok := MIGProfileOf(m, tc.r)
		got := ""
		if ok {
			got = p.Name
		}
		if got != tc.want || n != tc.count {
			t.Errorf("%s: %q x%d, want %q x%d", tc.r, got, n, tc.want, tc.count)
		}
	}
}

// oneShapeTrace is a cluster of nodes with GPUs GPUs each and pods that
// all ask for the same GPU share.
func oneShapeTrace(nodes, gpus int, r allocator.Request) *Trace {
	t := &Trace{Workload: "one-shape"}
	for i := 0; i < nodes; i++ {
		t.Nodes = append(t.Nodes, NodeSpec{Name: fmt.Sprintf("n%d", i), CPUMilli: 1 << 20, MemMiB: 1 << 30, GPUs: gpus, Model: "A100"})
	}
	for i := 0; i < 4; i++ {
		t.Pods = append(t.Pods, PodSpec{Name: fmt.Sprintf("p%d", i), Request: r})
	}
	return t
}

// TestRunMIGCapacity fills GPUs with one profile: how many instances of
// it an A100 holds is known (7 x 1g.5gb, 3 x 2g.10gb, 2 x 3g.20gb, one
// 4g.20gb, one 7g), whatever the policy.
func TestRunMIGCapacity(t *testing.T) {
	for _, tc := range []struct {
		r       allocator.Request
		perGPU  int
		compute int
	}{
		{allocator.Request{GPUMilli: 110}, 7, 1},
		{allocator.Request{GPUMilli: 230}, 3, 2},
		{allocator.Request{GPUMilli: 320}, 2, 3},
		{allocator.Request{GPUMilli: 470}, 1, 4},
		{allocator.Request{GPUMilli: 810}, 1, 7},
		{allocator.Request{GPUs: 1}, 1, 7},
		{allocator.Request{GPUs: 2}, 1, 7},
	} {
		for _, policy := range MIGPolicies() {
			tr := oneShapeTrace(3, 2, tc.r)
			res, err := RunMIG(tr, MIGConfig{Policy: policy, Seed: 1, Plan: PlanOptions{Ratio: 3}})
			if err != nil {
				t.Fatal(err)
			}
			want := 6 * tc.perGPU / max(1, tc.r.GPUs)
			if res.GPUPlaced != want || res.GPUPods <= want {
				t.Errorf("%s %s: placed %d of %d, want %d (and more arrived)", policy, tc.r, res.GPUPlaced, res.GPUPods, want)
			}
			// Idle MIG compute at the end: 7 - perGPU*compute slices per GPU.
			last := res.SliceCurve[len(res.SliceCurve)-1]
			wantIdle := 100 * float64(7-tc.perGPU*tc.compute) / 7
			if d := last.UnallocatedPct - wantIdle; d > 0.02 || d < -0.02 {
				t.Errorf("%s %s: idle MIG compute %.2f%%, want %.2f%%", policy, tc.r, last.UnallocatedPct, wantIdle)
			}
		}
	}
}

// referenceMIG replays a trace with the generic mig API (a Layout per GPU,
// Placer.Place), no cache, the nodes scanned in tie-break order: what
// MIGFirstFit and, on one-GPU nodes, MIGFrag do. It returns the placed
// demand after each arrival.
func referenceMIG(t *testing.T, tr *Trace, strategy mig.Strategy, seed int64) []int64 {
	t.Helper()
	m := a100(t)
	plan, err := NewPlan(tr, seed, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	demand := map[string]float64{}
	for _, p := range tr.Pods {
		if prof, n, ok := MIGProfileOf(m, p.Request); ok {
			demand[prof.Name] += float64(n)
		}
	}
	meter, err := mig.NewMeter(m, demand)
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		spec     NodeSpec
		cpu, mem int64
		gpus     []mig.Layout
	}
	nodes := make([]*node, len(plan.Nodes))
	for i, s := range plan.Nodes {
		nodes[i] = &node{spec: s, cpu: s.CPUMilli, mem: s.MemMiB, gpus: make([]mig.Layout, s.GPUs)}
		for g := range nodes[i].gpus {
			nodes[i].gpus[g].Model = m
		}
	}
	order := make([]int, len(nodes))
	for i := range order {
		order[plan.Rank[i]] = i
	}
	var placed int64
	var out []int64
	for _, pi := range plan.Order {
		r := plan.Pods[pi].Request
		prof, count, isGPU := MIGProfileOf(m, r)
		for _, ni := range order {
			n := nodes[ni]
			if n.cpu < r.CPUMilli || n.mem < r.MemMiB || (isGPU && (len(n.gpus) == 0 || !r.AllowsModel(n.spec.Model))) {
				continue
			}
			var took []int
			var at []api.MIGPlacement
			if isGPU && prof.Name == m.Full().Name {
				for g := range n.gpus {
					if len(n.gpus[g].Instances) == 0 && len(took) < count {
						took = append(took, g)
						at = append(at, api.MIGPlacement{Start: 0, Size: 8})
					}
				}
				if len(took) < count {
					continue
				}
			} else if isGPU {
				for g := range n.gpus {
					if c, ok := (mig.Placer{Mode: mig.Dynamic, Strategy: strategy, Meter: meter}).Place(n.gpus[g], prof.Name); ok {
						took, at = []int{g}, []api.MIGPlacement{c.Placement}
						break
					}
				}
				if len(took) == 0 {
					continue
				}
			}
			n.cpu -= r.CPUMilli
			n.mem -= r.MemMiB
			for i, g := range took {
				n.gpus[g].Instances = append(n.gpus[g].Instances, mig.Instance{Profile: prof.Name, Placement: at[i], Used: true})
				if err := n.gpus[g].Validate(); err != nil {
					t.Fatalf("reference: %v", err)
				}
			}
			if isGPU {
				placed += r.TotalGPUMilli()
			}
			break
		}
		out = append(out, placed)
	}
	return out
}

// TestRunMIGMatchesReference compares RunMIG (cached, on slice masks)
// with referenceMIG (the generic mig API, uncached): the same placed
// demand and the same curve.
func TestRunMIGMatchesReference(t *testing.T) {
	for seed := int64(1); seed <= 4; seed++ {
		tr := synthTrace(seed)
		// MIGFirstFit on the synthetic cluster (8- and 2-GPU nodes).
		checkReference(t, tr, MIGFirstFit, mig.FirstFit, seed)
		// MIGFrag on one-GPU nodes, where its choice is the Placer's.
		one := &Trace{Workload: tr.Workload, Pods: tr.Pods}
		for i, n := range tr.Nodes {
			for g := 0; g < n.GPUs; g++ {
				one.Nodes = append(one.Nodes, NodeSpec{Name: fmt.Sprintf("%s-%d", n.Name, g), CPUMilli: n.CPUMilli / int64(n.GPUs), MemMiB: n.MemMiB / int64(n.GPUs), GPUs: 1, Model: tr.Nodes[i].Model})
			}
		}
		checkReference(t, one, MIGFrag, mig.FragAware, seed)
	}
}

func checkReference(t *testing.T, tr *Trace, policy string, strategy mig.Strategy, seed int64) {
	t.Helper()
	res, err := RunMIG(tr, MIGConfig{Policy: policy, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	ref := referenceMIG(t, tr, strategy, seed)
	if len(ref) != res.Pods {
		t.Fatalf("%s seed %d: reference saw %d arrivals, RunMIG %d", policy, seed, len(ref), res.Pods)
	}
	if ref[len(ref)-1] != res.Demand {
		t.Errorf("%s seed %d: placed demand %d, reference %d", policy, seed, res.Demand, ref[len(ref)-1])
	}
	var events []Event
	var arrived int64
	plan, _ := NewPlan(tr, seed, PlanOptions{})
	for i, pi := range plan.Order {
		arrived += plan.Pods[pi].Request.TotalGPUMilli()
		events = append(events, Event{ArrivedMilli: arrived, UsedMilli: ref[i]})
	}
	if want := BinEvents(events, tr.TotalGPUs()); !reflect.DeepEqual(res.Curve, want) {
		t.Errorf("%s seed %d: curve differs from the reference's", policy, seed)
	}
}

// TestRunMIGInvariants: on the synthetic trace, every policy is
// deterministic, places no more demand than MIG compute it hands out (a
// profile covers its pod's share), never more than the cluster, and the
// summary reads the runs back.
func TestRunMIGInvariants(t *testing.T) {
	tr := synthTrace(7)
	var all []*MIGResult
	for _, policy := range MIGPolicies() {
		for seed := int64(1); seed <= 3; seed++ {
			a, err := RunMIG(tr, MIGConfig{Policy: policy, Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := RunMIG(tr, MIGConfig{Policy: policy, Seed: seed})
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s seed %d: two runs differ", policy, seed)
			}
			if a.GPUPlaced > a.GPUPods || a.Placed > a.Pods || a.GPUPlaced == 0 {
				t.Errorf("%s seed %d: placed %d/%d pods, %d/%d GPU pods", policy, seed, a.Placed, a.Pods, a.GPUPlaced, a.GPUPods)
			}
			if len(a.Curve) != len(a.SliceCurve) {
				t.Fatalf("%s: curves of %d and %d points", policy, len(a.Curve), len(a.SliceCurve))
			}
			for i := range a.Curve {
				d, s := a.Curve[i].AllocPct, a.SliceCurve[i].AllocPct
				if d > s+0.01 || s > 100 {
					t.Errorf("%s seed %d at %d%%: demand placed %.2f%%, MIG compute handed out %.2f%%", policy, seed, a.Curve[i].ArrivedPct, d, s)
				}
			}
			all = append(all, a)
		}
	}
	sums := SummarizeMIG(all)
	if len(sums) != len(MIGPolicies()) {
		t.Fatalf("%d summaries", len(sums))
	}
	for _, s := range sums {
		if s.Unplaced.N != 3 || s.Idle.N != 3 || s.PodsPlaced.N != 3 || s.GPUPodsPlaced.N != 3 || len(s.Curve) == 0 || s.Summary().Policy != "mig-"+s.Policy {
			t.Errorf("summary %+v", s)
		}
	}
	if _, err := RunMIG(tr, MIGConfig{Policy: "bestfit"}); err == nil {
		t.Error("an unknown MIG policy ran")
	}
	if _, err := RunMIG(tr, MIGConfig{Policy: MIGFGD, Model: "T4"}); err == nil {
		t.Error("a model without MIG ran")
	}
}
