package allocator

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFit(t *testing.T) {
	tests := []struct {
		name string
		node *Node
		req  Request
		want Reason
	}{
		{"cpu-only fits", makeNode().Obj(), cpuReq(8000), Fits},
		{"cpu-only on gpu-less node", makeNode().Model("").Obj(), cpuReq(8000), Fits},
		{"cpu-only ignores models", makeNode().GPUs(1).Obj(), withModels(cpuReq(1000), "T4"), Fits},
		{"insufficient cpu", makeNode().CPU(64000, 7999).Obj(), cpuReq(8000), InsufficientCPU},
		{"insufficient memory", makeNode().Mem(1000, 1023).Obj(), cpuReq(1), InsufficientMemory},
		{"gpu request on gpu-less node", makeNode().Obj(), sliceReq(1000, 500), NoGPUs},
		{"model not allowed", makeNode().GPUs(2).Obj(), withModels(wholeReq(1000, 1), "T4", "V100"), ModelNotAllowed},
		{"model allowed", makeNode().Model("V100").GPUs(2).Obj(), withModels(wholeReq(1000, 1), "T4", "V100"), Fits},
		{"a word of the model's name allowed", makeNode().Model("NVIDIA A100-SXM4-40GB").GPUs(2).Obj(), withModels(wholeReq(1000, 1), "A100"), Fits},
		{"part of a word of the model's name not allowed", makeNode().Model("NVIDIA A100-SXM4-40GB").GPUs(2).Obj(), withModels(wholeReq(1000, 1), "A10"), ModelNotAllowed},
		{"model checked before cpu", makeNode().CPU(64000, 0).GPUs(2).Obj(), withModels(wholeReq(1000, 1), "T4"), ModelNotAllowed},
		{"cpu checked before gpu", makeNode().CPU(64000, 0).Free(0, 0).Obj(), wholeReq(1000, 1), InsufficientCPU},
		{"whole gpus fit", makeNode().Free(1000, 300, 1000).Obj(), wholeReq(1000, 2), Fits},
		{"whole gpus need fully free ones", makeNode().Free(1000, 999, 1000).Obj(), wholeReq(1000, 3), InsufficientWholeGPUs},
		{"slice fits a partly used gpu", makeNode().Free(0, 450).Obj(), sliceReq(1000, 450), Fits},
		{"slice fits no gpu", makeNode().Free(449, 300).Obj(), sliceReq(1000, 450), NoGPUForSlice},
		{"slice memory must fit the same gpu",
			func() *Node {
				n := makeNode().GPUs(2).GPUMem(16000).Obj()
				n.GPUs[0].MemFreeMiB = 100 // enough compute, too little memory
				n.GPUs[1].MilliFree = 100  // enough memory, too little compute
				return n
			}(),
			Request{CPUMilli: 1, GPUMilli: 500, GPUMemMiB: 4000}, NoGPUForSlice},
		{"memory-only slice", makeNode().GPUs(1).GPUMem(16000).Obj(), Request{GPUMemMiB: 4000}, Fits},
		{"memory-only slice on untracked gpu memory", makeNode().GPUs(1).Obj(), Request{GPUMemMiB: 4000}, NoGPUForSlice},
		{"whole gpu with used memory is not free",
			func() *Node { n := makeNode().GPUs(1).GPUMem(16000).Obj(); n.GPUs[0].MemFreeMiB = 15000; return n }(),
			wholeReq(0, 1), InsufficientWholeGPUs},
		{"invalid: negative cpu", makeNode().Obj(), Request{CPUMilli: -1}, InvalidRequest},
		{"invalid: whole and slice", makeNode().GPUs(2).Obj(), Request{GPUs: 1, GPUMilli: 500}, InvalidRequest},
		{"invalid: slice of a whole gpu", makeNode().GPUs(2).Obj(), Request{GPUMilli: 1000}, InvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.node.Clone()
			if got := Fit(tc.node, tc.req); got != tc.want {
				t.Errorf("Fit() = %v, want %v", got, tc.want)
			}
			if d := cmp.Diff(before, tc.node); d != "" {
				t.Errorf("Fit modified the node (-before +after):\n%s", d)
			}
			err := CheckFit(tc.node, tc.req)
			if tc.want == Fits {
				if err != nil {
					t.Errorf("CheckFit() = %v, want nil", err)
				}
				return
			}
			var fe *FitError
			if !errors.As(err, &fe) || fe.Reason != tc.want || fe.Node != tc.node.Name {
				t.Errorf("CheckFit() = %#v, want *FitError{%s, %v}", err, tc.node.Name, tc.want)
			}
		})
	}
}

