package bound

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"

	"github.com/tessera-gpu/tessera/allocator"
)

// Packable is what packing a set of pods onto a number of GPUs can reach
// at best, relaxed to a linear program: an upper bound on the GPU milli any
// placement of any subset of them holds.
type Packable struct {
	// Milli is the bound: no placement of the pods, online or offline,
	// holds more GPU milli on the GPUs.
	Milli float64
	// Patterns is how many ways of filling one GPU with slices the
	// column generation priced before no better one was left.
	Patterns int
}

// Pack bounds the GPU milli that any placement of a subset of the
// pods (whole GPUs and single-GPU slices; CPU-only pods and slices of
// GPU memory alone add nothing, as in TotalGPUMilli) can
// hold on gpus GPUs. It relaxes the problem to GPUs alone: node
// boundaries, GPU models, CPU and memory are left out, and every GPU holds
// any set of slices whose milli add up to at most 1000, so the bound holds
// for the real problem too.
//
// The bound is the cutting-stock linear program with the choice to leave
// pods out: maximise the milli of whole GPUs used plus, over fillings of
// one GPU with slices (patterns), each filling's milli times how many GPUs
// take it, with at most gpus GPUs, at most the pods' whole GPUs, and no
// more slices of a size than there are pods of it. Its dual is solved by
// constraint generation (a knapsack over 1000 milli finds the filling the
// current prices undervalue most), and the returned value is the dual
// objective of prices checked feasible against every filling by an exact
// knapsack, so it is a valid bound whatever the solver's rounding.
func Pack(gpus int, pods []allocator.Request) (Packable, error) {
	if gpus < 0 {
		return Packable{}, fmt.Errorf("negative GPU count %d", gpus)
	}
	var whole int64
	count := map[int64]int64{}
	for _, r := range pods {
		switch r.Kind() {
		case allocator.Whole:
			whole += int64(r.GPUs)
		case allocator.Shared:
			switch {
			case r.GPUMilli >= allocator.MilliPerGPU:
				return Packable{}, fmt.Errorf("slice of %d milli: want less than %d", r.GPUMilli, allocator.MilliPerGPU)
			case r.GPUMilli > 0: // a slice of memory alone counts no milli
				count[r.GPUMilli]++
			}
		}
	}
	sizes := make([]int64, 0, len(count))
	for s := range count {
		sizes = append(sizes, s)
	}
	slices.Sort(sizes)
	d := dualLP{gpus: float64(gpus), whole: float64(whole), sizes: sizes}
	for _, s := range sizes {
		d.counts = append(d.counts, float64(count[s]))
	}
	if gpus == 0 {
		return Packable{}, nil
	}
	if len(sizes) == 0 {
		return Packable{Milli: float64(min(whole, int64(gpus)) * allocator.MilliPerGPU)}, nil
	}
	// Start with one slice per GPU, one pattern per size.
	for i := range sizes {
		p := make([]int64, len(sizes))
		p[i] = 1
		d.patterns = append(d.patterns, p)
	}
	const maxRounds = 2000
	var price []float64
	for range maxRounds {
		next, err := d.solve()
		if err != nil {
			if price == nil {
				return Packable{}, err
			}
			break // the last prices give a valid, if looser, bound
		}
		price = next
		best, value := d.knapsack(price[1 : 1+len(sizes)])
		if value <= price[0]+1e-6 {
			break
		}
		if slices.ContainsFunc(d.patterns, func(p []int64) bool { return slices.Equal(p, best) }) {
			break // the solver's rounding; the certificate below stays valid
		}
		d.patterns = append(d.patterns, best)
	}
	return Packable{Milli: d.certificate(price), Patterns: len(d.patterns)}, nil
}

// dualLP is the dual of the packing program: a price u per GPU, a price
// per slice size and a price per whole GPU; minimise gpus*u + the pods'
// counts times their prices, such that every known filling's milli is at
// most u plus its slices' prices, and a whole GPU's 1000 at most u plus its
// price.
type dualLP struct {
	gpus, whole float64
	sizes       []int64
	counts      []float64
	patterns    [][]int64
}

