package quota

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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Evicter evicts pods through the Eviction API, which honours
// PodDisruptionBudgets: a budget that forbids the eviction answers 429
// (extender.KubeEvicter fits).
type Evicter interface {
	// Evict evicts the pod; with dryRun the API server only checks that
	// it may (budgets included).
	Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error
}

// BudgetOverrider ends a pod its PodDisruptionBudget keeps from eviction
// (extender.KubeEvicter: a deletion conditional on the pod's UID, as
// kube-scheduler's preemption does).
type BudgetOverrider interface {
	DeletePastBudget(ctx context.Context, pod *corev1.Pod) error
}

// FirstRefused dry-runs the eviction of every pod and returns the first
// one the API server refuses (a budget), with the refusal; nil when all
// may go (a pod already gone may go).
func FirstRefused(ctx context.Context, evict func(context.Context, *corev1.Pod, bool) error, pods []*corev1.Pod) (*corev1.Pod, error) {
	for _, p := range pods {
		if err := evict(ctx, p, true); err != nil && !apierrors.IsNotFound(err) {
			return p, err
		}
	}
	return nil, nil
}

// EvictOrPast evicts pod through ev; with over set (a reclaim past
// budgets), a pod its budget keeps from eviction (429) is deleted through
// over instead, and past says so.
func EvictOrPast(ctx context.Context, ev Evicter, over BudgetOverrider, pod *corev1.Pod) (past bool, err error) {
	err = ev.Evict(ctx, pod, false)
	if over != nil && apierrors.IsTooManyRequests(err) {
		return true, over.DeletePastBudget(ctx, pod)
	}
	return false, err
}

// EventRecorder records Kubernetes Events (record.EventRecorder fits).
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Metrics counts reclaim's evictions (extender.Metrics fits).
type Metrics interface {
	// ReclaimEvicted counts a pod of namespace evicted by reclaim.
	ReclaimEvicted(namespace string)
	// ReclaimBlocked counts a workload of namespace whose eviction a
	// budget refused.
	ReclaimBlocked(namespace string)
}

// Nodes is the GPU ledger as reclaim sees it (extender.QuotaNodes).
type Nodes interface {
	// Tracks reports whether the ledger still counts the pod: an eviction
	// is in flight until the pod is seen leaving.
	Tracks(uid types.UID) bool
	// PodFits returns the test of whether a pending pod fits a node it may
	// use, or why its request cannot be read.
	PodFits(pod *corev1.Pod) (Fits, error)
}

// RoomHolder is implemented by a Nodes that can hold the room reclaim
// frees for a pending pod outside any gang on one node of the GPU ledger
// (extender.QuotaRoom: a sealed plan on the pod, as tier preemption
// writes), so that no other pod takes the freed GPUs while the victims
// leave: the quota hold alone keeps out only namespaces that would borrow.
type RoomHolder interface {
	// HoldRoom holds room for pod, until expires, on a node where it fits
	// once the pods gone have left; it says where ("GPU 3 of node n1").
	HoldRoom(ctx context.Context, pod *corev1.Pod, gone map[types.UID]bool, expires time.Time) (string, error)
}

// Fits tests whether waiting work fits the GPU ledger. Reclaim calls it
// once per decision with the pods already leaving (gone): it reads the
// ledger then, and returns the test of each choice of victims, whether
// the work fits once they are gone too.
type Fits func(gone map[types.UID]bool) func(victims map[types.UID]bool) bool

