package allocator

import "testing"

func TestSelect(t *testing.T) {
	p := mustPolicy(t, "bestfit")
	nodes := []*Node{
		makeNode().Name("c").CPU(64000, 0).GPUs(2).Obj(), // insufficient CPU
		makeNode().Name("b").GPUs(2).Obj(),               // ties with a
		makeNode().Name("a").GPUs(2).Obj(),               // ties with b
		makeNode().Name("d").Model("T4").GPUs(2).Obj(),   // model not allowed
		makeNode().Name("e").Free(0, 0).Obj(),            // no GPU for the slice
	}
	r := withModels(sliceReq(1000, 500), "A100")

	sel, err := Select(p, nodes, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Node != 2 {
		t.Errorf("without ranks chose %d, want 2 (smallest name)", sel.Node)
	}
	if sel.Rejected.Count(InsufficientCPU) != 1 || sel.Rejected.Count(ModelNotAllowed) != 1 ||
		sel.Rejected.Count(NoGPUForSlice) != 1 || sel.Rejected.Total() != 3 {
		t.Errorf("rejections = %s", sel.Rejected.String())
	}
	if got := sel.Rejected.String(); got != "1 gpu-model-not-allowed, 1 insufficient-cpu, 1 no-gpu-for-slice" {
		t.Errorf("Rejections.String() = %q", got)
	}

	sel, err = Select(p, nodes, r, []int{0, 1, 2, 3, 4})
	if err != nil || sel.Node != 1 {
		t.Errorf("with ranks chose %d (%v), want 1 (lowest rank)", sel.Node, err)
	}
	if _, err := Select(p, nodes, r, []int{0}); err == nil {
		t.Errorf("Select accepted a rank slice of the wrong length")
	}
	sel, _ = Select(p, nodes[:1], r, nil)
	if sel.Node != -1 {
		t.Errorf("chose %d for a request that fits nothing", sel.Node)
	}
	// A higher score beats a lower rank.
	fuller := makeNode().Name("z").Free(1000, 500).Obj()
	sel, _ = Select(p, append(nodes, fuller), r, []int{0, 1, 2, 3, 4, 99})
	if sel.Node != 5 {
		t.Errorf("chose %d, want the best-fit node 5", sel.Node)
	}
}
