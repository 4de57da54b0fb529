package extender

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/preempt"
	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// PreemptClient is what the preemptor writes to the API server.
type PreemptClient interface {
	// Evict evicts a pod through the Eviction API (a dry run when dryRun).
	Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error
	// SetPlan writes (sealed) or, with "", removes a pod's plan.
	SetPlan(ctx context.Context, pod *corev1.Pod, value string) error
}

// PlanWriter writes (sealed) or, with "", removes a pod's plan
// (planner.KubeGang).
type PlanWriter interface {
	SetPlan(ctx context.Context, pod *corev1.Pod, value string) error
}

var _ PlanWriter = (*planner.KubeGang)(nil)

// KubePreempt is the PreemptClient of a real API server.
type KubePreempt struct {
	Evicter *KubeEvicter
	Gang    PlanWriter
}

var _ PreemptClient = (*KubePreempt)(nil)

func (k *KubePreempt) Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error {
	return k.Evicter.Evict(ctx, pod, dryRun)
}

func (k *KubePreempt) SetPlan(ctx context.Context, pod *corev1.Pod, value string) error {
	return k.Gang.SetPlan(ctx, pod, value)
}

// Preemptor makes room for a pending GPU pod of a higher priority by
// evicting pods of lower priorities, whatever the shapes: a slice may
// evict whole-GPU pods, a whole-GPU pod may evict slices, a large slice
// may evict the slices that fragment a GPU. kube-scheduler cannot see
// these cases (a node's slice resources read 0 while its GPUs are used
// whole; its dry run keeps every slice as the node's memory units add
// up), so Tessera decides them itself.
//
// For each pending pod kube-scheduler found unschedulable (highest
// priority first, then oldest) that fits no node even once the pods
// already leaving are gone, it chooses the node and the fewest,
// least important victims whose removal makes the pod fit there, at GPU
// level (allocator/preempt, with the extender's own fit). Victims are
// whole workloads (a gang goes whole) of lower priority, that have run at
// least MinRuntime, that quota lets go (a namespace is never taken under
// its ElasticQuota min by another namespace), and that their
// PodDisruptionBudgets let go (a dry run first; a refused workload is
// passed over and the choice made again). A pod its namespace's
// ElasticQuota refuses fits nowhere whatever the GPUs: its victims must
// also bring the namespace within its quota, which only its own
// lower-priority workloads can do (choose). A pod whose preemptionPolicy is
// Never preempts nothing.
//
// The room freed goes to the pod it was freed for: the pod gets a sealed
// plan (api.GangPlan) naming the node (and the GPU, for a slice), which
// the ledger counts and the filter honours, so no other pod takes it. The
// plan expires after HoldFor; an expired plan of a pod that did not bind
// is removed, with an Event and the useless-preemption metric.
//
// Sync is not safe for concurrent use: run it from one goroutine (Run).
type Preemptor struct {
	Cache  *Cache
	Client PreemptClient
	// Pods lists the pods (from the informer's cache).
	Pods   func() ([]*corev1.Pod, error)
	Policy allocator.Policy
	Events EventRecorder
	// Metrics may be nil.
	Metrics *Metrics
	// HoldsOnly: it releases expired holds (of room quota reclaim freed)
	// and preempts for no pod (--preemption=false).
	HoldsOnly bool
	// Quota may be nil: no quota rule applies.
	Quota *equota.Enforcer
	// Queues may be nil: no queue rule applies. With queues, no victim is
	// taken whose queue would go below its guarantee at any level.
	Queues *planner.QueueBook
	// MinRuntime protects pods that started less than this long ago.
	MinRuntime time.Duration
	// HoldFor is how long the freed room is held for the asker (default
	// 2m).
	HoldFor time.Duration
	// BlockedFor is how long a workload a budget protected is passed over
	// (default 1m).
	BlockedFor time.Duration
	// PastBudgets, when set, ends the pods of victims every choice needs
	// past their PodDisruptionBudgets, as kube-scheduler's preemption does
	// (a budget is a preference: victims it protects are passed over
	// while another choice makes room). Nil: such a preemption waits.
	PastBudgets equota.BudgetOverrider
	Now         func() time.Time
	// FruitlessFor is how long a gang for which nothing could be
	// preempted is not asked about again (default 10s): a waiting gang is
	// planned on every planner pass, and each ask lists every pod and
	// plans the whole gang again.
	FruitlessFor time.Duration
	// Gangs, when set, completes the victims' gangs (a PodGroup's
	// minMember, hence their extra members); nil reads api.GangOf.
	Gangs *planner.GangBook
	// NominationGrace is how long a pod kube-scheduler's preemption
	// nominated a node for is left to it (default
	// DefaultNominationGrace).
	NominationGrace time.Duration

	blocked planner.PassOver
	// fruitless are the gangs (by unit key) ForGang found nothing to
	// preempt for lately.
	fruitless planner.PassOver

	// evicted are the pods this preemptor evicted: the informer may not
	// show them leaving yet.
	evicted planner.Evictions
	// nominations are the nodes kube-scheduler nominated for pending
	// pods, as first seen (leftToScheduler).
	nominations map[types.UID]nomination
}