// Enforcer applies ElasticQuota at the extender's edges: admission at
// filter and gang planning, reclaim by eviction, quota-aware preemption.
// Decisions are the pure functions of allocator/quota on states built
// afresh from the informers; evictions happen outside every lock.
type Enforcer struct {
	Ledger *Ledger
	// Nodes is the GPU ledger (reclaim's fit tests).
	Nodes   Nodes
	Evicter Evicter
	// PastBudgets, when set, ends the pods of workloads every choice needs
	// though their budgets refuse eviction (a budget is a preference, as in
	// kube-scheduler's preemption: a tenant's budget does not keep what its
	// namespace borrows above its min); nil: such a reclaim waits.
	PastBudgets BudgetOverrider
	// Pod reads a pod from the informer cache (preempt victims).
	Pod func(namespace, name string) (*corev1.Pod, error)
	// Events and Metrics may be nil.
	Events  EventRecorder
	Metrics Metrics
	// HoldFor is how long reclaimed room is held for the asker (default 2m).
	HoldFor time.Duration
	// BlockedFor is how long a workload whose eviction a budget refused is
	// passed over (default 1m).
	BlockedFor time.Duration
	Now        func() time.Time
	// GangOf reads a victim's gang for the preempt verb's gang rules; nil
	// is api.GangOf (a PodGroup gang's minMember then unknown: no extra
	// members go alone).
	GangOf GangOf

	mu       sync.Mutex
	inflight map[types.UID]time.Time // evicted, not yet seen leaving
	blocked  map[string]time.Time    // workload key -> passed over until
	// reclaimedFor: plain pods room was reclaimed for, until when no more
	// is reclaimed for them (their hold's end).
	reclaimedFor map[types.UID]time.Time
	queue        chan types.NamespacedName
	once         sync.Once
}

func (e *Enforcer) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Enforcer) init() {
	e.once.Do(func() {
		e.inflight = map[types.UID]time.Time{}
		e.blocked = map[string]time.Time{}
		e.reclaimedFor = map[types.UID]time.Time{}
		e.queue = make(chan types.NamespacedName, 256)
	})
}

// AdmitPod decides at filter. A pod already counted (planned or reserved)
// is not counted twice.
func (e *Enforcer) AdmitPod(ctx context.Context, pod *corev1.Pod) Verdict {
	req := Use(pod)
	if len(req) == 0 {
		return Verdict{Allowed: true}
	}
	if st, err := e.Ledger.FastState(pod.Namespace, pod.UID); err == nil && st != nil {
		if _, governed := st.Quotas[pod.Namespace]; !governed {
			return Verdict{Allowed: true}
		}
		if d := st.Admit(pod.Namespace, req); d.Allowed {
			return Verdict{Allowed: true, WithinMin: !d.Borrowing, Message: d.Reason}
		}
		// Refused: the full view explains it (and may see it afresh).
	}
	v, err := e.Ledger.View(pod.Namespace, func(p *corev1.Pod) bool { return p.UID == pod.UID })
	if err != nil {
		// Quota cannot be read: the GPU checks still protect the nodes.
		klog.FromContext(ctx).Info("Quota state unavailable; admitting", "pod", klog.KObj(pod), "err", err)
		return Verdict{Allowed: true}
	}
	if _, governed := v.State.Quotas[pod.Namespace]; !governed {
		return Verdict{Allowed: true}
	}
	return AdmitRequest(v, pod.Namespace, corev1helpers.PodPriority(pod), req, "pod "+pod.Name)
}

// AdmitGang decides for a whole gang before it is planned.
func (e *Enforcer) AdmitGang(ctx context.Context, ns string, members []*corev1.Pod) Verdict {
	uids := map[types.UID]bool{}
	req := core.Resources{}
	var prio int32
	counted := false
	for _, m := range members {
		uids[m.UID] = true
		req = req.Add(Use(m))
		prio = max(prio, corev1helpers.PodPriority(m))
		counted = counted || e.Ledger.Counted(m)
	}
	if !counted {
		// The usual case, gated members that count for nothing yet: the
		// index answers an admission.
		if st, err := e.Ledger.FastState(ns, ""); err == nil && st != nil {
			if _, governed := st.Quotas[ns]; !governed {
				return Verdict{Allowed: true}
			}
			if d := st.Admit(ns, req); d.Allowed {
				return Verdict{Allowed: true, WithinMin: !d.Borrowing, Message: d.Reason}
			}
		}
	}
	v, err := e.Ledger.View(ns, func(p *corev1.Pod) bool { return uids[p.UID] })
	if err != nil {
		klog.FromContext(ctx).Info("Quota state unavailable; admitting the gang", "namespace", ns, "err", err)
		return Verdict{Allowed: true}
	}
	if _, governed := v.State.Quotas[ns]; !governed {
		return Verdict{Allowed: true}
	}
	name := fmt.Sprintf("%d members", len(members))
	if len(members) > 0 {
		if g, ok, err := api.GangOf(members[0]); ok && err == nil {
			name = fmt.Sprintf("gang %s (%d members)", g.Name, len(members))
		}
	}
	return AdmitRequest(v, ns, prio, req, name)
}

