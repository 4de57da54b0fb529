package allocator

import "fmt"

// nodeBuilder builds test nodes: makeNode().GPUs(8).Obj().
type nodeBuilder struct{ n Node }

func makeNode() *nodeBuilder {
	return &nodeBuilder{n: Node{
		Name:             "node-0",
		Model:            "A100",
		CPUMilliCapacity: 64000, CPUMilliFree: 64000,
		MemMiBCapacity: 262144, MemMiBFree: 262144,
	}}
}

func (b *nodeBuilder) Name(s string) *nodeBuilder  { b.n.Name = s; return b }
func (b *nodeBuilder) Model(s string) *nodeBuilder { b.n.Model = s; return b }

// CPU sets capacity and free CPU (milli).
func (b *nodeBuilder) CPU(capacity, free int64) *nodeBuilder {
	b.n.CPUMilliCapacity, b.n.CPUMilliFree = capacity, free
	return b
}

// Mem sets capacity and free memory (MiB).
func (b *nodeBuilder) Mem(capacity, free int64) *nodeBuilder {
	b.n.MemMiBCapacity, b.n.MemMiBFree = capacity, free
	return b
}

// GPUs adds k fully free GPUs (without GPU memory tracking).
func (b *nodeBuilder) GPUs(k int) *nodeBuilder {
	for i := 0; i < k; i++ {
		b.n.GPUs = append(b.n.GPUs, GPU{Index: len(b.n.GPUs), MilliFree: MilliPerGPU})
	}
	return b
}

// GPUMem gives every GPU `total` MiB of memory, all free.
func (b *nodeBuilder) GPUMem(total int64) *nodeBuilder {
	for i := range b.n.GPUs {
		b.n.GPUs[i].MemTotalMiB, b.n.GPUs[i].MemFreeMiB = total, total
	}
	return b
}

// Free sets the free compute of each GPU, in order (adds GPUs as needed).
func (b *nodeBuilder) Free(milli ...int64) *nodeBuilder {
	for i, m := range milli {
		if i >= len(b.n.GPUs) {
			b.GPUs(1)
		}
		b.n.GPUs[i].MilliFree = m
	}
	return b
}

// Pods sets the GPU pod class counts.
func (b *nodeBuilder) Pods(counts ...int32) *nodeBuilder {
	b.n.GPUPods = append([]int32(nil), counts...)
	return b
}

func (b *nodeBuilder) Obj() *Node { return b.n.Clone() }

// Request builders.
func cpuReq(cpu int64) Request                  { return Request{CPUMilli: cpu, MemMiB: 1024} }
func sliceReq(cpu, milli int64) Request         { return Request{CPUMilli: cpu, MemMiB: 1024, GPUMilli: milli} }
func wholeReq(cpu int64, gpus int) Request      { return Request{CPUMilli: cpu, MemMiB: 1024, GPUs: gpus} }
func withModels(r Request, m ...string) Request { r.Models = m; return r }

func set(pos ...int) GPUSet {
	var s GPUSet
	for _, p := range pos {
		s = s.With(p)
	}
	return s
}

func (s GPUSet) GoString() string { return fmt.Sprintf("set(%s)", s) }
