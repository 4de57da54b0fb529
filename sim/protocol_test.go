package sim

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func isPermutation(xs []int) bool {
	s := append([]int(nil), xs...)
	sort.Ints(s)
	for i, v := range s {
		if v != i {
			return false
		}
	}
	return true
}

func TestNewPlan(t *testing.T) {
	tr := synthTrace(1)
	capacity := int64(tr.TotalGPUs()) * 1000

	p1, err := NewPlan(tr, 42, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := NewPlan(tr, 42, PlanOptions{})
	if d := cmp.Diff(p1.Order, p2.Order); d != "" || !cmp.Equal(p1.Rank, p2.Rank) {
		t.Fatalf("same seed, different plans:\n%s", d)
	}
	p3, _ := NewPlan(tr, 43, PlanOptions{})
	if cmp.Equal(p1.Order, p3.Order) || cmp.Equal(p1.Rank, p3.Rank) {
		t.Errorf("seeds 42 and 43 gave the same plan")
	}

	// Pods and nodes are sorted by name; the first len(pods) arrivals are a
	// shuffle of all pods, the rest are samples.
	if !sort.SliceIsSorted(p1.Pods, func(i, j int) bool { return p1.Pods[i].Name < p1.Pods[j].Name }) ||
		!sort.SliceIsSorted(p1.Nodes, func(i, j int) bool { return p1.Nodes[i].Name < p1.Nodes[j].Name }) {
		t.Errorf("plan pods or nodes are not sorted by name")
	}
	n := len(tr.Pods)
	if len(p1.Order) <= n || !isPermutation(p1.Order[:n]) {
		t.Fatalf("the first %d arrivals are not a permutation of the pods (%d arrivals)", n, len(p1.Order))
	}
	if isPermutation(p1.Order[:n]) && sort.IntsAreSorted(p1.Order[:n]) {
		t.Errorf("pods were not shuffled")
	}
	var total, maxPod int64
	for _, i := range p1.Order {
		m := p1.Pods[i].Request.TotalGPUMilli()
		total += m
		maxPod = max(maxPod, m)
	}
	target := DefaultRatio * float64(capacity)
	if float64(total) > target+float64(maxPod) || float64(total) < target-float64(maxPod) {
		t.Errorf("arrivals request %d milli GPU, want about %.0f (1.3 x %d)", total, target, capacity)
	}
	if !isPermutation(p1.Rank) {
		t.Errorf("tie-break ranks are not a permutation: %v", p1.Rank)
	}

	byName, _ := NewPlan(tr, 42, PlanOptions{TieBreak: TieBreakName})
	for i, r := range byName.Rank {
		if r != i {
			t.Fatalf("name tie-break rank[%d] = %d", i, r)
		}
	}
	if !cmp.Equal(byName.Order, p1.Order) {
		t.Errorf("the tie-break changed the arrival order")
	}

	// A ratio below the workload's size drops random pods instead.
	small, err := NewPlan(tr, 42, PlanOptions{Ratio: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	total = 0
	for _, i := range small.Order {
		total += small.Pods[i].Request.TotalGPUMilli()
	}
	if len(small.Order) >= n || float64(total) > 0.2*float64(capacity) {
		t.Errorf("ratio 0.2: %d arrivals requesting %d milli, want fewer than %d pods within %v", len(small.Order), total, n, 0.2*float64(capacity))
	}

	zero := 0
	other, _ := NewPlan(tr, 42, PlanOptions{PermDraws: &zero})
	if cmp.Equal(other.Rank, p1.Rank) || !cmp.Equal(other.Order, p1.Order) {
		t.Errorf("PermDraws should change only the node permutation")
	}
	neg := -1
	if _, err := NewPlan(tr, 42, PlanOptions{PermDraws: &neg}); err == nil {
		t.Errorf("negative PermDraws accepted")
	}
	if _, err := NewPlan(tr, 42, PlanOptions{Ratio: -1}); err == nil {
		t.Errorf("negative ratio accepted")
	}
	if _, err := NewPlan(&Trace{Nodes: []NodeSpec{{Name: "cpu", CPUMilli: 1}}, Pods: tr.Pods}, 42, PlanOptions{}); err == nil {
		t.Errorf("a cluster without GPUs accepted")
	}
}

func TestParseTieBreak(t *testing.T) {
	for in, want := range map[string]TieBreak{"": TieBreakArtifact, "artifact": TieBreakArtifact, "name": TieBreakName} {
		if got, err := ParseTieBreak(in); err != nil || got != want {
			t.Errorf("ParseTieBreak(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseTieBreak("random"); err == nil {
		t.Errorf("ParseTieBreak accepted an unknown value")
	}
}