// NoRoom queues the pod for a reclaim pass (Run); it never blocks.
func (e *Enforcer) NoRoom(pod *corev1.Pod) {
	e.init()
	select {
	case e.queue <- types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}:
	default:
	}
}

// Run reclaims for pending pods until ctx is done: those NoRoom queues,
// and every period the pods of governed namespaces that kube-scheduler
// found unschedulable (a full cluster fails kube-scheduler's own resource
// check before the extender's filter is asked). Each is read afresh and,
// while still pending and fitting no node, gets room by ReclaimFor.
func (e *Enforcer) Run(ctx context.Context, period time.Duration) {
	e.init()
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case key := <-e.queue:
			if err := e.ReclaimForPod(ctx, key); err != nil {
				logger.V(2).Info("No reclaim for pod", "pod", key, "err", err)
			}
		case <-t.C:
			for _, key := range e.Unschedulable() {
				if err := e.ReclaimForPod(ctx, key); err != nil {
					logger.V(3).Info("No reclaim for pod", "pod", key, "err", err)
				}
			}
		}
	}
}

// ReclaimQueued reclaims for the next pod NoRoom queued, as Run would; it
// reports false, without waiting, when none is queued.
func (e *Enforcer) ReclaimQueued(ctx context.Context) (bool, error) {
	e.init()
	select {
	case key := <-e.queue:
		return true, e.ReclaimForPod(ctx, key)
	default:
		return false, nil
	}
}

