package allocator

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testWorkload is small enough to compute fragmentation by hand:
// 25% CPU-only pods (4 cores), 50% half-GPU slices (2 cores), 25% one-GPU
// pods (8 cores).
func testWorkload() Workload {
	return Workload{Shapes: []Shape{
		{Request: Request{CPUMilli: 4000}, Freq: 0.25},
		{Request: Request{CPUMilli: 2000, GPUMilli: 500}, Freq: 0.5},
		{Request: Request{CPUMilli: 8000, GPUs: 1}, Freq: 0.25},
	}}
}

func mustPolicy(t *testing.T, name string) Policy {
	t.Helper()
	p, err := NewPolicy(name, WithWorkload(testWorkload()), WithRand(rand.New(rand.NewSource(1))))
	if err != nil {
		t.Fatalf("NewPolicy(%q): %v", name, err)
	}
	return p
}

func TestPolicyEvaluate(t *testing.T) {
	// A 2-GPU node with 16 cores, GPU 0 free and GPU 1 with 600m free.
	twoGPU := makeNode().CPU(64000, 16000).Free(1000, 600).Obj()
	tests := []struct {
		policy string
		node   *Node
		req    Request
		want   Evaluation
	}{
		// bestfit: int(100*(1 - ((16000-8000)/128000 + (1600-400)/8000)/2)) = 89
		{"bestfit", twoGPU, sliceReq(8000, 400), Evaluation{Score: 89, GPUs: set(1)}},
		{"bestfit", twoGPU, wholeReq(8000, 1), Evaluation{Score: 93, GPUs: set(0)}},
		// dotprod: int(100*(1 - (0.125*0.0625 + 0.2*0.05)/2)) = 99
		{"dotprod", twoGPU, sliceReq(8000, 400), Evaluation{Score: 99, GPUs: set(1)}},
		// gpupacking: a slice on a shared GPU: 100 - (600*100/1000)/10 = 94
		{"gpupacking", twoGPU, sliceReq(1000, 400), Evaluation{Score: 94, GPUs: set(1)}},
		// ... a slice that needs the free GPU of a used node: 50 - 1
		{"gpupacking", twoGPU, sliceReq(1000, 700), Evaluation{Score: 49, GPUs: set(0)}},
		// ... a node with all GPUs free: 33 - 8 (at least the number of free GPUs)
		{"gpupacking", makeNode().GPUs(8).Obj(), wholeReq(1000, 2), Evaluation{Score: 25, GPUs: set(0, 1)}},
		{"gpupacking", makeNode().GPUs(1).Obj(), wholeReq(1000, 1), Evaluation{Score: 32, GPUs: set(0)}},
		{"gpupacking", twoGPU, cpuReq(1000), Evaluation{}},
		// gpuclustering: fill = 25*(8000-1600)/8000 = 20, plus the band
		{"gpuclustering", makeNode().Free(1000, 600).Pods(2).Obj(), sliceReq(1, 400), Evaluation{Score: 95, GPUs: set(1)}},
		{"gpuclustering", makeNode().Free(1000, 600).Pods(2, 1).Obj(), sliceReq(1, 400), Evaluation{Score: 70, GPUs: set(1)}},
		{"gpuclustering", makeNode().GPUs(2).Obj(), sliceReq(1, 400), Evaluation{Score: 25 + 18, GPUs: set(0)}},
		{"gpuclustering", makeNode().Free(1000, 600).Pods(0, 1).Obj(), sliceReq(1, 400), Evaluation{Score: 20, GPUs: set(1)}},
		{"gpuclustering", twoGPU, cpuReq(1), Evaluation{}},
		// fgd, computed by hand from testWorkload (see TestNodeFrag): the
		// node's fragmentation is 550; a slice on GPU 1 brings it to 350
		// (int(100*sigmoid(0.2)) = 54), on GPU 0 to 550 (50).
		{"fgd", twoGPU, sliceReq(2000, 500), Evaluation{Score: 54, GPUs: set(1)}},
		// a whole GPU: 550 -> 300, int(100*sigmoid(0.25)) = 56
		{"fgd", twoGPU, wholeReq(8000, 1), Evaluation{Score: 56, GPUs: set(0)}},
		// a CPU-only pod leaves 6 cores: the one-GPU shape lacks CPU, 550 -> 800
		{"fgd", twoGPU, cpuReq(10000), Evaluation{Score: 43}},
		// spread: mean free share of CPU (0.375), memory (0.5 - 1/256) and GPU (0.6)
		{"spread", makeNode().CPU(64000, 32000).Mem(262144, 131072).Free(1000, 600).Obj(), sliceReq(8000, 400),
			Evaluation{Score: 100 * (0.375 + (131072.0-1024)/262144 + 0.6) / 3, GPUs: set(0)}},
	}
	for _, tc := range tests {
		t.Run(tc.policy+"/"+tc.req.String(), func(t *testing.T) {
			p := mustPolicy(t, tc.policy)
			if Fit(tc.node, tc.req) != Fits {
				t.Fatalf("test request does not fit the test node")
			}
			before := tc.node.Clone()
			got := p.Evaluate(tc.node, tc.req)
			if d := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); d != "" {
				t.Errorf("Evaluate (-want +got):\n%s", d)
			}
			if d := cmp.Diff(before, tc.node); d != "" {
				t.Errorf("Evaluate modified the node:\n%s", d)
			}
		})
	}
}

