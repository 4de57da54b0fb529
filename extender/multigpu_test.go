package extender

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// A multi-GPU slice on nodes with NVLink cliques: its GPUs are taken in
// one clique when one has room (the smallest that suffices), anywhere
// otherwise, and only in one with tessera.dev/nvlink: required; the bind's
// assignment carries all its GPUs in index order, and a bound pod counts
// its slice on each.
func TestMultiGPUSliceCliques(t *testing.T) {
	policy, err := NewPolicy(PolicyBinpack, DefaultWorkload(), 1)
	if err != nil {
		t.Fatal(err)
	}
	pod := func(nvlink bool) *Demand {
		b := testbuild.Pod("p").Shared(8, 40)
		if nvlink {
			b = b.NVLink()
		}
		p := b.Obj()
		p.Annotations[api.AnnotationGPUCount] = "2"
		d, err := ParseDemand(p)
		if err != nil {
			t.Fatal(err)
		}
		return &d
	}
	// GPU 1 and 3 of four are full (used whole).
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Cliques([]int{0, 1}, []int{2, 3}).Obj()
	for _, tc := range []struct {
		name   string
		node   string
		uses   []int // GPUs used whole
		nvlink bool
		want   []int // nil: does not fit
		reason Reason
	}{
		{name: "a free clique of two", want: []int{0, 1}},
		{name: "the other clique", uses: []int{1}, want: []int{2, 3}},
		{name: "across cliques when none has room", uses: []int{1, 3}, want: []int{0, 2}},
		{name: "required: none has room", uses: []int{1, 3}, nvlink: true, reason: NoGPUForSlice},
		{name: "required: a clique has room", uses: []int{0}, nvlink: true, want: []int{2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*PodUse
			for i, g := range tc.uses {
				pods = append(pods, &PodUse{UID: types.UID(rune('a' + i)), Whole: []string{testbuild.GPUUUID("n", g)}})
			}
			st := BuildNodeState(NewNodeInfo(node), pods)
			d := pod(tc.nvlink)
			if tc.want == nil {
				if v := Filter(st, d); v.Reason != tc.reason {
					t.Fatalf("Filter: %s (%s), want %s", v.Reason, v.Message, tc.reason)
				}
				return
			}
			if v := Filter(st, d); !v.Fits() {
				t.Fatalf("Filter: %s (%s)", v.Reason, v.Message)
			}
			u, err := ChoosePlacement(policy, st, "p", d)
			if err != nil {
				t.Fatal(err)
			}
			a := SharedAssignment(nil, u)
			s := a.Container("main").Shared
			var got []int
			for _, g := range s.GPUs() {
				got = append(got, g.Index)
			}
			if !slices.Equal(got, tc.want) || s.MemoryMiB != 4096 || s.Cores != 20 {
				t.Errorf("assignment %+v, want GPUs %v with 4096 MiB and 20%% each", s, tc.want)
			}
			bound := BuildNodeState(st.Info, append(pods, u))
			for _, p := range tc.want {
				if g := bound.GPUs[p]; g.MemUsedMiB != 4096 || g.CoresUsed != 20 {
					t.Errorf("GPU %d uses %d MiB and %d%%, want 4096 and 20", p, g.MemUsedMiB, g.CoresUsed)
				}
			}
		})
	}
	// More GPUs than the node has: refused for good (preemption cannot help).
	p := testbuild.Pod("p").Shared(8, 40).Obj()
	p.Annotations[api.AnnotationGPUCount] = "8"
	d, err := ParseDemand(p)
	if err != nil {
		t.Fatal(err)
	}
	if v := Filter(BuildNodeState(NewNodeInfo(node), nil), &d); v.Reason != GPUCountAboveNode || !v.Reason.Unresolvable() {
		t.Errorf("gpu-count 8 on 4 GPUs: %s (%s), want %s, unresolvable", v.Reason, v.Message, GPUCountAboveNode)
	}
}