// Unschedulable lists the pods of governed namespaces that kube-scheduler
// marked unschedulable and that ask for a governed resource, oldest first.
func (e *Enforcer) Unschedulable() []types.NamespacedName {
	var pods []*corev1.Pod
	for ns := range e.Ledger.Quotas.Quotas() {
		list, err := e.Ledger.Pods(ns)
		if err != nil {
			continue
		}
		for _, p := range list {
			if gpureq.PendingUnschedulable(p) && len(Use(p)) > 0 {
				pods = append(pods, p)
			}
		}
	}
	sort.Slice(pods, func(i, j int) bool {
		if !pods[i].CreationTimestamp.Equal(&pods[j].CreationTimestamp) {
			return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp)
		}
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
	out := make([]types.NamespacedName, len(pods))
	for i, p := range pods {
		out[i] = types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
	return out
}

// ReclaimForPod reads the pod afresh and, while it is still pending and
// fits no node it may use (Nodes.PodFits), gets it room as ReclaimFor
// does, once per hold (HoldFor): a pod room was reclaimed for gets no more
// until its hold ends.
func (e *Enforcer) ReclaimForPod(ctx context.Context, key types.NamespacedName) error {
	e.init()
	pod, err := e.Pod(key.Namespace, key.Name)
	if err != nil {
		return fmt.Errorf("reading pod: %w", err)
	}
	if pod.Spec.NodeName != "" || gpureq.Ended(pod) || api.HasGangGate(pod) {
		return nil
	}
	if _, planned := pod.Annotations[api.AnnotationGangPlan]; planned {
		return nil
	}
	if until, ok := e.reclaimedRecently(pod.UID); ok {
		// Room was reclaimed for it already: it is kube-scheduler's to
		// take. Reclaiming again at every resync while it has not bound
		// evicted a borrower every 2 s on make demo, where each victim's
		// replacement (a whole GPU) took the GPU freed for a slice before
		// the node advertised its slice capacity again.
		klog.FromContext(ctx).V(2).Info("Room was reclaimed for the pod; not again before its hold ends", "pod", klog.KObj(pod), "until", until)
		return nil
	}
	fits, err := e.Nodes.PodFits(pod)
	if err != nil {
		return err
	}
	r, err := e.Choose(ctx, pod.Namespace, []*corev1.Pod{pod}, fits)
	if err != nil {
		return err
	}
	if r.Victims() {
		until := e.now().Add(e.holdFor())
		e.mu.Lock()
		e.reclaimedFor[pod.UID] = until
		e.mu.Unlock()
		if h, ok := e.Nodes.(RoomHolder); ok {
			// The room first, then the evictions.
			where, err := h.HoldRoom(ctx, pod, r.Gone, until)
			if err != nil {
				klog.FromContext(ctx).Info("The room reclaimed for the pod is held by quota only", "pod", klog.KObj(pod), "err", err)
			} else {
				r.Msg += "; the room is held for it on " + where
			}
		}
	}
	return r.Evict(ctx)
}

// reclaimedRecently reports whether room was reclaimed for pod less than
// a hold ago, and until when no more is; it forgets those whose time is up.
func (e *Enforcer) reclaimedRecently(uid types.UID) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	for k, until := range e.reclaimedFor {
		if !now.Before(until) {
			delete(e.reclaimedFor, k)
		}
	}
	until, ok := e.reclaimedFor[uid]
	return until, ok
}

// holdFor is how long reclaimed room is held (HoldFor, default 2m).
func (e *Enforcer) holdFor() time.Duration {
	if e.HoldFor <= 0 {
		return 2 * time.Minute
	}
	return e.HoldFor
}

func workloadKey(w core.Workload) string { return w.Namespace + "/" + w.Name }

// extraWorkloads are the extra members of the elastic gang whose running
// members are pods (none for a pod outside a gang, or a gang without a
// known minimum), each a workload of its own ("gang NAME member POD"),
// newest first.
func (e *Enforcer) extraWorkloads(pods []*corev1.Pod) []core.Workload {
	if len(pods) == 0 {
		return nil
	}
	g, ok, err := e.gangOf()(pods[0])
	if !ok || err != nil {
		return nil
	}
	var out []core.Workload
	for _, x := range g.Extras(pods, gpureq.StartedAt) {
		out = append(out, core.Workload{Namespace: x.Namespace, Name: api.ExtraMemberKey(api.GangUnitKey(g.Name), x.Name), Priority: corev1helpers.PodPriority(x),
			Created: gpureq.StartedAt(x), Uses: Use(x), Pods: []string{x.Name}, Extra: true})
	}
	return out
}

// ErrNothingGuaranteed is wrapped when reclaim is not due: the asking
// namespace has no quota or would be above its min.
var ErrNothingGuaranteed = errors.New("reclaim not due")

// choice is a decided reclaim: the workloads to evict and their pods.
type choice struct {
	victims []core.Workload
	pods    map[string][]*corev1.Pod // workload key -> pods
	// gone are the pods counted gone before the choice: those leaving and
	// those whose eviction is in flight.
	gone  map[types.UID]bool
	state *core.State
	req   core.Resources
}

// decide chooses the victims under e.mu; Reclaim.Evict marks their pods
// in flight.
func (e *Enforcer) decide(ns string, askers []*corev1.Pod, fits Fits, honourBudgets bool) (*choice, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	asker := map[types.UID]bool{}
	req := core.Resources{}
	for _, p := range askers {
		asker[p.UID] = true
		req = req.Add(Use(p))
	}
	v, err := e.Ledger.View(ns, func(p *corev1.Pod) bool { _, evicting := e.inflight[p.UID]; return asker[p.UID] || evicting })
	if err != nil {
		return nil, err
	}
	// Forget evictions that the informer shows leaving or gone (or that
	// are old: the informer missed them).
	for uid, at := range e.inflight {
		if !e.Nodes.Tracks(uid) || now.Sub(at) > 2*time.Minute {
			delete(e.inflight, uid)
		}
	}
	for _, p := range v.Leaving {
		delete(e.inflight, p.UID)
	}
	for k, until := range e.blocked {
		if now.After(until) {
			delete(e.blocked, k)
		}
	}
	if _, governed := v.State.Quotas[ns]; !governed {
		return nil, fmt.Errorf("%w for %s: the namespace has no quota", ErrNothingGuaranteed, ns)
	}
	if d := v.State.Admit(ns, req); !d.Allowed || d.Borrowing {
		return nil, fmt.Errorf("%w for %s: %s", ErrNothingGuaranteed, ns, d.Reason)
	}
	gone := map[types.UID]bool{}
	for uid := range e.inflight {
		gone[uid] = true
	}
	for _, p := range v.Leaving {
		gone[p.UID] = true
	}
	fitsWithout := fits(gone)
	byName := map[string]*corev1.Pod{}
	var cand []*corev1.Pod
	for _, p := range v.Pods {
		if !asker[p.UID] {
			cand = append(cand, p)
			byName[p.Namespace+"/"+p.Name] = p
		}
	}
	podsOf := func(w core.Workload) []*corev1.Pod {
		out := make([]*corev1.Pod, 0, len(w.Pods))
		for _, n := range w.Pods {
			out = append(out, byName[w.Namespace+"/"+n])
		}
		return out
	}
	var running []core.Workload
	for _, w := range Workloads(cand) {
		// An elastic gang's members beyond its minimum go alone, before
		// any whole workload of their priority (api.Gang.Extras, newest
		// first), as in tier preemption and queue reclaim; taking the gang
		// whole still ends every member.
		for _, x := range append([]core.Workload{w}, e.extraWorkloads(podsOf(w))...) {
			if _, blocked := e.blocked[workloadKey(x)]; !blocked || !honourBudgets {
				running = append(running, x)
			}
		}
	}
	victims, err := v.State.Reclaim(ns, req, running, func(ws []core.Workload) bool {
		g := map[types.UID]bool{}
		for _, w := range ws {
			for _, p := range podsOf(w) {
				g[p.UID] = true
			}
		}
		return fitsWithout(g)
	})
	if err != nil {
		return nil, err
	}
	c := &choice{victims: victims, pods: map[string][]*corev1.Pod{}, gone: gone, state: v.State, req: req}
	for _, w := range victims {
		c.pods[workloadKey(w)] = podsOf(w)
	}
	return c, nil
}

// holdUses is what a reclaim holds for the asking namespace: its request
// and, in the resources its request does not name, what the victims free
// there. Across GPU shapes (whole GPUs freed for a slice, which asks
// memory and cores) the request alone held nothing a borrower of whole
// GPUs needs: on make demo each victim's replacement was admitted and
// took the GPU freed for the slice.
func (c *choice) holdUses() core.Resources {
	uses := core.Resources{}.Add(c.req)
	freed := core.Resources{}
	for _, w := range c.victims {
		freed = freed.Add(w.Uses)
	}
	for r, v := range freed {
		if uses[r] == 0 && v > 0 {
			uses[r] = v
		}
	}
	return uses
}

// release forgets in-flight evictions of pods (their eviction failed).
func (e *Enforcer) release(pods []*corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pods {
		delete(e.inflight, p.UID)
	}
}

// anyBlocked reports whether a workload is passed over for its budget.
func (e *Enforcer) anyBlocked() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.blocked) > 0
}

