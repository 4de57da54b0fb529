package planner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// GangPlanner plans gangs all-or-nothing: it holds gated members until
// minMember of them exist and the whole group fits, then reserves the
// group's capacity in the ledger at once (against the snapshot it planned
// on), records each member's node in its plan annotation and only then
// removes the members' gates. Gangs are planned one at a time, oldest
// first, each against a ledger that counts the plans before it, so two
// gangs that fit only alone never split the room: one is planned, the
// other waits whole. A plan whose members have not all bound when it
// expires is released: every member is evicted (its controller recreates
// it, gated again) and an Event says why.
//
// Sync is not safe for concurrent use: run it from one goroutine (Run).
type GangPlanner struct {
	ledger Ledger
	client GangClient
	pods   func() ([]*corev1.Pod, error)
	policy allocator.Policy
	levels []gang.Level
	events EventRecorder
	now    func() time.Time
	// waiting is the last reason reported per waiting workload and topic
	// (topicWait, topicReserved, topicBackfill), so that an Event is
	// emitted when the reason changes, not on every pass.
	waiting map[string]map[string]*waitState
	// capTold: gang members told they wait for their gang's cap
	// (tessera.dev/gang-max-member), apart from waiting, whose one reason
	// per gang the members that try to fit change every pass.
	capTold map[types.UID]bool
	// quota, when set, admits each gang whole and reclaims room for a
	// gang within its namespace's min.
	quota GangQuota
	// queues, when set, orders the workloads and admits them by their
	// Queue; qsnap is its snapshot for the current pass.
	queues *QueueBook
	qsnap  *QueueSnapshot
	// passSnap is the ledger as the current pass sees it: taken once, so
	// that room freed while the pass goes on is not taken by a workload
	// ordered after one that waited for it; the pass's own reservations
	// are added as they are made.
	passSnap Snapshot
	// passPods are the pods the current pass listed, by UID (reserve.go
	// reads their run-time hints).
	passPods map[types.UID]*corev1.Pod
	// passNominated are the nodes kube-scheduler's preemption nominated
	// for the pass's pending pods (nominatedNodes).
	passNominated map[string]bool
	// replans counts how many times the workload being planned has
	// planned again because a node changed under its plan (binds land
	// while a pass runs); at most maxReplans.
	replans int
	// growing is set while a started gang plans a member beyond its
	// minMember (grow): such a member does not preempt.
	growing      bool
	queueReclaim QueueReclaim
	// preempt, when set, preempts lower tiers for a queued pod that fits
	// nowhere.
	preempt TierPreempt
	// reservation configures reservations (reserve.go); reserved holds
	// the current one by workload key, cooldown the workloads whose
	// reservation ran out, until when they may not reserve again.
	reservation  ReservationConfig
	reserved     map[string]*reservation
	heldBefore   map[string]map[string]bool // workload key -> nodes it last held
	cooldown     map[string]time.Time
	reservations atomic.Int64
	// store keeps the reservation records across restarts
	// (reserve_store.go); published are the last pass's records, for the
	// status page.
	store     storeState
	published atomic.Pointer[[]api.ReservationRecord]
	// views publishes the reservations to the filter and the bind
	// (backfill.go).
	views views
	// consolidator, when set, moves pods for a workload that fits nowhere
	// (consolidate.go).
	consolidator *Consolidator
	// holds are the rooms consolidation freed, held for their workloads
	// by key (consolidate.go, freedHold).
	holds map[string]*freedHold
	// schedulers are the schedulerNames whose pods the extender serves:
	// only their ungated gang members are planned.
	schedulers map[string]bool
	// gangBook receives passGangs, the gangs the pass completed (their
	// PodGroups read), at the end of each pass.
	gangBook  *GangBook
	passGangs map[string]api.Gang
	// timeoutMax is the operator's bound on a gang's timeout
	// (GangTimeout); cutOld, by gang key, when a plan written under a
	// longer bound (before the bound, or with a larger one: its expiry
	// lies further than timeoutMax ahead) expires: timeoutMax after this
	// planner first saw it.
	timeoutMax time.Duration
	cutOld     map[string]time.Time
}

// DefaultGangTimeoutMax is the default bound on a gang's timeout (the
// extender's --gang-timeout-max): three times api.DefaultGangTimeout.
const DefaultGangTimeoutMax = 30 * time.Minute

// GangTimeout is how long the plan of gang g holds the room planned for
// its members until they all bind: the timeout g declares (its
// api.AnnotationGangTimeout, its PodGroup's spec.scheduleTimeoutSeconds,
// else api.DefaultGangTimeout), but at most limit, the operator's
// --gang-timeout-max (the timeout is written by the pods' creator, and
// nothing a pod's creator writes is taken as Tessera's decision: a tenant's
// gang of 8 GPUs that can never bind, declaring 9223372036 seconds, held
// its node until 2319). When the timeout is cut, note says so for messages
// ("" when it is not).
func GangTimeout(g *api.Gang, limit time.Duration) (d time.Duration, note string) {
	if g.Timeout <= limit {
		return g.Timeout, ""
	}
	asked := fmt.Sprintf("the gang asked %ds", int64(g.Timeout/time.Second))
	if g.Timeout == api.DefaultGangTimeout {
		asked = "the default is " + api.DefaultGangTimeout.String()
	}
	return limit, "the operator's --gang-timeout-max; " + asked
}

