package jobs

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
)

// Elastic gangs (Job.MinGPUs, Config.ElasticMin), as the extender runs
// them: a job of several pods starts once its minimum of pods fits (the
// gang planner plans those, as extender/planner plans a PodGroup's
// minMember); after each pass, its other pods join one at a time, oldest
// gang first, into free room only (never held nodes, never evicting), each
// admitted by the queues (StrategyQueues) or the quota (StrategyGang) as
// the extender admits one more member; under pressure the pods beyond the
// minimum are taken back first, newest first, before any whole job: they
// are offered to reclaim (allocator/queue and allocator/quota,
// Workload.Extra) beside their job, and a reservation counts them as
// preemptible occupants (StrategyReserve). A gang never drops below its
// minimum.
//
// The traces carry no elasticity, so two assumptions of ours stand in for
// it: a job's work is its pods × its duration in pod-seconds, done at one
// pod-second per running pod per second (linear scaling: at full size it
// ends after its duration, as a rigid job does); and a pod taken back
// costs no work (the gang keeps running, as torchelastic-style jobs
// continue from their last state). Evicting a whole job loses everything
// it ran, as for rigid jobs.
//
// StrategyNoGang and StrategyFIFO run every job rigid: without gangs there
// is no minimum to start at, and strict FIFO lets nothing pass a blocked
// job.

// minPods is how many of a job's pods (of sizes) must run for it to start.
func (s *sim) minPods(j Job, sizes []int) int {
	n := len(sizes)
	if n == 1 || s.cfg.Strategy == StrategyNoGang || s.cfg.Strategy == StrategyFIFO {
		return n
	}
	m := n
	switch {
	case j.MinGPUs > 0:
		m = (j.MinGPUs + sizes[0] - 1) / sizes[0]
	case s.cfg.ElasticMin > 0:
		m = int(math.Ceil(s.cfg.ElasticMin * float64(n)))
	}
	return min(max(m, 1), n)
}

// gpusOf is the GPUs j's first n pods count for: all the job's GPUs once
// every pod runs (the last pod of a job that is not a multiple of a node
// counts for what is left of it).
func (j *jobState) gpusOf(n int) int {
	if n >= len(j.sizes) {
		return j.job.GPUs
	}
	sum := 0
	for _, g := range j.sizes[:n] {
		sum += g
	}
	return min(sum, j.job.GPUs)
}

// gpusNow is the GPUs j's running pods count for.
func (j *jobState) gpusNow() int { return j.gpusOf(j.placed) }

// startGPUs is the GPUs j needs to start.
func (j *jobState) startGPUs() int { return j.gpusOf(j.min) }

// extraUses is what pod k of j counts for beyond the pods before it.
func (j *jobState) extraUses(k int) int { return j.gpusOf(k+1) - j.gpusOf(k) }

// progress brings j's work left and GPU-time up to now, at its current
// size.
func (s *sim) progress(j *jobState) {
	dt := s.now - j.since
	j.left -= int64(j.placed) * dt
	j.gpuSec += int64(j.gpusNow()) * dt
	j.since = s.now
}

// due is when j ends at its current size.
func (s *sim) due(j *jobState) int64 {
	p := int64(j.placed)
	return s.now + (j.left+p-1)/p
}

// resized books a change of j's running pods (from before GPUs) and moves
// its completion.
func (s *sim) resized(j *jobState, before int) {
	delta := j.gpusNow() - before
	s.runGPUs += delta
	if s.quota != nil {
		s.quota.Used[j.team] = s.quota.Used[j.team].Add(gpuRes(delta))
	}
	s.q.used[j.fteam] += int64(delta)
	s.q.pending[j.fteam] -= int64(delta)
	for i, c := range s.running {
		if c.job == j {
			c.at = s.due(j)
			heap.Fix(&s.running, i)
			return
		}
	}
}