// block passes over workload key (its budget refused an eviction) for
// BlockedFor.
func (e *Enforcer) block(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.BlockedFor
	if d <= 0 {
		d = time.Minute
	}
	e.blocked[key] = e.now().Add(d)
}

// ReclaimFor frees room for askers of namespace ns within its min, when
// fits says they fit nowhere once the pods already leaving are gone: it
// chooses the victims (Choose) and evicts them at once (Reclaim.Evict). It
// returns what it did, or why it cannot.
func (e *Enforcer) ReclaimFor(ctx context.Context, ns string, askers []*corev1.Pod, fits Fits) (string, error) {
	r, err := e.Choose(ctx, ns, askers, fits)
	if err != nil {
		return "", err
	}
	return r.Msg, r.Evict(ctx)
}

// Reclaim is a reclaim chosen for the askers of a namespace, not yet
// carried out.
type Reclaim struct {
	// Msg says what the reclaim does, for the askers' wait reason.
	Msg string
	// Gone are the pods gone once the room is free: those already leaving
	// (or evicted by an earlier reclaim) and the victims' pods.
	Gone map[types.UID]bool

	e      *Enforcer
	ns     string
	askers []*corev1.Pod
	c      *choice
	// pastBudgets: the victims' pods whose budgets refuse are deleted.
	pastBudgets bool
}

// Victims reports whether the reclaim evicts anything: without victims the
// room is being freed by pods that are leaving.
func (r *Reclaim) Victims() bool { return r != nil && len(r.c.victims) > 0 }