// GangQuota is what the gang planner asks of quota (extender.Quota).
type GangQuota interface {
	// AdmitGang decides whether namespace ns may start the whole gang.
	AdmitGang(ctx context.Context, ns string, members []*corev1.Pod) equota.Verdict
	// ReclaimFor chooses how to free room for askers (within their
	// namespace's min) when fits says they fit no snapshot of the ledger.
	// As TierPreempt.ForGang, it evicts nothing itself: it returns what it
	// will do (or why it cannot), the pods gone once the room is free
	// (those already leaving and its victims), and evict (nil when there
	// are no victims), which the planner calls once the askers' plan holds
	// the room.
	ReclaimFor(ctx context.Context, ns string, askers []*corev1.Pod, fits func(Snapshot) bool) (msg string, gone map[types.UID]bool, evict func(context.Context) error, err error)
}

// TierPreempt is what the planner asks of tier preemption
// (extender.Preemptor).
type TierPreempt interface {
	// For preempts lower tiers for pod, a queued pod that fits nowhere;
	// it reports whether it evicted (the room is then held for pod).
	For(ctx context.Context, pod *corev1.Pod) (bool, error)
	// ForGang chooses lower-tier victims for a gang's members when fits
	// says they fit no snapshot of the ledger. It evicts nothing itself:
	// it returns what it will do (or why it cannot), the pods gone once
	// the room is free (those already leaving and its victims), and evict,
	// which evicts the victims (nil when there are none). The planner
	// holds the room in the ledger first and evicts after, so that no
	// other pod (a victim's own replacement, made by its controller at
	// once) is bound into the room before the gang's plan holds it.
	ForGang(ctx context.Context, members []*corev1.Pod, fits func(Snapshot) bool) (msg string, gone map[types.UID]bool, evict func(context.Context) error, err error)
}

// GangPlannerConfig configures a GangPlanner.
type GangPlannerConfig struct {
	// Ledger is the extender's ledger of nodes (extender.PlannerLedger).
	Ledger Ledger
	Client GangClient
	// Pods lists the pods (from the informer's cache).
	Pods   func() ([]*corev1.Pod, error)
	Policy allocator.Policy
	// Levels are the cluster's topology levels (node label keys), lowest
	// first; a gang's api.AnnotationGangTopology overrides them.
	Levels []api.TopologyLevel
	// Events may be nil.
	Events EventRecorder
	// Now defaults to time.Now.
	Now func() time.Time
	// Quota may be nil: no quota.
	Quota GangQuota
	// Queues may be nil: no workload queues. QueueReclaim may be nil: no
	// reclaim for queues.
	Queues       *QueueBook
	QueueReclaim QueueReclaim
	// Preempt may be nil: queued pods do not preempt lower tiers.
	Preempt TierPreempt
	// Reservation configures reservations for workloads that wait too
	// long; the zero value makes none.
	Reservation ReservationConfig
	// Reservations may be nil: what the planner knows of reservations
	// (when each began, the nodes held, cooldowns) lives in memory only,
	// and a restart starts it anew.
	Reservations ReservationStore
	// Consolidation may be nil: no consolidation.
	Consolidation *Consolidator
	// Gangs may be nil; else the planner stores there the gangs of each
	// pass as it completed them (GangBook).
	Gangs *GangBook
	// GangTimeoutMax bounds how long a gang's plan holds its room
	// (GangTimeout); 0: DefaultGangTimeoutMax.
	GangTimeoutMax time.Duration
	// SchedulerNames are the schedulerNames whose pods go through the
	// extender (kube-scheduler's profiles that call it); default
	// default-scheduler. A gang member of another scheduler is planned
	// only when gated.
	SchedulerNames []string
}

// NewGangPlanner returns a planner.
func NewGangPlanner(cfg GangPlannerConfig) *GangPlanner {
	p := &GangPlanner{ledger: cfg.Ledger, client: cfg.Client, pods: cfg.Pods, policy: cfg.Policy, events: cfg.Events, now: cfg.Now, waiting: map[string]map[string]*waitState{}, quota: cfg.Quota,
		queues: cfg.Queues, queueReclaim: cfg.QueueReclaim, schedulers: map[string]bool{}, gangBook: cfg.Gangs,
		reservation: cfg.Reservation, reserved: map[string]*reservation{}, heldBefore: map[string]map[string]bool{}, cooldown: map[string]time.Time{}, preempt: cfg.Preempt,
		consolidator: cfg.Consolidation, holds: map[string]*freedHold{}, store: storeState{store: cfg.Reservations},
		timeoutMax: cfg.GangTimeoutMax, cutOld: map[string]time.Time{}}
	if p.now == nil {
		p.now = time.Now
	}
	if p.timeoutMax <= 0 {
		p.timeoutMax = DefaultGangTimeoutMax
	}
	names := cfg.SchedulerNames
	if len(names) == 0 {
		names = []string{corev1.DefaultSchedulerName}
	}
	for _, n := range names {
		p.schedulers[n] = true
	}
	p.levels = toGangLevels(cfg.Levels)
	return p
}

func toGangLevels(levels []api.TopologyLevel) []gang.Level {
	out := make([]gang.Level, 0, len(levels))
	for _, l := range levels {
		out = append(out, gang.Level{Key: l.Key, Required: l.Required})
	}
	return out
}

// Run calls Sync on every signal of trigger and every period until ctx is
// done.
func (p *GangPlanner) Run(ctx context.Context, trigger <-chan struct{}, period time.Duration) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if err := p.Sync(ctx); err != nil {
			logger.Info("Gang planning pass failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		case <-t.C:
		}
	}
}

