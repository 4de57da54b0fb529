package allocator

import (
	"math"
	"testing"
)

func TestPricedGaps(t *testing.T) {
	mix := func(f810, f160, f470, fWhole float64) Workload {
		return Workload{Shapes: []Shape{
			{Request: sliceReq(1000, 810), Freq: f810}, {Request: sliceReq(1000, 160), Freq: f160},
			{Request: sliceReq(1000, 470), Freq: f470}, {Request: wholeReq(1000, 1), Freq: fWhole},
		}}
	}
	const tol = 1e-3
	for _, c := range []struct {
		name string
		w    Workload
		// want: gap waste at chosen gaps, within tol.
		want map[int]float64
	}{
		// 500m slices pair up and whole GPUs fill the rest: no gap is
		// wasted, a free GPU neither.
		{"pairs", Workload{Shapes: []Shape{{Request: sliceReq(1000, 500), Freq: 0.5}, {Request: wholeReq(1000, 1), Freq: 0.5}}},
			map[int]float64{0: 0, 500: 0, 1000: 0}},
		// Nothing fits 400m or less: such a gap is lost whole.
		{"600s", Workload{Shapes: []Shape{{Request: sliceReq(1000, 600), Freq: 0.5}, {Request: wholeReq(1000, 1), Freq: 0.5}}},
			map[int]float64{100: 100, 400: 400, 599: 599}},
		// Ten 810m slices for each 160m one: the 160m slices are all
		// spent on 810m slices' gaps, so a 190m gap keeps at best 30m
		// plus the 160m slice's worth, its whole size: 190 in all.
		{"scarce fillers", mix(0.4, 0.04, 0.4, 0.16), map[int]float64{190: 190, 30: 30}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := tessera(t, c.w).(*tesseraPolicy)
			for g := 0; g <= MilliPerGPU; g++ {
				if w := p.gapWaste[g]; w < -tol || w > float64(g)+tol {
					t.Fatalf("W(%d) = %v, want within [0, %d]", g, w, g)
				}
			}
			for g, want := range c.want {
				if got := p.gapWaste[g]; math.Abs(got-want) > tol {
					t.Errorf("W(%d) = %v, want %v", g, got, want)
				}
			}
		})
	}
	// A 160m slice closes an 810m slice's gap rather than a 470m one's,
	// and rather than take a free GPU.
	p := tessera(t, mix(0.4, 0.04, 0.4, 0.16))
	n := makeNode().Free(190, 530, 1000).Obj()
	if ev := p.Evaluate(n, sliceReq(1000, 160)); ev.GPUs != set(0) {
		t.Errorf("160m slice went to %v, want GPU 0 (the 190m gap)", ev.GPUs)
	}
	// A 470m slice pairs with another rather than open a GPU.
	n = makeNode().Free(530, 1000).Obj()
	if ev := p.Evaluate(n, sliceReq(1000, 470)); ev.GPUs != set(0) {
		t.Errorf("470m slice went to %v, want GPU 0 (the 530m gap)", ev.GPUs)
	}
}

// Without slices there is nothing to price: the recursion's table stays.
func TestPricedGapsFallBack(t *testing.T) {
	w := Workload{Shapes: []Shape{{Request: wholeReq(8000, 1), Freq: 0.5}, {Request: wholeReq(64000, 8), Freq: 0.5}}}
	priced := tessera(t, w).(*tesseraPolicy)
	recursion := tessera(t, w, WithTesseraConfig(recursionConfig())).(*tesseraPolicy)
	if priced.gapWaste != recursion.gapWaste {
		t.Error("a workload without slices: the priced table differs from the recursion's")
	}
	if _, ok := lpGapWaste(priced.model); ok {
		t.Error("lpGapWaste priced a workload without slices")
	}
}

// With slices that pack exactly, the priced gaps waste nothing anywhere,
// and OpenCost is what closes a GPU rather than shrink a gap or open a
// free GPU: without it the three score the same.
func TestPricedGapsOpenCost(t *testing.T) {
	w, r, closing, shrinking, free := openCostCase()
	cfg := DefaultTesseraConfig()
	cfg.FragWeight = 0
	p := tessera(t, w, WithTesseraConfig(cfg))
	ec, es, ef := p.Evaluate(closing, r), p.Evaluate(shrinking, r), p.Evaluate(free, r)
	if !(ec.Score > es.Score && es.Score > ef.Score) {
		t.Errorf("scores closing %v, shrinking %v, free %v; want decreasing", ec.Score, es.Score, ef.Score)
	}
	cfg.OpenCost = 0
	p = tessera(t, w, WithTesseraConfig(cfg))
	ec, es, ef = p.Evaluate(closing, r), p.Evaluate(shrinking, r), p.Evaluate(free, r)
	if math.Abs(ec.Score-es.Score) > 1e-3 || math.Abs(es.Score-ef.Score) > 1e-3 {
		t.Errorf("without OpenCost: closing %v, shrinking %v, free %v; want equal", ec.Score, es.Score, ef.Score)
	}
}