// Choose decides how to free room for askers of namespace ns within its
// min, when fits says they fit nowhere once the pods already leaving are
// gone, and evicts nothing. The victims are whole workloads of namespaces
// above their min (allocator/quota Reclaim: lowest priority first, newest
// first, never taking a namespace under its own min, and only those whose
// freed room serves the askers). A workload a PodDisruptionBudget protects
// (429, checked for every member with a dry run, so that a gang is never
// half evicted) is passed over and reported, and the choice is made again
// without it; when no choice leaves such workloads out, with PastBudgets
// set they are chosen anyway and Evict deletes the pods whose budgets
// still refuse. The caller plans the askers on the room without Gone, holds
// it, and then calls Evict: evicting first let a victim's replacement (a
// Deployment's, made at once and not gated) be bound into the freed room
// before the askers' plan held it.
func (e *Enforcer) Choose(ctx context.Context, ns string, askers []*corev1.Pod, fits Fits) (*Reclaim, error) {
	e.init()
	logger := klog.FromContext(ctx)
	var blockedMsgs []string
	defer func() {
		if len(blockedMsgs) == 0 {
			return
		}
		for _, p := range askers {
			e.event(p, corev1.EventTypeWarning, api.EventReclaimBlocked, "tessera: quota reclaim for namespace %s passed over %d workload(s) whose PodDisruptionBudgets refuse eviction: %s", ns, len(blockedMsgs), strings.Join(blockedMsgs, "; "))
		}
	}()
	pastBudgets := false
	for attempt := 0; attempt < 9; attempt++ {
		c, err := e.decide(ns, askers, fits, !pastBudgets)
		if err != nil && !pastBudgets && e.PastBudgets != nil && e.anyBlocked() && !errors.Is(err, ErrNothingGuaranteed) {
			// No choice leaves out the workloads whose budgets refused:
			// choose among every workload, past their budgets.
			pastBudgets = true
			continue
		}
		if err != nil {
			if len(blockedMsgs) > 0 {
				err = fmt.Errorf("%w; passed over as their PodDisruptionBudgets refuse eviction: %s", err, strings.Join(blockedMsgs, "; "))
			}
			return nil, err
		}
		r := &Reclaim{Gone: c.gone, e: e, ns: ns, askers: askers, c: c, pastBudgets: pastBudgets}
		if len(c.victims) == 0 {
			r.Msg = "room is being freed by pods that are leaving"
			return r, nil
		}
		if pastBudgets {
			var names []string
			for _, w := range c.victims {
				names = append(names, fmt.Sprintf("%s of namespace %s (%d pods)", w.Name, w.Namespace, len(w.Pods)))
				for _, p := range c.pods[workloadKey(w)] {
					r.Gone[p.UID] = true
				}
			}
			r.Msg = fmt.Sprintf("namespace %s is under its min and needs %s: evicting %s, past their PodDisruptionBudgets where they refuse (every choice needs them)", ns, Describe(c.req), strings.Join(names, ", "))
			return r, nil
		}
		// API calls, outside the lock: a dry run for every pod of every
		// victim.
		retry := false
		var names []string
		for _, w := range c.victims {
			pods := c.pods[workloadKey(w)]
			if blocker, err := FirstRefused(ctx, e.Evicter.Evict, pods); blocker != nil {
				e.block(workloadKey(w))
				msg := fmt.Sprintf("%s of namespace %s cannot be evicted: pod %s: %v", w.Name, w.Namespace, blocker.Name, err)
				blockedMsgs = append(blockedMsgs, msg)
				logger.Info("Reclaim victim refused", "namespace", ns, "victim", workloadKey(w), "pod", blocker.Name, "err", err)
				if e.Metrics != nil {
					e.Metrics.ReclaimBlocked(w.Namespace)
				}
				// On the pod whose budget refused, once per BlockedFor
				// (the workload is passed over until then); the askers
				// hear of every refusal once, when the choice is made.
				e.event(blocker, corev1.EventTypeWarning, api.EventReclaimBlocked, "tessera: quota reclaim for namespace %s: %s", ns, msg)
				retry = true
				continue
			}
			names = append(names, fmt.Sprintf("%s of namespace %s (%d pods)", w.Name, w.Namespace, len(w.Pods)))
			for _, p := range pods {
				r.Gone[p.UID] = true
			}
		}
		if retry {
			continue // choose again without the refused workloads
		}
		r.Msg = fmt.Sprintf("namespace %s is under its min and needs %s: evicting %s", ns, Describe(c.req), strings.Join(names, ", "))
		return r, nil
	}
	return nil, &core.ReclaimError{Namespace: ns, Reason: "every workload that could be reclaimed is protected by a PodDisruptionBudget: " + strings.Join(blockedMsgs, "; ")}
}