// group is one gang and its live members.
type group struct {
	gang    *api.Gang
	members []*corev1.Pod
	oldest  time.Time
	// key names the group in waiting and the queue order: the gang's key,
	// or "pod <namespace>/<name>" for a single queued pod.
	key string
	// single is a GPU pod outside any gang held by the queue gate: a
	// workload of one.
	single bool
	// mins are the minimum sizes the members declare, when they disagree
	// (the largest counts): told in the wait reason.
	mins map[int]bool
}

// Sync makes one pass over every gang. Errors of single gangs are
// collected; the other gangs still get their turn.
func (p *GangPlanner) Sync(ctx context.Context) error {
	pods, err := p.pods()
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	p.loadStore(ctx)
	groups := map[string]*group{}
	malformed := map[string]bool{}
	var loose, unqueued []*corev1.Pod
	for _, pod := range pods {
		if gpureq.Ended(pod) {
			continue
		}
		g, ok, err := api.GangOf(pod)
		if !ok {
			switch {
			case pod.Spec.NodeName != "":
			case api.HasQueueGate(pod) && !p.queuedNamespace(pod.Namespace):
				unqueued = append(unqueued, pod)
			case p.queuedSingle(pod):
				key := api.PodKey(pod.Namespace, pod.Name)
				single := &api.Gang{Namespace: pod.Namespace, Name: pod.Name, MinMember: 1, Timeout: api.DefaultGangTimeout}
				groups[key] = &group{gang: single, members: []*corev1.Pod{pod}, oldest: pod.CreationTimestamp.Time, key: key, single: true}
			case api.HasGangGate(pod):
				loose = append(loose, pod)
			}
			continue
		}
		if err != nil {
			// Held, never taken as valid nor as a plain pod (the filter
			// passes it no node): told why, gated or not, while it waits.
			if api.HasGangGate(pod) || pod.Spec.NodeName == "" && p.serves(pod) {
				key := api.PodKey(pod.Namespace, pod.Name)
				malformed[key] = true
				p.wait(key, []*corev1.Pod{pod}, err.Error())
			}
			continue
		}
		gr := groups[g.Key()]
		if gr == nil {
			gr = &group{gang: g, oldest: pod.CreationTimestamp.Time, key: g.Key()}
			groups[g.Key()] = gr
		}
		gr.members = append(gr.members, pod)
		if pod.CreationTimestamp.Time.Before(gr.oldest) {
			gr.oldest = pod.CreationTimestamp.Time
		}
		if g.MinMember != gr.gang.MinMember {
			if gr.mins == nil {
				gr.mins = map[int]bool{gr.gang.MinMember: true}
			}
			gr.mins[g.MinMember] = true
		}
		if g.MinMember > gr.gang.MinMember {
			gr.gang.MinMember = g.MinMember
		}
		if g.MaxMember > 0 && (gr.gang.MaxMember == 0 || g.MaxMember < gr.gang.MaxMember) {
			gr.gang.MaxMember = g.MaxMember // members that disagree: the smallest cap
		}
	}
	order := make([]*group, 0, len(groups))
	for _, gr := range groups {
		sort.Slice(gr.members, func(i, j int) bool { return gr.members[i].Name < gr.members[j].Name })
		order = append(order, gr)
	}
	p.restore(groups)
	p.qsnap = nil
	if p.queues != nil {
		if p.qsnap, err = p.queues.Snapshot(); err != nil {
			return fmt.Errorf("queues: %w", err)
		}
	}
	p.passSnap = p.ledger.Snapshot()
	p.passPods = make(map[types.UID]*corev1.Pod, len(pods))
	for _, pod := range pods {
		p.passPods[pod.UID] = pod
	}
	p.passNominated = nominatedNodes(pods)
	p.passGangs = map[string]api.Gang{}
	defer func() {
		p.gangBook.store(p.passGangs)
		p.passSnap, p.passPods, p.passNominated, p.passGangs = nil, nil, nil, nil
		p.publish()
	}()
	var errs []error
	p.inOrder(order, func(gr *group) {
		if err := p.syncGroup(ctx, gr); err != nil {
			errs = append(errs, err)
		}
	})
	errs = append(errs, p.liftLooseGates(ctx, loose), p.liftUnqueued(ctx, unqueued))
	for key := range p.waiting {
		if _, live := groups[key]; !live && !malformed[key] {
			delete(p.waiting, key)
		}
	}
	for uid := range p.capTold {
		if pod, live := p.passPods[uid]; !live || !api.HasGangGate(pod) {
			delete(p.capTold, uid)
		}
	}
	for key := range p.reserved {
		if _, live := groups[key]; !live {
			p.releaseReservation(key)
		}
	}
	for key := range p.holds {
		if _, live := groups[key]; !live {
			p.releaseHold(key)
			continue
		}
		p.liveHold(key) // one past its time is released
	}
	// What is kept of workloads that are gone is forgotten.
	gone := func(key string) bool { _, live := groups[key]; return !live }
	maps.DeleteFunc(p.cooldown, func(key string, _ time.Time) bool { return gone(key) })
	maps.DeleteFunc(p.cutOld, func(key string, _ time.Time) bool { return gone(key) })
	maps.DeleteFunc(p.heldBefore, func(key string, _ map[string]bool) bool { return gone(key) })
	maps.DeleteFunc(p.store.restoredSince, func(key string, _ time.Time) bool { return gone(key) })
	p.saveStore(ctx, groups)
	return errors.Join(errs...)
}

