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
	more := waterfill(left, rest, weight, children)
	for i := range got {
		got[i] += more[i]
	}
	return got
}

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