// Evict carries the reclaim out: it holds the room for the namespace
// (Ledger.Hold) until its work starts, then evicts the victims' pods
// through the Eviction API, with a Reclaimed Event on each and a
// QuotaReclaiming Event on each asker. Pods already gone are skipped;
// the errors of the others are joined. Without victims it does nothing.
func (r *Reclaim) Evict(ctx context.Context) error {
	if !r.Victims() {
		return nil
	}
	e, c, ns := r.e, r.c, r.ns
	logger := klog.FromContext(ctx)
	e.mu.Lock()
	now := e.now()
	for _, w := range c.victims {
		for _, p := range c.pods[workloadKey(w)] {
			e.inflight[p.UID] = now
		}
	}
	e.mu.Unlock()
	// The room is held for ns before the first eviction: a victim's
	// replacement, made by its controller at once, would otherwise borrow
	// it while the evictions are still under way.
	e.Ledger.Hold(ns, string(r.askers[0].UID), c.state.Used[ns], c.holdUses(), e.holdFor())
	var over BudgetOverrider
	if r.pastBudgets {
		over = e.PastBudgets
	}
	var errs []error
	for _, w := range c.victims {
		why := e.why(c, ns, w)
		for _, p := range c.pods[workloadKey(w)] {
			past, err := EvictOrPast(ctx, e.Evicter, over, p)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				e.release([]*corev1.Pod{p})
				errs = append(errs, fmt.Errorf("evicting %s/%s for namespace %s: %w", p.Namespace, p.Name, ns, err))
				continue
			}
			if e.Metrics != nil {
				e.Metrics.ReclaimEvicted(w.Namespace)
			}
			if past {
				e.event(p, corev1.EventTypeWarning, api.EventReclaimed, "tessera: deleted past its PodDisruptionBudget to reclaim quota for namespace %s (every choice needs it: a budget does not keep what a namespace borrows above its min): %s", ns, why)
				continue
			}
			e.event(p, corev1.EventTypeWarning, api.EventReclaimed, "tessera: evicted to reclaim quota for namespace %s: %s", ns, why)
		}
		logger.Info("Reclaimed", "for", ns, "victim", workloadKey(w), "pods", w.Pods, "why", why)
	}
	for _, p := range r.askers {
		e.event(p, corev1.EventTypeNormal, api.EventQuotaReclaiming, "tessera: quota: %s", r.Msg)
	}
	return errors.Join(errs...)
}

// why explains a victim's choice for its Events.
func (e *Enforcer) why(c *choice, ns string, w core.Workload) string {
	st := c.state
	used, min := st.Used[ns], st.Quotas[ns].Min
	vUsed, vMin := st.Used[w.Namespace], st.Quotas[w.Namespace].Min
	keeps := fmt.Sprintf("whose eviction keeps %s at its min", w.Namespace)
	rest := vUsed.Sub(w.Uses)
	for r, n := range w.Uses {
		if n > 0 && rest[r] < vMin[r] {
			// core.Straddles chose it: the namespace falls below its min,
			// by less than the asker is short of its own.
			keeps = fmt.Sprintf("that borrows more than %s is then short of its min, and leaves it less short than %s (a workload mostly borrowed is taken whole)", w.Namespace, ns)
			break
		}
	}
	return fmt.Sprintf("%s uses %s of its min %s and asks for %s; %s uses %s above its min %s; %s (priority %d, created %s) is the lowest-priority, newest workload %s",
		ns, Describe(used), Describe(min), Describe(c.req), w.Namespace, Describe(vUsed), Describe(vMin), w.Name, w.Priority, w.Created.UTC().Format(time.RFC3339), keeps)
}

func (e *Enforcer) event(p *corev1.Pod, typ, reason, format string, args ...any) {
	if e.Events != nil && p != nil {
		e.Events.Eventf(p, typ, reason, format, args...)
	}
}

// Victim is a pod kube-scheduler would preempt on a node, as the GPU
// ledger counts it there.
type Victim struct {
	UID types.UID
	// Namespace and Name are the pod's the ledger counts on the node
	// under UID (empty: none).
	Namespace, Name string
	// GPUs reports that the pod holds GPUs on the node.
	GPUs bool
}