func (p *Preemptor) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Run calls Sync every period until ctx is done.
func (p *Preemptor) Run(ctx context.Context, period time.Duration) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if err := p.Sync(ctx); err != nil {
			logger.Info("Preemption pass failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sync makes one pass: it releases expired holds, then preempts for the
// pods that need it.
func (p *Preemptor) Sync(ctx context.Context) error {
	pods, err := p.Pods()
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	var errs []error
	var askers []*corev1.Pod
	now := p.now()
	pending := map[types.UID]bool{}
	for _, pod := range pods {
		switch {
		case p.expired(pod):
			errs = append(errs, p.release(ctx, pod))
		case !p.HoldsOnly && mayPreempt(pod) && (p.Queues == nil || !p.Queues.Queued(pod.Namespace)):
			// A pod of a queued namespace is the planner's: it asks For
			// in queue order.
			pending[pod.UID] = true
			if !p.leftToScheduler(pod, now) {
				askers = append(askers, pod)
			}
		}
	}
	for uid := range p.nominations {
		if !pending[uid] {
			delete(p.nominations, uid)
		}
	}
	if len(askers) == 0 {
		return errors.Join(errs...)
	}
	qsnap := p.queues()
	sort.Slice(askers, func(i, j int) bool {
		a, b := corev1helpers.PodPriority(askers[i]), corev1helpers.PodPriority(askers[j])
		if a != b {
			return a > b
		}
		if !askers[i].CreationTimestamp.Equal(&askers[j].CreationTimestamp) {
			return askers[i].CreationTimestamp.Before(&askers[j].CreationTimestamp)
		}
		return askers[i].Namespace+"/"+askers[i].Name < askers[j].Namespace+"/"+askers[j].Name
	})
	for _, a := range askers {
		if _, err := p.preemptFor(ctx, a, pods, qsnap); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// queues is the queues' state now: nil without queues, or when it cannot
// be read (no queue rule applies then, as without queues).
func (p *Preemptor) queues() *planner.QueueSnapshot {
	if p.Queues == nil {
		return nil
	}
	snap, err := p.Queues.Snapshot()
	if err != nil {
		return nil
	}
	return snap
}

// mayPreempt reports a pending GPU pod kube-scheduler found unschedulable
// that may preempt: not a gang member (the gang planner places gangs),
// without a plan, with a priority and no preemptionPolicy Never.
func mayPreempt(pod *corev1.Pod) bool {
	return gpureq.PendingUnschedulable(pod) && preempts(pod)
}

// DefaultNominationGrace is how long the preemptor leaves a pod to
// kube-scheduler's own preemption once it nominated a node for it.
const DefaultNominationGrace = 10 * time.Second

// nomination is a node kube-scheduler nominated for a pod, and when the
// preemptor first saw it.
type nomination struct {
	node string
	seen time.Time
}

// leftToScheduler reports a pod kube-scheduler's own preemption nominated
// a node for within NominationGrace: it is evicting the victims there
// (asynchronously: the informer may not show them leaving yet), and
// preempting for the pod meanwhile would evict a second set of victims
// for it (make demo showed it: an elastic gang lost two members to one
// 4-GPU pod). A nomination kept longer (kube-scheduler keeps a stale one
// when its next preemption finds no candidate) no longer holds the
// preemptor back. It records the nominations it sees in nominations and
// forgets the others.
func (p *Preemptor) leftToScheduler(pod *corev1.Pod, now time.Time) bool {
	node := pod.Status.NominatedNodeName
	if node == "" {
		delete(p.nominations, pod.UID)
		return false
	}
	if p.nominations == nil {
		p.nominations = map[types.UID]nomination{}
	}
	n, ok := p.nominations[pod.UID]
	if !ok || n.node != node {
		n = nomination{node: node, seen: now}
		p.nominations[pod.UID] = n
	}
	grace := p.NominationGrace
	if grace == 0 {
		grace = DefaultNominationGrace
	}
	return now.Sub(n.seen) < grace
}

// preempts reports a GPU pod outside any gang with a priority and no
// preemptionPolicy Never.
func preempts(pod *corev1.Pod) bool {
	if !tierPreempts(pod) {
		return false
	}
	if _, member, _ := api.GangOf(pod); member {
		return false
	}
	return len(gpureq.QuotaCount(pod)) > 0
}

// tierPreempts reports a pod with a priority (as the API server set it
// from its class) and no preemptionPolicy Never.
func tierPreempts(pod *corev1.Pod) bool {
	if corev1helpers.PodPriority(pod) == 0 {
		return false
	}
	return pod.Spec.PreemptionPolicy == nil || *pod.Spec.PreemptionPolicy != corev1.PreemptNever
}

// claimant is who asks to preempt: a pod, or a gang's members.
type claimant struct {
	// who names it in Events and logs ("namespace/name", "gang
	// namespace/name").
	who string
	ns  string
	// prio is its priority (a gang's lowest member priority); req what it
	// asks for in all.
	prio int32
	req  quota.Resources
	// self are its pods; unit its own unit key (never a victim).
	self map[types.UID]bool
	unit string
}

// podClaimant is pod as a claimant.
func podClaimant(pod *corev1.Pod) claimant {
	return claimant{who: pod.Namespace + "/" + pod.Name, ns: pod.Namespace, prio: corev1helpers.PodPriority(pod), req: gpureq.QuotaCount(pod),
		self: map[types.UID]bool{pod.UID: true}, unit: planner.UnitOf(pod)}
}

// expired reports a pod outside any gang, not bound, whose plan (a hold of
// preempted room) has expired.
func (p *Preemptor) expired(pod *corev1.Pod) bool {
	if pod.Spec.NodeName != "" || gpureq.Ended(pod) {
		return false
	}
	plan, ok, err := api.GetGangPlan(pod.Annotations)
	if !ok || err != nil || !p.now().After(plan.Expires) {
		return false
	}
	_, member, _ := api.GangOf(pod)
	return !member
}

func (p *Preemptor) release(ctx context.Context, pod *corev1.Pod) error {
	if err := p.Client.SetPlan(ctx, pod, ""); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing the hold of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	p.Cache.ReleaseGang([]types.UID{pod.UID})
	p.Metrics.preemptionUseless()
	p.event(pod, corev1.EventTypeWarning, api.EventPreemptionExpired, "tessera: the room freed for this pod (by preemption or quota reclaim) was held until its plan expired and the pod did not bind there; the hold is released and the pod is considered again")
	klog.FromContext(ctx).Info("Released an expired preemption hold", "pod", klog.KObj(pod))
	return nil
}

// For preempts for a queued pod the planner could not place (it is held
// by the queue gate, so kube-scheduler never finds it unschedulable): the
// same choice as for any pod; the plan it writes is the planner's to
// honour (it lifts the gate). It reports whether it evicted.
func (p *Preemptor) For(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if !preempts(pod) || pod.Spec.NodeName != "" {
		return false, nil
	}
	if _, planned := pod.Annotations[api.AnnotationGangPlan]; planned {
		return false, nil
	}
	pods, err := p.Pods()
	if err != nil {
		return false, fmt.Errorf("listing pods: %w", err)
	}
	return p.preemptFor(ctx, pod, pods, p.queues())
}

// split sorts pods into those gone once the room is free (leaving, or
// evicted by this preemptor in the last two minutes: the informer shows a
// pod leaving well before) and the others bound and running, so that an
// eviction in flight is neither repeated nor replaced by another.
func (p *Preemptor) split(pods []*corev1.Pod, now time.Time) (gone map[types.UID]bool, running []*corev1.Pod) {
	gone = p.evicted.Current(now)
	for _, pod := range pods {
		switch {
		case pod.DeletionTimestamp != nil:
			gone[pod.UID] = true
		case gone[pod.UID]:
		case pod.Spec.NodeName != "" && !gpureq.Ended(pod):
			running = append(running, pod)
		}
	}
	return gone, running
}

// workload is one eviction unit and its pods.
type workload struct {
	unit preempt.Unit
	w    quota.Workload
	pods []*corev1.Pod
}

// preemptFor makes room for asker when it fits nowhere, or does nothing;
// it reports whether it evicted. A victim a budget protects is passed
// over and the choice made again; when no choice leaves such victims out,
// with PastBudgets they are chosen among the others and deleted past
// their budgets.
func (p *Preemptor) preemptFor(ctx context.Context, asker *corev1.Pod, pods []*corev1.Pod, qsnap *planner.QueueSnapshot) (bool, error) {
	logger := klog.FromContext(ctx)
	d, err := ParseDemand(asker)
	if err != nil {
		return false, nil // the filter reports it on the pod
	}
	pastBudgets := false
	for attempt := 0; attempt < 5; attempt++ {
		c := p.choose(asker, &d, pods, qsnap, pastBudgets)
		if c == nil {
			if p.mayGoPastBudgets(pastBudgets) {
				pastBudgets = true
				continue
			}
			return false, nil
		}
		if !pastBudgets {
			if blocker := p.dryRun(ctx, podClaimant(asker), []*corev1.Pod{asker}, c.victims); blocker != "" {
				logger.V(2).Info("Preemption victim protected by a budget; choosing again", "pod", klog.KObj(asker), "victim", blocker)
				continue
			}
		}
		return true, p.apply(ctx, asker, &d, c, p.overrider(pastBudgets))
	}
	return false, nil
}

// mayGoPastBudgets reports that a preemption that found no choice without
// the victims budgets protected may choose again among every victim: it
// has not yet (past), PastBudgets is set, and some victim is passed over.
func (p *Preemptor) mayGoPastBudgets(past bool) bool {
	return !past && p.PastBudgets != nil && len(p.blocked.Current(p.now())) > 0
}

// overrider is what ends the victims past their budgets: PastBudgets when
// the choice was made past them, else nil (evictions only).
func (p *Preemptor) overrider(pastBudgets bool) equota.BudgetOverrider {
	if pastBudgets {
		return p.PastBudgets
	}
	return nil
}

// decision is a preemption chosen for a pod: the node, the victims, and
// the node's state without them.
type decision struct {
	node    string
	victims []*workload
	after   *NodeState
	// quota says why the pod's namespace's ElasticQuota refuses it, when
	// it does: the victims bring the namespace within its quota too.
	quota string
}

// choose decides a preemption for asker on the current snapshot: nil
// when asker fits somewhere already (or will, once leaving pods are
// gone) or when no preemption makes room.
//
// A pod its namespace's ElasticQuota refuses (above its max, or borrowing
// beyond what can be lent) fits nowhere whatever the GPUs: when its
// namespace's lower-priority workloads would admit it (the filter calls
// the refusal resolvable), the victims must also bring the namespace
// within its quota (quota.State.AdmitsWithout). kube-scheduler's dry run
// offers the preempt verb only the victims the node's room needs, which
// leave the namespace above its max (make demo: a 4-GPU pod of a
// namespace at its max of 8 waited for ever beside its own 8 one-GPU pods
// of a lower priority), so Tessera decides these itself. Every node's
// candidate offers, besides its own units, the namespace's units on other
// nodes (preempt.Unit.Elsewhere: they free quota, not room there).
func (p *Preemptor) choose(asker *corev1.Pod, d *Demand, pods []*corev1.Pod, qsnap *planner.QueueSnapshot, pastBudgets bool) *decision {
	now := p.now()
	gone, running := p.split(pods, now)
	base := without(p.Cache.Snapshot(), gone)
	c := podClaimant(asker)
	qs := p.quotaState(c, gone)
	refused := ""
	if qs != nil {
		if v := qs.Admit(c.ns, c.req); !v.Allowed {
			refused = v.Reason
		}
	}
	// Only nodes asker may go to (package eligible): room freed on the
	// others cannot serve it, and room free on them is no reason to wait.
	allowed := eligible.For(asker)
	var nodes []*NodeState
	for _, st := range base {
		if st.Admits(allowed) {
			if refused == "" && Check(st, d) == Fits {
				return nil // kube-scheduler will place it (or the room is being freed)
			}
			nodes = append(nodes, st)
		}
	}
	units, unitsOf := p.units(c, running, now, qsnap, qs, pastBudgets)
	podsOf := func(victims []preempt.Unit) map[types.UID]*corev1.Pod {
		g := map[types.UID]*corev1.Pod{}
		for _, v := range victims {
			for _, pod := range units[v.Key].pods {
				g[pod.UID] = pod
			}
		}
		return g
	}
	// admitted: quota admits asker once the victims are gone (always,
	// when it admits it now).
	admitted := func(victims []preempt.Unit) bool { return true }
	var own []preempt.Unit // the namespace's units, for its quota
	if refused != "" {
		for _, w := range units {
			if w.w.Namespace == c.ns {
				own = append(own, w.unit)
			}
		}
		admitted = func(victims []preempt.Unit) bool {
			g := podsOf(victims)
			ps := make([]*corev1.Pod, 0, len(g))
			for _, pod := range g {
				ps = append(ps, pod)
			}
			// A gang and its extra members are units of their own: each
			// pod counts once.
			return qs.AdmitsWithout(c.ns, c.req, equota.Workloads(ps))
		}
		if !admitted(own) {
			return nil // nothing of its own namespace it may evict admits it
		}
	}
	var cands []preempt.Candidate
	for _, st := range nodes {
		cand := preempt.Candidate{Node: st.Info.Name}
		seen := map[string]bool{}
		for uid := range st.Pods {
			for _, k := range unitsOf[uid] {
				if w, ok := units[k]; ok && !seen[k] {
					seen[k] = true
					cand.Units = append(cand.Units, w.unit)
				}
			}
		}
		for _, u := range own {
			if !seen[u.Key] {
				u.Elsewhere = true
				cand.Units = append(cand.Units, u)
			}
		}
		sort.Slice(cand.Units, func(i, j int) bool { return cand.Units[i].Key < cand.Units[j].Key })
		if len(cand.Units) > 0 {
			cands = append(cands, cand)
		}
	}
	stateWithout := func(node string, victims []preempt.Unit) *NodeState {
		g := map[types.UID]bool{}
		for uid := range podsOf(victims) {
			g[uid] = true
		}
		return without(map[string]*NodeState{node: base[node]}, g)[node]
	}
	choice, ok := preempt.Choose(cands, func(node string, victims []preempt.Unit) bool {
		return admitted(victims) && Check(stateWithout(node, victims), d) == Fits
	})
	if !ok {
		return nil
	}
	out := &decision{node: choice.Node, after: stateWithout(choice.Node, choice.Victims), quota: refused}
	for _, v := range choice.Victims {
		out.victims = append(out.victims, units[v.Key])
	}
	return out
}

// quotaState is the ElasticQuota state as c's namespace sees it, c's own
// pods and those in gone (leaving, or evicted lately) not counted; nil
// without quota, or when it cannot be read (no quota rule applies then).
func (p *Preemptor) quotaState(c claimant, gone map[types.UID]bool) *quota.State {
	if p.Quota == nil {
		return nil
	}
	v, err := p.Quota.Ledger.View(c.ns, func(pod *corev1.Pod) bool { return c.self[pod.UID] || gone[pod.UID] })
	if err != nil {
		return nil
	}
	return v.State
}

// units are the workloads c may evict, by unit key: every pod of the
// workload of lower priority than c, run at least MinRuntime, not
// passed over for a budget (unless pastBudgets), and let go by quota and
// queues (qs, the ElasticQuota state: nil, none); never c's own. An elastic
// gang running more members than its minMember is also offered member by
// member for those beyond the minimum, newest first (its whole is still a
// unit: taking that ends every member, so it never drops below its
// minimum). unitsOf gives each pod's units.
func (p *Preemptor) units(c claimant, running []*corev1.Pod, now time.Time, qsnap *planner.QueueSnapshot, qs *quota.State, pastBudgets bool) (map[string]*workload, map[types.UID][]string) {
	prio := c.prio
	groups := map[string][]*corev1.Pod{}
	for _, pod := range running {
		if len(gpureq.QuotaCount(pod)) == 0 || c.self[pod.UID] {
			continue
		}
		k := planner.UnitOf(pod)
		if k == c.unit {
			continue
		}
		groups[k] = append(groups[k], pod)
	}
	blocked := p.blocked.Current(now)
	if pastBudgets {
		blocked = nil
	}
	req := c.req
	askerQueue, _ := qsnap.QueueOf(c.ns)
	out := map[string]*workload{}
	unitsOf := map[types.UID][]string{}
	for k, members := range groups {
		if blocked[k] {
			continue
		}
		ws := equota.Workloads(members)
		if len(ws) != 1 {
			continue
		}
		w := &workload{w: ws[0], pods: members, unit: preempt.Unit{Key: k, Priority: ws[0].Priority, Pods: len(members)}}
		ok := true
		for _, m := range members {
			started := gpureq.StartedAt(m)
			if started.After(w.unit.Started) {
				w.unit.Started = started
			}
			if corev1helpers.PodPriority(m) >= prio || now.Sub(started) < p.MinRuntime {
				ok = false
			}
		}
		if ok && qs != nil {
			ok, _ = qs.CanPreempt(c.ns, req, w.w)
		}
		if vq, queued := qsnap.QueueOf(members[0].Namespace); ok && queued {
			ok, _ = qsnap.State.CanPreempt(askerQueue, req, queue.Workload{Key: k, Queue: vq, Uses: w.w.Uses, Preemptible: true})
		}
		if !ok {
			continue
		}
		out[k] = w
		for _, m := range members {
			unitsOf[m.UID] = append(unitsOf[m.UID], k)
		}
		for _, e := range p.extras(members) {
			ek := api.ExtraMemberKey(k, e.Name)
			if blocked[ek] {
				continue
			}
			ew := equota.Workloads([]*corev1.Pod{e})[0]
			out[ek] = &workload{w: ew, pods: []*corev1.Pod{e}, unit: preempt.Unit{Key: ek, Priority: w.unit.Priority, Started: gpureq.StartedAt(e), Pods: 1, Extra: true}}
			unitsOf[e.UID] = append(unitsOf[e.UID], ek)
		}
	}
	return out, unitsOf
}

// extras are the running members of an elastic gang beyond its
// minMember, newest first (api.Gang.Extras); none for a pod outside a gang
// or a gang without a known minimum.
func (p *Preemptor) extras(members []*corev1.Pod) []*corev1.Pod {
	g, ok, err := p.Gangs.GangOf(members[0])
	if !ok || err != nil {
		return nil
	}
	return g.Extras(members, gpureq.StartedAt)
}

// dryRun checks every victim pod may be evicted for c (askers are its
// pods); it returns the first refused workload (passed over for
// BlockedFor), or "".
func (p *Preemptor) dryRun(ctx context.Context, c claimant, askers []*corev1.Pod, victims []*workload) string {
	for _, v := range victims {
		pod, err := equota.FirstRefused(ctx, p.Client.Evict, v.pods)
		if pod == nil {
			continue
		}
		d := p.BlockedFor
		if d <= 0 {
			d = time.Minute
		}
		p.blocked.Add(v.unit.Key, p.now().Add(d))
		p.Metrics.preemptionBlocked()
		msg := fmt.Sprintf("tessera: preemption for %s passed over %s: pod %s cannot be evicted: %v", c.who, v.unit.Key, pod.Name, err)
		for _, a := range askers {
			p.event(a, corev1.EventTypeWarning, api.EventPreemptionBlocked, "%s", msg)
		}
		p.event(pod, corev1.EventTypeWarning, api.EventPreemptionBlocked, "%s", msg)
		return v.unit.Key
	}
	return ""
}

// apply evicts the victims of c (past their budgets through over, when
// set) and holds the freed room for asker with a plan on c's node.
func (p *Preemptor) apply(ctx context.Context, asker *corev1.Pod, d *Demand, c *decision, over equota.BudgetOverrider) error {
	node, victims, after := c.node, c.victims, c.after
	logger := klog.FromContext(ctx)
	hold := p.HoldFor
	if hold <= 0 {
		hold = 2 * time.Minute
	}
	plan, err := HoldPlan(p.Policy, after, asker, d, p.now().Add(hold))
	if err != nil {
		return fmt.Errorf("preemption for %s/%s: %w", asker.Namespace, asker.Name, err)
	}
	ann := map[string]string{}
	if err := api.SetGangPlan(ann, plan); err != nil {
		return fmt.Errorf("preemption for %s/%s: %w", asker.Namespace, asker.Name, err)
	}
	var names []string
	for _, v := range victims {
		names = append(names, fmt.Sprintf("%s (priority %d)", api.KeyName(v.unit.Key), v.unit.Priority))
	}
	where := plan.Where()
	// The hold first: once a victim is gone its room must not be taken by
	// another pod before the asker's plan is recorded.
	if err := p.Client.SetPlan(ctx, asker, ann[api.AnnotationGangPlan]); err != nil {
		return fmt.Errorf("preemption for %s/%s: writing the plan: %w", asker.Namespace, asker.Name, err)
	}
	needs, makes := "fits no node", "makes room on "+where
	if c.quota != "" {
		needs = fmt.Sprintf("is refused by its namespace's ElasticQuota (%s)", c.quota)
		makes = fmt.Sprintf("brings namespace %s within its quota and makes room on %s", asker.Namespace, where)
	}
	err = p.evict(ctx, podClaimant(asker), victims, over, func(v *workload) string {
		return fmt.Sprintf("tessera: evicted for %s/%s (priority %d), which needs %s and %s: %s (priority %d) is among the pods of the lowest priorities whose removal %s; the room is held for %s/%s until %s",
			asker.Namespace, asker.Name, corev1helpers.PodPriority(asker), equota.Describe(gpureq.QuotaCount(asker)), needs, api.KeyName(v.unit.Key), v.unit.Priority, makes, asker.Namespace, asker.Name, plan.Expires.Format(time.RFC3339))
	})
	if c.quota != "" {
		p.event(asker, corev1.EventTypeNormal, api.EventPreempting, "tessera: its namespace's ElasticQuota refuses it (%s): evicting %s to bring namespace %s within its quota and make room on %s; the room is held for this pod until %s",
			c.quota, strings.Join(names, ", "), asker.Namespace, where, plan.Expires.Format(time.RFC3339))
	} else {
		p.event(asker, corev1.EventTypeNormal, api.EventPreempting, "tessera: evicting %s to make room on %s; the room is held for this pod until %s",
			strings.Join(names, ", "), where, plan.Expires.Format(time.RFC3339))
	}
	logger.Info("Preempting", "pod", klog.KObj(asker), "node", node, "victims", names, "expires", plan.Expires, "quota", c.quota)
	return err
}

// HoldPlan is the plan that holds room on node after (its state once the
// pods leaving for it are gone) for pod, a pod outside any gang asking d,
// until expires: for a slice its GPU, as the policy places it (a
// multi-GPU slice is planned without one: it holds its GPU count of the
// node's GPUs, and its bind places it); for whole GPUs the GPUs
// ChooseWholeGPUs names, so that no slice takes a GPU the pods leaving for
// it still use. Tier preemption and quota reclaim write it before they
// evict.
func HoldPlan(policy allocator.Policy, after *NodeState, pod *corev1.Pod, d *Demand, expires time.Time) (api.GangPlan, error) {
	node := after.Info.Name
	plan := api.GangPlan{Gang: pod.Name, Node: node, Expires: expires.UTC().Truncate(time.Second)}
	if d.Kind() == allocator.Shared {
		u, err := ChoosePlacement(policy, after, pod.UID, d)
		if err != nil || len(u.Shared) == 0 {
			return plan, fmt.Errorf("placing the slice on %s: %v", node, err)
		}
		if d.gpus() == 1 {
			plan.GPU = &api.GPURef{UUID: u.Shared[0].UUID, Index: u.Shared[0].Index}
		}
	} else if gpus, ok := ChooseWholeGPUs(after, d); ok {
		plan.GPUs = gpus
	}
	return plan, nil
}

// evict evicts the victims' pods for c, with a Preempted Event (why says
// why the victim goes) on each and the preemption metric; with over (a
// choice made past budgets), a pod its budget keeps is deleted.
func (p *Preemptor) evict(ctx context.Context, c claimant, victims []*workload, over equota.BudgetOverrider, why func(v *workload) string) error {
	var errs []error
	for _, v := range victims {
		msg := why(v)
		if v.unit.Extra {
			msg += "; " + api.ExtraMemberEvicted
		}
		for _, pod := range v.pods {
			past, err := equota.EvictOrPast(ctx, p.Client, over, pod)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("evicting %s/%s for %s: %w", pod.Namespace, pod.Name, c.who, err))
				continue
			}
			p.evicted.Add(pod.UID, p.now())
			p.Metrics.preempted(pod.Namespace)
			if past {
				p.event(pod, corev1.EventTypeWarning, api.EventPreempted, "%s; deleted past its PodDisruptionBudget (every choice of victims needs it: a budget does not keep a lower tier's GPUs from a higher one)", msg)
				continue
			}
			p.event(pod, corev1.EventTypeWarning, api.EventPreempted, "%s", msg)
		}
	}
	return errors.Join(errs...)
}

func (p *Preemptor) event(pod *corev1.Pod, typ, reason, format string, args ...any) {
	if p.Events != nil && pod != nil {
		p.Events.Eventf(pod, typ, reason, format, args...)
	}
}
