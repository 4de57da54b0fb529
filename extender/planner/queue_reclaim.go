package planner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// QueueReclaim is what the gang planner asks of queue reclaim.
type QueueReclaim interface {
	// ReclaimFor frees room for askers (a workload of queue q asking for
	// want within its guarantee or fair share) when fits says they fit no
	// node state: it returns what it did and the pods gone once the room
	// is free (those already leaving and the victims), or why it cannot.
	ReclaimFor(ctx context.Context, snap *QueueSnapshot, q string, askers []*corev1.Pod, want quota.Resources, fits func(Snapshot) bool) (string, map[types.UID]bool, error)
	// PreemptOwnFor evicts lower-priority workloads of queue q itself so
	// that askers, which the queue's admission refused, are admitted and
	// fit (queue.State.PreemptOwn); it returns what it did and the pods
	// gone once the room is free, or why it cannot.
	PreemptOwnFor(ctx context.Context, snap *QueueSnapshot, q string, askers []*corev1.Pod, want quota.Resources, fits func(Snapshot) bool) (string, map[types.UID]bool, error)
}

// QueueReclaimer takes back, for a queue within its guarantee (or below
// its fair share), what other queues borrow: it evicts their workloads
// whole (a gang goes whole) through the Eviction API, the fewest whose
// removal makes the asker fit (allocator/queue Reclaim with the
// extender's placement as the test of "enough"), never taking any queue
// below its guarantee at any level, never a workload that started less
// than MinRuntime ago. A workload its PodDisruptionBudget protects (a dry
// run first) is passed over for BlockedFor and the choice made again; when
// every choice needs such workloads, they are taken anyway past their
// budgets where PastBudgets is set (a budget is a preference, as in
// kube-scheduler's preemption: a tenant's budget does not keep what its
// queue borrows), and the reclaim waits otherwise. Pods already leaving
// count as gone, so a reclaim in flight is not repeated.
type QueueReclaimer struct {
	// Ledger is the extender's ledger of nodes.
	Ledger  Ledger
	Evicter Evicter
	// PastBudgets, when set, ends the pods of workloads every choice needs
	// though their budgets refuse eviction; nil: such a reclaim waits.
	PastBudgets BudgetOverrider
	// Pods lists the pods (informer cache).
	Pods   func() ([]*corev1.Pod, error)
	Events EventRecorder
	// Metrics may be nil.
	Metrics    ReclaimMetrics
	MinRuntime time.Duration
	BlockedFor time.Duration
	// Hold is how long after an eviction the pods it was made for have to
	// get a GPU it freed for it to count as useful
	// (tessera_extender_reclaim_evictions_total); 0: 2 minutes.
	Hold time.Duration
	Now  func() time.Time
	// Gangs, when set, completes the victims' gangs (a PodGroup's
	// minMember, hence their extra members); nil reads api.GangOf.
	Gangs *GangBook

	blocked PassOver

	mu       sync.Mutex
	inflight Evictions       // evicted, maybe not yet seen leaving
	watches  []*reclaimWatch // evictions whose result is not known yet
	settling bool            // a settle tick is scheduled
}

// ReclaimMetrics counts queue reclaim's evictions (extender.Metrics).
type ReclaimMetrics interface {
	// ReclaimEvicted counts a pod of namespace ns evicted by reclaim.
	ReclaimEvicted(ns string)
	// ReclaimBlocked counts a workload of namespace ns whose eviction a
	// budget refused.
	ReclaimBlocked(ns string)
	// ReclaimSettled counts n evicted pods whose result is known: useful
	// when the pods they were evicted for got a GPU they freed.
	ReclaimSettled(useful bool, n int)
}

// reclaimWatch follows one evicted workload until its result is known.
type reclaimWatch struct {
	askers []types.UID
	// freed are the GPUs ("node/UUID") the workload's pods held; nodes
	// are the nodes where a pod held GPUs not named yet.
	freed map[string]bool
	nodes map[string]bool
	pods  int
	until time.Time
}

var _ QueueReclaim = (*QueueReclaimer)(nil)