// inOrder calls sync for each group in the order they are planned.
// Without queues, oldest first: a gang that waits is not overtaken forever
// by newer ones that fit in what it leaves. With queues, the queues'
// order, asked afresh before each workload since every admission raises
// its queue's share: priority tier first, then fair share (the queue's
// use, recent history included, over its entitlement), then age; each
// queue's own workloads go by priority, then age. Workloads of namespaces
// no Queue serves go after queued ones of their tier.
func (p *GangPlanner) inOrder(groups []*group, sync func(*group)) {
	older := func(a, b *group) bool {
		if !a.oldest.Equal(b.oldest) {
			return a.oldest.Before(b.oldest)
		}
		return a.key < b.key
	}
	if p.qsnap == nil || p.qsnap.State.Tree == nil || len(p.qsnap.State.Tree.Names()) == 0 {
		sort.Slice(groups, func(i, j int) bool { return older(groups[i], groups[j]) })
		for _, gr := range groups {
			sync(gr)
		}
		return
	}
	// One line per queue ("" for the unqueued), best first; the heads
	// compete through the queues' order.
	lines := map[string][]*group{}
	work := map[*group]queue.Workload{}
	for _, gr := range groups {
		q, _ := p.qsnap.QueueOf(gr.gang.Namespace)
		w := queue.Workload{Key: gr.key, Queue: q, Created: gr.oldest, Uses: quota.Resources{}}
		for _, m := range gr.members {
			w.Priority = max(w.Priority, corev1helpers.PodPriority(m))
			w.Uses = w.Uses.Add(gpureq.QuotaCount(m))
		}
		work[gr] = w
		lines[q] = append(lines[q], gr)
	}
	for _, line := range lines {
		sort.Slice(line, func(i, j int) bool {
			if a, b := work[line[i]].Priority, work[line[j]].Priority; a != b {
				return a > b
			}
			return older(line[i], line[j])
		})
	}
	byKey := map[string]*group{}
	for _, gr := range groups {
		byKey[gr.key] = gr
	}
	heads := make([]queue.Workload, 0, len(lines))
	for len(lines) > 0 {
		heads = heads[:0]
		for _, line := range lines {
			heads = append(heads, work[line[0]])
		}
		p.qsnap.State.Order(heads)
		gr := byKey[heads[0].Key]
		q := heads[0].Queue
		if lines[q] = lines[q][1:]; len(lines[q]) == 0 {
			delete(lines, q)
		}
		sync(gr)
	}
}

func (p *GangPlanner) syncGroup(ctx context.Context, gr *group) error {
	logger := klog.FromContext(ctx)
	g := gr.gang
	if gr.single {
		m := gr.members[0]
		if plan, ok, err := api.GetGangPlan(m.Annotations); ok && err == nil && plan.Gang == m.Name {
			if p.awaitingVictims(plan) {
				return nil
			}
			// Planned, but the gate's removal failed or waited for the
			// pods evicted for it: lift it (again).
			return p.client.RemoveGate(ctx, m)
		}
		_, err := p.plan(ctx, gr.key, g, gr.members, 1)
		return err
	}
	if g.Source.FromPodGroup() {
		// A gang that names a PodGroup waits for it, whatever its members'
		// annotations say: a size there (tessera.dev/gang-min-member)
		// overrides the object's, it does not stand for it. (It did: a pod
		// labelled for a PodGroup that did not exist ran alone with
		// gang-min-member "1", and waited without it.)
		pg, err := p.client.GetPodGroup(ctx, g)
		if err != nil {
			p.wait(g.Key(), gatedOf(gr.members), fmt.Sprintf("%s %s cannot be read: %v", g.Source, g.Key(), err))
			return nil
		}
		if err := g.ApplyPodGroup(pg, gr.members[0]); err != nil {
			p.wait(g.Key(), gatedOf(gr.members), err.Error())
			return nil
		}
	}
	if err := g.CheckSize(); err != nil {
		p.wait(g.Key(), gatedOf(gr.members), fmt.Sprintf("gang %s: %v", g.Key(), err))
		return nil
	}
	if p.passGangs != nil {
		p.passGangs[g.Key()] = *g
	}
	var planned, gated []*corev1.Pod
	var expires time.Time
	allBound, awaiting := true, false
	for _, m := range gr.members {
		plan, ok, err := api.GetGangPlan(m.Annotations)
		switch {
		case ok && err == nil && plan.Gang == g.Name:
			planned = append(planned, m)
			if expires.IsZero() || plan.Expires.Before(expires) {
				expires = plan.Expires
			}
			awaiting = awaiting || p.awaitingVictims(plan)
			if m.Spec.NodeName == "" {
				allBound = false
			}
		case ok:
			// A malformed or foreign plan: the member is planned anew.
			gated = append(gated, m)
		case api.HasGangGate(m):
			gated = append(gated, m)
		case m.Spec.NodeName == "" && p.serves(m):
			// Created without the gate (the webhook absent or failing
			// open): the extender binds no member without a plan, so the
			// planner plans it as if gated.
			gated = append(gated, m)
		}
	}
	if len(planned) > 0 {
		if len(planned) < g.MinMember && !anyBound(planned) {
			// An interrupted plan (some annotations written, then a
			// failure) is released and planned again; but the cache may
			// lag this planner's own writes of a moment ago (a plan lands
			// one pod at a time, and kube-scheduler binds an ungated member
			// as soon as it sees its plan): released on that view, members
			// bound meanwhile were left without a plan and the others
			// waited for ever. So the API server's copies decide.
			fresh, err := p.freshPlanned(ctx, g, gr.members)
			if err != nil {
				return err
			}
			if len(fresh) >= g.MinMember || anyBound(fresh) {
				return nil // the cache catches up: the next pass sees the plan
			}
			logger.Info("Releasing an incomplete gang plan", "gang", g.Key(), "planned", len(fresh), "minMember", g.MinMember)
			return p.clearPlans(ctx, unionByName(fresh, planned))
		}
		if allBound {
			delete(p.cutOld, g.Key())
		} else if p.now().After(p.boundExpiry(g.Key(), expires)) {
			delete(p.cutOld, g.Key())
			return p.expire(ctx, gr, planned)
		}
		if awaiting {
			return nil
		}
		var errs []error
		for _, m := range planned {
			if api.HasGangGate(m) {
				if err := p.client.RemoveGate(ctx, m); err != nil {
					errs = append(errs, fmt.Errorf("pod %s/%s: removing gate: %w", m.Namespace, m.Name, err))
				}
			}
		}
		if len(gated) > 0 && len(errs) == 0 {
			// Members beyond minMember join the running gang one at a
			// time, as room appears (an elastic gang grows), up to its cap.
			errs = append(errs, p.grow(ctx, gr.key, g, p.underCap(g, gated, len(planned)), len(planned)))
		}
		return errors.Join(errs...)
	}
	if len(gated) == 0 {
		return nil // members not gated: the scheduler places them as it will
	}
	if len(gated) < g.MinMember {
		msg := fmt.Sprintf("gang %s: %d of %d members exist, waiting to be planned together", g.Key(), len(gated), g.MinMember)
		if len(gr.mins) > 1 {
			// Members written with different sizes: the largest counts,
			// and saying so names the mistake.
			msg += fmt.Sprintf(" (its members disagree on the minimum size: %s; the largest counts)", joinInts(slices.Sorted(maps.Keys(gr.mins))))
		}
		p.wait(g.Key(), gated, msg)
		return nil
	}
	if len(gated) == g.MinMember {
		_, err := p.plan(ctx, gr.key, g, gated, g.MinMember)
		return err
	}
	// An elastic gang (more members than minMember) starts with minMember
	// of them, as soon as those fit, and the others join one at a time.
	started, err := p.plan(ctx, gr.key, g, gated[:g.MinMember], g.MinMember)
	if !started && err == nil {
		p.tellExtras(gr.key, g, gated[g.MinMember:])
	}
	if !started || err != nil {
		return err
	}
	return p.grow(ctx, gr.key, g, p.underCap(g, gated[g.MinMember:], g.MinMember), g.MinMember)
}

