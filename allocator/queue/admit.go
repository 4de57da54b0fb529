package queue

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// Decision is the answer to an admission question.
type Decision struct {
	Allowed bool
	// Borrowing is true when the request takes some queue on the path
	// above its guarantee: the work may later be reclaimed.
	Borrowing bool
	// Reason explains a refusal, or what was borrowed; it names the
	// queue, the resource and the numbers.
	Reason string
}

// admission is one Admit question, as the checks see it.
type admission struct {
	v     *view
	queue string
	path  []string // root first
	req   quota.Resources
	res   []corev1.ResourceName // what req asks for, sorted
}

// An admitCheck returns a decision to stop with, or nil to go on.
type admitCheck func(a *admission) *Decision

// admitChecks run in order; the first decision is the answer. Past the
// last one the request borrows, and is allowed.
var admitChecks = []admitCheck{
	checkKnown,
	checkLeaf,
	checkValid,
	checkLimits,
	checkWithinGuarantee,
	checkWeight,
	checkWithinFairShare,
	checkCapacity,
	checkLending,
}

// Admit decides whether queue may start work using req. Within its
// guarantee at every level of its path it is allowed; beyond it the queue
// borrows, only from what the other queues' guarantees do not need (a
// queue never lends what its guarantee needs).
func (s *State) Admit(queue string, req quota.Resources) Decision {
	a := &admission{v: s.view(), queue: queue, req: req, res: positive(req)}
	a.path = a.v.t.Path(queue)
	for _, check := range admitChecks {
		if d := check(a); d != nil {
			return *d
		}
	}
	return Decision{Allowed: true, Borrowing: true, Reason: a.borrowed()}
}

func refuse(format string, args ...any) *Decision {
	return &Decision{Reason: fmt.Sprintf(format, args...)}
}

func checkKnown(a *admission) *Decision {
	if a.path == nil {
		return refuse("queue %s is not defined", a.queue)
	}
	return nil
}

func checkLeaf(a *admission) *Decision {
	if !a.v.t.isLeaf(a.queue) {
		return refuse("queue %s has child queues (%s): only leaf queues admit work", a.queue, strings.Join(a.v.t.Children(a.queue), ", "))
	}
	return nil
}

func checkValid(a *admission) *Decision {
	if why := a.v.t.Invalid(a.queue); why != "" {
		return refuse("queue %s admits nothing until it is fixed: %s", a.queue, why)
	}
	return nil
}

// checkLimits: every queue on the path, leaf first, stays within its limit.
func checkLimits(a *admission) *Decision {
	for i := len(a.path) - 1; i >= 0; i-- {
		q := a.path[i]
		lim := a.v.spec(q).Limit
		for _, r := range a.res {
			l, ok := lim[r]
			if after := a.v.used[q][r] + a.req[r]; ok && after > l {
				return refuse("queue %s would use %d %s, above its limit %d", q, after, r, l)
			}
		}
	}
	return nil
}

// overGuarantee returns the first queue on the path, leaf first, and
// resource in which the request takes the queue above its guarantee, with
// what the queue would then claim (claimOnPath).
func (a *admission) overGuarantee() (string, corev1.ResourceName, int64, bool) {
	claim := map[corev1.ResourceName]int64{}
	for i := len(a.path) - 1; i >= 0; i-- {
		q := a.path[i]
		for _, r := range a.res {
			claim[r] = a.claimOnPath(i, r, claim[r])
			if claim[r] > a.v.spec(q).Guaranteed[r] {
				return q, r, claim[r], true
			}
		}
	}
	return "", "", 0, false
}

// claimOnPath is what the request makes the queue at a.path[i] claim of r
// against its guarantee, given below, the claim of the queue after it on
// the path: for the leaf, its use with the request; above it, the claim
// below plus what the queue's other children keep (kept). Their use
// beyond that is borrowed, and the asker takes it back by reclaim: a
// team within its guarantee is within its department's too while a
// sibling team borrows the rest, even when that borrowing has the
// department at its own guarantee.
func (a *admission) claimOnPath(i int, r corev1.ResourceName, below int64) int64 {
	q := a.path[i]
	if i == len(a.path)-1 {
		return a.v.used[q][r] + a.req[r]
	}
	for _, c := range a.v.t.Children(q) {
		if c != a.path[i+1] {
			below += a.v.kept(c, r)
		}
	}
	return below
}