func TestReasonStrings(t *testing.T) {
	seen := map[string]Reason{}
	for _, r := range append([]Reason{Fits}, Reasons()...) {
		s := r.String()
		if prev, dup := seen[s]; dup {
			t.Errorf("reasons %d and %d share the label %q", prev, r, s)
		}
		seen[s] = r
		if r.Message() == "" {
			t.Errorf("reason %v has no message", r)
		}
	}
	if got, want := len(Reasons()), int(numReasons)-1; got != want {
		t.Errorf("Reasons() has %d entries, want %d", got, want)
	}
}

func TestRequestValidateAndKind(t *testing.T) {
	tests := []struct {
		req     Request
		kind    Kind
		milli   int64
		wantErr bool
	}{
		{Request{CPUMilli: 1000}, CPUOnly, 0, false},
		{Request{GPUMilli: 250}, Shared, 250, false},
		{Request{GPUMemMiB: 512}, Shared, 0, false},
		{Request{GPUs: 4}, Whole, 4000, false},
		{Request{GPUs: 1, GPUMemMiB: 1}, Whole, 1000, true},
		{Request{GPUMilli: 1000}, Shared, 1000, true},
		{Request{GPUs: 65}, Whole, 65000, true},
		{Request{MemMiB: -1}, CPUOnly, 0, true},
	}
	for _, tc := range tests {
		if got := tc.req.Kind(); got != tc.kind {
			t.Errorf("%+v: Kind() = %v, want %v", tc.req, got, tc.kind)
		}
		if got := tc.req.TotalGPUMilli(); got != tc.milli {
			t.Errorf("%+v: TotalGPUMilli() = %d, want %d", tc.req, got, tc.milli)
		}
		if err := tc.req.Validate(); (err != nil) != tc.wantErr {
			t.Errorf("%+v: Validate() = %v, want error %v", tc.req, err, tc.wantErr)
		}
	}
}

func TestGPUSet(t *testing.T) {
	s := set(0, 3, 63)
	if got, want := s.Positions(), []int{0, 3, 63}; !cmp.Equal(got, want) {
		t.Errorf("Positions() = %v, want %v", got, want)
	}
	if s.Len() != 3 || !s.Has(3) || s.Has(2) || s.Has(64) || s.Has(-1) {
		t.Errorf("set %s: Len/Has wrong", s)
	}
	if got := s.String(); got != "0-3-63" {
		t.Errorf("String() = %q", got)
	}
	n := makeNode().GPUs(4).Obj()
	for i := range n.GPUs {
		n.GPUs[i].Index = 10 + i
	}
	if got := n.DeviceIndices(set(1, 2)); !cmp.Equal(got, []int{11, 12}) {
		t.Errorf("DeviceIndices = %v", got)
	}
}

func TestNodeValidate(t *testing.T) {
	good := makeNode().Free(1000, 0).Obj()
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	bad := []*Node{
		makeNode().Name("").Obj(),
		makeNode().CPU(10, 11).Obj(),
		makeNode().Mem(10, -1).Obj(),
		makeNode().Free(1001).Obj(),
		func() *Node { n := makeNode().GPUs(1).Obj(); n.GPUs[0].MemFreeMiB = 1; return n }(),
		makeNode().Pods(-1).Obj(),
		makeNode().GPUs(65).Obj(),
	}
	for i, n := range bad {
		if err := n.Validate(); err == nil {
			t.Errorf("bad node %d validated", i)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	n := makeNode().Free(1000, 500).Pods(1, 0).Obj()
	c := n.Clone()
	c.GPUs[0].MilliFree = 0
	c.GPUPods[0] = 7
	if n.GPUs[0].MilliFree != 1000 || n.GPUPods[0] != 1 {
		t.Errorf("Clone shares memory with the original: %+v", n)
	}
}