// solve returns the prices: u, one per size, the whole GPU's.
func (d *dualLP) solve() ([]float64, error) {
	s, p := len(d.sizes), len(d.patterns)
	vars := 1 + s + 1 + p + 1 // u, prices, whole price, surpluses
	rows := p + 1
	a := mat.NewDense(rows, vars, nil)
	b := make([]float64, rows)
	c := make([]float64, vars)
	c[0] = d.gpus
	copy(c[1:], d.counts)
	c[1+s] = d.whole
	for r, pat := range d.patterns {
		a.Set(r, 0, 1)
		var v float64
		for i, n := range pat {
			if n > 0 {
				a.Set(r, 1+i, float64(n))
				v += float64(n * d.sizes[i])
			}
		}
		a.Set(r, 1+s+1+r, -1)
		// A perturbation keeps the simplex off degenerate vertices, where
		// it stalled; lowering the right-hand side keeps the start below
		// feasible (the certificate corrects what it changes).
		b[r] = v - 1e-7*float64(r+1)
	}
	a.Set(p, 0, 1)
	a.Set(p, 1+s, 1)
	a.Set(p, vars-1, -1)
	b[p] = allocator.MilliPerGPU
	// Start at u = 1000, no prices: every filling holds at most 1000
	// milli, so the surpluses are not negative. Basic: u and every
	// filling's surplus.
	basic := make([]int, 0, rows)
	basic = append(basic, 0)
	for r := range p {
		basic = append(basic, 1+s+1+r)
	}
	_, x, err := lp.Simplex(c, a, b, 1e-9, basic)
	if err != nil {
		return nil, fmt.Errorf("pack bound: %w", err)
	}
	return x[:1+s+1], nil
}

// knapsack returns the filling of one GPU with the most milli above the
// slices' prices (at most as many slices of a size as there are pods of
// it), and that value.
func (d *dualLP) knapsack(price []float64) ([]int64, float64) {
	const capMilli = allocator.MilliPerGPU
	best := make([]float64, capMilli+1)
	// take[i][w]: copies of size i in the best filling of w milli using
	// sizes 0..i.
	take := make([][]int16, len(d.sizes))
	for i, sz := range d.sizes {
		gain := float64(sz) - max(price[i], 0)
		limit := min(int64(d.counts[i]), capMilli/sz)
		take[i] = make([]int16, capMilli+1)
		if gain <= 0 || limit == 0 {
			continue
		}
		next := slices.Clone(best)
		for w := int64(0); w <= capMilli; w++ {
			for k := int64(1); k <= limit && k*sz <= w; k++ {
				if v := best[w-k*sz] + float64(k)*gain; v > next[w] {
					next[w] = v
					take[i][w] = int16(k)
				}
			}
		}
		best = next
	}
	pat := make([]int64, len(d.sizes))
	w := int64(capMilli)
	for i := len(d.sizes) - 1; i >= 0; i-- {
		k := int64(take[i][w])
		pat[i] = k
		w -= k * d.sizes[i]
	}
	return pat, best[capMilli]
}

// certificate makes the prices feasible for every filling (u at least the
// knapsack's best, the whole GPU's price covering the rest of 1000) and
// returns their objective, an upper bound on the packable milli by weak
// duality.
func (d *dualLP) certificate(price []float64) float64 {
	sp := make([]float64, len(d.sizes))
	for i := range sp {
		sp[i] = max(price[1+i], 0)
	}
	_, u := d.knapsack(sp)
	u = max(u, price[0], 0)
	wholePrice := max(allocator.MilliPerGPU-u, 0)
	bound := d.gpus*u + d.whole*wholePrice
	for i, n := range d.counts {
		bound += n * sp[i]
	}
	// Never above what the pods ask or the GPUs hold.
	var asked float64 = d.whole * allocator.MilliPerGPU
	for i, n := range d.counts {
		asked += n * float64(d.sizes[i])
	}
	return math.Min(bound, math.Min(asked, d.gpus*allocator.MilliPerGPU))
}
