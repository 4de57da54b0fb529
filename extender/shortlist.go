package extender

import (
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
	// The k-th best score is the threshold: every node above it stays, and
	// of the nodes at it the first ones in the order sent, up to k. (A
	// stable sort of all the nodes by score took a third of the filter's
	// time at 5000 nodes; sorting the bare scores to find the threshold
	// is a fraction of that.)
	sorted := slices.Clone(raw)
	slices.Sort(sorted)
	threshold := sorted[len(sorted)-k]
	above := 0
	for _, s := range raw {
		if s > threshold {
			above++
		}
	}
	atThreshold := k - above
	for j, s := range raw {
		switch {
		case s > threshold:
		case s == threshold && atThreshold > 0:
			atThreshold--
		default:
			passed[idx[j]] = false
		}
	}
	return len(idx) - k
}
