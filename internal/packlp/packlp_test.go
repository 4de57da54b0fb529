package packlp

import (
	"math"
	"slices"
	"testing"
)

func TestSolve(t *testing.T) {
	for _, c := range []struct {
		name string
		p    Problem
		want float64 // Bound
	}{
		{"no GPUs", Problem{Sizes: []int64{500}, Counts: []float64{2}}, 0},
		{"whole only", Problem{Bins: 8, Whole: 6}, 6000},
		{"whole beyond the GPUs", Problem{Bins: 8, Whole: 12}, 8000},
		{"600s: one per GPU", Problem{Bins: 2, Sizes: []int64{600}, Counts: []float64{3}, PodCounts: true}, 1200},
		{"400s: two per GPU", Problem{Bins: 2, Sizes: []int64{400}, Counts: []float64{5}, PodCounts: true}, 1600},
		{"810s and two 190s", Problem{Bins: 10, Sizes: []int64{190, 810}, Counts: []float64{2, 10}, PodCounts: true}, 10*810 + 2*190},
		{"a GPU whole rather than a lone 810", Problem{Bins: 3, Whole: 2, Sizes: []int64{810}, Counts: []float64{2}, PodCounts: true}, 2810},
		{"exact fillings", Problem{Bins: 3, Sizes: []int64{300, 400, 700}, Counts: []float64{4, 1, 2}, PodCounts: true}, 3000},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.p.Capacity = 1000
			s, err := Solve(c.p)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(s.Bound-c.want) > 1e-6 {
				t.Errorf("Bound = %v, want %v", s.Bound, c.want)
			}
		})
	}
}

// Without PodCounts the counts are proportions: the prices, U and the
// values of gaps do not depend on their scale.
func TestSolveScaleFree(t *testing.T) {
	base := Problem{Bins: 1, Whole: 0.2, Sizes: []int64{160, 320, 470, 810}, Counts: []float64{0.04, 0.1, 0.3, 0.5}, Capacity: 1000}
	a, err := Solve(base)
	if err != nil {
		t.Fatal(err)
	}
	big := base
	big.Bins, big.Whole = base.Bins*5000, base.Whole*5000
	big.Counts = nil
	for _, n := range base.Counts {
		big.Counts = append(big.Counts, n*5000)
	}
	b, err := Solve(big)
	if err != nil {
		t.Fatal(err)
	}
	va, vb := a.Values(base), b.Values(big)
	if len(va) != 1001 || math.Abs(va[1000]-a.U) > 1e-9 {
		t.Fatalf("Values: %d long, Values[1000] %v, U %v", len(va), va[1000], a.U)
	}
	for g := range va {
		if math.Abs(va[g]-vb[g]) > 1e-4 {
			t.Fatalf("value of a %d gap: %v at one scale, %v at another", g, va[g], vb[g])
		}
		if g > 0 && va[g] < va[g-1] {
			t.Fatalf("values fall from %v to %v at %d", va[g-1], va[g], g)
		}
	}
	if math.Abs(b.Bound-5000*a.Bound) > 1e-3*b.Bound {
		t.Errorf("bounds %v and %v: want the second 5000 times the first", a.Bound, b.Bound)
	}
}

func TestSolveRefuses(t *testing.T) {
	for name, p := range map[string]Problem{
		"no capacity":        {Bins: 1},
		"negative GPUs":      {Bins: -1, Capacity: 1000},
		"counts unmatched":   {Bins: 1, Capacity: 1000, Sizes: []int64{100}},
		"size too big":       {Bins: 1, Capacity: 1000, Sizes: []int64{1000}, Counts: []float64{1}},
		"sizes not sorted":   {Bins: 1, Capacity: 1000, Sizes: []int64{300, 200}, Counts: []float64{1, 1}},
		"negative count":     {Bins: 1, Capacity: 1000, Sizes: []int64{300}, Counts: []float64{-1}},
		"size not positive":  {Bins: 1, Capacity: 1000, Sizes: []int64{0}, Counts: []float64{1}},
		"GPUs not a number":  {Bins: math.NaN(), Capacity: 1000},
		"infinite whole":     {Bins: 1, Whole: math.Inf(1), Capacity: 1000},
		"count not a number": {Bins: 1, Capacity: 1000, Sizes: []int64{300}, Counts: []float64{math.NaN()}},
	} {
		if _, err := Solve(p); err == nil {
			t.Errorf("%s: solved %+v", name, p)
		}
	}
}

func TestWithCounts(t *testing.T) {
	p := Problem{Bins: 2, Capacity: 1000}.WithCounts(map[int64]float64{810: 3, 160: 1, 470: 2})
	if !slices.Equal(p.Sizes, []int64{160, 470, 810}) || !slices.Equal(p.Counts, []float64{1, 2, 3}) || p.Bins != 2 {
		t.Errorf("WithCounts: %+v", p)
	}
	if err := p.validate(); err != nil {
		t.Error(err)
	}
}
