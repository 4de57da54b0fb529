package queue

import (
	"fmt"
	"sort"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/allocator/victims"
)

// PreemptOwn chooses workloads of the asker's own leaf queue, of a lower
// priority than prio, to evict so that a workload asking req there is
// admitted (Admit, with the victims' use gone from the queue) and fits
// (enough, monotone as for Reclaim): a team's urgent work displaces the
// team's own batch work once the team fills its guarantee, its limit or
// the cluster, as it would in a namespace no Queue serves (there Admit
// refused it, and the workload waited for ever behind its own queue's
// lower tiers). Other queues' work is never taken here (Reclaim and tier
// preemption decide that). Candidates are preemptible, lowest priority
// first, elastic extras before whole workloads, then newest; the choice is
// the shortest enough prefix, made minimal (allocator/victims). freed is
// what the queue's work already leaving frees, which Used still counts
// (evicted a moment ago, not yet seen leaving): it is counted gone, so a
// second pass does not evict again for the same asker. It returns the
// victims (none when what is leaving is enough), or an error saying why
// none would do.
func (s *State) PreemptOwn(queue string, req quota.Resources, prio int32, running []Workload, freed quota.Resources, enough func([]Workload) bool) ([]Workload, error) {
	var cands []Workload
	for _, w := range running {
		if w.Queue == queue && w.Preemptible && w.Priority < prio {
			cands = append(cands, w)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return evictFirst(cands[i], cands[j], nil) }) // one queue: none further above
	admitted := func(vs []Workload) bool {
		freed := quota.Resources{}.Add(freed)
		for _, w := range vs {
			freed = freed.Add(w.Uses)
		}
		without := *s
		without.Used = make(map[string]quota.Resources, len(s.Used))
		for k, v := range s.Used {
			without.Used[k] = v
		}
		without.Used[queue] = s.Used[queue].Sub(freed)
		return without.Admit(queue, req).Allowed && enough(vs)
	}
	takeAll := func() func(Workload) bool { return func(Workload) bool { return true } }
	chosen, ok := victims.Choose(cands, func(w Workload) string { return w.Key }, takeAll, admitted)
	switch {
	case ok:
		return chosen, nil
	case len(cands) == 0:
		return nil, fmt.Errorf("queue %s runs no preemptible workload of a lower priority than %d", queue, prio)
	default:
		return nil, fmt.Errorf("evicting every lower-priority workload of queue %s would not admit it or make room for it", queue)
	}
}
