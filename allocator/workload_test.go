package allocator

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestNewWorkload(t *testing.T) {
	x := sliceReq(1000, 500) // 5 pods
	y := wholeReq(8000, 1)   // 3 pods
	z := cpuReq(1000)        // 1 pod
	w := cpuReq(2000)        // 1 pod, ties with z; larger key first
	xMem := x                // same shape, other memory
	xMem.MemMiB = 99999
	reqs := []Request{x, y, z, x, y, w, x, xMem, y, x}
	strip := func(r Request) Request { r.MemMiB = 0; return r }
	approx := cmpopts.EquateApprox(0, 1e-12)

	t.Run("popularity 0.8 keeps the top shapes and renormalises", func(t *testing.T) {
		got, err := NewWorkload(reqs, 0.8)
		if err != nil {
			t.Fatal(err)
		}
		want := Workload{Shapes: []Shape{{strip(x), 0.625}, {strip(y), 0.375}}}
		if d := cmp.Diff(want, got, approx); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	})
	t.Run("popularity 0.95 keeps everything, ties by decreasing shape", func(t *testing.T) {
		got, err := NewWorkload(reqs, DefaultPopularity)
		if err != nil {
			t.Fatal(err)
		}
		want := Workload{Shapes: []Shape{{strip(x), 0.5}, {strip(y), 0.3}, {strip(w), 0.1}, {strip(z), 0.1}}}
		if d := cmp.Diff(want, got, approx); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("Validate() = %v", err)
		}
	})
	t.Run("models are part of the shape", func(t *testing.T) {
		got, err := NewWorkload([]Request{withModels(x, "T4"), x, withModels(x, "T4")}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Shapes) != 2 || !cmp.Equal(got.Shapes[0].Request.Models, []string{"T4"}) {
			t.Errorf("got %+v", got)
		}
	})
	for _, bad := range []struct {
		reqs []Request
		pop  float64
	}{{nil, 0.95}, {reqs, 0}, {reqs, 1.5}, {[]Request{{GPUs: 1, GPUMilli: 3}}, 0.95}} {
		if _, err := NewWorkload(bad.reqs, bad.pop); err == nil {
			t.Errorf("NewWorkload(%v, %v) succeeded", bad.reqs, bad.pop)
		}
	}
}

func TestNodeFrag(t *testing.T) {
	w := testWorkload()
	tests := []struct {
		name string
		node *Node
		want FragAmount
	}{
		{
			// Idle 1600. CPU-only shape: XL, 0.25*1600. Slice: both GPUs
			// host it (Q3, nothing small). One-GPU shape: GPU 0 hosts it,
			// GPU 1's 600 is too small: 0.25*600 to LackGPU, 0.25*1000 Q3.
			name: "two GPUs, one partly used",
			node: makeNode().CPU(64000, 16000).Free(1000, 600).Obj(),
			want: FragAmount{LackGPU: 150, Satisfied: 800 + 250, CPUOnlySatisfied: 400},
		},
		{
			name: "short of CPU for the one-GPU and CPU-only shapes",
			node: makeNode().CPU(64000, 3000).Free(1000, 600).Obj(),
			want: FragAmount{Satisfied: 0.5 * 1600, LackCPU: 0.25 * 1600, CPUOnlyLackCPU: 400},
		},
		{
			name: "no GPU fits a slice, CPU short for everything",
			node: makeNode().CPU(64000, 1000).Free(400, 0).Obj(),
			want: FragAmount{LackBoth: 0.5*400 + 0.25*400, CPUOnlyLackCPU: 100},
		},
		{
			name: "full node has no fragmentation",
			node: makeNode().Free(0, 0).Obj(),
			want: FragAmount{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeFrag(tc.node, w)
			if d := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-9)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if idle := float64(tc.node.GPUMilliFree()); math.Abs(got.Idle()-idle) > 1e-9 {
				t.Errorf("categories sum to %v, want the idle %v", got.Idle(), idle)
			}
		})
	}
	if got := (FragAmount{LackBoth: 1, LackGPU: 2, Satisfied: 100, LackCPU: 4, CPUOnlySatisfied: 8, CPUOnlyLackCPU: 16, NoAccess: 32}).Fragmented(); got != 63 {
		t.Errorf("Fragmented() = %v, want 63 (everything but Satisfied)", got)
	}

	t.Run("model not allowed", func(t *testing.T) {
		wt := Workload{Shapes: []Shape{{Request: withModels(sliceReq(1000, 500), "T4"), Freq: 1}}}
		got := NodeFrag(makeNode().Model("A100").Free(1000).Obj(), wt)
		if d := cmp.Diff(FragAmount{NoAccess: 1000}, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
		m, err := NewFragMeter(wt)
		if err != nil {
			t.Fatal(err)
		}
		if got2 := m.Amount(makeNode().Model("T4").Free(1000).Obj()); got2 != (FragAmount{Satisfied: 1000}) {
			t.Errorf("FragMeter on an allowed model = %+v", got2)
		}
	})
}