func (r *QueueReclaimer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// ReclaimFor implements QueueReclaim.
func (r *QueueReclaimer) ReclaimFor(ctx context.Context, snap *QueueSnapshot, q string, askers []*corev1.Pod, want quota.Resources, fits func(Snapshot) bool) (string, map[types.UID]bool, error) {
	logger := klog.FromContext(ctx)
	pods, err := r.Pods()
	if err != nil {
		return "", nil, fmt.Errorf("listing pods: %w", err)
	}
	pastBudgets := false
	for attempt := 0; attempt < 5; attempt++ {
		victims, podsOf, gone, err := r.choose(snap, q, askers, want, pods, fits, !pastBudgets)
		if err != nil && !pastBudgets && r.PastBudgets != nil && len(r.blocked.Current(r.now())) > 0 {
			// No choice leaves out the workloads whose budgets refused:
			// choose among every workload, past their budgets.
			pastBudgets = true
			continue
		}
		if err != nil {
			return "", nil, err
		}
		if len(victims) == 0 {
			return "", gone, nil // room is being freed by pods that are leaving
		}
		if !pastBudgets {
			if blocker := r.dryRun(ctx, victims, podsOf); blocker != "" {
				logger.V(2).Info("Queue reclaim victim protected by a budget; choosing again", "queue", q, "victim", blocker)
				continue
			}
		}
		var over equota.BudgetOverrider // every choice needs the victims
		if pastBudgets {
			over = r.PastBudgets
		}
		var names []string
		var errs []error
		var askerUIDs []types.UID
		for _, p := range askers {
			askerUIDs = append(askerUIDs, p.UID)
		}
		evicted := map[types.UID]bool{} // a gang and one of its extras may both be victims
		for _, w := range victims {
			for _, p := range podsOf[w.Key] {
				gone[p.UID] = true
			}
			watch := &reclaimWatch{askers: askerUIDs, freed: map[string]bool{}, nodes: map[string]bool{}, until: r.now().Add(r.hold())}
			names = append(names, fmt.Sprintf("%s of queue %s", api.KeyName(w.Key), w.Queue))
			why := fmt.Sprintf("queue %s asks for %s within its guarantee or fair share; queue %s borrows beyond its own", q, equota.Describe(want), w.Queue)
			if w.Extra {
				why += "; " + api.ExtraMemberEvicted
			}
			for _, p := range podsOf[w.Key] {
				if evicted[p.UID] {
					continue
				}
				evicted[p.UID] = true
				past, err := equota.EvictOrPast(ctx, r.Evicter, over, p)
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("evicting %s/%s for queue %s: %w", p.Namespace, p.Name, q, err))
					continue
				}
				r.inflight.Add(p.UID, r.now())
				if r.Metrics != nil {
					r.Metrics.ReclaimEvicted(p.Namespace)
				}
				watch.add(r.Ledger, p)
				if past {
					r.event(p, corev1.EventTypeWarning, api.EventReclaimed, "tessera: deleted past its PodDisruptionBudget to reclaim for queue %s (every choice needs it: a budget does not keep what a queue borrows): %s", q, why)
					continue
				}
				r.event(p, corev1.EventTypeWarning, api.EventReclaimed, "tessera: evicted to reclaim for queue %s: %s", q, why)
			}
			r.watch(watch)
		}
		msg := fmt.Sprintf("queue %s reclaims %s: evicting %s", q, equota.Describe(want), strings.Join(names, ", "))
		for _, p := range askers {
			r.event(p, corev1.EventTypeNormal, api.EventQuotaReclaiming, "tessera: %s", msg)
		}
		logger.Info("Queue reclaim", "queue", q, "victims", names)
		return msg, gone, errors.Join(errs...)
	}
	return "", nil, &queue.ReclaimError{Queue: q, Reason: "every workload that could be reclaimed is protected by a PodDisruptionBudget"}
}