// tellExtras tells the members of an elastic gang beyond its minimum,
// while the gang waits to start, why they wait (once each): the planner
// plans the first minMember members and the reasons go to those, and the
// others had no Event at all.
func (p *GangPlanner) tellExtras(key string, g *api.Gang, extras []*corev1.Pod) {
	msg := fmt.Sprintf("gang %s: waits to start with its first %d members (their Events say why); this member is beyond its minimum and joins once the gang runs and room for it is free", g.Key(), g.MinMember)
	for _, m := range p.untold(key, topicExtra, msg, extras) {
		p.events.Eventf(m, corev1.EventTypeNormal, "GangWaiting", "tessera: %s", msg)
	}
}

// underCap is the part of waiting (in name order) that may join a gang of
// which have members hold a plan (running, or about to): all of it
// without a cap (tessera.dev/gang-max-member), else up to the cap; the
// members left out are told why and wait for a running member to end.
func (p *GangPlanner) underCap(g *api.Gang, waiting []*corev1.Pod, have int) []*corev1.Pod {
	room := g.Room(have)
	if room < 0 || len(waiting) <= room {
		return waiting
	}
	if p.capTold == nil {
		p.capTold = map[types.UID]bool{}
	}
	for _, m := range waiting[room:] {
		if !p.capTold[m.UID] && p.events != nil {
			p.events.Eventf(m, corev1.EventTypeNormal, "GangWaiting", "tessera: gang %s: at most %d members run at once (%s); this one waits for a running member to end",
				g.Key(), g.MaxMember, api.AnnotationGangMaxMember)
		}
		p.capTold[m.UID] = true
	}
	return waiting[:room]
}

// maxReplans bounds how often one workload plans again in a pass because
// a node changed under its plan. Giving up passes its turn to the
// workloads after it in the pass, which breaks its queue's order until the
// next pass, so a few tries are worth it: binds of the pass's earlier
// workloads land every few tens of milliseconds.
const maxReplans = 5

// leavingAtPassStart is the part of gone that was already leaving (being
// deleted) in the pass's view of the pods.
func (p *GangPlanner) leavingAtPassStart(gone map[types.UID]bool) map[types.UID]bool {
	out := map[types.UID]bool{}
	for uid := range gone {
		if pod := p.passPods[uid]; pod != nil && pod.DeletionTimestamp != nil {
			out[uid] = true
		}
	}
	return out
}

// grow plans the gang's waiting members one at a time, in name order,
// until one does not fit; have members are planned already. A member
// beyond minMember preempts no lower tier: an elastic gang grows into free
// room only.
func (p *GangPlanner) grow(ctx context.Context, key string, g *api.Gang, waiting []*corev1.Pod, have int) error {
	defer func() { p.growing = false }()
	for _, m := range waiting {
		p.growing = have >= g.MinMember
		planned, err := p.plan(ctx, key, g, []*corev1.Pod{m}, 1)
		if !planned || err != nil {
			return err
		}
		have++
	}
	return nil
}

