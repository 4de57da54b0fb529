package allocator

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestApplyRelease(t *testing.T) {
	tests := []struct {
		name    string
		node    *Node
		req     Request
		gpus    GPUSet
		want    *Node // nil when Apply must fail
		wantErr bool
	}{
		{
			name: "cpu-only",
			node: makeNode().GPUs(2).Obj(),
			req:  cpuReq(4000),
			want: makeNode().CPU(64000, 60000).Mem(262144, 262144-1024).GPUs(2).Obj(),
		},
		{
			name: "slice",
			node: makeNode().Free(1000, 600).Obj(),
			req:  sliceReq(2000, 450),
			gpus: set(1),
			want: makeNode().CPU(64000, 62000).Mem(262144, 262144-1024).Free(1000, 150).Pods(1).Obj(),
		},
		{
			name: "slice with gpu memory",
			node: makeNode().GPUs(2).GPUMem(16000).Obj(),
			req:  Request{CPUMilli: 1000, GPUMilli: 300, GPUMemMiB: 5000},
			gpus: set(0),
			want: func() *Node {
				n := makeNode().CPU(64000, 63000).GPUs(2).GPUMem(16000).Pods(1).Obj()
				n.GPUs[0].MilliFree, n.GPUs[0].MemFreeMiB = 700, 11000
				return n
			}(),
		},
		{
			name: "two whole gpus",
			node: makeNode().Free(1000, 500, 1000, 1000).Obj(),
			req:  wholeReq(8000, 2),
			gpus: set(0, 3),
			want: makeNode().CPU(64000, 56000).Mem(262144, 262144-1024).Free(0, 500, 1000, 0).Pods(0, 0, 1).Obj(),
		},
		{name: "whole gpu not free", node: makeNode().Free(1000, 999).Obj(), req: wholeReq(1, 1), gpus: set(1), wantErr: true},
		{name: "wrong gpu count", node: makeNode().GPUs(4).Obj(), req: wholeReq(1, 2), gpus: set(1), wantErr: true},
		{name: "slice on two gpus", node: makeNode().GPUs(4).Obj(), req: sliceReq(1, 100), gpus: set(1, 2), wantErr: true},
		{name: "slice does not fit chosen gpu", node: makeNode().Free(1000, 50).Obj(), req: sliceReq(1, 100), gpus: set(1), wantErr: true},
		{name: "gpu beyond node", node: makeNode().GPUs(2).Obj(), req: sliceReq(1, 100), gpus: set(5), wantErr: true},
		{name: "cpu-only given gpus", node: makeNode().GPUs(2).Obj(), req: cpuReq(1), gpus: set(0), wantErr: true},
		{name: "does not fit cpu", node: makeNode().CPU(10, 10).GPUs(1).Obj(), req: wholeReq(11, 1), gpus: set(0), wantErr: true},
		{name: "invalid request", node: makeNode().GPUs(1).Obj(), req: Request{GPUs: 1, GPUMilli: 1}, gpus: set(0), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig := tc.node.Clone()
			n := tc.node.Clone()
			err := Apply(n, tc.req, tc.gpus)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Apply() succeeded, want an error")
				}
				if d := cmp.Diff(orig, n); d != "" {
					t.Errorf("failed Apply modified the node (-before +after):\n%s", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply() = %v", err)
			}
			want := tc.want.Clone()
			want.Name = n.Name
			if d := cmp.Diff(want, n); d != "" {
				t.Errorf("after Apply (-want +got):\n%s", d)
			}
			if err := Release(n, tc.req, tc.gpus); err != nil {
				t.Fatalf("Release() = %v", err)
			}
			// Release restores everything except that the class counter
			// slice may have grown.
			if len(orig.GPUPods) < len(n.GPUPods) {
				orig.GPUPods = append(orig.GPUPods, make([]int32, len(n.GPUPods)-len(orig.GPUPods))...)
			}
			if d := cmp.Diff(orig, n); d != "" {
				t.Errorf("Apply+Release is not the identity (-before +after):\n%s", d)
			}
		})
	}
}

func TestReleaseRejectsWhatWasNotApplied(t *testing.T) {
	tests := []struct {
		name string
		node *Node
		req  Request
		gpus GPUSet
	}{
		{"cpu above capacity", makeNode().GPUs(1).Obj(), cpuReq(1), 0},
		{"whole gpu that is free", makeNode().CPU(64000, 0).Mem(262144, 0).Free(1000).Pods(0, 1).Obj(), wholeReq(1, 1), set(0)},
		{"slice above gpu capacity", makeNode().CPU(64000, 0).Mem(262144, 0).Free(900).Pods(1).Obj(), sliceReq(1, 200), set(0)},
		{"no pod of that class", makeNode().CPU(64000, 0).Mem(262144, 0).Free(500).Obj(), sliceReq(1, 200), set(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node.Clone()
			if err := Release(n, tc.req, tc.gpus); err == nil {
				t.Fatalf("Release() succeeded, want an error")
			}
			if d := cmp.Diff(tc.node, n); d != "" {
				t.Errorf("failed Release modified the node:\n%s", d)
			}
		})
	}
}
