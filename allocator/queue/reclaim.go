package queue

import (
	"fmt"
	"math"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// ReclaimError says why reclaim cannot give a queue its request.
type ReclaimError struct {
	Queue  string
	Reason string
}

func (e *ReclaimError) Error() string {
	return fmt.Sprintf("reclaim for queue %s: %s", e.Queue, e.Reason)
}

// reclaimMode is why an asker may reclaim.
type reclaimMode int

const (
	// forGuarantee: the asker stays within its guarantee at every level.
	forGuarantee reclaimMode = iota
	// forFairShare: the asker's leaf stays within its fair share.
	forFairShare
)

// Reclaim chooses whole workloads of other queues to evict so that queue,
// asking for req, gets room. The asker must stay within its limits, and
// either within its guarantee at every level of its path or, its leaf,
// within its fair share (FairShare).
//
// Candidates are other queues' preemptible workloads that use something
// req asks for, lowest priority first, then the queue furthest above its
// fair share, then newest, then by Key. A candidate is taken only if,
// after every eviction chosen so far and it, no queue on its path falls
// below its guarantee in a resource it uses (the asker's ancestors among
// them, counting the request), so reclaim never flaps. Reclaiming for a
// fair share also requires, like Kueue's LessThanOrEqualToFinalShare, that
// under the deepest common ancestor the asker's side, with the request, is
// not above the victim's side after the eviction, measured as used over
// fair share in the requested resources.
//
// enough reports whether victims free enough room (the caller checks real
// placement, GPU by GPU); it must be monotone (a superset of an enough set
// is enough). Reclaim takes the shortest enough prefix of the candidates,
// then, in one pass from the last victim back, drops every victim without
// which the rest is still enough, so no eviction is made that is not
// needed. It returns the victims in candidate order, or a *ReclaimError.
func (s *State) Reclaim(queue string, req quota.Resources, running []Workload, enough func(victims []Workload) bool) ([]Workload, error) {
	v := s.view()
	fail := func(format string, args ...any) ([]Workload, error) {
		return nil, &ReclaimError{Queue: queue, Reason: fmt.Sprintf(format, args...)}
	}
	a := &admission{v: v, queue: queue, req: req, res: positive(req), path: v.t.Path(queue)}
	for _, check := range []admitCheck{checkKnown, checkLeaf, checkValid, checkLimits} {
		if d := check(a); d != nil {
			return fail("%s", d.Reason)
		}
	}
	mode := forGuarantee
	if q, r, over := a.overGuarantee(); over {
		mode = forFairShare
		for _, r2 := range a.res {
			entitled := max(v.spec(queue).Guaranteed[r2], v.fair[queue][r2])
			if after := v.used[queue][r2] + req[r2]; after > entitled {
				return fail("queue %s would use %d %s, above its fair share %d, and %s would be above its guarantee %d in %s: only guarantees and fair shares are reclaimed", queue, after, r2, v.fair[queue][r2], q, v.spec(q).Guaranteed[r], r)
			}
		}
	}
	if enough(nil) {
		return nil, nil
	}
	cands := v.candidates(queue, a.res, running)
	taken := map[string]quota.Resources{} // evicted so far, per queue's subtree
	var victims []Workload
	for _, w := range cands {
		if ok, _ := v.mayTake(a, mode, taken, w); !ok {
			continue
		}
		for _, q := range v.t.nodes[w.Queue].path {
			taken[q] = taken[q].Add(w.Uses)
		}
		victims = append(victims, w)
		if enough(victims) {
			return minimal(victims, enough), nil
		}
	}
	return fail("other queues borrow too little to free %s without falling below their own guarantees", req)
}

// minimal drops, from the last victim back, each victim without which the
// others are still enough.
func minimal(victims []Workload, enough func([]Workload) bool) []Workload {
	keep := append([]Workload(nil), victims...)
	for i := len(keep) - 2; i >= 0; i-- { // the last one was needed
		without := append(append([]Workload(nil), keep[:i]...), keep[i+1:]...)
		if enough(without) {
			keep = without
		}
	}
	return keep
}

// candidates are the workloads Reclaim may take, in the order it tries
// them.
func (v *view) candidates(queue string, res []corev1.ResourceName, running []Workload) []Workload {
	var out []Workload
	for _, w := range running {
		if w.Queue == queue || !w.Preemptible {
			continue
		}
		if _, known := v.t.node(w.Queue); !known {
			continue
		}
		if len(res) > 0 && len(positiveIn(w.Uses, res)) == 0 {
			continue // frees nothing the asker needs
		}
		out = append(out, w)
	}
	above := map[string]float64{}
	for _, w := range out {
		if _, ok := above[w.Queue]; !ok {
			above[w.Queue] = v.ratio(w.Queue, v.used[w.Queue], nil)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.Priority != b.Priority:
			return a.Priority < b.Priority
		case above[a.Queue] != above[b.Queue]:
			return above[a.Queue] > above[b.Queue]
		case !a.Created.Equal(b.Created):
			return a.Created.After(b.Created)
		}
		return a.Key < b.Key
	})
	return out
}