// nominatedNodes are the nodes kube-scheduler's preemption nominated for a
// pending pod of pods: the room freed there is that pod's, so an elastic
// gang's extra member, which takes free room only, does not take it (it
// would be taken back at once: the victims kube-scheduler evicts are often
// such members).
func nominatedNodes(pods []*corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, pod := range pods {
		if n := pod.Status.NominatedNodeName; n != "" && pod.Spec.NodeName == "" && !gpureq.Ended(pod) {
			out[n] = true
		}
	}
	return out
}

// withoutNodes is s without the named nodes (s itself when it has none of
// them).
func withoutNodes(s Snapshot, names map[string]bool) Snapshot {
	hit := false
	for name := range names {
		if _, ok := s[name]; ok {
			hit = true
			break
		}
	}
	if !hit {
		return s
	}
	out := make(Snapshot, len(s))
	for name, n := range s {
		if !names[name] {
			out[name] = n
		}
	}
	return out
}

// equalUses reports whether a and b ask for the same amounts.
func equalUses(a, b quota.Resources) bool {
	for r, v := range a {
		if b[r] != v {
			return false
		}
	}
	for r, v := range b {
		if a[r] != v {
			return false
		}
	}
	return true
}

// Reservations is how many workloads hold a reservation (0 or 1).
func (p *GangPlanner) Reservations() int64 { return p.reservations.Load() }

// queuedSingle reports a pod outside any gang that the planner admits:
// one held by the queue gate, or a GPU pod of a namespace a Queue serves
// that its owner ungated (or the webhook, failing open, never gated) and
// that has no plan yet: the verbs place it only once it is planned. A pod
// held by the gang gate though it declares no gang is such a pod whoever
// schedules it (the webhook gives it the queue gate too; without that,
// lifting the gang's would let it skip its queue), and so is one planned
// alone (its plan is named after it) whose gang gate is still to lift.
func (p *GangPlanner) queuedSingle(pod *corev1.Pod) bool {
	if api.HasQueueGate(pod) {
		return true
	}
	gangGated := api.HasGangGate(pod)
	if plan, planned, err := api.GetGangPlan(pod.Annotations); planned {
		return gangGated && err == nil && plan.Gang == pod.Name
	}
	if p.queues == nil || !(p.serves(pod) || gangGated) || len(gpureq.QuotaCount(pod)) == 0 {
		return false
	}
	return p.queues.Queued(pod.Namespace)
}

// queuedNamespace reports a namespace a Queue serves (a malformed Queue
// still serves the namespaces it names, admitting nothing).
func (p *GangPlanner) queuedNamespace(ns string) bool {
	return p.queues != nil && p.queues.Queued(ns)
}

// liftUnqueued lifts the gates of pods outside any gang that the queue
// gate holds though no Queue serves their namespace (the Queue was
// deleted, or edited to drop the namespace, while they waited; or the
// gate was their owner's): as docs/queues.md says, such a namespace's
// pods are scheduled as before, by kube-scheduler, their ElasticQuota
// checked at filter. Each gets a Normal Event (api.EventQueueGateLifted).
// A pod planned before its Queue went keeps its plan: the lift pins it
// there. The planner starts only once the Queues are known, so a
// namespace is never taken as unserved for want of reading them.
func (p *GangPlanner) liftUnqueued(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, pod := range pods {
		errs = append(errs, p.liftAsPlain(ctx, pod, "the queue gate of a pod no Queue serves", api.EventQueueGateLifted,
			fmt.Sprintf("no Queue serves namespace %s (any more): the queue gate is lifted and the pod is scheduled as a plain pod", pod.Namespace)))
	}
	return errors.Join(errs...)
}

// liftAsPlain lifts pod's Tessera gates, so that kube-scheduler schedules
// it as a plain pod, and tells it why with a Normal Event (reason, msg);
// what names the gate lifted in the log and in the error (nil when the
// pod is gone).
func (p *GangPlanner) liftAsPlain(ctx context.Context, pod *corev1.Pod, what, reason, msg string) error {
	if err := p.client.RemoveGate(ctx, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod %s/%s: lifting %s: %w", pod.Namespace, pod.Name, what, err)
	}
	klog.FromContext(ctx).V(2).Info("Lifted "+what, "pod", klog.KObj(pod))
	if p.events != nil {
		p.events.Eventf(pod, corev1.EventTypeNormal, reason, "tessera: %s", msg)
	}
	return nil
}

