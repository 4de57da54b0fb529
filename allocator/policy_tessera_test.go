package allocator

import (
	"math"
	"math/rand"
	"testing"
)

func tessera(t *testing.T, w Workload, opts ...Option) Policy {
	t.Helper()
	p, err := NewPolicy("tessera", append([]Option{WithWorkload(w)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recursionConfig is the default tuning with the gap-waste recursion in
// place of the priced gaps (TesseraConfig.PricedGaps), for the tests of
// the recursion.
func recursionConfig() TesseraConfig {
	cfg := DefaultTesseraConfig()
	cfg.PricedGaps = 0
	return cfg
}

func TestTesseraCPUStranding(t *testing.T) {
	// GPU pods need 10 cores per GPU. A 32-core CPU-only pod would leave
	// the 8-GPU node 64 cores for 8 GPUs (1.6 GPUs stranded); the 2-GPU
	// node keeps plenty.
	w := Workload{Shapes: []Shape{{Request: wholeReq(10000, 1), Freq: 0.5}, {Request: cpuReq(8000), Freq: 0.5}}}
	p := tessera(t, w)
	big := makeNode().Name("big").CPU(96000, 96000).GPUs(8).Obj()
	small := makeNode().Name("small").CPU(104000, 104000).GPUs(2).Obj()
	r := cpuReq(32000)
	eb, es := p.Evaluate(big, r), p.Evaluate(small, r)
	want := -DefaultTesseraConfig().StrandWeight * (8000 - 64000.0/10)
	if math.Abs(eb.Score-want) > 1e-9 || es.Score != 0 {
		t.Errorf("scores big %v small %v, want %v and 0", eb.Score, es.Score, want)
	}
	// FGD sees no difference: neither node lacks CPU for a typical pod yet.
	f, _ := NewPolicy("fgd", WithWorkload(w))
	if fb, fs := f.Evaluate(big, r), f.Evaluate(small, r); fb.Score != fs.Score {
		t.Errorf("fgd scores differ (%v, %v); the test no longer shows what stranding adds", fb.Score, fs.Score)
	}
}

func TestTesseraGapWaste(t *testing.T) {
	// Half the pods are 470m slices, half whole GPUs: a 470m slice should
	// complete a GPU with 530m free (leaving 60m) rather than open a free
	// GPU, on whichever node.
	w := Workload{Shapes: []Shape{{Request: sliceReq(1000, 470), Freq: 0.5}, {Request: wholeReq(1000, 1), Freq: 0.5}}}
	p := tessera(t, w)
	partly := makeNode().Name("partly").Free(1000, 530).Obj()
	free := makeNode().Name("free").Free(1000, 1000).Obj()
	r := sliceReq(1000, 470)
	ep, ef := p.Evaluate(partly, r), p.Evaluate(free, r)
	if ep.GPUs != set(1) || !(ep.Score > ef.Score) {
		t.Errorf("partly used node: %+v, free node: %+v; want GPU 1 of the partly used node, scoring higher", ep, ef)
	}
	tp := p.(*tesseraPolicy)
	for g := 1; g < MilliPerGPU; g++ {
		if v := tp.gapWaste[g]; v < 0 || v > float64(g) {
			t.Fatalf("expected waste of a %dm gap is %v, outside [0, %d]", g, v, g)
		}
	}
	if tp.gapWaste[469] != 469 {
		t.Errorf("no slice fits a 469m gap, its waste should be all of it, got %v", tp.gapWaste[469])
	}
	if !(tp.gapWaste[530] < 530) {
		t.Errorf("a 530m gap fits a 470m slice, its expected waste should be below 530, got %v", tp.gapWaste[530])
	}
}

func TestTesseraModelPressure(t *testing.T) {
	// Half the GPU demand can only run on T4, which is 2 of the cluster's
	// 10 GPUs: T4 pressure = 0.5 / 0.2 = 2.5, A100 pressure 0.
	w := Workload{Shapes: []Shape{{Request: withModels(wholeReq(1000, 1), "T4"), Freq: 0.5}, {Request: wholeReq(1000, 1), Freq: 0.5}}}
	with := tessera(t, w, WithModelCapacity(map[string]int{"T4": 2, "A100": 8}))
	without := tessera(t, w)
	t4 := makeNode().Model("T4").GPUs(2).Obj()
	a100 := makeNode().Model("A100").GPUs(8).Obj()
	r := wholeReq(1000, 1)
	if d, want := with.Evaluate(t4, r).Score-without.Evaluate(t4, r).Score, -DefaultTesseraConfig().ModelWeight*2.5*1000; math.Abs(d-want) > 1e-9 {
		t.Errorf("T4 pressure changes the score by %v, want %v", d, want)
	}
	if d := with.Evaluate(a100, r).Score - without.Evaluate(a100, r).Score; d != 0 {
		t.Errorf("A100 has no pressure but its score changed by %v", d)
	}
	if !(with.Evaluate(a100, r).Score > with.Evaluate(t4, r).Score) {
		t.Errorf("an unconstrained pod should prefer the A100 node")
	}
}

// TestTesseraModelPressureByWord: a shape asking for "T4" puts pressure
// on the GPUs NVML names "Tesla T4" (api.ModelAllowed), as it does on
// exact names.
func TestTesseraModelPressureByWord(t *testing.T) {
	w := Workload{Shapes: []Shape{{Request: withModels(wholeReq(1000, 1), "T4"), Freq: 0.5}, {Request: wholeReq(1000, 1), Freq: 0.5}}}
	with := tessera(t, w, WithModelCapacity(map[string]int{"Tesla T4": 2, "NVIDIA A100-SXM4-40GB": 8}))
	without := tessera(t, w)
	t4 := makeNode().Model("Tesla T4").GPUs(2).Obj()
	r := wholeReq(1000, 1)
	if d, want := with.Evaluate(t4, r).Score-without.Evaluate(t4, r).Score, -DefaultTesseraConfig().ModelWeight*2.5*1000; math.Abs(d-want) > 1e-9 {
		t.Errorf("T4 pressure changes the score by %v, want %v", d, want)
	}
}

func TestTesseraGapRouting(t *testing.T) {
	// Slices of 300m and 100m, equally frequent. A 400m gap filled by a
	// uniformly random fitting slice leaves 100m or 300m; routed, the
	// scheduler prefers the filler that leaves less waste.
	w := Workload{Shapes: []Shape{{Request: sliceReq(1000, 300), Freq: 0.5}, {Request: sliceReq(1000, 100), Freq: 0.5}}}
	cfg := recursionConfig()
	cfg.GapRouting = 0
	uniform := tessera(t, w, WithTesseraConfig(cfg)).(*tesseraPolicy)
	// By hand: W(g) = (1-q) g + q * mean of W(g-s) over fitting s, q = p/(p+c).
	c := cfg.GapCompetition
	want := map[int]float64{}
	want[50] = 50
	want[100] = (c/(0.5+c))*100 + (0.5/(0.5+c))*0
	want[200] = (c/(0.5+c))*200 + (0.5/(0.5+c))*want[100]
	want[300] = (c/(1+c))*300 + (1/(1+c))*(0.5*0+0.5*want[200])
	for g, v := range want {
		if math.Abs(uniform.gapWaste[g]-v) > 1e-9 {
			t.Errorf("uniform fillers: W(%d) = %v, want %v", g, uniform.gapWaste[g], v)
		}
	}
	cfg.GapRouting = 5
	routed := tessera(t, w, WithTesseraConfig(cfg)).(*tesseraPolicy)
	// W(300): the 300m slice leaves W(0) = 0, the 100m one W(200) > 0, so
	// routing weighs the 300m filler more.
	w0, w200 := routed.gapWaste[0], routed.gapWaste[200]
	r300, r100 := 0.5, 0.5*math.Exp(-(w200-w0)/5)
	if got, want := routed.gapWaste[300], (c/(1+c))*300+(1/(1+c))*(r300*w0+r100*w200)/(r300+r100); math.Abs(got-want) > 1e-9 {
		t.Errorf("routed: W(300) = %v, want %v", got, want)
	}
	for g := 1; g < MilliPerGPU; g++ {
		if v := routed.gapWaste[g]; v < 0 || v > float64(g) || v > uniform.gapWaste[g]+1e-9 {
			t.Fatalf("routed W(%d) = %v, want within [0, %d] and at most the uniform %v", g, v, g, uniform.gapWaste[g])
		}
	}
	// Fillers far worse than the best must not underflow to a NaN.
	cfg.GapRouting = 1e-9
	tiny := tessera(t, w, WithTesseraConfig(cfg)).(*tesseraPolicy)
	for g := 1; g < MilliPerGPU; g++ {
		if v := tiny.gapWaste[g]; math.IsNaN(v) || v < 0 || v > float64(g) {
			t.Fatalf("GapRouting 1e-9: W(%d) = %v", g, v)
		}
	}
}

// openCostCase is a workload of 250m and 500m slices and whole GPUs, a
// 250m slice, and three nodes of one GPU: 250m free (the slice closes
// it), 750m free (it shrinks the gap) and free.
func openCostCase() (w Workload, r Request, closing, shrinking, free *Node) {
	w = Workload{Shapes: []Shape{
		{Request: sliceReq(1000, 250), Freq: 0.2},
		{Request: sliceReq(1000, 500), Freq: 0.2},
		{Request: wholeReq(1000, 1), Freq: 0.6},
	}}
	return w, sliceReq(1000, 250), makeNode().Name("closing").Free(250).Obj(),
		makeNode().Name("shrinking").Free(750).Obj(), makeNode().Name("free").Free(1000).Obj()
}

func TestTesseraOpenCost(t *testing.T) {
	// Every gap is likely closed, so the recursion's gap waste alone
	// prefers shrinking a 750m gap to 500m over closing a 250m gap. The
	// cost per partly used GPU makes closing the GPU win, and keeps a free
	// GPU last.
	w, r, closing, shrinking, free := openCostCase()
	cfg := recursionConfig()
	cfg.FragWeight = 0 // the exact difference below is of the gap terms alone
	p := tessera(t, w, WithTesseraConfig(cfg))
	ec, es, ef := p.Evaluate(closing, r), p.Evaluate(shrinking, r), p.Evaluate(free, r)
	if !(ec.Score > es.Score && es.Score > ef.Score) {
		t.Errorf("scores closing %v, shrinking %v, free %v; want decreasing", ec.Score, es.Score, ef.Score)
	}
	tp := p.(*tesseraPolicy)
	if d, want := ec.Score-es.Score, cfg.GapWeight*(cfg.OpenCost+tp.gapWaste[250]-(tp.gapWaste[750]-tp.gapWaste[500])); math.Abs(d-want) > 1e-9 {
		t.Errorf("closing - shrinking = %v, want %v", d, want)
	}
	cfg.OpenCost = 0
	p = tessera(t, w, WithTesseraConfig(cfg))
	if ec, es := p.Evaluate(closing, r), p.Evaluate(shrinking, r); !(es.Score > ec.Score) {
		t.Errorf("without the open cost: closing %v, shrinking %v; the test no longer shows what the cost adds", ec.Score, es.Score)
	}
}

// TestTesseraSharedSkipsSameStateGPUs checks that evaluating a slice only
// on the first of GPUs in the same state loses nothing: on random nodes
// the score is, within rounding, the best over every fitting GPU, and the
// GPU chosen is the first one that reaches it.
func TestTesseraSharedSkipsSameStateGPUs(t *testing.T) {
	w := Workload{Shapes: []Shape{
		{Request: sliceReq(2000, 250), Freq: 0.3},
		{Request: sliceReq(4000, 500), Freq: 0.3},
		{Request: wholeReq(8000, 1), Freq: 0.2},
		{Request: wholeReq(64000, 8), Freq: 0.2},
	}}
	p := tessera(t, w).(*tesseraPolicy)
	rng := rand.New(rand.NewSource(3))
	levels := []int64{0, 250, 500, 750, 1000}
	for round := range 200 {
		b := makeNode().CPU(96000, int64(8000+rng.Intn(88000)))
		free := make([]int64, 1+rng.Intn(8))
		for i := range free {
			free[i] = levels[rng.Intn(len(levels))]
		}
		n := b.Free(free...).Obj()
		r := sliceReq(int64(1000+rng.Intn(4000)), levels[1+rng.Intn(3)])
		got := p.Evaluate(n, r)
		// Brute force: every fitting GPU, no skipping.
		best, first := math.Inf(-1), -1
		scores := make([]float64, len(n.GPUs))
		for i := range n.GPUs {
			scores[i] = math.Inf(-1)
			if !sliceFits(&n.GPUs[i], r) {
				continue
			}
			gpus := append([]GPU(nil), n.GPUs...)
			gpus[i].MilliFree -= r.GPUMilli
			gpus[i].MemFreeMiB -= r.GPUMemMiB
			scores[i] = p.cost(n.Model, n.CPUMilliFree, n.GPUs) - p.cost(n.Model, n.CPUMilliFree-r.CPUMilli, gpus) - p.cfg.ModelWeight*p.pressure[n.Model]*float64(r.TotalGPUMilli())
			best = math.Max(best, scores[i])
		}
		for i, s := range scores {
			if first < 0 && s > best-1e-6 {
				first = i
			}
		}
		if first < 0 {
			if !math.IsInf(got.Score, -1) {
				t.Fatalf("round %d: free %v: no GPU fits, got %+v", round, free, got)
			}
			continue
		}
		if math.Abs(got.Score-best) > 1e-6 || !got.GPUs.Has(first) {
			t.Fatalf("round %d: free %v, slice %d: got score %v on %v, want %v on GPU %d (scores %v)", round, free, r.GPUMilli, got.Score, got.GPUs, best, first, scores)
		}
	}
}

func TestTesseraScarcityAndFreeWaste(t *testing.T) {
	// 810m slices are ten times as frequent as the 160m slices that are
	// the only ones to fit their 190m gaps; 470m slices pair up.
	mix := func(f810, f160, f470, fWhole float64) Workload {
		return Workload{Shapes: []Shape{
			{Request: sliceReq(1000, 810), Freq: f810}, {Request: sliceReq(1000, 160), Freq: f160},
			{Request: sliceReq(1000, 470), Freq: f470}, {Request: wholeReq(1000, 1), Freq: fWhole},
		}}
	}
	on := recursionConfig()
	off := recursionConfig()
	off.Scarcity, off.FreeWaste = 0, 0
	for _, c := range []struct {
		name string
		w    Workload
		// wantW190Above: with Scarcity, W(190) must exceed this share of
		// 190 (the gaps outnumber their fillers ten to one).
		wantW190Above float64
		// wantW530Below: 470m slices fill 530m gaps (how surely depends
		// on how common they are).
		wantW530Below float64
	}{
		{"whole-heavy", mix(0.1, 0.01, 0.1, 0.79), 0.85, 150},
		{"slice-heavy", mix(0.4, 0.04, 0.4, 0.16), 0.85, 150},
		{"few-470", mix(0.5, 0.05, 0.01, 0.44), 0.85, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := tessera(t, c.w, WithTesseraConfig(on)).(*tesseraPolicy)
			old := tessera(t, c.w, WithTesseraConfig(off)).(*tesseraPolicy)
			if w := p.gapWaste[190]; w < c.wantW190Above*190 || w > 190 {
				t.Errorf("W(190) = %v with scarcity, want in [%v, 190]", w, c.wantW190Above*190)
			}
			if !(old.gapWaste[190] < p.gapWaste[190]) {
				t.Errorf("W(190) without scarcity %v, with %v: scarcity should raise it", old.gapWaste[190], p.gapWaste[190])
			}
			// By default the other gaps change only through the gaps their
			// fillers leave: W(180) not at all, W(350) (a 160m slice
			// leaves 190m) goes up. With ClaimFillers: only 160m slices fit
			// a 350m gap, and the 190m gaps claim them all, so it is never
			// filled; 470m slices are not claimed, and they fill 530m gaps.
			if p.gapWaste[180] != old.gapWaste[180] || !(p.gapWaste[350] > old.gapWaste[350]) {
				t.Errorf("W(180), W(350) = %v, %v; without scarcity %v, %v: want equal and higher", p.gapWaste[180], p.gapWaste[350], old.gapWaste[180], old.gapWaste[350])
			}
			claimCfg := recursionConfig()
			claimCfg.ClaimFillers = 1
			pc := tessera(t, c.w, WithTesseraConfig(claimCfg)).(*tesseraPolicy)
			if pc.gapWaste[350] != 350 || !(old.gapWaste[350] < 350) {
				t.Errorf("W(350) = %v with claims, %v without; want 350 and below 350", pc.gapWaste[350], old.gapWaste[350])
			}
			if !(pc.gapWaste[530] < c.wantW530Below) {
				t.Errorf("W(530) = %v with claims, want below %v (470m slices fill it)", pc.gapWaste[530], c.wantW530Below)
			}
			if pc.gapWaste[190] != p.gapWaste[190] {
				t.Errorf("W(190) = %v with claims, %v without: the big slices' own gaps should not change", pc.gapWaste[190], p.gapWaste[190])
			}
			if old.gapWaste[MilliPerGPU] != 0 {
				t.Errorf("without FreeWaste a free GPU costs %v, want 0", old.gapWaste[MilliPerGPU])
			}
			free := p.gapWaste[MilliPerGPU]
			if !(free > 0) {
				t.Errorf("free GPU waste %v, want > 0 (810m slices take free GPUs)", free)
			}
			// Taking a free GPU for a slice never lowers the cost.
			for _, s := range []int{810, 470, 160} {
				if d := p.gapWaste[MilliPerGPU-s] + p.cfg.OpenCost - free; d < 0 {
					t.Errorf("a %dm slice on a free GPU changes the gap cost by %v, want >= 0", s, d)
				}
			}
			// A 160m slice closes an 810m slice's gap rather than a 470m
			// one's, and rather than take a free GPU.
			n := makeNode().Free(190, 530, 1000).Obj()
			if ev := p.Evaluate(n, sliceReq(1000, 160)); ev.GPUs != set(0) {
				t.Errorf("160m slice went to %v, want GPU 0 (the 190m gap)", ev.GPUs)
			}
		})
	}
}

func TestTesseraFragmentedMatchesAmount(t *testing.T) {
	withModel := benchWorkload()
	withModel.Shapes[3].Request = withModels(withModel.Shapes[3].Request, "T4")
	for _, c := range []struct {
		name string
		w    Workload
	}{
		{"15-shapes", benchWorkload()},
		{"90-shapes", benchWorkloadWide()},
		{"model-constrained", withModel},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultTesseraConfig()
			cfg.Remainder = 0
			fgd := tessera(t, c.w, WithTesseraConfig(cfg)).(*tesseraPolicy)
			p := tessera(t, c.w).(*tesseraPolicy)
			rng := rand.New(rand.NewSource(7))
			for _, n := range benchCluster()[:400] {
				for i := range n.GPUs {
					n.GPUs[i].MilliFree = []int64{0, 1000, int64(rng.Intn(100)) * 10}[rng.Intn(3)]
				}
				cpu := int64(rng.Intn(int(n.CPUMilliCapacity) + 1))
				for _, model := range []string{n.Model, "T4"} {
					want := fgd.model.amount(model, cpu, n.GPUs).Fragmented()
					if got := fgd.fragmented(model, cpu, n.GPUs); got != want {
						t.Fatalf("node %s model %s cpu %d GPUs %+v: fragmented %v, amount %v", n.Name, model, cpu, n.GPUs, got, want)
					}
					// With Remainder: plus, for each whole-GPU shape of
					// several GPUs that fits, the free GPUs beyond its last
					// instance.
					free := 0
					for _, g := range n.GPUs {
						if g.FullyFree() {
							free++
						}
					}
					for _, sh := range fgd.model.shapes {
						if sh.whole && sh.count > 1 && free >= sh.count && cpu >= sh.cpu && sh.allows(model) {
							want += sh.freq * float64(free%sh.count*MilliPerGPU)
						}
					}
					if got := p.fragmented(model, cpu, n.GPUs); math.Abs(got-want) > 1e-6*math.Max(1, want) {
						t.Fatalf("node %s model %s cpu %d GPUs %+v: with Remainder fragmented %v, want %v", n.Name, model, cpu, n.GPUs, got, want)
					}
				}
			}
		})
	}
}

// TestShapeAllowsModelByWord: a shape's models match GPU names as
// api.ModelAllowed says, in FGD's measure as in the fit.
func TestShapeAllowsModelByWord(t *testing.T) {
	m := compileWorkload(Workload{Shapes: []Shape{{Request: withModels(wholeReq(1000, 1), "A100"), Freq: 1}}})
	s := &m.shapes[0]
	for model, want := range map[string]bool{"A100": true, "NVIDIA A100-SXM4-40GB": true, "NVIDIA A10": false, "NVIDIA H100 80GB HBM3": false} {
		if got := s.allows(model); got != want {
			t.Errorf("allows(%q) = %v, want %v", model, got, want)
		}
	}
}

// TestTesseraRemainderKeepsNodesFull: a workload of 1-, 2- and 4-GPU pods
// and no 8-GPU pod (as the extender learns it from the pods it saw). A
// 1-GPU pod on a node with 4 free GPUs leaves room for as many 4- and
// 2-GPU pods as on an empty node, so it goes to the used node; FGD's
// measure alone (does one 4-GPU pod still fit?) sent it to the empty one.
func TestTesseraRemainderKeepsNodesFull(t *testing.T) {
	w := Workload{Shapes: []Shape{
		{Request: wholeReq(8000, 1), Freq: 0.2},
		{Request: wholeReq(16000, 2), Freq: 0.6},
		{Request: wholeReq(32000, 4), Freq: 0.2},
	}}
	half := makeNode().Name("half").CPU(256000, 256000).Free(0, 0, 0, 0, 1000, 1000, 1000, 1000).Obj()
	empty := makeNode().Name("empty").CPU(256000, 256000).GPUs(8).Obj()
	for _, tc := range []struct {
		remainder float64
		want      string
	}{{1, "half"}, {0, "empty"}} {
		cfg := DefaultTesseraConfig()
		cfg.Remainder = tc.remainder
		p := tessera(t, w, WithTesseraConfig(cfg))
		h, e := p.Evaluate(half, wholeReq(8000, 1)).Score, p.Evaluate(empty, wholeReq(8000, 1)).Score
		got := "half"
		if e > h {
			got = "empty"
		}
		if got != tc.want {
			t.Errorf("Remainder %v: a 1-GPU pod scores %v on the half-used node, %v on the empty one; want it on the %s node", tc.remainder, h, e, tc.want)
		}
	}
}
