package extender

import (
	"cmp"
	"math"
	"slices"

	"github.com/tessera-gpu/tessera/allocator"
)

// shortlist keeps, of the nodes marked in passed, the k the policy scores
// best and clears passed for the others; it returns how many it cleared.
// k <= 0 keeps them all. Equal scores keep the order kube-scheduler sent.
//
// Why filter may leave feasible nodes out: the extender's prioritize
// weight outweighs every other score (deploy/extender), so kube-scheduler
// places the pod on one of the nodes the extender scores best anyway.
// Scoring every feasible node again with the stock plugins and sending
// them all through prioritize costs the scheduler's serial cycle time in
// proportion to the node count, for nodes that cannot win. The scores are
// memoised per node state and demand, so prioritize does not evaluate the
// kept nodes again.
func shortlist(p allocator.Policy, q *Query, states []*NodeState, passed []bool, k int) int {
	if k <= 0 {
		return 0
	}
	idx := make([]int, 0, len(passed))
	for i, ok := range passed {
		if ok {
			idx = append(idx, i)
		}
	}
	if len(idx) <= k {
		return 0
	}
	raw := make([]float64, len(idx))
	parallelFor(len(idx), func(j int) {
		s, ok := q.Score(p, states[idx[j]])
		if !ok || math.IsNaN(s) {
			s = math.Inf(-1)
		}
		raw[j] = s
	})
	order := make([]int, len(idx))
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(raw[b], raw[a]) })
	for _, j := range order[k:] {
		passed[idx[j]] = false
	}
	return len(idx) - k
}
