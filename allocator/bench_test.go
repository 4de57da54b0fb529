package allocator

import (
	"fmt"
	"math/rand"
	"testing"
)

// benchCluster builds a 1213-node cluster shaped like the Alibaba trace's
// (mostly 8-GPU and 2-GPU nodes), half used, from a fixed seed.
func benchCluster() []*Node { return benchClusterScaled(1) }

// benchClusterScaled is benchCluster with every node shape's count
// multiplied by scale (rounded).
func benchClusterScaled(scale float64) []*Node {
	rng := rand.New(rand.NewSource(1))
	shapes := []struct {
		model    string
		gpus     int
		cpu, mem int64
		count    int
	}{
		{"G2", 8, 96000, 393216, 549}, {"T4", 2, 104000, 524288, 387}, {"P100", 2, 16000, 122880, 131},
		{"G3", 8, 128000, 786432, 39}, {"V100M16", 4, 32000, 131072, 28}, {"V100M32", 8, 96000, 786432, 21},
		{"V100M16", 1, 8000, 32768, 19}, {"T4", 4, 96000, 393216, 17}, {"V100M32", 4, 48000, 376832, 9},
		{"V100M16", 8, 64000, 262144, 8}, {"P100", 1, 8000, 61440, 3}, {"A10", 1, 128000, 1048576, 2},
	}
	var nodes []*Node
	for _, s := range shapes {
		count := int(float64(s.count)*scale + 0.5)
		for i := 0; i < count; i++ {
			n := makeNode().Model(s.model).CPU(s.cpu, s.cpu/2+int64(rng.Intn(int(s.cpu/2)))).Mem(s.mem, s.mem/2).Obj()
			n.Name = s.model + "-" + string(rune('a'+len(nodes)%26))
			for g := 0; g < s.gpus; g++ {
				free := int64(MilliPerGPU)
				switch rng.Intn(3) {
				case 0:
					free = 0
				case 1:
					free = int64(rng.Intn(100)) * 10
				}
				n.GPUs = append(n.GPUs, GPU{Index: g, MilliFree: free})
			}
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// benchWorkload is a target workload like the trace's top shapes.
func benchWorkload() Workload {
	reqs := []Request{}
	add := func(r Request, n int) {
		for i := 0; i < n; i++ {
			reqs = append(reqs, r)
		}
	}
	add(wholeReq(11000, 1), 1682)
	add(sliceReq(3000, 810), 1047)
	add(wholeReq(3000, 1), 470)
	add(sliceReq(11000, 470), 388)
	add(cpuReq(12000), 370)
	add(sliceReq(8000, 470), 360)
	add(wholeReq(12000, 1), 326)
	add(cpuReq(32000), 290)
	add(sliceReq(11000, 650), 237)
	add(sliceReq(4000, 320), 232)
	add(sliceReq(4000, 230), 122)
	add(sliceReq(4000, 160), 54)
	add(wholeReq(64000, 8), 21)
	add(wholeReq(24000, 2), 16)
	add(wholeReq(40000, 4), 15)
	w, err := NewWorkload(reqs, DefaultPopularity)
	if err != nil {
		panic(err)
	}
	return w
}

// BenchmarkPodScoring measures the cost of scoring one pod against all
// 1213 nodes (Fit + Evaluate on every node, then the best is kept), with a
// mix of slice, whole-GPU and CPU-only requests.
func BenchmarkPodScoring(b *testing.B) {
	nodes := benchCluster()
	if len(nodes) != 1213 {
		b.Fatalf("bench cluster has %d nodes", len(nodes))
	}
	reqs := []Request{sliceReq(3000, 810), wholeReq(11000, 1), sliceReq(8000, 470), cpuReq(12000), wholeReq(64000, 8), sliceReq(4000, 320)}
	for _, name := range PolicyNames() {
		p, err := NewPolicy(name, WithWorkload(benchWorkload()), WithRand(rand.New(rand.NewSource(1))))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Select(p, nodes, reqs[i%len(reqs)], nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchWorkloadWide is benchWorkload's shapes, each in six CPU sizes (90
// shapes, all kept: the simulator gives tessera every shape of the trace,
// 91 on the Alibaba default trace).
func benchWorkloadWide() Workload {
	var reqs []Request
	for _, sh := range benchWorkload().Shapes {
		for k := int64(1); k <= 6; k++ {
			r := sh.Request
			r.CPUMilli = r.CPUMilli * k / 3
			n := int(sh.Freq*1000) + 1
			for i := 0; i < n; i++ {
				reqs = append(reqs, r)
			}
		}
	}
	w, err := NewWorkload(reqs, 1)
	if err != nil {
		panic(err)
	}
	return w
}

// BenchmarkTesseraPodScoring5000 measures the tessera policy's per-pod cost
// at the extender's largest scale: Fit + Evaluate on 5000 nodes (the bench
// cluster scaled up), the best kept, for the same mix of requests as
// BenchmarkPodScoring; with the 15-shape and the 90-shape target workload,
// and FGD for comparison. The extender's budget for filter + prioritize
// is 5 ms per pod.
func BenchmarkTesseraPodScoring5000(b *testing.B) {
	nodes := benchClusterScaled(5000.0 / 1213)
	if len(nodes) < 4990 || len(nodes) > 5010 {
		b.Fatalf("bench cluster has %d nodes", len(nodes))
	}
	reqs := []Request{sliceReq(3000, 810), wholeReq(11000, 1), sliceReq(8000, 470), cpuReq(12000), wholeReq(64000, 8), sliceReq(4000, 320)}
	for _, c := range []struct {
		name, policy string
		w            Workload
	}{
		{"tessera-15shapes", PolicyTessera, benchWorkload()},
		{"tessera-90shapes", PolicyTessera, benchWorkloadWide()},
		{"fgd-15shapes", PolicyFGD, benchWorkload()},
	} {
		p, err := NewPolicy(c.policy, WithWorkload(c.w))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Select(p, nodes, reqs[i%len(reqs)], nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTesseraPolicyBuild is what building the tessera policy costs
// (the extender's learned policy rebuilds it every 50 new pods): with the
// priced gaps it solves the packing LP of the workload's slices.
func BenchmarkTesseraPolicyBuild(b *testing.B) {
	for _, c := range []struct {
		name string
		w    Workload
	}{{"15-shapes", benchWorkload()}, {"90-shapes", benchWorkloadWide()}} {
		for _, priced := range []float64{0, 1} {
			cfg := DefaultTesseraConfig()
			cfg.PricedGaps = priced
			b.Run(fmt.Sprintf("%s/priced=%v", c.name, priced), func(b *testing.B) {
				for b.Loop() {
					if _, err := NewPolicy(PolicyTessera, WithWorkload(c.w), WithTesseraConfig(cfg)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
