package sim

import (
	"math"
	"strconv"
)

// MaxArrivedPct is the last arrived-workload percentage reported (1.3x).
const MaxArrivedPct = 130

// Point is the cluster at one arrived-workload percentage.
type Point struct {
	// ArrivedPct is the GPU request of the arrived pods as a percentage of
	// the cluster's GPU capacity (0..130).
	ArrivedPct int
	// AllocPct is the GPU allocation ratio (%); UnallocatedPct = 100 - AllocPct.
	AllocPct       float64
	UnallocatedPct float64
	// FragPct is the fragmented GPU compute as a percentage of capacity.
	FragPct float64
}

// BinEvents turns per-pod events into one point per arrived percentage the
// way the artifact's analysis scripts (merge_alloc_discrete.py,
// merge_frag_discrete.py) do: each event's arrived ratio is rounded to a
// whole percent (half to even), its allocation ratio to 2 decimals; a
// percentage's value is the mean over its events, or over the events within
// ±1 point when it has none, rounded to 2 decimals. Percentages with no
// event in reach are left out.
func BinEvents(events []Event, totalGPUs int) []Point {
	if totalGPUs <= 0 {
		return nil
	}
	type bin struct{ alloc, frag []float64 }
	bins := make([]bin, MaxArrivedPct+2)
	tot := float64(totalGPUs)
	for _, e := range events {
		ar := math.RoundToEven(float64(e.ArrivedMilli) / tot / 10)
		if ar < 0 || ar > MaxArrivedPct+1 {
			continue
		}
		b := &bins[int(ar)]
		b.alloc = append(b.alloc, round2(float64(e.UsedMilli)/tot/10))
		// The artifact logs the fragmentation amount with 2 decimals.
		b.frag = append(b.frag, round2(e.FragMilli))
	}
	var out []Point
	for pct := 0; pct <= MaxArrivedPct; pct++ {
		a := bins[pct]
		if len(a.alloc) == 0 {
			a = bin{}
			for q := pct - 1; q <= pct+1; q++ {
				if q >= 0 && q < len(bins) {
					a.alloc = append(a.alloc, bins[q].alloc...)
					a.frag = append(a.frag, bins[q].frag...)
				}
			}
		}
		if len(a.alloc) == 0 {
			continue
		}
		n := float64(len(a.alloc))
		alloc := round2(pairwiseSum(a.alloc) / n)
		out = append(out, Point{
			ArrivedPct:     pct,
			AllocPct:       alloc,
			UnallocatedPct: round2(100 - alloc),
			FragPct:        round2(100 * (pairwiseSum(a.frag) / n) / 1000 / tot),
		})
	}
	return out
}

// pairwiseSum adds xs the way numpy (and so pandas' mean) does: blocks of
// up to 128 values are summed with 8 interleaved accumulators, larger
// inputs are split in halves. Matching it keeps the 2-decimal rounding of
// the means identical to the artifact's.
func pairwiseSum(xs []float64) float64 {
	n := len(xs)
	switch {
	case n < 8:
		var s float64
		for _, x := range xs {
			s += x
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], xs[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for j := 0; j < 8; j++ {
				r[j] += xs[i+j]
			}
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += xs[i]
		}
		return s
	}
	n2 := n / 2
	n2 -= n2 % 8
	return pairwiseSum(xs[:n2]) + pairwiseSum(xs[n2:])
}

// round2 rounds to 2 decimals like Python's round(x, 2): correctly rounded
// from the exact binary value, ties to even.
func round2(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	return v
}

// At returns the point at pct, if present.
func At(curve []Point, pct int) (Point, bool) {
	for _, p := range curve {
		if p.ArrivedPct == pct {
			return p, true
		}
	}
	return Point{}, false
}

// Stats is a mean and sample standard deviation.
type Stats struct {
	Mean, SD float64
	N        int
}

// MeanSD returns the mean and sample standard deviation of xs.
func MeanSD(xs []float64) Stats {
	s := Stats{N: len(xs)}
	if s.N == 0 {
		return s
	}
	for _, x := range xs {
		s.Mean += x
	}
	s.Mean /= float64(s.N)
	if s.N > 1 {
		var ss float64
		for _, x := range xs {
			ss += (x - s.Mean) * (x - s.Mean)
		}
		s.SD = math.Sqrt(ss / float64(s.N-1))
	}
	return s
}