// liftLooseGates lifts the gang gate of pods that declare no gang (its
// user added the gate, or removed the gang's annotations while it waited)
// and that no queue holds (queuedSingle): the gate would hold them for
// ever, for a gang that does not exist. Each gets a Normal Event
// (api.EventGangGateLifted) saying why, and is then scheduled as a plain
// pod: the extender's filter checks its quota as any other's. A plan it
// carries, of the gang it left, is removed first (its room released), and
// the gate lifted on a later pass, when the pod is plain: a namespace's
// Queue then admits it first. A pod with a malformed declaration is none
// of these: it stays held (Sync).
func (p *GangPlanner) liftLooseGates(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, pod := range pods {
		if api.HasQueueGate(pod) {
			continue // the queue's to lift, with the gang's (queuedSingle)
		}
		if _, planned := pod.Annotations[api.AnnotationGangPlan]; planned {
			klog.FromContext(ctx).Info("Removing the plan of a pod that left its gang", "pod", klog.KObj(pod))
			if err := p.clearPlans(ctx, []*corev1.Pod{pod}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		errs = append(errs, p.liftAsPlain(ctx, pod, "the gang gate of a pod that declares no gang", api.EventGangGateLifted,
			fmt.Sprintf("no gang declared (no annotation %s, label %s or annotation %s): the gang gate is lifted and the pod is scheduled as a plain pod",
				api.AnnotationGang, api.LabelPodGroup, api.AnnotationVolcanoGroupName)))
	}
	return errors.Join(errs...)
}

// serves reports whether the extender schedules pod (its schedulerName is
// one of the profiles that call the extender).
func (p *GangPlanner) serves(pod *corev1.Pod) bool {
	name := pod.Spec.SchedulerName
	if name == "" {
		name = corev1.DefaultSchedulerName
	}
	return p.schedulers[name]
}

// freshPlanned reads members, the gang's members in the cache, from the
// API server and returns those that carry a plan of the gang there.
func (p *GangPlanner) freshPlanned(ctx context.Context, g *api.Gang, members []*corev1.Pod) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, m := range members {
		f, err := p.client.GetPod(ctx, m.Namespace, m.Name)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("gang %s: reading member %s: %w", g.Key(), m.Name, err)
		case f.UID != m.UID:
			continue
		}
		if plan, ok, err := api.GetGangPlan(f.Annotations); ok && err == nil && plan.Gang == g.Name {
			out = append(out, f)
		}
	}
	return out, nil
}

// cacheLagsPlan reports whether members the cache shows without a plan of
// gang g hold one the planner wrote a moment ago: the ledger counts them
// planned (outside the workload's own reservation or hold), and the API
// server's copy carries the plan. Planned again on the cache's view, a
// member's hold moved to another node while the pod stayed pinned to the
// first (its gate gone, nothing re-pinned it) and could bind nowhere until
// its plan expired. Only such members are read afresh.
func (p *GangPlanner) cacheLagsPlan(ctx context.Context, key string, g *api.Gang, members []*corev1.Pod) (bool, error) {
	own := map[types.UID]bool{}
	if r := p.reserved[key]; r != nil {
		for _, uid := range r.uids {
			own[uid] = true
		}
	}
	if h := p.holds[key]; h != nil {
		for _, uid := range h.uids {
			own[uid] = true
		}
	}
	var suspects []*corev1.Pod
	for _, m := range members {
		if plan, ok, err := api.GetGangPlan(m.Annotations); own[m.UID] || ok && err == nil && plan.Gang == g.Name {
			continue
		}
		if h, ok := p.ledger.Holds(m.UID); ok && h.Planned {
			suspects = append(suspects, m)
		}
	}
	if len(suspects) == 0 {
		return false, nil
	}
	fresh, err := p.freshPlanned(ctx, g, suspects)
	if err != nil || len(fresh) == 0 {
		return false, err
	}
	klog.FromContext(ctx).V(2).Info("The cache does not show the plan of a workload planned a moment ago yet; not planning it again", "workload", key, "member", klog.KObj(fresh[0]))
	return true, nil
}

// unionByName is a's pods, then those of b that a does not name: for the
// same member, a's copy (the API server's) wins over b's (the cache's).
func unionByName(a, b []*corev1.Pod) []*corev1.Pod {
	seen := make(map[string]bool, len(a))
	out := append([]*corev1.Pod(nil), a...)
	for _, p := range a {
		seen[p.Namespace+"/"+p.Name] = true
	}
	for _, p := range b {
		if !seen[p.Namespace+"/"+p.Name] {
			out = append(out, p)
		}
	}
	return out
}

func anyBound(pods []*corev1.Pod) bool {
	for _, m := range pods {
		if m.Spec.NodeName != "" {
			return true
		}
	}
	return false
}

func gatedOf(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, m := range pods {
		if api.HasGangGate(m) {
			out = append(out, m)
		}
	}
	return out
}

// clearPlans removes the plan annotations of pods (best effort: every pod
// is tried).
func (p *GangPlanner) clearPlans(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	uids := make([]types.UID, 0, len(pods))
	for _, m := range pods {
		uids = append(uids, m.UID)
		if err := p.client.SetPlan(ctx, m, ""); err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s: clearing the plan: %w", m.Namespace, m.Name, err))
		}
	}
	p.ledger.ReleaseGang(uids)
	return errors.Join(errs...)
}

// boundExpiry is when the plan of gang key, which expires at expires,
// expires under the operator's bound: a plan made under a longer bound
// (its expiry lies further than timeoutMax ahead: written before
// --gang-timeout-max, or with a larger one) expires timeoutMax after this
// planner first saw it so. Kept in memory only: after a restart such a
// plan holds timeoutMax from then.
func (p *GangPlanner) boundExpiry(key string, expires time.Time) time.Time {
	if cut, ok := p.cutOld[key]; ok && cut.Before(expires) {
		return cut
	}
	if limit := p.now().Add(p.timeoutMax); expires.After(limit) {
		p.cutOld[key] = limit
		return limit
	}
	return expires
}

