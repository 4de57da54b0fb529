package extender

import (
	"cmp"
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	"github.com/tessera-gpu/tessera/allocator"
)

// shortlist keeps, of the nodes marked in passed, those prioritize ranks
// best and clears passed for the others; it returns how many it cleared.
// k <= 0 keeps them all.
//
// The rank is prioritize's: a node where the pod's NUMA alignment is
// possible before one where it is not (PreferAligned), then the policy's
// score.
//
//   - A pod without a soft scheduling preference of its own
//     (softPreferences) keeps one node of the best rank: kube-scheduler
//     takes it at once (it runs its Score plugins, and calls prioritize,
//     only when more than one node is feasible). Exact ties (identical
//     empty nodes, say) go to the node whose name sorts first. They were
//     left to kube-scheduler's plugins, which spread them (the default
//     profile's LeastAllocated and default topology spreading): a burst of
//     pods is filtered faster than its binds reach the extender, so each
//     pod of the burst saw the same ties, and a Deployment of 20 one-GPU
//     pods on make demo's cluster went 5, 6, 5 and 4 to its four nodes,
//     leaving no 8-GPU node whole. By name, a burst fills one node (until
//     kube-scheduler's own count of its resources, assumed pods included,
//     filters it out) before the next, as binpacking would with every
//     bind known.
//   - A pod with soft preferences keeps the k best (of equal ranks, the
//     first in the order kube-scheduler sent), so that kube-scheduler
//     weighs its preferences among nodes the extender scores alike. So
//     does any pod when one of its best-ranked nodes has a PreferNoSchedule
//     taint the pod does not tolerate: kube-scheduler's TaintToleration
//     then finds the untainted nodes next to it.
//
// Why filter may leave feasible nodes out: the extender's prioritize
// weight outweighs every other score (deploy/extender), so kube-scheduler
// places the pod on one of the nodes the extender scores best anyway.
// Scoring every feasible node again with the stock plugins and sending
// them all through prioritize costs the scheduler's serial cycle time in
// proportion to the node count, for nodes that cannot win. The scores are
// memoised per node state and demand, so prioritize does not evaluate the
// kept nodes again.
func shortlist(p allocator.Policy, q *Query, pod *corev1.Pod, states []*NodeState, passed []bool, k int) int {
	if k <= 0 {
		return 0
	}
	idx := make([]int, 0, len(passed))
	for i, ok := range passed {
		if ok {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return 0
	}
	ranks := make([]rank, len(idx))
	parallelFor(len(idx), func(j int) {
		st := states[idx[j]]
		s, ok := q.Score(p, st)
		if !ok || math.IsNaN(s) {
			s = math.Inf(-1)
		}
		ranks[j] = rank{aligned: st.numaAligned(q.D), score: s}
	})
	best := ranks[0]
	for _, r := range ranks[1:] {
		if r.compare(best) > 0 {
			best = r
		}
	}
	if !softPreferences(pod) && !avoidedAt(pod, states, idx, ranks, best) {
		// One node: of the best, the first by name.
		keep := -1
		for j, r := range ranks {
			if r.compare(best) == 0 && (keep < 0 || states[idx[j]].Info.Name < states[idx[keep]].Info.Name) {
				keep = j
			}
		}
		for j := range ranks {
			if j != keep {
				passed[idx[j]] = false
			}
		}
		return len(ranks) - 1
	}
	if len(idx) <= k {
		return 0
	}
	// The k-th best rank is the threshold. (A stable sort of all the nodes
	// took a third of the filter's time at 5000 nodes; sorting the bare
	// ranks to find the threshold is a fraction of that.)
	sorted := slices.Clone(ranks)
	slices.SortFunc(sorted, rank.compare)
	threshold := sorted[len(sorted)-k]
	// Every node above the threshold stays, and of the nodes at it the
	// first ones in the order sent, up to k in all.
	atThreshold := k
	for _, r := range ranks {
		if r.compare(threshold) > 0 {
			atThreshold--
		}
	}
	left := 0
	for j, r := range ranks {
		switch c := r.compare(threshold); {
		case c > 0:
		case c == 0 && atThreshold > 0:
			atThreshold--
		default:
			passed[idx[j]] = false
			left++
		}
	}
	return left
}

// rank is a fitting node's place in prioritize's order.
type rank struct {
	aligned bool
	score   float64
}

func (r rank) compare(o rank) int {
	if r.aligned != o.aligned {
		if r.aligned {
			return 1
		}
		return -1
	}
	return cmp.Compare(r.score, o.score)
}

// softPreferences reports whether the pod asks kube-scheduler to weigh
// something of its own when it scores nodes: preferred node affinity,
// preferred pod affinity or anti-affinity, or a topology spread
// constraint it may break (ScheduleAnyway).
func softPreferences(pod *corev1.Pod) bool {
	if a := pod.Spec.Affinity; a != nil {
		if a.NodeAffinity != nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
		if a.PodAffinity != nil && len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
	}
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == corev1.ScheduleAnyway {
			return true
		}
	}
	return false
}

// avoidedAt reports whether a node of rank best has a PreferNoSchedule
// taint the pod does not tolerate.
func avoidedAt(pod *corev1.Pod, states []*NodeState, idx []int, ranks []rank, best rank) bool {
	for j, r := range ranks {
		if r.compare(best) != 0 {
			continue
		}
		taints := states[idx[j]].Info.PreferNoSchedule
		if len(taints) == 0 {
			continue
		}
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(taints, pod.Spec.Tolerations, nil); untolerated {
			return true
		}
	}
	return false
}
