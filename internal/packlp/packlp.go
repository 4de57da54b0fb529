// Package packlp solves the linear relaxation of packing GPU slices and
// whole GPUs onto GPUs: the cutting-stock linear program, with the choice
// to leave pods out. Its dual prices say what each slice size is worth
// when the GPUs are scarce, and from them what a GPU left with a gap of g
// milli can still be filled with: the simulator bounds what any placement
// can reach with it (sim/bound), and the tessera policy values gaps by it
// (allocator).
//
// The program: maximise the milli of whole GPUs used plus, over the ways
// of filling one GPU with slices (patterns), each pattern's milli times the
// number of GPUs that take it; at most Bins GPUs in all, at most Whole of
// them whole, and no more slices of a size than Counts says. Its dual has
// a price U per GPU, a price per slice size and one per whole GPU:
// minimise Bins*U + Counts·prices + Whole*(whole price), such that every
// pattern's milli is at most U plus its slices' prices, and 1000 at most U
// plus the whole price. It is solved by constraint generation: a knapsack
// over one GPU finds the pattern the current prices undervalue most, until
// none is left.
package packlp

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// Problem is a packing to relax.
type Problem struct {
	// Bins is the number of GPUs.
	Bins float64
	// Whole is the number of GPUs whole-GPU pods ask for.
	Whole float64
	// Sizes are the slice sizes (milli), ascending, each in (0, Capacity);
	// Counts[i] slices are of size Sizes[i].
	Sizes  []int64
	Counts []float64
	// Capacity is one GPU's milli (1000).
	Capacity int64
	// PodCounts says that Counts are pods, so that one GPU holds at most
	// Counts[i] (rounded up) slices of size i. Without it Counts are
	// proportions (the prices do not depend on their scale) and only
	// Capacity limits what one GPU holds.
	PodCounts bool
}

// WithCounts returns p with Sizes and Counts taken from count (slices by
// size), sizes ascending.
func (p Problem) WithCounts(count map[int64]float64) Problem {
	p.Sizes, p.Counts = make([]int64, 0, len(count)), make([]float64, 0, len(count))
	for size := range count {
		p.Sizes = append(p.Sizes, size)
	}
	slices.Sort(p.Sizes)
	for _, size := range p.Sizes {
		p.Counts = append(p.Counts, count[size])
	}
	return p
}

// Solution is the dual of a Problem.
type Solution struct {
	// U is the price of a GPU: the most milli above its slices' prices
	// that one GPU can be filled with (checked by an exact knapsack).
	U float64
	// Prices are the slice sizes' prices (not negative), as Sizes.
	Prices []float64
	// Bound is the dual objective: an upper bound on the milli any packing
	// of the problem's slices and whole GPUs holds, never above what they
	// ask nor what the GPUs hold.
	Bound float64
	// Patterns is how many patterns were priced.
	Patterns int
}

// maxRounds bounds the constraint generation; the certificate keeps the
// bound valid if it stops early.
const maxRounds = 2000

// Solve returns the dual prices of p. The prices are made feasible for
// every pattern after the solver (U is raised to the knapsack's best), so
// Bound is valid whatever the solver's rounding.
func Solve(p Problem) (Solution, error) {
	if err := p.validate(); err != nil {
		return Solution{}, err
	}
	if p.Bins == 0 {
		return Solution{Prices: make([]float64, len(p.Sizes))}, nil
	}
	if len(p.Sizes) == 0 {
		return Solution{U: float64(p.Capacity), Bound: min(p.Whole, p.Bins) * float64(p.Capacity)}, nil
	}
	d := dual{p: p}
	for i := range p.Sizes {
		pat := make([]int64, len(p.Sizes))
		pat[i] = 1
		d.patterns = append(d.patterns, pat)
	}
	var price []float64
	for range maxRounds {
		next, err := d.solve()
		if err != nil {
			if price == nil {
				return Solution{}, err
			}
			break // the last prices give a valid, if looser, bound
		}
		price = next
		best, value := d.p.knapsack(price[1:1+len(p.Sizes)], nil)
		if value <= price[0]+1e-6 {
			break
		}
		if slices.ContainsFunc(d.patterns, func(q []int64) bool { return slices.Equal(q, best) }) {
			break // the solver's rounding; the certificate stays valid
		}
		d.patterns = append(d.patterns, best)
	}
	return p.certify(price[0], price[1:1+len(p.Sizes)], len(d.patterns)), nil
}

// Values returns, for every gap g from 0 to Capacity, the most milli
// above the prices that a gap of g can be filled with: Values()[Capacity]
// is at most U, and equal once the generation has converged.
func (s Solution) Values(p Problem) []float64 {
	values := make([]float64, p.Capacity+1)
	p.knapsack(s.Prices, values)
	for g := 1; g < len(values); g++ {
		values[g] = max(values[g], values[g-1])
	}
	return values
}