// PreemptVictims applies PreemptVictims (the function) to the victims on
// one node and returns the UIDs kept, and which of them are extra members
// of elastic gangs. A dropped victim that uses no GPU was needed by
// kube-scheduler for CPU or memory, so the node is then no candidate
// (false).
func (e *Enforcer) PreemptVictims(ctx context.Context, pod *corev1.Pod, victims []Victim) (kept []types.UID, extra map[types.UID]bool, ok bool) {
	v, err := e.Ledger.View(pod.Namespace, func(p *corev1.Pod) bool { return p.UID == pod.UID })
	if err != nil {
		klog.FromContext(ctx).Info("Quota state unavailable; keeping no gang or quota victim", "pod", klog.KObj(pod), "err", err)
		v = &View{State: &core.State{Quotas: map[string]core.Quota{}, Used: map[string]core.Resources{}}}
	}
	vp := e.podsOf(victims)
	byUID := map[types.UID]bool{}
	for _, p := range vp {
		byUID[p.UID] = true
	}
	allowed, extra, dropped := PreemptVictims(v, e.gangOf(), e.members, pod, Use(pod), vp)
	may := map[types.UID]bool{}
	for _, p := range allowed {
		may[p.UID] = true
	}
	for _, vi := range victims {
		switch {
		case may[vi.UID]:
			kept = append(kept, vi.UID)
		case byUID[vi.UID]:
			if !vi.GPUs {
				return nil, nil, false
			}
		default:
			kept = append(kept, vi.UID) // not a pod the extender knows: the scheduler's business
		}
	}
	if len(dropped) > 0 {
		names := make([]string, 0, len(dropped))
		for n := range dropped {
			names = append(names, n)
		}
		sort.Strings(names)
		klog.FromContext(ctx).V(2).Info("Preemption victims kept by quota or gang rules", "pod", klog.KObj(pod), "kept", names, "why", dropped[names[0]])
	}
	return kept, extra, true
}

// NodeExtras applies NodeExtras (the function) to the pods of one node
// (onNode) and returns the UIDs of the extra members it finds there, the
// newest first.
func (e *Enforcer) NodeExtras(pod *corev1.Pod, onNode []Victim, victims []types.UID) []types.UID {
	vs := map[types.UID]bool{}
	for _, uid := range victims {
		vs[uid] = true
	}
	var out []types.UID
	for _, p := range NodeExtras(e.gangOf(), e.members, pod, e.podsOf(onNode), vs) {
		out = append(out, p.UID)
	}
	return out
}

// podsOf reads the pods the victims name from the informer cache; a pod
// gone or replaced (another UID under the name) is left out.
func (e *Enforcer) podsOf(victims []Victim) []*corev1.Pod {
	var out []*corev1.Pod
	for _, vi := range victims {
		if vi.Name == "" {
			continue
		}
		p, err := e.Pod(vi.Namespace, vi.Name)
		if err != nil || p.UID != vi.UID {
			continue
		}
		out = append(out, p)
	}
	return out
}

// members lists the pods of gang g (by api.GangOf) the ledger knows.
func (e *Enforcer) members(g *api.Gang) []*corev1.Pod {
	pods, err := e.Ledger.Pods(g.Namespace)
	if err != nil {
		return nil
	}
	var out []*corev1.Pod
	for _, p := range pods {
		if mg, ok, err := api.GangOf(p); ok && err == nil && mg.Key() == g.Key() {
			out = append(out, p)
		}
	}
	return out
}

// gangOf is GangOf, or api.GangOf when unset.
func (e *Enforcer) gangOf() GangOf {
	if e.GangOf == nil {
		return api.GangOf
	}
	return e.GangOf
}

// AdmitsWithout reports whether quota admits pod once victims are gone:
// preemption that frees GPUs but leaves the namespace above its max would
// be useless.
func (e *Enforcer) AdmitsWithout(ctx context.Context, pod *corev1.Pod, victims []types.UID) bool {
	req := Use(pod)
	if len(req) == 0 {
		return true
	}
	gone := map[types.UID]bool{pod.UID: true}
	for _, uid := range victims {
		gone[uid] = true
	}
	v, err := e.Ledger.View(pod.Namespace, func(p *corev1.Pod) bool { return gone[p.UID] })
	if err != nil {
		klog.FromContext(ctx).Info("Quota state unavailable; admitting", "pod", klog.KObj(pod), "err", err)
		return true
	}
	if _, governed := v.State.Quotas[pod.Namespace]; !governed {
		return true
	}
	return v.State.Admit(pod.Namespace, req).Allowed
}