// growElastic lets running elastic gangs take free room after a pass, one
// pod at a time, oldest gang first. nodes are the nodes an extra pod may
// use; admit says whether j's team may use gpus more.
func (s *sim) growElastic(nodes []gang.Node, admit func(j *jobState, gpus int) bool) error {
	var gangs []*jobState
	for _, c := range s.running {
		if c.job.placed < len(c.job.sizes) {
			gangs = append(gangs, c.job)
		}
	}
	sort.Slice(gangs, func(a, b int) bool { return gangs[a].order < gangs[b].order })
	noRoom := map[int]bool{} // pod sizes that found no room: room only shrinks here
	for _, j := range gangs {
		for j.placed < len(j.sizes) {
			k := j.placed
			if noRoom[j.sizes[k]] || !admit(j, j.extraUses(k)) {
				break
			}
			g := gang.Group{Namespace: j.team, Name: j.job.ID, MinMember: 1,
				Members: []gang.Member{{Name: fmt.Sprintf("%s-%d", j.job.ID, k), Request: j.request(k)}}}
			plan, err := gang.PlanGroup(g, nodes, s.policy)
			if errors.Is(err, gang.ErrNoRoom) {
				noRoom[j.sizes[k]] = true
				break
			}
			if err != nil {
				return err
			}
			s.progress(j)
			before := j.gpusNow()
			s.apply(j, plan)
			s.resized(j, before)
			s.res.ElasticGrows++
		}
	}
	return nil
}

// victim is pod k of running job j taken back, or j whole when k < 0.
type victim struct {
	j *jobState
	k int
}

// extras are j's pods beyond its minimum, as victims.
func (j *jobState) extras() []victim {
	var out []victim
	for k := j.min; k < j.placed; k++ {
		out = append(out, victim{j, k})
	}
	return out
}

// freedCloneOf returns the nodes with the victims' pods released.
func (s *sim) freedCloneOf(victims []victim) []gang.Node {
	out := make([]gang.Node, len(s.nodes))
	copy(out, s.nodes)
	cloned := map[int]bool{}
	release := func(vj *jobState, k int) {
		n := vj.nodes[k]
		if n < 0 {
			return
		}
		if !cloned[n] {
			out[n].Node = out[n].Node.Clone()
			cloned[n] = true
		}
		if err := allocator.Release(out[n].Node, vj.request(k), vj.gpus[k]); err != nil {
			panic(fmt.Sprintf("releasing victim %s on a clone: %v", vj.job.ID, err)) // the simulator's own ledger is broken
		}
	}
	whole := map[*jobState]bool{}
	for _, v := range victims {
		if v.k < 0 {
			whole[v.j] = true
			for k := range v.j.nodes {
				release(v.j, k)
			}
		}
	}
	for _, v := range victims {
		if v.k >= 0 && !whole[v.j] {
			release(v.j, v.k)
		}
	}
	return out
}

// takeBack evicts the whole victims and takes back the extra pods of the
// others (a job's pods highest first, so moving its last pod into a freed
// slot never moves another victim).
func (s *sim) takeBack(victims []victim) {
	whole := map[*jobState]bool{}
	for _, v := range victims {
		if v.k < 0 && !whole[v.j] {
			whole[v.j] = true
			s.evict(v.j)
		}
	}
	var extras []victim
	for _, v := range victims {
		if v.k >= 0 && !whole[v.j] {
			extras = append(extras, v)
		}
	}
	sort.Slice(extras, func(a, b int) bool {
		if extras[a].j != extras[b].j {
			return extras[a].j.order < extras[b].j.order
		}
		return extras[a].k > extras[b].k
	})
	for _, v := range extras {
		s.shrink(v.j, v.k)
	}
}

// shrink takes back pod k of running job j, one beyond its minimum: the
// gang keeps running, slower.
func (s *sim) shrink(j *jobState, k int) {
	if k < j.min || k >= j.placed {
		panic(fmt.Sprintf("job %s: taking back pod %d of %d placed, minimum %d", j.job.ID, k, j.placed, j.min)) // the simulator's own ledger is broken
	}
	s.progress(j)
	before := j.gpusNow()
	if err := allocator.Release(s.nodes[j.nodes[k]].Node, j.request(k), j.gpus[k]); err != nil {
		panic(fmt.Sprintf("taking back job %s pod %d: %v", j.job.ID, k, err))
	}
	last := j.placed - 1
	j.nodes[k], j.gpus[k], j.podStart[k] = j.nodes[last], j.gpus[last], j.podStart[last]
	j.nodes[last], j.gpus[last] = -1, 0
	j.placed--
	s.resized(j, before)
	s.res.ElasticShrinks++
	s.noRoom = map[string]bool{} // the pod freed room
}
