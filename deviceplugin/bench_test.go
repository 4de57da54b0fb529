package deviceplugin_test

import (
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// The kubelet's calls on an 8-GPU node, end to end over gRPC on a unix
// socket: what the kubelet waits for when it admits a pod.
func BenchmarkGetPreferredAllocation8GPUs(b *testing.B) {
	for _, name := range []string{nvmlmock.DGXA100Name, nvmlmock.DGX1VName} {
		e := newEnv(b, nvmlmock.Builtin(name), nil).start(true)
		all := e.totals()
		e.kubelet.waitCounts("registration", all, all)
		available := e.kubelet.healthyIDs(gpuR)
		for _, size := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("%s/size=%d", name, size), func(b *testing.B) {
				for b.Loop() {
					ids, err := e.kubelet.preferred(gpuR, available, nil, size)
					if err != nil || len(ids) != size {
						b.Fatalf("GetPreferredAllocation = %v, %v", ids, err)
					}
				}
			})
		}
		e.stop()
	}
}

func BenchmarkAllocate8GPUs(b *testing.B) {
	e := newEnv(b, nvmlmock.DGXA100(), nil)
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, all)
	for _, size := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("gpu/size=%d", size), func(b *testing.B) {
			ids := e.kubelet.healthyIDs(gpuR)[:size]
			for b.Loop() {
				if _, err := e.kubelet.allocate(gpuR, ids...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	e.stop()
	// Shared units on a node with no whole GPU in use.
	e = newEnv(b, nvmlmock.DGXA100(), nil)
	e.nri.connected.Store(true)
	e.start(true)
	e.kubelet.waitCounts("registration", all, all)
	b.Run("gpu-memory/units=16", func(b *testing.B) {
		ids := unitsOf(api.ResourceGPUMemory, e.uuid(7), 16)
		for b.Loop() {
			if _, err := e.kubelet.allocate(api.ResourceGPUMemory, ids...); err != nil {
				b.Fatal(err)
			}
		}
	})
}