// kept is what of queue q's use of r reclaim by a queue outside q's
// subtree must leave it: its use up to its guarantee, or up to what its
// children keep when their guarantees add up to more (no queue on a
// victim's path is taken below its guarantee).
func (v *view) kept(q string, r corev1.ResourceName) int64 {
	var children int64
	for _, c := range v.t.Children(q) {
		children += v.kept(c, r)
	}
	return min(v.used[q][r], max(v.spec(q).Guaranteed[r], children))
}

func checkWithinGuarantee(a *admission) *Decision {
	if _, _, _, over := a.overGuarantee(); !over {
		return &Decision{Allowed: true, Reason: fmt.Sprintf("queue %s stays within its guarantee at every level", a.queue)}
	}
	return nil
}

// checkWeight: a queue weighing 0 borrows nothing beyond its guarantee.
func checkWeight(a *admission) *Decision {
	for i := len(a.path) - 1; i >= 0; i-- {
		q := a.path[i]
		sp := a.v.spec(q)
		for _, r := range a.res {
			if after := a.v.used[q][r] + a.req[r]; after > sp.Guaranteed[r] && sp.weight(r) == 0 {
				return refuse("queue %s would use %d %s, above its guarantee %d, and its weight for %s is 0: it borrows nothing", q, after, r, sp.Guaranteed[r], r)
			}
		}
	}
	return nil
}

// checkWithinFairShare: a leaf that stays within its fair share with the
// request (FairShare: what the queues' guarantees, weights and demands give
// it of the cluster) borrows, and is allowed even when the queues fill the
// cluster: what other queues use beyond their own fair shares is reclaimed
// for it (Reclaim, docs/queues.md step 4). Without it, the capacity check
// below refused such a request whenever others' borrowing filled the
// cluster, and reclaim for a fair share was never reached (on make demo a
// team using 8 of its fair share of 12 waited for ever behind a team using
// 20 of its 16).
func checkWithinFairShare(a *admission) *Decision {
	if a.v.fairShareEligible(a) != "" {
		return nil
	}
	return &Decision{Allowed: true, Borrowing: true, Reason: a.borrowed()}
}

func checkCapacity(a *admission) *Decision {
	total := a.v.totalUsed()
	for _, r := range a.res {
		if after := total[r] + a.req[r]; after > a.v.s.Capacity[r] {
			return refuse("queue %s would borrow %s, but the queues would use %d of the cluster's %d", a.queue, r, after, a.v.s.Capacity[r])
		}
	}
	return nil
}

// checkLending: what the cluster has left after the request still covers
// every other queue's unmet guaranteed demand, min(guaranteed, used +
// pending) − used. "Other queues" are the siblings of each queue on the
// asker's path (top-level queues included), each counted for its whole
// subtree at its own level, so a guarantee is never counted twice.
func checkLending(a *admission) *Decision {
	total := a.v.totalUsed()
	for _, r := range a.res {
		left := a.v.s.Capacity[r] - total[r] - a.req[r]
		var need int64
		var who []string
		for _, q := range a.others() {
			if n := a.v.unmetGuarantee(q, r); n > 0 {
				need += n
				who = append(who, fmt.Sprintf("%s %d", q, n))
			}
		}
		if left < need {
			return refuse("queue %s would borrow %s, but after the request the cluster would have %d left while other queues' unmet guarantees need %d (%s)", a.queue, r, left, need, strings.Join(who, ", "))
		}
	}
	return nil
}

// others are the queues beside the asker's path: the siblings of every
// queue on it, sorted.
func (a *admission) others() []string {
	var out []string
	parent := ""
	for _, q := range a.path {
		for _, sib := range a.v.t.Children(parent) {
			if sib != q {
				out = append(out, sib)
			}
		}
		parent = q
	}
	sort.Strings(out)
	return out
}

// unmetGuarantee is what a queue's guarantee of r still needs:
// min(guaranteed, demand) − used, at least 0; with State.Waiting, only
// what of it the waiting work that could start within the guarantee
// needs.
func (v *view) unmetGuarantee(q string, r corev1.ResourceName) int64 {
	n := max(min(v.spec(q).Guaranteed[r], v.demand[q][r])-v.used[q][r], 0)
	if v.startable != nil {
		n = min(n, v.startable[q][r])
	}
	return n
}

func (a *admission) borrowed() string {
	q, r, claim, _ := a.overGuarantee()
	return fmt.Sprintf("queue %s borrows: %s would use %d %s, above its guarantee %d", a.queue, q, claim, r, a.v.spec(q).Guaranteed[r])
}
