package allocator

import "github.com/tessera-gpu/tessera/internal/packlp"

// maxPricedSizes bounds the slice sizes the packing LP is solved for; a
// workload with more keeps the gap-waste recursion. The LP's cost grows
// fast with them (64 sizes of random milli: 0.16 s, 128: 2.7 s, on the
// 2-core dev machine), and the extender rebuilds its learned policy every
// 50 pods; the extender learns at most 64 shapes, and the Alibaba pod
// lists have 19 or 20 slice sizes.
const maxPricedSizes = 64

// lpGapWaste is the gap waste of TesseraConfig.PricedGaps: the workload's
// pods, scaled so that they ask exactly what the GPUs hold (the point at
// which waste is counted), are packed by the cutting-stock LP (packlp),
// whose dual prices each slice size by what it is worth when GPUs are
// scarce. A GPU left with g milli free then wastes g minus the most milli
// above the prices it can still be filled with: what it leaves empty plus
// what its fillers would have been worth elsewhere. A slice small enough
// to close the gaps big slices leave is priced near its size when such
// fillers are few, so spending it where a bigger one fits costs; a free
// GPU wastes 1000 minus the best filling's value. The prices do not depend
// on the scale, so the workload's frequencies serve as counts. ok is false
// when the workload has no slices, too many slice sizes, or the LP fails.
func lpGapWaste(m fragModel) (w [MilliPerGPU + 1]float64, ok bool) {
	count := map[int64]float64{}
	var whole, milli float64
	for _, s := range m.shapes {
		if s.cpuOK {
			continue
		}
		milli += s.freq * float64(s.milli) * float64(s.count)
		switch {
		case s.whole:
			whole += s.freq * float64(s.count)
		case s.milli > 0 && s.milli < MilliPerGPU:
			count[s.milli] += s.freq
		}
	}
	if len(count) == 0 || len(count) > maxPricedSizes {
		return w, false
	}
	p := packlp.Problem{Bins: milli / MilliPerGPU, Whole: whole, Capacity: MilliPerGPU}.WithCounts(count)
	sol, err := packlp.Solve(p)
	if err != nil {
		return w, false
	}
	values := sol.Values(p)
	for g := range MilliPerGPU {
		w[g] = float64(g) - values[g]
	}
	w[MilliPerGPU] = MilliPerGPU - sol.U
	return w, true
}
