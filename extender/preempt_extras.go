package extender

import (
	"math"

	"k8s.io/apimachinery/pkg/types"
)

// preemptCandidate is one node's answer to kube-scheduler's preemption
// dry run, as the preempt verb is about to return it.
type preemptCandidate struct {
	victims []types.UID
	// extra are the victims that are extra members of elastic gangs
	// (beyond their minMember).
	extra map[types.UID]bool
	pdb   int64
}

// extrasFirst drops the candidate nodes on which a whole workload would be
// preempted while another candidate, no worse by kube-scheduler's first
// two criteria (fewest budget violations, then the lowest highest victim
// priority), takes only extra members of elastic gangs at that priority:
// under pressure an elastic gang gives back its extra members before any
// whole workload goes (allocator/preempt orders its units the same way).
// kube-scheduler then picks among the nodes left by its own criteria, the
// victims that started last among them. st gives the node states whose
// pods' priorities count; a victim it does not know (a pod without GPUs)
// keeps its node from being the one preferred.
func extrasFirst(cands map[string]preemptCandidate, st func(node string) (*NodeState, bool)) {
	type rank struct {
		pdb       int64
		top       int32
		onlyExtra bool // every victim at the top priority is an extra member
		known     bool // every victim is a GPU pod of the node state
	}
	ranks := make(map[string]rank, len(cands))
	for node, c := range cands {
		r := rank{pdb: c.pdb, top: math.MinInt32, onlyExtra: true, known: true}
		s, _ := st(node)
		for _, uid := range c.victims {
			var u *PodUse
			if s != nil {
				u = s.Pods[uid]
			}
			if u == nil {
				r.known = false
				continue
			}
			switch {
			case u.Priority > r.top:
				r.top, r.onlyExtra = u.Priority, c.extra[uid]
			case u.Priority == r.top:
				r.onlyExtra = r.onlyExtra && c.extra[uid]
			}
		}
		ranks[node] = r
	}
	for node, n := range ranks {
		if n.onlyExtra {
			continue
		}
		for other, m := range ranks {
			if other != node && m.known && m.onlyExtra && m.pdb <= n.pdb && m.top <= n.top {
				delete(cands, node)
				break
			}
		}
	}
}