func TestFGDPrefersLessFragmentation(t *testing.T) {
	p := mustPolicy(t, "fgd")
	// A slice of 500 fills GPU 1 (500 free) exactly on node a, and opens a
	// free GPU on node b: a must score higher.
	a := makeNode().Name("a").Free(0, 500).Obj()
	b := makeNode().Name("b").Free(1000, 1000).Obj()
	r := sliceReq(2000, 500)
	if ea, eb := p.Evaluate(a, r), p.Evaluate(b, r); !(ea.Score > eb.Score) {
		t.Errorf("fgd scores exact fit %v, free GPU %v; want exact fit higher", ea.Score, eb.Score)
	}
}

func TestRandomPolicy(t *testing.T) {
	n := makeNode().Free(1000, 100, 600, 450).Obj()
	r := sliceReq(1, 450)
	counts := map[GPUSet]int{}
	p1, _ := NewPolicy("random", WithRand(rand.New(rand.NewSource(7))))
	p2, _ := NewPolicy("random", WithRand(rand.New(rand.NewSource(7))))
	if !IsRandomized(p1) || IsRandomized(mustPolicy(t, "fgd")) {
		t.Fatalf("IsRandomized wrong")
	}
	const trials = 3000
	for i := 0; i < trials; i++ {
		e1, e2 := p1.Evaluate(n, r), p2.Evaluate(n, r)
		if e1 != e2 {
			t.Fatalf("same seed, different evaluations: %+v vs %+v", e1, e2)
		}
		if e1.Score < 0 || e1.Score >= 1 {
			t.Fatalf("score %v outside [0, 1)", e1.Score)
		}
		counts[e1.GPUs]++
	}
	// GPUs 0, 2 and 3 fit the slice; GPU 1 does not.
	if counts[set(1)] != 0 || len(counts) != 3 {
		t.Fatalf("random chose %v, want only GPUs 0, 2, 3", counts)
	}
	for s, c := range counts {
		if c < trials/3-150 || c > trials/3+150 {
			t.Errorf("GPU %s chosen %d times of %d, want about a third", s, c, trials)
		}
	}
	if got := p1.Evaluate(makeNode().Free(1000, 0, 1000).Obj(), wholeReq(1, 2)).GPUs; got != set(0, 2) {
		t.Errorf("random whole GPUs = %s, want the first free ones (0-2)", got)
	}
}

func TestNewPolicy(t *testing.T) {
	for _, name := range PolicyNames() {
		p := mustPolicy(t, name)
		if p.Name() != name {
			t.Errorf("NewPolicy(%q).Name() = %q", name, p.Name())
		}
	}
	if p, err := NewPolicy(" FGD ", WithWorkload(testWorkload())); err != nil || p.Name() != "fgd" {
		t.Errorf("NewPolicy is not case-insensitive: %v, %v", p, err)
	}
	_, err := NewPolicy("firstfit")
	if !errors.Is(err, ErrUnknownPolicy) || !strings.Contains(err.Error(), "firstfit") {
		t.Errorf("unknown policy error = %v", err)
	}
	if _, err := NewPolicy("fgd"); err == nil {
		t.Errorf("fgd without a workload built")
	}
	if _, err := NewPolicy("tessera"); err == nil {
		t.Errorf("tessera without a workload built")
	}
	if _, err := NewPolicy("random"); err == nil {
		t.Errorf("random without a random source built")
	}
	bad := Workload{Shapes: []Shape{{Request: Request{GPUMilli: 500}, Freq: 0.4}}}
	if _, err := NewPolicy("fgd", WithWorkload(bad)); err == nil {
		t.Errorf("fgd with frequencies summing to 0.4 built")
	}
	for _, name := range []string{"fgd", "tessera"} {
		if !NeedsWorkload(name) {
			t.Errorf("NeedsWorkload(%q) = false", name)
		}
	}
}

// Every policy's GPU choice must be a valid placement, on random nodes and
// requests, and Evaluate must not change the node.
func TestPolicyChoicesAreValidPlacements(t *testing.T) {
	rng := rand.New(rand.NewSource(42))
	models := []string{"A100", "T4"}
	for _, name := range PolicyNames() {
		p := mustPolicy(t, name)
		for i := 0; i < 2000; i++ {
			b := makeNode().Model(models[rng.Intn(2)]).CPU(64000, int64(rng.Intn(64001))).Mem(262144, int64(rng.Intn(262145)))
			for g := rng.Intn(9); g > 0; g-- {
				b.GPUs(1)
			}
			n := b.Obj()
			for g := range n.GPUs {
				if rng.Intn(2) == 0 {
					n.GPUs[g].MilliFree = int64(rng.Intn(101)) * 10
				}
			}
			var r Request
			switch rng.Intn(3) {
			case 0:
				r = cpuReq(int64(rng.Intn(32000)))
			case 1:
				r = sliceReq(int64(rng.Intn(16000)), int64(1+rng.Intn(99))*10)
			default:
				r = wholeReq(int64(rng.Intn(32000)), 1+rng.Intn(8))
			}
			if rng.Intn(4) == 0 {
				r.Models = []string{"T4"}
			}
			if Fit(n, r) != Fits {
				if _, err := Place(p, n, r); err == nil {
					t.Fatalf("%s: Place succeeded for a request that does not fit", name)
				}
				continue
			}
			before := n.Clone()
			gpus, err := Place(p, n, r)
			if err != nil {
				t.Fatalf("%s: Place: %v", name, err)
			}
			if d := cmp.Diff(before, n); d != "" {
				t.Fatalf("%s: Evaluate modified the node:\n%s", name, d)
			}
			if err := Apply(n, r, gpus); err != nil {
				t.Fatalf("%s: its choice %s for %s on %+v is not a valid placement: %v", name, gpus, r, before, err)
			}
		}
	}
}