// choose decides the victims on the current ledger, the pods already
// leaving (gone) counted as gone; none when the askers fit once those are
// gone.
func (r *QueueReclaimer) choose(snap *QueueSnapshot, q string, askers []*corev1.Pod, want quota.Resources, pods []*corev1.Pod, fits func(Snapshot) bool, honourBudgets bool) (victims []queue.Workload, podsOf map[string][]*corev1.Pod, gone map[types.UID]bool, err error) {
	now := r.now()
	gone, groups := r.running(snap, pods, askers, now, func(string) bool { return true })
	base := without(r.Ledger.Snapshot(), gone)
	if fits(base) {
		return nil, nil, gone, nil
	}
	// Only workloads with a pod on a node some asker may run on are
	// candidates: GPUs freed elsewhere cannot serve the askers, and would
	// spend the victims' queues' surplus for nothing.
	allowed := make([]eligible.Pod, len(askers))
	for i, a := range askers {
		allowed[i] = eligible.For(a)
	}
	useful := map[string]bool{}
	for name, st := range base {
		for _, a := range allowed {
			if st.Admits(a) {
				useful[name] = true
				break
			}
		}
	}
	for k, members := range groups {
		keep := false
		for _, m := range members {
			keep = keep || useful[m.Spec.NodeName]
		}
		if !keep {
			delete(groups, k)
		}
	}
	running := r.workloads(snap, groups, now, honourBudgets)
	victims, err = snap.State.Reclaim(q, want, running, fitsWithout(base, groups, fits))
	return victims, groups, gone, err
}

// running sorts pods into those gone once the room is free (evicted by
// this reclaimer lately, or leaving) and, by UnitOf, the running GPU pods
// of the queues of (by queue name) that may be victims, askers left out.
func (r *QueueReclaimer) running(snap *QueueSnapshot, pods, askers []*corev1.Pod, now time.Time, of func(queue string) bool) (gone map[types.UID]bool, groups map[string][]*corev1.Pod) {
	asker := podUIDs(askers)
	gone = r.inflight.Current(now)
	groups = map[string][]*corev1.Pod{}
	for _, p := range pods {
		switch {
		case p.DeletionTimestamp != nil:
			gone[p.UID] = true
		case gone[p.UID]:
		case p.Spec.NodeName != "" && !gpureq.Ended(p) && !asker[p.UID]:
			if pq, queued := snap.QueueOf(p.Namespace); queued && of(pq) && len(gpureq.QuotaCount(p)) > 0 {
				groups[UnitOf(p)] = append(groups[UnitOf(p)], p)
			}
		}
	}
	return gone, groups
}

// fitsWithout is the enough test of a choice of victims: fits on base
// without the pods of the victims (by workload key, groups).
func fitsWithout(base Snapshot, groups map[string][]*corev1.Pod, fits func(Snapshot) bool) func([]queue.Workload) bool {
	return func(ws []queue.Workload) bool {
		g := map[types.UID]bool{}
		for _, w := range ws {
			for _, p := range groups[w.Key] {
				g[p.UID] = true
			}
		}
		return fits(without(base, g))
	}
}

