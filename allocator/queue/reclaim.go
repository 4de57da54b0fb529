package queue

import (
	"fmt"
	"math"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/allocator/victims"
)

// ReclaimError says why reclaim cannot give a queue its request.
type ReclaimError struct {
	Queue  string
	Reason string
}

func (e *ReclaimError) Error() string {
	return fmt.Sprintf("reclaim for queue %s: %s", e.Queue, e.Reason)
}

// Reclaim chooses whole workloads of other queues to evict so that queue,
// asking for req, gets room. The asker must stay within its limits, and
// its leaf either within its guarantee or within its fair share
// (FairShare) with the request.
//
// Candidates are other queues' preemptible workloads, whatever GPU
// resources they use (a whole GPU freed can serve a slice, and slices
// freed a whole GPU; enough decides, and a victim it does not need is
// dropped), lowest priority first, then the queue furthest above its
// fair share (dominant used over fair share), then newest, then by Key. A
// candidate is taken only if, after every eviction chosen so far and it:
//   - no queue on its path below the deepest common ancestor with the
//     asker falls below its guarantee in a resource it uses (the common
//     ancestors lose to the asker what they gain; victimKeepsGuarantee),
//     but for one case: an asker taking back its own guarantee may take a
//     workload that straddles the victim queue's guarantee, from a queue
//     above its guarantee before that eviction, when what the queue is
//     then short of its guarantee is less than what the asker is short of
//     its own, and the workload is an elastic gang's extra member or
//     borrows more than its queue is then short (quota.Straddles). A
//     queue guaranteed 2 borrowing 14 GPUs through one 16-GPU gang would
//     otherwise keep them while the asker stays short of its guarantee for
//     ever; a workload half within its queue's guarantee is kept (taking
//     such whole workloads, on the job-trace replay, swung mean completion
//     times both ways and lost more work to restarts). The largest
//     shortfall strictly falls with every such eviction, so reclaim never
//     flaps;
//   - and, under the deepest common ancestor of the asker and the victim,
//     either the asker's queues stay within their guarantees with the
//     request (a team takes back its guarantee from a sibling that
//     borrowed it, even when their department as a whole is at its own
//     guarantee), or the asker reclaims for its fair share and, like
//     Kueue's LessThanOrEqualToFinalShare, its side with the request is
//     not above the victim's side after the eviction, each measured as
//     its dominant used over fair share (over every resource it uses).
//
// enough reports whether victims free enough room (the caller checks real
// placement, GPU by GPU); it must be monotone (a superset of an enough set
// is enough). Reclaim takes the shortest enough prefix of the candidates,
// then, in one pass from the last victim back, drops every victim without
// which the rest is still enough, so no eviction is made that is not
// needed. When the candidates run out first because a victim's queue
// would fall below its guarantee, the victims that the fewest enough set
// of all the candidates does not need (their freed room cannot serve the
// asker: GPUs of another NVLink clique, node or rack than the one it needs)
// are passed over and the choice is made again, so a queue's surplus is
// not spent on them. It returns the victims in candidate order, or a
// *ReclaimError.
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
	fair := v.fairShareEligible(a)
	if q, r, _, over := a.overGuarantee(); over && a.path[len(a.path)-1] == q && fair != "" {
		return fail("queue %s would use %d %s, above its guarantee %d, and %s: only guarantees and fair shares are reclaimed", queue, v.used[q][r]+req[r], r, v.spec(q).Guaranteed[r], fair)
	}
	cands := v.candidates(queue, running)
	// A candidate is taken while mayTake admits it, counting what was
	// taken before it in the same attempt (allocator/victims: the shortest
	// enough prefix, made minimal; victims of useless room passed over).
	// Victims that keep every queue at its guarantee are tried first; only
	// when they do not free the room may a workload straddle its queue's
	// guarantee (a second try, made only when a candidate's queue borrows
	// in a resource it uses: without one it would choose the same, and
	// each try calls enough, which plans the asker, again and again).
	tries := []bool{false}
	if slices.ContainsFunc(cands, v.borrowsThrough) {
		tries = append(tries, true)
	}
	for _, straddle := range tries {
		newTaker := func() func(Workload) bool {
			taken := map[string]quota.Resources{} // evicted so far, per queue's subtree
			return func(w Workload) bool {
				if ok, _ := v.mayTake(a, fair == "", straddle, taken, w); !ok {
					return false
				}
				for _, q := range v.t.nodes[w.Queue].path {
					taken[q] = taken[q].Add(w.Uses)
				}
				return true
			}
		}
		if chosen, ok := victims.Choose(cands, func(w Workload) string { return w.Key }, newTaker, enough); ok {
			return chosen, nil
		}
	}
	if len(cands) == 0 {
		// Nothing of another queue may go: say so, rather than blame
		// borrowing that does not exist (on make demo a full cluster of
		// pods of a namespace no Queue serves read "other queues borrow
		// too little").
		return fail("no workload of another queue may be taken back to free %s: none runs evictable work now (pods of namespaces no Queue serves are never reclaimed)", req)
	}
	return fail("other queues borrow too little to free %s without falling below their own guarantees", req)
}

