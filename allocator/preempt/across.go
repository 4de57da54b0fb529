package preempt

import (
	"slices"
	"sort"
)

// FitsAll reports whether the asker (a whole gang, say, planned with its
// topology over every node) fits once victims are gone.
type FitsAll func(victims []Unit) bool

// ChooseAcross chooses victims among units that may live on many nodes,
// for an asker that spans nodes (a gang) and whose fit only the caller can
// judge. It returns no victims and true when the asker fits as it is, and
// false when it fits not even with every unit gone.
//
// The units are taken in order of least cost until the asker fits: the
// extra members of elastic gangs first (they go before any whole workload),
// then the lowest priority, then the newest (it has lost the least work),
// then the fewest pods, then the key. Then every taken unit is given back,
// the most costly first, while the asker still fits without it, so that
// each remaining victim is needed: a unit taken on a node that cannot serve
// the asker (another rack, too few GPUs left there) is never the reason for
// an eviction. Last, a single unit that suffices alone replaces the set
// when it costs less: extra members alone before any whole workload, then
// Choose's cost among nodes (the least important top victim, the fewest
// pods ended).
//
// The fit is asked once with every unit gone, then O(log n) times in a
// binary search for the shortest prefix that fits (the fit grows as units
// go), once per unit of that prefix (the reprieve), and for at most
// maxSingles single units that cost less.
func ChooseAcross(units []Unit, fits FitsAll) ([]Unit, bool) {
	if fits(nil) {
		return nil, true
	}
	us := slices.Clone(units)
	sort.SliceStable(us, func(i, j int) bool { return acrossLess(us[i], us[j]) })
	if len(us) == 0 || !fits(us) {
		return nil, false
	}
	// The shortest prefix that fits; fits(us) holds, so n is at most
	// len(us) and us[:n] fits.
	n := sort.Search(len(us), func(n int) bool { return n > 0 && fits(us[:n]) })
	anyNode := func(_ string, victims []Unit) bool { return fits(victims) }
	taken := reprieve("", slices.Clone(us[:n]), anyNode)
	// The units are in order of cost, so the first single one that fits
	// is the cheapest; at most maxSingles are tried, which bounds the
	// planning calls on a large cluster (every one plans the whole asker).
	tried := 0
	for _, u := range us {
		if len(taken) == 1 || tried == maxSingles {
			break
		}
		one := []Unit{u}
		if !acrossCheaper(costOf(one), costOf(taken)) {
			continue
		}
		tried++
		if fits(one) {
			taken = one
		}
	}
	return taken, true
}

// maxSingles bounds how many single units ChooseAcross tries in place of
// the set it found.
const maxSingles = 64

// acrossLess orders units by the cost of taking them, least first.
func acrossLess(a, b Unit) bool {
	switch {
	case a.Extra != b.Extra:
		return a.Extra
	case a.Priority != b.Priority:
		return a.Priority < b.Priority
	case !a.Started.Equal(b.Started):
		return a.Started.After(b.Started)
	case a.Pods != b.Pods:
		return a.Pods < b.Pods
	}
	return a.Key < b.Key
}

// acrossCheaper orders sets of victims as ChooseAcross takes units: extra
// members alone before any set with a whole workload, then Choose's cost.
func acrossCheaper(a, b cost) bool {
	if (a.whole == 0) != (b.whole == 0) {
		return a.whole == 0
	}
	return a.less(b)
}