// workloads are the queue Workloads of groups (running pods by UnitOf),
// each gang's extra members besides it, alone (added to groups under
// api.ExtraMemberKey); a workload younger than MinRuntime, or one whose
// budget refused an eviction lately (with honourBudgets), is not
// preemptible.
func (r *QueueReclaimer) workloads(snap *QueueSnapshot, groups map[string][]*corev1.Pod, now time.Time, honourBudgets bool) []queue.Workload {
	blocked := map[string]bool{}
	if honourBudgets {
		blocked = r.blocked.Current(now)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var running []queue.Workload
	for _, k := range keys {
		members := groups[k]
		wq, _ := snap.QueueOf(members[0].Namespace)
		w := queue.Workload{Key: k, Queue: wq, Uses: quota.Resources{}, Preemptible: !blocked[k]}
		for _, m := range members {
			w.Priority = max(w.Priority, corev1helpers.PodPriority(m))
			w.Uses = w.Uses.Add(gpureq.QuotaCount(m))
			started := gpureq.StartedAt(m)
			if started.After(w.Created) {
				w.Created = started
			}
			if now.Sub(started) < r.MinRuntime {
				w.Preemptible = false
			}
		}
		running = append(running, w)
		// An elastic gang's members beyond its minimum go alone, before
		// any whole workload (api.Gang.Extras, newest first); taking the
		// gang whole still ends every member.
		g, ok, gerr := r.Gangs.GangOf(members[0])
		if !ok || gerr != nil {
			continue
		}
		for _, e := range g.Extras(members, gpureq.StartedAt) {
			ek := api.ExtraMemberKey(k, e.Name)
			started := gpureq.StartedAt(e)
			groups[ek] = []*corev1.Pod{e}
			running = append(running, queue.Workload{Key: ek, Queue: wq, Priority: corev1helpers.PodPriority(e), Created: started,
				Uses: gpureq.QuotaCount(e), Preemptible: !blocked[ek] && now.Sub(started) >= r.MinRuntime, Extra: true})
		}
	}
	return running
}

// PreemptOwnFor implements QueueReclaim. Victims go through the Eviction
// API: a workload its PodDisruptionBudget protects is passed over next
// time (as reclaim's), and none is deleted past its budget.
func (r *QueueReclaimer) PreemptOwnFor(ctx context.Context, snap *QueueSnapshot, q string, askers []*corev1.Pod, want quota.Resources, fits func(Snapshot) bool) (string, map[types.UID]bool, error) {
	pods, err := r.Pods()
	if err != nil {
		return "", nil, fmt.Errorf("listing pods: %w", err)
	}
	now := r.now()
	var prio int32
	for i, a := range askers {
		if p := corev1helpers.PodPriority(a); i == 0 || p > prio {
			prio = p
		}
	}
	// A queue without running work of a lower priority has nothing to
	// give (the common case for the queue's waiting work of its own
	// tier): say so before building anything.
	lower := false
	for _, p := range pods {
		if p.Spec.NodeName != "" && corev1helpers.PodPriority(p) < prio && !gpureq.Ended(p) {
			if pq, queued := snap.QueueOf(p.Namespace); queued && pq == q {
				lower = true
				break
			}
		}
	}
	if !lower {
		return "", nil, fmt.Errorf("queue %s runs no workload of a lower priority than %d", q, prio)
	}
	gone, groups := r.running(snap, pods, askers, now, func(pq string) bool { return pq == q })
	// What the snapshot counts of the queue's use beyond what its pods
	// not leaving use now is freed: pods evicted a moment ago (this
	// preemption's, in flight) or seen leaving since the snapshot was
	// made. A pass (or a retry within one) right after an eviction must
	// not evict again for the same asker: on the e2e cluster a retry 200
	// ms later evicted two more notebooks.
	asker := podUIDs(askers)
	stays := quota.Resources{}
	for _, p := range pods {
		if pq, queued := snap.QueueOf(p.Namespace); queued && pq == q && !gone[p.UID] && !asker[p.UID] && usesQueue(p) {
			stays = stays.Add(gpureq.QuotaCount(p))
		}
	}
	freed := quota.Resources{}
	for r, v := range snap.State.Used[q] {
		if d := v - stays[r]; d > 0 {
			freed[r] = d
		}
	}
	base := without(r.Ledger.Snapshot(), gone)
	victims, err := snap.State.PreemptOwn(q, want, prio, r.workloads(snap, groups, now, true), freed, fitsWithout(base, groups, fits))
	if err != nil {
		return "", nil, err
	}
	if len(victims) == 0 {
		return "", gone, nil // what is leaving admits it and makes room
	}
	var names []string
	var errs []error
	evicted := map[types.UID]bool{}
	out := 0 // pods evicted
	for _, w := range victims {
		names = append(names, api.KeyName(w.Key))
		for _, p := range groups[w.Key] {
			if evicted[p.UID] {
				continue
			}
			evicted[p.UID] = true
			if _, err := equota.EvictOrPast(ctx, r.Evicter, nil, p); err != nil {
				if apierrors.IsTooManyRequests(err) {
					r.blocked.Add(w.Key, now.Add(r.blockedFor()))
				}
				if !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("evicting %s/%s for a higher tier of queue %s: %w", p.Namespace, p.Name, q, err))
				}
				continue
			}
			gone[p.UID] = true
			out++
			r.inflight.Add(p.UID, now)
			r.event(p, corev1.EventTypeWarning, api.EventPreempted, "tessera: evicted for %s of the same queue %s, of a higher priority (%d): the queue is at its guarantee, its limit or the cluster's capacity, and its lower tiers make room", askers[0].Namespace+"/"+askers[0].Name, q, prio)
		}
	}
	if out == 0 {
		return "", nil, errors.Join(errs...)
	}
	msg := fmt.Sprintf("preempting lower tiers of its own queue %s: evicting %s", q, strings.Join(names, ", "))
	for _, p := range askers {
		r.event(p, corev1.EventTypeNormal, api.EventPreempting, "tessera: %s", msg)
	}
	klog.FromContext(ctx).Info("Queue preempts its own lower tiers", "queue", q, "victims", names)
	return msg, gone, errors.Join(errs...)
}