func (p Problem) validate() error {
	switch {
	case p.Capacity <= 0:
		return fmt.Errorf("packlp: capacity %d", p.Capacity)
	case !(p.Bins >= 0) || !(p.Whole >= 0) || math.IsInf(p.Bins, 0) || math.IsInf(p.Whole, 0):
		return fmt.Errorf("packlp: %v GPUs, %v whole", p.Bins, p.Whole)
	case len(p.Counts) != len(p.Sizes):
		return fmt.Errorf("packlp: %d sizes, %d counts", len(p.Sizes), len(p.Counts))
	}
	for i, s := range p.Sizes {
		if s <= 0 || s >= p.Capacity || i > 0 && s <= p.Sizes[i-1] {
			return errors.New("packlp: sizes must ascend within (0, capacity)")
		}
		if !(p.Counts[i] >= 0) || math.IsInf(p.Counts[i], 0) {
			return fmt.Errorf("packlp: %v slices of %d", p.Counts[i], s)
		}
	}
	return nil
}

// knapsack returns the pattern of one GPU with the most milli above the
// prices (with PodCounts, at most Counts[i] slices of size i) and its
// value; into all,
// when not nil (Capacity+1 long), the best value of every capacity.
func (p Problem) knapsack(price []float64, all []float64) ([]int64, float64) {
	c := p.Capacity
	best := make([]float64, c+1)
	// take[i][w]: copies of size i in the best filling of w using sizes
	// 0..i.
	take := make([][]int32, len(p.Sizes))
	for i, sz := range p.Sizes {
		gain := float64(sz) - max(price[i], 0)
		limit := c / sz
		if p.PodCounts {
			limit = min(int64(math.Ceil(p.Counts[i])), limit)
		}
		take[i] = make([]int32, c+1)
		if gain <= 0 || limit <= 0 {
			continue
		}
		next := slices.Clone(best)
		for w := int64(0); w <= c; w++ {
			for k := int64(1); k <= limit && k*sz <= w; k++ {
				if v := best[w-k*sz] + float64(k)*gain; v > next[w] {
					next[w] = v
					take[i][w] = int32(k)
				}
			}
		}
		best = next
	}
	if all != nil {
		copy(all, best)
	}
	pat := make([]int64, len(p.Sizes))
	w := c
	for i := len(p.Sizes) - 1; i >= 0; i-- {
		k := int64(take[i][w])
		pat[i] = k
		w -= k * p.Sizes[i]
	}
	return pat, best[c]
}

// certify makes the prices feasible for every pattern (U at least the
// knapsack's best, the whole price covering the rest of Capacity) and
// returns them with their objective.
func (p Problem) certify(u float64, price []float64, patterns int) Solution {
	sp := make([]float64, len(price))
	for i, x := range price {
		sp[i] = max(x, 0)
	}
	_, k := p.knapsack(sp, nil)
	u = max(u, k, 0)
	capacity := float64(p.Capacity)
	bound := p.Bins*u + p.Whole*max(capacity-u, 0)
	asked := p.Whole * capacity
	for i, n := range p.Counts {
		bound += n * sp[i]
		asked += n * float64(p.Sizes[i])
	}
	return Solution{U: u, Prices: sp, Bound: min(bound, asked, p.Bins*capacity), Patterns: patterns}
}

// dual is the dual program restricted to the patterns found so far.
type dual struct {
	p        Problem
	patterns [][]int64
}

// solve returns the prices: U, one per size, the whole price. A panic of
// the solver (it panics on inputs it finds inconsistent) is returned as an
// error: the caller keeps its last prices.
func (d *dual) solve() (prices []float64, err error) {
	defer func() {
		if r := recover(); r != nil {
			prices, err = nil, fmt.Errorf("packlp: simplex: %v", r)
		}
	}()
	s, n := len(d.p.Sizes), len(d.patterns)
	vars := 1 + s + 1 + n + 1 // U, prices, whole price, surpluses
	rows := n + 1
	a := mat.NewDense(rows, vars, nil)
	b := make([]float64, rows)
	c := make([]float64, vars)
	c[0] = d.p.Bins
	copy(c[1:], d.p.Counts)
	c[1+s] = d.p.Whole
	for r, pat := range d.patterns {
		a.Set(r, 0, 1)
		var v float64
		for i, k := range pat {
			if k > 0 {
				a.Set(r, 1+i, float64(k))
				v += float64(k * d.p.Sizes[i])
			}
		}
		a.Set(r, 1+s+1+r, -1)
		// Lowering each right-hand side a little keeps the simplex off
		// degenerate vertices, where it stalled, and the start below
		// feasible; the certificate corrects what it changes.
		b[r] = v - 1e-7*float64(r+1)
	}
	a.Set(n, 0, 1)
	a.Set(n, 1+s, 1)
	a.Set(n, vars-1, -1)
	b[n] = float64(d.p.Capacity)
	// Start at U = Capacity with no prices: no pattern holds more, so the
	// surpluses are not negative. Basic: U and every pattern's surplus.
	basic := make([]int, 0, rows)
	basic = append(basic, 0)
	for r := range n {
		basic = append(basic, 1+s+1+r)
	}
	_, x, err := lp.Simplex(c, a, b, 1e-9, basic)
	if err != nil {
		return nil, fmt.Errorf("packlp: %w", err)
	}
	return x[:1+s+1], nil
}