// expire releases a plan whose members did not all bind in time: every
// member of the gang, bound or not, is evicted, so that the gang is
// retried together, and each gets an Event naming the members that did not
// bind.
func (p *GangPlanner) expire(ctx context.Context, gr *group, planned []*corev1.Pod) error {
	g := gr.gang
	var unbound []string
	for _, m := range planned {
		if m.Spec.NodeName == "" {
			unbound = append(unbound, m.Name)
		}
	}
	timeout, cut := GangTimeout(g, p.timeoutMax)
	after := timeout.String()
	if cut != "" {
		after += " (" + cut + ")"
	}
	msg := fmt.Sprintf("tessera: gang %s: plan expired after %s with %d of %d planned members unbound (%s); evicting all %d members to retry the gang together",
		g.Key(), after, len(unbound), len(planned), strings.Join(unbound, ", "), len(gr.members))
	klog.FromContext(ctx).Info("Gang plan expired", "gang", g.Key(), "unbound", unbound, "members", len(gr.members))
	var errs []error
	uids := make([]types.UID, 0, len(gr.members))
	for _, m := range gr.members {
		uids = append(uids, m.UID)
		if p.events != nil {
			p.events.Eventf(m, corev1.EventTypeWarning, "GangTimeout", "%s", msg)
		}
		if err := p.client.Evict(ctx, m); err != nil {
			errs = append(errs, fmt.Errorf("evicting %s/%s: %w", m.Namespace, m.Name, err))
		}
	}
	p.ledger.ReleaseGang(uids)
	return errors.Join(errs...)
}

// GangTrigger is a pod informer handler that signals trigger (without
// blocking) when a gang member is added, changes or goes, so that the
// planner makes a pass.
func GangTrigger(trigger chan<- struct{}) toolscache.ResourceEventHandler {
	signal := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		_, member, _ := api.GangOf(pod)
		_, planned := pod.Annotations[api.AnnotationGangPlan]
		if !member && !planned && !api.HasQueueGate(pod) && !api.HasGangGate(pod) {
			// A pod leaving frees room a waiting gang may need, or is one
			// a planned workload waits for (awaitingVictims): only
			// deletions and completions of other pods matter, and the
			// periodic pass sees those soon enough.
			return
		}
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    signal,
		UpdateFunc: func(_, obj any) { signal(obj) },
		DeleteFunc: signal,
	}
}

// ruledOut names the nodes with GPUs that refuse every member (package
// eligible: cordoned, an untolerated taint, outside their node selector
// and affinity) and why, for a waiting reason: "; 1 of 4 GPU nodes refuse
// every member: a100-1 (node is cordoned (unschedulable))"; "" for none.
func ruledOut(snap Snapshot, members []*corev1.Pod) string {
	allowed := make([]eligible.Pod, len(members))
	for i, m := range members {
		allowed[i] = eligible.For(m)
	}
	names := make([]string, 0, len(snap))
	for n, st := range snap {
		if st.Usable() && st.GPUCount() > 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		why := ""
		for _, a := range allowed {
			w := snap[n].Refusal(a)
			if w == "" {
				why = ""
				break
			}
			if why == "" {
				why = w
			}
		}
		if why != "" {
			out = append(out, fmt.Sprintf("%s (%s)", n, why))
		}
	}
	if len(out) == 0 {
		return ""
	}
	const shown = 3
	msg := fmt.Sprintf("; %d of %d GPU nodes refuse every member: %s", len(out), len(names), strings.Join(out[:min(len(out), shown)], ", "))
	if len(out) > shown {
		msg += fmt.Sprintf(" and %d more", len(out)-shown)
	}
	return msg
}

// podAllows says whether pod may be scheduled on a gang node of snap:
// the node's cordon and taints, the pod's node selector and required node
// affinity (package eligible, what kube-scheduler's filters check). Without
// it the planner would plan a member on a node kube-scheduler never binds
// it to, and the gang would wait for its plan to expire, again and again.
func podAllows(snap Snapshot, pod *corev1.Pod) func(gang.Node) bool {
	allowed := eligible.For(pod)
	return func(n gang.Node) bool {
		if n.Node == nil {
			return false
		}
		st, ok := snap[n.Node.Name]
		return ok && st.Admits(allowed)
	}
}

// maxAwait is how long a planned workload keeps its gates at most while
// pods evicted for it still run (a pod stuck terminating, a node gone):
// then kube-scheduler tries it as it did before the wait, and the pods'
// end lets it bind.
const maxAwait = 2 * time.Minute

// awaits are the pods of victims a workload planned now waits for before
// its gates are lifted (api.GangPlan.Awaits): those still there (being
// deleted counts: their containers hold the GPUs until they stop), its
// own members aside, sorted, the first api.MaxAwaited of them; and until
// when, at most maxAwait (nil when none).
func (p *GangPlanner) awaits(members []*corev1.Pod, victims map[types.UID]bool) ([]types.UID, *time.Time) {
	own := podUIDs(members)
	var left []types.UID
	for uid := range victims {
		if !own[uid] && !p.gone(uid) {
			left = append(left, uid)
		}
	}
	if len(left) == 0 {
		return nil, nil
	}
	slices.Sort(left)
	until := p.now().Add(maxAwait).UTC().Truncate(time.Second)
	return left[:min(len(left), api.MaxAwaited)], &until
}

// gone reports whether the pod uid has left the cluster or stopped.
func (p *GangPlanner) gone(uid types.UID) bool {
	pod := p.passPods[uid]
	return pod == nil || gpureq.Terminal(pod)
}

// awaitingVictims reports whether a workload planned by plan still waits
// for pods evicted for it to go (awaits); read from the plan, the wait
// outlives a restart.
func (p *GangPlanner) awaitingVictims(plan *api.GangPlan) bool {
	return plan.Awaiting(p.now(), p.gone)
}

// joinInts writes ns as "2, 3".
func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ", ")
}