// borrowsThrough reports whether w's queue uses more than its guarantee of
// a resource w uses: only then may w straddle it.
func (v *view) borrowsThrough(w Workload) bool {
	for _, r := range positive(w.Uses) {
		if v.used[w.Queue][r] > v.spec(w.Queue).Guaranteed[r] {
			return true
		}
	}
	return false
}

// candidates are the workloads Reclaim may take, in the order it tries
// them.
func (v *view) candidates(queue string, running []Workload) []Workload {
	var out []Workload
	for _, w := range running {
		if w.Queue == queue || !w.Preemptible {
			continue
		}
		if _, known := v.t.node(w.Queue); !known {
			continue
		}
		if v.t.Invalid(w.Queue) != "" {
			// A queue that admits nothing (malformed, or a namespace two
			// queues claim) keeps what runs: its guarantee is not known,
			// and a Queue an admin wrote wrong must not make running work
			// reclaimable (on make demo a second Queue naming team-a's
			// namespace had team-a's pods evicted within a second, as
			// borrowers of the new, guarantee-less queue).
			continue
		}
		out = append(out, w)
	}
	above := map[string]float64{}
	for _, w := range out {
		if _, ok := above[w.Queue]; !ok {
			above[w.Queue] = v.ratio(w.Queue, v.used[w.Queue], nil)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return evictFirst(out[i], out[j], above) })
	return out
}

// evictFirst is the order victims are tried in: lowest priority first,
// elastic extras before whole workloads, then the queue furthest above
// its fair share (above; nil: all equal), then newest, then by Key.
func evictFirst(a, b Workload, above map[string]float64) bool {
	switch {
	case a.Priority != b.Priority:
		return a.Priority < b.Priority
	case a.Extra != b.Extra:
		return a.Extra
	case above[a.Queue] != above[b.Queue]:
		return above[a.Queue] > above[b.Queue]
	case !a.Created.Equal(b.Created):
		return a.Created.After(b.Created)
	}
	return a.Key < b.Key
}

// fairShareEligible says why the asker's leaf, with the request, would be
// above its fair share (and its guarantee, if larger); "" when it is not.
func (v *view) fairShareEligible(a *admission) string {
	for _, r := range a.res {
		entitled := max(v.spec(a.queue).Guaranteed[r], v.fair[a.queue][r])
		if after := v.used[a.queue][r] + a.req[r]; after > entitled {
			return fmt.Sprintf("%d %s is above its fair share %d", after, r, v.fair[a.queue][r])
		}
	}
	return ""
}

// mayTake says whether w can be evicted for the asker after taken.
//
// Always: no queue on w's path goes below its guarantee in a resource w
// uses (victimKeepsGuarantee), but, with straddle, an extra member may take
// it below, from above it, by less than the asker taking back its
// guarantee is short of its own.
//
// Then, with d the deepest common ancestor of the asker and w: either
// every queue of the asker's path below d stays within its guarantee with
// the request (the asker takes back a guarantee, whatever d's own use), or
// the asker reclaims up to its fair share (fairOK) and, like Kueue's
// LessThanOrEqualToFinalShare, its side under d with the request is not
// above w's side after the eviction, each measured as its dominant used
// over fair share, so the victim cannot take it back in turn.
func (v *view) mayTake(a *admission, fairOK, straddle bool, taken map[string]quota.Resources, w Workload) (bool, string) {
	vpath := v.t.nodes[w.Queue].path
	i := 0
	for i < len(a.path) && i < len(vpath) && a.path[i] == vpath[i] {
		i++
	}
	if i == len(a.path) || i == len(vpath) {
		return false, fmt.Sprintf("%s's queue %s is on queue %s's path", w.Key, w.Queue, a.queue)
	}
	// within: every queue of the asker's path below d stays within its
	// guarantee with the request; short is the least any of them is short
	// of its guarantee before it, per resource asked.
	within := true
	short := quota.Resources{}
	for n, q := range a.path[i:] {
		for _, r := range a.res {
			left := v.spec(q).Guaranteed[r] - v.used[q][r]
			if a.req[r] > left {
				within = false
			}
			if n == 0 || left < short[r] {
				short[r] = left
			}
		}
	}
	if !within || !straddle {
		short = nil
	}
	if ok, why := v.victimKeepsGuarantee(a, taken, w, short); !ok {
		return false, why
	}
	if within {
		return true, fmt.Sprintf("queue %s stays at or above its guarantee", w.Queue)
	}
	if !fairOK {
		return false, fmt.Sprintf("queue %s would be above both its guarantee and its fair share", a.queue)
	}
	mine, theirs := a.path[i], vpath[i]
	// Each side by its dominant resource, over everything it uses: the
	// victim may use other GPU resources than the asker asks for (whole
	// GPUs against slices), and measured in the asker's it would always
	// look at 0. Recent use counts as in the queue order (Share): a queue
	// that used more lately runs less now, and reclaim does not undo that
	// (measured on current use alone, it took back from a queue without
	// history what the order had given it for the other's history: e2e
	// TestQueuesFairShareByHistory).
	ra := v.recentRatio(mine, v.used[mine].Sub(taken[mine]).Add(a.req))
	rb := v.recentRatio(theirs, v.used[theirs].Sub(taken[theirs]).Sub(w.Uses))
	if ra > rb {
		return false, fmt.Sprintf("after evicting %s, queue %s would be at %.3g of its fair share, below queue %s at %.3g", w.Key, theirs, rb, mine, ra)
	}
	return true, fmt.Sprintf("queue %s stays at or above queue %s's share of its fair share", theirs, mine)
}