// mayTake says whether w can be evicted for the asker after taken: no
// queue on w's path goes below its guarantee in a resource w uses, and for
// a fair share the asker's side stays at or below the victim's side.
func (v *view) mayTake(a *admission, mode reclaimMode, taken map[string]quota.Resources, w Workload) (bool, string) {
	vpath := v.t.nodes[w.Queue].path
	after := func(q string) quota.Resources {
		u := v.used[q].Sub(taken[q])
		if onPath(a.path, q) {
			u = u.Add(a.req)
		}
		return u
	}
	for i := len(vpath) - 1; i >= 0; i-- {
		q := vpath[i]
		rest := after(q).Sub(w.Uses)
		for _, r := range positive(w.Uses) {
			if g := v.spec(q).Guaranteed[r]; rest[r] < g {
				return false, fmt.Sprintf("evicting %s would put queue %s at %d %s, below its guarantee %d", w.Key, q, rest[r], r, g)
			}
		}
	}
	if mode == forGuarantee {
		return true, fmt.Sprintf("queue %s stays at or above its guarantee", w.Queue)
	}
	i := 0
	for i < len(a.path) && i < len(vpath) && a.path[i] == vpath[i] {
		i++
	}
	if i == len(a.path) || i == len(vpath) {
		return false, "the victim's queue is on the asker's path"
	}
	mine, theirs := a.path[i], vpath[i]
	ra := v.ratio(mine, after(mine), a.res)
	rb := v.ratio(theirs, after(theirs).Sub(w.Uses), a.res)
	if ra > rb {
		return false, fmt.Sprintf("after evicting %s, queue %s would be at %.3g of its fair share, below queue %s at %.3g", w.Key, theirs, rb, mine, ra)
	}
	return true, fmt.Sprintf("queue %s stays at or above queue %s's share of its fair share", theirs, mine)
}

// ratio is a queue's dominant used over fair share, over res (every
// resource used when res is nil); a resource used without a fair share
// counts as infinitely above.
func (v *view) ratio(q string, used quota.Resources, res []corev1.ResourceName) float64 {
	if res == nil {
		res = positive(used)
	}
	var out float64
	for _, r := range res {
		u := used[r]
		if u <= 0 {
			continue
		}
		fs := v.fair[q][r]
		if fs <= 0 {
			return math.Inf(1)
		}
		out = math.Max(out, float64(u)/float64(fs))
	}
	return out
}

// positiveIn returns the resources of res that r has above 0.
func positiveIn(r quota.Resources, res []corev1.ResourceName) []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, k := range res {
		if r[k] > 0 {
			out = append(out, k)
		}
	}
	return out
}

// CanPreempt reports whether a workload of queue asker, asking for req at a
// higher priority, may evict victim. Within one queue priority alone
// decides. Across queues the victim's queue must stay at or above its
// guarantee at every level of its path (the asker's ancestors counting the
// request), so a higher tier never takes a queue below its guarantee.
func (s *State) CanPreempt(asker string, req quota.Resources, victim Workload) (bool, string) {
	if !victim.Preemptible {
		return false, fmt.Sprintf("%s may not be evicted now", victim.Key)
	}
	if victim.Queue == asker {
		return true, "same queue"
	}
	v := s.view()
	a := &admission{v: v, queue: asker, req: req, res: positive(req), path: v.t.Path(asker)}
	for _, check := range []admitCheck{checkKnown, checkValid} {
		if d := check(a); d != nil {
			return false, d.Reason
		}
	}
	if _, known := v.t.node(victim.Queue); !known {
		return true, fmt.Sprintf("%s's queue %s is not defined, so nothing of it is guaranteed", victim.Key, victim.Queue)
	}
	return v.mayTake(a, forGuarantee, nil, victim)
}
