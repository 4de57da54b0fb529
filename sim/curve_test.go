package sim

import (
	"math"
	"math/big"
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBinEvents(t *testing.T) {
	// One GPU: 10 milli arrived is 1%.
	events := []Event{
		{ArrivedMilli: 10, UsedMilli: 10, FragMilli: 100},
		{ArrivedMilli: 20, UsedMilli: 20},
		{ArrivedMilli: 25, UsedMilli: 20}, // 2.5% rounds half to even: 2%
		{ArrivedMilli: 40, UsedMilli: 30},
	}
	got := BinEvents(events, 1)
	want := []Point{
		{ArrivedPct: 0, AllocPct: 1, UnallocatedPct: 99, FragPct: 10}, // no event at 0%: uses 1% (within ±1)
		{ArrivedPct: 1, AllocPct: 1, UnallocatedPct: 99, FragPct: 10},
		{ArrivedPct: 2, AllocPct: 2, UnallocatedPct: 98},
		{ArrivedPct: 3, AllocPct: 2.33, UnallocatedPct: 97.67}, // events at 2% and 4%: (2+2+3)/3
		{ArrivedPct: 4, AllocPct: 3, UnallocatedPct: 97},
		{ArrivedPct: 5, AllocPct: 3, UnallocatedPct: 97},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if BinEvents(events, 0) != nil {
		t.Errorf("BinEvents with no GPUs should return nil")
	}
}

func TestRound2(t *testing.T) {
	// Python's round(x, 2) values, including binary ties and near-ties.
	for in, want := range map[float64]float64{0.125: 0.12, 0.375: 0.38, 2.675: 2.67, 1.005: 1, 95.125: 95.12, -1.555: -1.55, 91.035: 91.03} {
		if got := round2(in); got != want {
			t.Errorf("round2(%v) = %v, want %v", in, got, want)
		}
	}
}

func TestPairwiseSum(t *testing.T) {
	xs := []float64{1e16, 1, 1, 1, 1, 1, 1, 1, 1}
	// numpy: the 8 accumulators start with the first 8 values, are summed
	// as a tree, then the 9th value is added.
	want := ((1e16 + 1) + (1 + 1)) + ((1 + 1) + (1 + 1)) + 1
	if got := pairwiseSum(xs); got != want {
		t.Errorf("pairwiseSum = %v, want %v", got, want)
	}
	rng := rand.New(rand.NewSource(3))
	for _, n := range []int{0, 3, 8, 100, 128, 129, 1000} {
		v := make([]float64, n)
		exact := new(big.Float).SetPrec(200)
		for i := range v {
			v[i] = rng.Float64() * 100
			exact.Add(exact, new(big.Float).SetFloat64(v[i]))
		}
		e, _ := exact.Float64()
		if got := pairwiseSum(v); math.Abs(got-e) > 1e-9*math.Max(1, e) {
			t.Errorf("n=%d: pairwiseSum = %v, exact %v", n, got, e)
		}
	}
}

func TestMeanSD(t *testing.T) {
	s := MeanSD([]float64{2, 4, 4, 4, 5, 5, 7, 9})
	if s.N != 8 || s.Mean != 5 || math.Abs(s.SD-2.138089935299395) > 1e-12 {
		t.Errorf("MeanSD = %+v", s)
	}
	if s := MeanSD(nil); s.N != 0 || s.Mean != 0 {
		t.Errorf("MeanSD(nil) = %+v", s)
	}
	if s := MeanSD([]float64{3}); s.Mean != 3 || s.SD != 0 {
		t.Errorf("MeanSD of one value = %+v", s)
	}
}
