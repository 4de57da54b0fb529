package queue

import (
	"math"
	"math/bits"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// FairShare returns what each queue, leaf or parent, should have of each
// resource of Capacity now. Per resource it is hierarchical water-filling,
// top-down:
//
//   - The top-level queues share Capacity; every other queue's children
//     share the queue's own fair share.
//   - A queue's demand is the used plus pending of its subtree (an
//     invalid queue, or one under an invalid ancestor, counts only its
//     used: it admits nothing more).
//   - First each child gets min(guaranteed, limit, demand). When the
//     share does not cover all of that (capacity shrank, or children
//     guarantee more than their parent), it is split in proportion to
//     those amounts.
//   - What is left is split among children whose demand is unmet, in
//     proportion to their weight (missing = 1, 0 takes nothing), each
//     capped by its limit and its demand; what a capped child cannot take
//     goes round again to the others, until nothing is left or everyone
//     is satisfied.
//   - With HistoryWeight k above 0 (and a HalfLife), each of those
//     weights is first tilted by what the child borrowed lately: with w
//     its weight's fraction among them and u its recent use beyond its
//     guarantee (Usage over the half-life's steady state, as Share counts
//     it) as a fraction of what is left, its weight becomes
//     max(0, w + k·(w − u)). A child that borrowed its weight's part of
//     what was lent keeps its weight, one that borrowed more gets less of
//     what is lent now, one that borrowed less gets more; children that
//     borrowed in proportion to their weights keep their proportions, and
//     a child's use within its guarantee never counts. Since recent use
//     follows what a queue gets, the split settles at the weights' over
//     time (KAI-Scheduler's time-aware fairness works alike). What the
//     tilted weights cannot place (the children that take it capped, the
//     others tilted to 0) is split again by the plain weights.
//
// Amounts are integers: each round gives every child the floor of its
// proportion, and the units left over go one each to the children with the
// largest remainders, ties by name. What no child can take stays with the
// parent, unused.
func (s *State) FairShare() map[string]quota.Resources {
	v := s.view()
	out := make(map[string]quota.Resources, len(v.fair))
	for q, r := range v.fair {
		out[q] = quota.Resources{}.Add(r)
	}
	return out
}

func (v *view) fairShare() map[string]quota.Resources {
	demand := v.demand
	fair := make(map[string]quota.Resources, len(v.t.order))
	for _, name := range v.t.order {
		fair[name] = quota.Resources{}
	}
	for _, r := range sortedNames(v.s.Capacity) {
		var level func(share int64, children []string)
		level = func(share int64, children []string) {
			got := v.splitLevel(r, share, children, demand)
			for i, c := range children {
				fair[c][r] = got[i]
				level(got[i], v.t.nodes[c].children)
			}
		}
		level(max(v.s.Capacity[r], 0), v.t.roots)
	}
	return fair
}

// splitLevel splits share of r among siblings: guarantees first, then the
// rest by weight.
func (v *view) splitLevel(r corev1.ResourceName, share int64, children []string, demand map[string]quota.Resources) []int64 {
	n := len(children)
	if n == 0 {
		return nil
	}
	want := make([]int64, n) // min(limit, demand)
	guar := make([]int64, n)
	weight := make([]int64, n)
	for i, c := range children {
		sp := v.spec(c)
		want[i] = max(demand[c][r], 0)
		if lim, ok := sp.Limit[r]; ok {
			want[i] = min(want[i], max(lim, 0))
		}
		guar[i] = min(max(sp.Guaranteed[r], 0), want[i])
		weight[i] = sp.weight(r)
	}
	got := waterfill(share, guar, guar, children)
	left := share
	rest := make([]int64, n)
	for i := range children {
		left -= got[i]
		rest[i] = want[i] - got[i]
	}
	tilted, ok := v.tilt(r, left, children, rest, weight)
	if !ok {
		tilted = weight
	}
	more := waterfill(left, rest, tilted, children)
	for i := range got {
		got[i] += more[i]
	}
	if ok {
		// What the tilted weights could not place (its takers capped, the
		// others tilted to 0) goes by the plain weights: history lowers a
		// queue's part, it does not leave GPUs without a queue.
		for i := range children {
			left -= more[i]
			rest[i] -= more[i]
		}
		again := waterfill(left, rest, weight, children)
		for i := range got {
			got[i] += again[i]
		}
	}
	return got
}

// tilt returns the weights by which the children split left of r, when
// history tilts them (false without a HistoryWeight, a HalfLife or
// anything left, or when no claimant would keep a weight above 0): each
// claimant's (rest above 0) weight fraction w tilted by its recent use
// beyond its guarantee over left, u, to max(0, w + k·(w − u)), in integer
// units of tiltScale.
func (v *view) tilt(r corev1.ResourceName, left int64, children []string, rest, weight []int64) ([]int64, bool) {
	k := v.s.HistoryWeight
	if k <= 0 || v.s.HalfLife <= 0 || left <= 0 || math.IsNaN(k) || math.IsInf(k, 0) {
		return nil, false
	}
	var sumW float64
	for i := range children {
		if rest[i] > 0 && weight[i] > 0 {
			sumW += float64(weight[i])
		}
	}
	if sumW == 0 {
		return nil, false
	}
	norm := steadyState(v.s.HalfLife)
	tilted := make([]float64, len(children))
	var sumT float64
	for i, c := range children {
		if rest[i] <= 0 || weight[i] <= 0 {
			continue
		}
		w := float64(weight[i]) / sumW
		borrowed := max(v.hist[c][r]/norm-float64(max(v.spec(c).Guaranteed[r], 0)), 0)
		u := borrowed / float64(left)
		t := max(w+k*(w-u), 0)
		if math.IsNaN(t) || math.IsInf(t, 0) {
			return nil, false
		}
		tilted[i] = t
		sumT += t
	}
	if sumT <= 0 {
		return nil, false
	}
	out := make([]int64, len(children))
	for i, t := range tilted {
		out[i] = int64(math.Round(t / sumT * tiltScale))
	}
	return out, true
}

// tiltScale is the integer total tilted weights are given in.
const tiltScale = 1 << 30

// waterfill splits total among claimants in proportion to weight, each
// capped by caps, integer units with remainders to the largest fractional
// parts, ties by name (names are sorted). It returns what each gets; their
// sum is at most total.
func waterfill(total int64, caps, weights []int64, names []string) []int64 {
	got := make([]int64, len(caps))
	active := make([]int, 0, len(caps))
	for i := range caps {
		if caps[i] > 0 && weights[i] > 0 {
			active = append(active, i)
		}
	}
	for total > 0 && len(active) > 0 {
		var sumW int64
		for _, i := range active {
			sumW = satAdd(sumW, weights[i])
		}
		type part struct {
			i        int
			floor    int64
			fraction uint64
		}
		parts := make([]part, len(active))
		var given int64
		for k, i := range active {
			q, rem := mulDiv(uint64(total), uint64(min(weights[i], sumW)), uint64(sumW))
			parts[k] = part{i: i, floor: int64(q), fraction: rem}
			given += int64(q)
		}
		// The units the floors leave (fewer than the claimants) go to
		// the largest remainders, ties by name.
		if extra := total - given; extra > 0 {
			order := make([]int, len(parts))
			for k := range order {
				order[k] = k
			}
			sort.SliceStable(order, func(a, b int) bool {
				pa, pb := parts[order[a]], parts[order[b]]
				if pa.fraction != pb.fraction {
					return pa.fraction > pb.fraction
				}
				return names[pa.i] < names[pb.i]
			})
			for _, k := range order[:min(extra, int64(len(order)))] {
				parts[k].floor++
			}
		}
		capped := false
		next := active[:0]
		for _, p := range parts {
			give := min(p.floor, caps[p.i]-got[p.i])
			got[p.i] += give
			total -= give
			if got[p.i] >= caps[p.i] {
				capped = true
				continue
			}
			next = append(next, p.i)
		}
		active = next
		if !capped {
			break // everything was given
		}
	}
	return got
}

// mulDiv returns a·b/c and a·b mod c for c > 0 and b ≤ c.
func mulDiv(a, b, c uint64) (uint64, uint64) {
	hi, lo := bits.Mul64(a, b)
	if hi >= c { // cannot happen for b ≤ c; keep Div64 from panicking
		return math.MaxInt64, 0
	}
	return bits.Div64(hi, lo, c)
}
