package jobs

import (
	"errors"
	"fmt"

	"github.com/tessera-gpu/tessera/allocator/consolidate"
	"github.com/tessera-gpu/tessera/allocator/gang"
)

// Consolidation in StrategyReserve (Config.ConsolidateMovesPerMinute > 0,
// tessera-sim jobs --consolidate-moves-per-minute): a job holding a
// reservation that cannot start on its held nodes (nor by evicting the
// preemptible backfill there) gets whole nodes by moving running jobs of
// one pod smaller than a node (allocator/consolidate's Decide, with
// gang.PlanGroup on the cluster without them as the judge). The trace says
// nothing of which jobs consent, so every such job is taken as movable: a
// bound of what consolidation can do. A moved job restarts from the
// beginning (its work so far is lost and counted in LostGPUHours and
// Evictions) and waits in the queue again like an evicted job. At most
// ConsolidateMovesPerMinute jobs are moved in any minute of simulated
// time; a job that needs more moves is not consolidated for.

// consolidation is the moves made, by time (seconds).
type consolidation struct {
	recent []int64
	moved  int
}

// budget is how many moves may be made now.
func (s *sim) consolidationBudget() int {
	c := s.cons
	kept := c.recent[:0]
	for _, t := range c.recent {
		if s.now-t < 60 {
			kept = append(kept, t)
		}
	}
	c.recent = kept
	return max(s.cfg.ConsolidateMovesPerMinute-len(kept), 0)
}

// consolidateFor moves small jobs so that j, holding a reservation, fits
// on the nodes no other reservation holds, and starts it there.
func (s *sim) consolidateFor(j *jobState) (bool, error) {
	if s.cons == nil {
		return false, nil
	}
	budget := s.consolidationBudget()
	if budget == 0 {
		return false, nil
	}
	r := s.rsv
	var idx []int // nodes j may use, by index in s.nodes
	for i := range s.nodes {
		if b := r.heldBy[i]; b == nil || b == j {
			idx = append(idx, i)
		}
	}
	view := make([]consolidate.Node, len(idx))
	at := map[int]int{}
	for k, i := range idx {
		at[i] = k
		view[k] = consolidate.Node{Name: s.nodes[i].Node.Name, GPUs: len(s.nodes[i].Node.GPUs), Eligible: true}
	}
	owner := map[string]*jobState{}
	for _, c := range s.running {
		rj := c.job
		movable := len(rj.sizes) == 1 && rj.sizes[0] < s.cfg.GPUsPerNode
		for p, n := range rj.nodes {
			k, ok := at[n]
			if n < 0 || !ok {
				continue
			}
			name := fmt.Sprintf("%s/%d", rj.job.ID, p)
			owner[name] = rj
			view[k].Pods = append(view[k].Pods, consolidate.Pod{Name: name, GPUs: rj.gpus[p].Positions(), Movable: movable})
		}
	}
	var plan *gang.Plan
	judge := func(moves []consolidate.Move) bool {
		var gone []victim
		for _, m := range moves {
			gone = append(gone, victim{owner[m.Pod], -1})
		}
		freed := s.freedCloneOf(gone)
		trial := make([]gang.Node, len(idx))
		for k, i := range idx {
			trial[k] = freed[i]
		}
		p, err := gang.PlanGroup(s.group(j), trial, s.policy)
		if err != nil {
			return false
		}
		plan = p
		return true
	}
	w := consolidate.Workload{Members: j.sizes[:j.min]}
	moves, err := consolidate.Decide(view, w, budget, judge)
	switch {
	case errors.Is(err, consolidate.ErrFits):
		return false, fmt.Errorf("consolidation: job %s fits without moves, but did not start", j.job.ID)
	case errors.Is(err, consolidate.ErrNoPlan), errors.Is(err, consolidate.ErrBudget):
		return false, nil
	case err != nil:
		return false, err
	}
	if !judge(moves.Moves) {
		return false, fmt.Errorf("consolidation: job %s: the plan Decide accepted does not fit", j.job.ID)
	}
	for _, m := range moves.Moves {
		rj := owner[m.Pod]
		if !rj.started {
			continue
		}
		delete(r.inside, rj)
		s.evict(rj)
		s.cons.recent = append(s.cons.recent, s.now)
		s.cons.moved++
	}
	s.apply(j, plan)
	s.startJob(j)
	s.reserveStarted(j)
	return true, nil
}