// victimKeepsGuarantee says whether evicting w, after taken, leaves every
// queue on w's path below its deepest common ancestor with the asker at or
// above its guarantee in the resources w uses. The common ancestors and
// theirs are not asked: for them the eviction moves room from one child to
// another, none of it to another department (a department that
// guarantees whole GPUs, its own in use by one team's whole-GPU pods,
// refused its other team's slices their guarantee: a whole GPU freed for a
// slice lowered the department's whole GPUs, though the slice then uses
// that GPU, and the message blamed the sibling's borrowing).
//
// short, when not nil, is what the asker, taking back its guarantee, is
// short of it per resource (the least over its queues below the deepest
// common ancestor): a queue above its guarantee in r before this eviction
// may then fall below it, by less than short[r], when w is an extra member
// or w borrows more of r than the queue is then short (straddles).
func (v *view) victimKeepsGuarantee(a *admission, taken map[string]quota.Resources, w Workload, short quota.Resources) (bool, string) {
	vpath := v.t.nodes[w.Queue].path
	for i := len(vpath) - 1; i >= 0; i-- {
		q := vpath[i]
		if onPath(a.path, q) {
			break // a common ancestor, and so are all above it
		}
		before := v.used[q].Sub(taken[q])
		rest := before.Sub(w.Uses)
		for _, r := range positive(w.Uses) {
			g := v.spec(q).Guaranteed[r]
			if rest[r] >= g || quota.Straddles(before[r], rest[r], g, short, r, w.Extra) {
				continue
			}
			return false, fmt.Sprintf("evicting %s would put queue %s at %d %s, below its guarantee %d", w.Key, q, rest[r], r, g)
		}
	}
	return true, fmt.Sprintf("queue %s stays at or above its guarantee", w.Queue)
}

// recentRatio is ratio over every resource used, with the queue's recent
// use (its usage history over the half-life's steady state, as Share
// counts it) added to what it uses: the share of its fair share it has
// had lately and has now.
func (v *view) recentRatio(q string, used quota.Resources) float64 {
	out := v.ratio(q, used, nil) // a resource used without a fair share: +Inf
	for r, x := range v.lately(q, used) {
		if fs := v.fair[q][r]; fs > 0 { // history alone of a resource it is not entitled to: left out
			out = math.Max(out, x/float64(fs))
		}
	}
	return out
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

// CanPreempt reports whether a workload of queue asker, asking for req at a
// higher priority, may evict victim. Within one queue priority alone
// decides. Across queues the victim's queue must stay at or above its
// guarantee at every level of its path (the asker's ancestors counting the
// request), so a higher tier never takes a queue below its guarantee. An
// asker of no queue ("") is held to the victim's side only.
func (s *State) CanPreempt(asker string, req quota.Resources, victim Workload) (bool, string) {
	if !victim.Preemptible {
		return false, fmt.Sprintf("%s may not be evicted now", victim.Key)
	}
	if victim.Queue == asker {
		return true, "same queue"
	}
	v := s.view()
	a := &admission{v: v, queue: asker, req: req, res: positive(req), path: v.t.Path(asker)}
	if asker != "" {
		for _, check := range []admitCheck{checkKnown, checkValid} {
			if d := check(a); d != nil {
				return false, d.Reason
			}
		}
	}
	if _, known := v.t.node(victim.Queue); !known {
		return true, fmt.Sprintf("%s's queue %s is not defined, so nothing of it is guaranteed", victim.Key, victim.Queue)
	}
	return v.victimKeepsGuarantee(a, nil, victim, nil)
}