func (r *QueueReclaimer) hold() time.Duration {
	if r.Hold > 0 {
		return r.Hold
	}
	return 2 * time.Minute
}

// add counts an evicted pod and the GPUs it held.
func (w *reclaimWatch) add(c Ledger, p *corev1.Pod) {
	w.pods++
	u, ok := c.Holds(p.UID)
	if !ok {
		w.nodes[p.Spec.NodeName] = true
		return
	}
	for _, g := range u.GPUs {
		w.freed[u.Node+"/"+g] = true
	}
	if u.Pending > 0 || u.Malformed {
		w.nodes[u.Node] = true
	}
}

// result says whether the askers got a GPU the workload freed (useful),
// or cannot any more (useless: the hold is over, or every asker is bound
// on GPUs all named and none of them freed by it); known is false while
// neither is so.
func (w *reclaimWatch) result(c Ledger, now time.Time) (useful, known bool) {
	settled := len(w.askers) > 0
	for _, uid := range w.askers {
		u, ok := c.Holds(uid)
		if !ok || u.Planned || u.Node == "" {
			settled = false
			continue
		}
		if w.nodes[u.Node] && (len(u.GPUs) > 0 || u.Pending > 0) {
			return true, true
		}
		for _, g := range u.GPUs {
			if w.freed[u.Node+"/"+g] {
				return true, true
			}
		}
		if u.Pending > 0 || u.Malformed {
			settled = false // its GPUs are not named yet
		}
	}
	if settled || now.After(w.until) {
		return false, true
	}
	return false, false
}

// watch follows an eviction until its result is known, checked every
// second.
func (r *QueueReclaimer) watch(w *reclaimWatch) {
	if w.pods == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watches = append(r.watches, w)
	if !r.settling {
		r.settling = true
		time.AfterFunc(time.Second, r.settleTick)
	}
}

func (r *QueueReclaimer) settleTick() {
	if r.settle(r.now()) > 0 {
		time.AfterFunc(time.Second, r.settleTick)
	}
}

// settle counts the evictions whose result is known now and returns how
// many are still followed.
func (r *QueueReclaimer) settle(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	left := r.watches[:0]
	for _, w := range r.watches {
		useful, known := w.result(r.Ledger, now)
		if !known {
			left = append(left, w)
			continue
		}
		if r.Metrics != nil {
			r.Metrics.ReclaimSettled(useful, w.pods)
		}
	}
	clear(r.watches[len(left):])
	r.watches = left
	if len(left) == 0 {
		r.settling = false
	}
	return len(left)
}

// dryRun checks every victim pod may be evicted; it returns the first
// refused workload (passed over for BlockedFor), or "".
func (r *QueueReclaimer) dryRun(ctx context.Context, victims []queue.Workload, podsOf map[string][]*corev1.Pod) string {
	for _, w := range victims {
		p, err := equota.FirstRefused(ctx, r.Evicter.Evict, podsOf[w.Key])
		if p == nil {
			continue
		}
		r.blocked.Add(w.Key, r.now().Add(r.blockedFor()))
		if r.Metrics != nil {
			r.Metrics.ReclaimBlocked(p.Namespace)
		}
		r.event(p, corev1.EventTypeWarning, api.EventReclaimBlocked, "tessera: queue reclaim passed over %s: pod %s cannot be evicted: %v", w.Key, p.Name, err)
		return w.Key
	}
	return ""
}

func (r *QueueReclaimer) event(pod *corev1.Pod, typ, reason, format string, args ...any) {
	if r.Events != nil && pod != nil {
		r.Events.Eventf(pod, typ, reason, format, args...)
	}
}

// blockedFor is how long a workload whose budget refused an eviction is
// passed over (BlockedFor; 0: a minute).
func (r *QueueReclaimer) blockedFor() time.Duration {
	if r.BlockedFor > 0 {
		return r.BlockedFor
	}
	return time.Minute
}
