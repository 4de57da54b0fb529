package planner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
)

// plan plans members (at least minMember of them) as one group and, when
// the whole group fits, reserves, records and releases it.
func (p *GangPlanner) plan(ctx context.Context, key string, g *api.Gang, members []*corev1.Pod, minMember int) (bool, error) {
	logger := klog.FromContext(ctx)
	demands := make([]Demand, len(members))
	shared := false
	for i, m := range members {
		d, err := p.ledger.ParseDemand(m)
		if err != nil {
			p.wait(key, members, fmt.Sprintf("gang %s: member %s: %v", g.Key(), m.Name, err))
			return false, nil
		}
		demands[i] = d
		shared = shared || d.Kind() == allocator.Shared
	}
	if lag, err := p.cacheLagsPlan(ctx, key, g, members); lag || err != nil {
		return false, err
	}
	// A reservation of this workload's is its own room: it is planned on
	// the nodes without its members' reserved uses (planOn, own), and the
	// reservation stays in the ledger meanwhile, so that the filter admits
	// no other pod to its room while this workload plans; its plan or a
	// new reservation takes its place in the ledger at once (ReserveGang
	// replaces a member's use), and one not replaced by the end of this
	// call is released (nobody's room, if the workload is not admitted
	// now).
	var own map[types.UID]bool          // its members' reserved uses
	since := p.store.restoredSince[key] // its reservation before a restart
	if r := p.reserved[key]; r != nil {
		own = uidSet(r.uids)
		since = r.since
		defer func() {
			if p.reserved[key] == r {
				p.releaseReservation(key)
			}
		}()
	}
	// Room consolidation freed for it stays held while it plans: its plan
	// takes the hold's place in the ledger (consolidate_hold.go).
	hold := p.liveHold(key)
	q, queued := p.qsnap.QueueOf(g.Namespace)
	want := quota.Resources{}
	refused := "" // why the queue does not admit it
	if queued {
		for _, m := range members {
			want = want.Add(gpureq.QuotaCount(m))
		}
		if d := p.qsnap.State.Admit(q, want); !d.Allowed {
			refused = d.Reason
			if p.queueReclaim == nil || p.growing {
				p.waitQueue(key, members, refused)
				return false, nil
			}
		}
	}
	if p.quota != nil {
		if v := p.quota.AdmitGang(ctx, g.Namespace, members); !v.Allowed {
			p.waitQuota(key, members, v.Message)
			return false, nil
		}
	}
	snap := p.passSnap
	if snap == nil {
		snap = p.ledger.Snapshot()
	}
	view := snap
	if hold != nil {
		// Its room: the nodes without the pods moved for it and its own
		// hold.
		view = without(snap, hold.gone)
	}
	if p.growing {
		view = withoutNodes(view, p.passNominated)
	}
	// planGroup plans the workload on the nodes of s, where what its
	// members hold already (a reservation) is its own; planOn does and
	// records those nodes as the ones its plan is made on (plannedOn),
	// where the GPUs of a slice over several GPUs are named.
	planGroup := func(s Snapshot) (*gang.Plan, error) {
		grp, nodes := p.gangInput(without(s, own), g, members, demands, minMember, shared)
		grp.Single = api.IsPodKey(key)
		return gang.PlanGroup(grp, nodes, p.policy)
	}
	var plannedOn Snapshot
	planOn := func(s Snapshot) (*gang.Plan, error) {
		r, err := planGroup(s)
		if err == nil {
			plannedOn = without(s, own)
		}
		return r, err
	}
	// evictVictims evicts what quota reclaim or tier preemption chose for
	// the workload, once its plan holds the room (nil: nothing to evict);
	// victims are the pods the plan counts gone (evicted or leaving).
	var evictVictims func(context.Context) error
	victims := map[types.UID]bool{}
	if hold != nil {
		maps.Copy(victims, hold.gone)
	}
	if refused != "" {
		// Its queue refused it: it may displace the queue's own lower
		// tiers, as a pod of a namespace no Queue serves would (the
		// queue's gate keeps their replacements from the room).
		msg, gone, perr := p.queueReclaim.PreemptOwnFor(ctx, p.qsnap, q, members, want, func(s Snapshot) bool {
			_, err := planGroup(s)
			return err == nil
		})
		if len(gone) == 0 {
			if perr != nil {
				refused += "; preemption within the queue: " + perr.Error()
			}
			p.waitQueue(key, members, refused)
			return false, nil
		}
		if perr != nil {
			klog.FromContext(ctx).Info("Preempting within a queue", "workload", key, "err", perr)
		}
		klog.FromContext(ctx).V(2).Info("Preempting within a queue", "workload", key, "why", refused, "what", msg)
		view = without(view, gone)
		maps.Copy(victims, gone)
	}
	res, err := planOn(view)
	if err != nil {
		reason := err.Error()
		if errors.Is(err, gang.ErrNoRoom) {
			reason += ruledOut(snap, members)
		}
		// Within its queue's guarantee or fair share, or its namespace's
		// min, the workload may get room by reclaim; the planner tries
		// again on its next pass.
		fits := func(s Snapshot) bool {
			_, err := planGroup(s)
			return err == nil
		}
		reclaimed := false
		switch {
		case !errors.Is(err, gang.ErrNoRoom):
		case p.growing:
			// An elastic gang's extra member takes free room only:
			// nothing is reclaimed, preempted, moved or reserved for it
			// (it would be the first taken back under pressure).
			reason = fmt.Sprintf("member %s, beyond the gang's minimum of %d, joins when room for it is free (nothing is reclaimed, preempted, moved or reserved for it): %s", members[0].Name, g.MinMember, reason)
		case queued && p.queueReclaim != nil:
			msg, gone, rerr := p.queueReclaim.ReclaimFor(ctx, p.qsnap, q, members, want, fits)
			usable := gone
			if rerr == nil && msg == "" {
				// No eviction: the room is freed by pods that are leaving.
				// Only those already leaving when the pass began count, so
				// that room appearing during a pass goes by the next
				// pass's order, not to whichever workload the pass had
				// reached (nor is anything preempted for it meanwhile).
				usable = p.leavingAtPassStart(gone)
			}
			switch {
			case rerr != nil:
				reason += "; queue reclaim: " + rerr.Error()
			case len(gone) > 0:
				reclaimed = true
				if len(usable) == 0 {
					reason += "; room is being freed by pods that began leaving during this planning pass: the next pass gives it out in order"
					break
				}
				// The room freed (or being freed) is the asker's: it is
				// planned there now, so that no other workload takes it;
				// the ledger holds it, and the members bind once the
				// pods leaving are gone.
				if r, perr := planOn(without(snap, usable)); perr == nil {
					res, err = r, nil
					maps.Copy(victims, usable)
				} else if msg != "" {
					reason += "; queue reclaim: " + msg
				}
			}
		case p.quota != nil:
			msg, gone, evict, rerr := p.quota.ReclaimFor(ctx, g.Namespace, members, fits)
			switch {
			case rerr != nil:
				if !errors.Is(rerr, equota.ErrNothingGuaranteed) {
					reason += "; quota reclaim: " + rerr.Error()
				}
			case evict == nil:
				reason += "; quota reclaim: " + msg
			default:
				// As after tier preemption: the workload is planned on
				// the room its victims free, the ledger holds it, and
				// they are evicted after (below), so that their
				// replacements, not gated, are not bound into it first.
				if r, perr := planOn(without(snap, gone)); perr == nil {
					res, err = r, nil
					evictVictims = evict
					maps.Copy(victims, gone)
				} else {
					reason += "; quota reclaim: " + msg + ", but the workload does not fit the room freed: nothing evicted"
				}
			}
		}
		preempting := false
		if err != nil && errors.Is(err, gang.ErrNoRoom) && p.preempt != nil && api.IsPodKey(key) {
			// A queued pod of a higher tier preempts as any pod would.
			evicted, perr := p.preempt.For(ctx, members[0])
			switch {
			case perr != nil:
				reason += "; preemption: " + perr.Error()
			case evicted:
				reason += "; preempting lower tiers for it"
				preempting = true
			}
		}
		if err != nil && errors.Is(err, gang.ErrNoRoom) && p.preempt != nil && !api.IsPodKey(key) && !reclaimed && !p.growing {
			// A gang of a higher tier preempts lower tiers so that the
			// freed GPUs form the domain it is planned in; as after queue
			// reclaim, it is planned on the room freed (or being freed)
			// now, so that the ledger holds it for the gang.
			msg, gone, evict, perr := p.preempt.ForGang(ctx, members, fits)
			if perr != nil {
				reason += "; preemption: " + perr.Error()
			}
			if len(gone) > 0 {
				preempting = true
				if r, gerr := planOn(without(snap, gone)); gerr == nil {
					res, err = r, nil
					evictVictims = evict
					maps.Copy(victims, gone)
				} else if msg != "" {
					reason += "; " + msg
				}
			} else if msg != "" {
				reason += "; preemption: " + msg
			}
		}
		if err != nil && errors.Is(err, gang.ErrNoRoom) && !shared && !preempting && !p.growing {
			// Move pods that consent to it, when its GPUs are scattered
			// (consolidate.go).
			if r, msg := p.consolidate(ctx, key, g, members, demands, minMember, without(snap, own)); r != nil {
				res, err = r, nil
				if h := p.holds[key]; h != nil {
					maps.Copy(victims, h.gone)
				}
			} else if msg != "" {
				reason += "; " + msg
			}
		}
		if err != nil && errors.Is(err, gang.ErrNoRoom) && !shared && !preempting {
			// Backfill into another workload's reservation, when its
			// run-time hints allow (reserve.go).
			if r, bsnap, restore, msg := p.backfill(key, g, members, demands, minMember); r != nil {
				defer restore()
				res, err, snap = r, nil, bsnap
				p.backfillEvent(key, members, msg)
			}
		}
		if err != nil {
			if errors.Is(err, gang.ErrNoRoom) && !shared && !preempting && !p.growing {
				if msg := p.reserve(key, g, members, demands, minMember, since); msg != "" {
					reason += "; " + msg
				}
			}
			p.wait(key, members, reason)
			return false, nil
		}
	}
	timeout, cut := GangTimeout(g, p.timeoutMax)
	expires := p.now().Add(timeout).UTC().Truncate(time.Second)
	awaits, awaitUntil := p.awaits(members, victims)
	uses := make([]*Use, len(members))
	values := make([]string, len(members))
	for i, pl := range res.Placements {
		plan := api.GangPlan{Gang: g.Name, Node: pl.Node, Expires: expires, Awaits: awaits, AwaitUntil: awaitUntil}
		if n := demands[i].SpansGPUs(); n > 1 {
			// A slice over several GPUs: the plan names all of them, as
			// its bind will place it, so that the ledger holds its share
			// of each and the bind puts it there (the allocator planned
			// its share of one GPU; the node admitted the rest:
			// Node.GangNode). A plan naming one GPU held 1/n of it, and
			// its bind, bound to that one GPU, never fitted.
			on := plannedOn
			if on == nil {
				on = snap
			}
			st, ok := on[pl.Node]
			if !ok {
				return false, fmt.Errorf("gang %s: member %s planned on node %s, which is not in the snapshot", g.Key(), members[i].Name, pl.Node)
			}
			gpus, err := st.SliceGPUs(demands[i])
			if err != nil {
				return false, fmt.Errorf("gang %s: member %s: naming the %d GPUs of its slice on %s: %w", g.Key(), members[i].Name, n, pl.Node, err)
			}
			plan.GPU, plan.Spread = &gpus[0], gpus[1:]
		} else if demands[i].Kind() == allocator.Shared {
			pos := pl.GPUs.Positions()
			if len(pos) != 1 {
				return false, fmt.Errorf("gang %s: member %s planned on %d GPUs for a slice", g.Key(), members[i].Name, len(pos))
			}
			ref := snap[pl.Node].GPURef(pos[0])
			plan.GPU = &ref
		} else if st := snap[pl.Node]; st.NamesWholeGPUs(demands[i]) {
			// The GPUs are named (api.GangPlan.GPUs) so that no slice
			// takes one while pods evicted for the gang still leave it.
			for _, pos := range pl.GPUs.Positions() {
				plan.GPUs = append(plan.GPUs, st.GPURef(pos))
			}
		}
		ann := map[string]string{}
		if err := api.SetGangPlan(ann, plan); err != nil {
			return false, fmt.Errorf("gang %s: %w", g.Key(), err)
		}
		values[i] = ann[api.AnnotationGangPlan]
		uses[i] = p.ledger.Planned(members[i], &plan)
	}
	if err := p.ledger.ReserveGang(snap, uses); err != nil {
		if errors.Is(err, ErrStaleSnapshot) && p.passSnap != nil && p.replans < maxReplans {
			// A node changed since the pass began (a pod bound or left):
			// this workload, which comes first, plans again at once on
			// the node as it is now.
			p.refreshUses(uses)
			p.replans++
			defer func() { p.replans-- }()
			return p.plan(ctx, key, g, members, minMember)
		}
		return false, fmt.Errorf("gang %s: %w (planned again on the next pass)", g.Key(), err)
	}
	// Its plan took the place of its reservation in the ledger.
	p.reservationTaken(key, members)
	// The workloads after this one in the pass see its reservation (and
	// nothing else that changed on the cluster meanwhile).
	p.refreshUses(uses)
	uids := make([]types.UID, len(members))
	for i, m := range members {
		uids[i] = m.UID
	}
	if evictVictims != nil {
		// The ledger holds the room now: the victims go.
		if err := evictVictims(ctx); err != nil {
			p.ledger.ReleaseGang(uids)
			p.refreshUses(uses)
			p.rehold(key)
			// Victims that did go count as gone on the next pass.
			p.wait(key, members, fmt.Sprintf("evicting for it: %v (it is planned again on the next pass)", err))
			return false, nil
		}
	}
	// API writes, outside any lock: every plan first, then the gates, so
	// that no member is released before the whole gang is recorded. Each
	// of the two steps writes up to apiWriters members at once: one after
	// the other, a gang of 128 took 256 round trips (5 s on a loaded
	// machine) before its last member could be scheduled.
	// A member whose write never ran (ctx ended) counts as failed.
	errs := make([]error, len(members))
	for i, m := range members {
		errs[i] = fmt.Errorf("gang %s: the plan of %s was not written (stopping)", g.Key(), m.Name)
	}
	workqueue.ParallelizeUntil(ctx, apiWriters, len(members), func(i int) {
		errs[i] = nil
		if err := p.client.SetPlan(ctx, members[i], values[i]); err != nil {
			errs[i] = fmt.Errorf("gang %s: writing the plan of %s: %w", g.Key(), members[i].Name, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		p.ledger.ReleaseGang(uids)
		var written []*corev1.Pod
		for i, m := range members {
			if errs[i] == nil {
				written = append(written, m)
			}
		}
		cerr := p.clearPlans(ctx, written)
		// A hold it had is counted again: its room stays its own.
		p.rehold(key)
		return false, errors.Join(err, cerr)
	}
	p.planHeld(key, uids)
	// Planned: what it knew of its reservations is of no more use (a later
	// reservation, should its plan expire, begins anew), and its record
	// leaves the ReservationStore at the end of the pass.
	delete(p.store.restoredSince, key)
	delete(p.heldBefore, key)
	delete(p.cooldown, key)
	if len(awaits) > 0 {
		// The gates are lifted by a later pass, once the victims are
		// gone: tried now, kube-scheduler would find their GPUs still
		// taken and report the pods unschedulable.
		logger.V(2).Info("Planned on room pods evicted for it still hold; the gates are lifted once they are gone", "workload", key)
	} else {
		for i, m := range members {
			errs[i] = fmt.Errorf("gang %s: the gate of %s was not lifted (stopping)", g.Key(), m.Name)
		}
		workqueue.ParallelizeUntil(ctx, apiWriters, len(members), func(i int) {
			errs[i] = nil
			// With its plan, so that the gate's removal pins it to its
			// node.
			if err := p.client.RemoveGate(ctx, withAnnotation(members[i], api.AnnotationGangPlan, values[i])); err != nil {
				errs[i] = fmt.Errorf("gang %s: removing the gate of %s: %w", g.Key(), members[i].Name, err)
			}
		})
	}
	delete(p.waiting, key)
	if queued {
		// The next workloads of this pass see what this one takes.
		st := p.qsnap.State
		st.Used[q] = st.Used[q].Add(want)
		pend := st.Pending[q].Sub(want)
		for r, v := range pend {
			pend[r] = max(v, 0)
		}
		st.Pending[q] = pend
		for i, w := range st.Waiting[q] {
			if equalUses(w, want) {
				st.Waiting[q] = append(st.Waiting[q][:i:i], st.Waiting[q][i+1:]...)
				break
			}
		}
	}
	where := "the cluster"
	if res.Level != "" {
		where = res.Level + "=" + res.Domain
	}
	logger.Info("Planned gang", "gang", g.Key(), "members", len(members), "domain", where, "nodes", placedOn(res), "expires", expires)
	if p.events != nil {
		for i, m := range members {
			if api.IsPodKey(key) {
				p.events.Eventf(m, corev1.EventTypeNormal, api.EventQueueAdmitted, "tessera: admitted by queue %s (%s); planned on node %s", q, p.admittedWhy(q, want), res.Placements[i].Node)
				continue
			}
			if cut != "" {
				p.events.Eventf(m, corev1.EventTypeNormal, "GangPlanned", "tessera: gang %s planned in %s: this member on node %s; the plan holds for %s (%s)", g.Key(), where, res.Placements[i].Node, timeout, cut)
			} else {
				p.events.Eventf(m, corev1.EventTypeNormal, "GangPlanned", "tessera: gang %s planned in %s: this member on node %s", g.Key(), where, res.Placements[i].Node)
			}
			if g.Levels != nil && len(res.Unlabelled) > 0 {
				// The gang's own levels (the cluster's are the operator's).
				p.events.Eventf(m, corev1.EventTypeWarning, api.EventGangTopologyUnmatched, "tessera: gang %s: no node it may use has the label %s of its %s levels; it was planned without them (a mistyped label key?)",
					g.Key(), strings.Join(res.Unlabelled, ", "), api.AnnotationGangTopology)
			}
		}
	}
	return true, errors.Join(errs...)
}

// gangInput is the planning input of members on the node states snap.
func (p *GangPlanner) gangInput(snap Snapshot, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int, shared bool) (gang.Group, []gang.Node) {
	names := make([]string, 0, len(snap))
	for n := range snap {
		names = append(names, n)
	}
	sort.Strings(names)
	kind := allocator.Whole
	if shared {
		kind = allocator.Shared
	}
	var nodes []gang.Node
	var unitMiB, sliceBaseMiB int64
	for _, n := range names {
		st := snap[n]
		if !st.Plannable(shared) {
			continue
		}
		if unitMiB == 0 {
			if u, base, ok := st.Units(); ok {
				unitMiB, sliceBaseMiB = u, base
			}
		}
		if gn, ok := st.GangNode(kind, demands); ok {
			nodes = append(nodes, gn)
		}
	}
	grp := gang.Group{Namespace: g.Namespace, Name: g.Name, MinMember: minMember, Levels: p.levels}
	if g.Levels != nil {
		grp.Levels = toGangLevels(g.Levels)
	}
	for i, m := range members {
		// Shared slices are sized with the memory unit of the cluster's
		// first GPU node: nodes with another unit may be misjudged.
		r := demands[i].Request(unitMiB, sliceBaseMiB)
		r.Models = demands[i].GPUModels()
		grp.Members = append(grp.Members, gang.Member{Name: m.Name, Request: r, NVLink: demands[i].NeedsNVLink(), Allowed: podAllows(snap, m)})
	}
	return grp, nodes
}
